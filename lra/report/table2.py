"""The LRA paper's efficiency table in its own form (aggregate step; issue 31, part 6).

Tay et al., "Long Range Arena", ICLR 2021, Table 2: training steps per second and peak
memory at sequence lengths 1K, 2K, 3K and 4K on the byte-level Text task, each model
relative to the Transformer. Here, from ``lra-bench`` records: one :class:`Table2` per
benchmark setting (:class:`~lra.report.efficiency.EfficiencyTable`: task, batch, precision,
device, platform and protocol alike, so every model in it, the Transformer included, was
measured the same way), each value relative to that table's Transformer row at the same
length (on the plain path when it was measured, as the paper's Transformer computes the full
L x L matrix; see :mod:`lra.report.efficiency`). Speed: ``train_steps_per_sec / the
Transformer's`` (x-times faster); memory: ``peak_memory_bytes / the Transformer's`` (a
fraction of its memory). A cell whose run did not finish holds its status (``OOM``).

Beside it, the published Table 2 (source ``lra_paper``, :mod:`lra.report.published`): the
relative speed the paper prints in brackets where it has one, else its steps/sec over its
Transformer's; the memory over its Transformer's.

Shapes: ``measured[row label][metric][length]`` and ``published[row label][metric][length]``
with metric in ``("speed", "memory")``.
"""

from dataclasses import dataclass, field

from lra.report import published as pub
from lra.report.efficiency import EfficiencyTable
from lra.report.load import BASELINE

LENGTHS = (1024, 2048, 3072, 4096)
PUBLISHED_SOURCE = "lra_paper"
METRICS = {"speed": "train_steps_per_sec", "memory": "peak_memory_bytes"}
# metric -> (absolute published metric, relative published metric)
PUBLISHED_METRICS = {
    "speed": ("steps_per_sec", "relative_steps_per_sec"),
    "memory": ("peak_memory", "relative_peak_memory"),
}


@dataclass
class Table2:
    setting: dict
    baseline: str
    rows: list[str]
    lengths: tuple[int, ...]
    measured: dict[str, dict[str, dict[int, float | str | None]]]
    published: dict[str, dict[str, dict[int, float | str | None]]] = field(default_factory=dict)
    published_labels: dict[str, str] = field(default_factory=dict)
    hardware: str = ""

    def best(self, metric: str, length: int) -> float | None:
        """The best measured value in a column (highest speed, lowest memory)."""
        values = [
            v
            for r in self.rows
            if isinstance(v := self.measured[r][metric].get(length), int | float)
        ]
        if not values:
            return None
        return max(values) if metric == "speed" else min(values)


def _relative(table: EfficiencyTable, row: str, length: int, key: str):
    status = table.status(row, length)
    if status is None:
        return None
    if status != "ok":
        return status.upper()
    mine, base = table.value(row, length, key), table.value(table.baseline, length, key)
    return None if mine is None or not base else mine / base


def _published_relative(model: str, rows: list, metric: str) -> tuple[dict, str, str]:
    """``({length: relative value}, label printed, hardware)`` of ``model`` in the paper."""
    absolute, relative = PUBLISHED_METRICS[metric]
    mine = pub.published_for(model, rows)
    base = {r.metric: r for r in pub.published_for(BASELINE, rows)}
    label = mine[0].model if mine else ""
    hardware = mine[0].hardware if mine else ""
    by_metric = {r.metric: r for r in mine}
    out: dict = {}
    if relative in by_metric:
        out.update(by_metric[relative].values)
    if absolute in by_metric and absolute in base:
        for n, v in by_metric[absolute].values.items():
            b = base[absolute].values.get(n)
            if n in out:
                continue
            if isinstance(v, int | float) and isinstance(b, int | float) and b:
                out[n] = v / b
            elif isinstance(v, str):
                out[n] = v
    return out, label, hardware


def table2(tables: list[EfficiencyTable], efficiency_rows: list | None = None) -> list[Table2]:
    """One :class:`Table2` per benchmark setting with a length in :data:`LENGTHS`."""
    paper = [r for r in efficiency_rows or [] if r.source.id == PUBLISHED_SOURCE]
    out = []
    for t in tables:
        lengths = tuple(n for n in LENGTHS if n in t.lengths)
        if not lengths:
            continue
        measured = {
            row: {m: {n: _relative(t, row, n, key) for n in lengths} for m, key in METRICS.items()}
            for row in t.models
        }
        result = Table2(t.setting, t.baseline, list(t.models), lengths, measured)
        for row in t.models:
            model = t.model_of(row)
            for metric in METRICS:
                values, label, hardware = _published_relative(model, paper, metric)
                if values:
                    result.published.setdefault(row, {})[metric] = {
                        n: values.get(n) for n in lengths
                    }
                    result.published_labels[row] = label
                    result.hardware = result.hardware or hardware
        out.append(result)
    return out
