"""TransNormer's Figure 1 as data: one point per model, from one protocol's leaderboard.

Figure 1 of "The Devil in Linear Transformer" (Qin et al., EMNLP 2022, p. 7025) plots each
model as one circle: LRA score on the y axis, training speed in steps per second on the x
axis, circle area proportional to peak memory. The paper's speed scripts ran the Text task
at length 2048 (REFERENCE.md sec. 6), so :data:`DEFAULT_LENGTH` is 2048.

* Protocol: the figure is drawn from one protocol's table: ``transnormer`` if there is
  one, else the only protocol there is, else a :class:`~lra.errors.ConfigError` asking for
  the ``protocol`` filter.
* Row: per model its default row (no override); a model with only one row uses that one;
  a model with several non-default rows is listed as missing (pick one with ``settings``).
* y = the row's LRA average (official tasks) or, for the tiny set, the mean test accuracy
  over the tiny tasks every plotted model has (tiny-task CPU numbers, not LRA scores);
  its error = the 95% interval of that average from the leaderboard's bootstrap
  (``y_interval``, seeds and test examples resampled per task) where every cell carries
  predictions, else the sample standard deviation over seeds of the per-seed score (the
  seed's mean over those tasks), over the seeds that ran every one of them.
* x = median training steps/sec of the model's benchmark record at ``length`` in the
  benchmark setting (task, batch, precision, device, protocol) of the figure's protocol
  with the most models measured there; its error = min-max over the timed windows.
* circle area = peak memory of that benchmark record.
* a model benchmarked on several softmax paths (plain, chunked, cuDNN) is one point per path,
  labelled with it (``transformer (plain)``, ``transformer (chunked)``), same y.
* published points (``published``, from :func:`lra.report.compare.published_points`): for
  the models drawn, the published LRA average against the published training steps/sec,
  hollow and labelled by source; never for tiny tasks.

Models lacking a score or a speed are listed as missing, never plotted at 0. No benchmark
record at ``length`` is an error naming the ``lra-bench`` command that makes them.
"""

import statistics
from dataclasses import dataclass, field

from lra.errors import ConfigError, DataError
from lra.report.efficiency import EfficiencyTable
from lra.report.leaderboard import Leaderboard, Row
from lra.report.load import (
    TINY_NOTE,
    UNSPECIFIED,
    protocol_order,
    record_name,
)

DEFAULT_LENGTH = 2048
FIGURE_PROTOCOL = "transnormer"
REFERENCE_LEGEND = "published (hollow, labelled by source)"


@dataclass
class Point:
    model: str
    label: str
    x: float
    x_low: float
    x_high: float
    y: float
    y_std: float | None
    n_seeds: int
    memory_bytes: float | None
    x_record: dict
    y_records: list[dict]
    windows: int = 0
    y_interval: tuple[float, float] | None = None  # 95%, seeds x test examples (stats)
    rounds: int = 1  # benchmark rounds (fresh processes) whose windows x_low..x_high pool


@dataclass
class Figure1Data:
    protocol: str
    task_set: str
    y_tasks: list[str]
    length: int
    points: list[Point]
    missing: dict[str, str]
    y_label: str
    table: EfficiencyTable | None
    notes: list[str] = field(default_factory=list)
    reference: list[dict] = field(default_factory=list)

    @property
    def tiny(self) -> bool:
        return self.task_set == "tiny"

    @property
    def labels(self) -> list[str]:
        return [p.label for p in self.points]

    @property
    def device(self) -> str:
        return "n/a" if self.table is None else str(self.table.setting.get("device"))

    def sources(self, root=None) -> dict:
        return {
            "protocol": self.protocol,
            "task_set": self.task_set,
            "length": self.length,
            "setting": None if self.table is None else self.table.setting,
            "y": self.y_label,
            "points": {
                p.label: {
                    "model": p.model,
                    "x_record": record_name(p.x_record, root),
                    "y_records": [record_name(r, root) for r in p.y_records],
                    "code_versions": sorted(
                        {str(r.get("code_version")) for r in [p.x_record, *p.y_records]}
                    ),
                }
                for p in self.points
            },
            "missing": self.missing,
            "published": [
                {k: r.get(k) for k in ("model", "label", "source", "citation", "speed_length")}
                for r in self.reference
            ],
        }


def figure_protocol(boards: list[Leaderboard]) -> Leaderboard:
    """The table Figure 1 is drawn from (see the module docstring)."""
    boards = [b for b in boards if b.rows]
    if not boards:
        raise DataError("Figure 1 needs training records; there are none to draw from")
    for board in boards:
        if board.protocol == FIGURE_PROTOCOL:
            return board
    if len(boards) == 1:
        return boards[0]
    names = ", ".join(sorted((b.protocol for b in boards), key=protocol_order))
    raise ConfigError(
        f"training records of several protocols ({names}) and none is {FIGURE_PROTOCOL}: "
        "Figure 1 is drawn from one protocol; choose it with protocol=<name> "
        "(or figure=false for the tables only)"
    )


def _pick_table(tables, length) -> EfficiencyTable | None:
    scored = [
        (sum(t.value(m, length, "train_steps_per_sec") is not None for m in t.models), -i, t)
        for i, t in enumerate(tables)
        if length in t.lengths
    ]
    return max(scored, key=lambda s: s[:2])[2] if scored else None


def bench_table(tables, length: int, protocol: str, models) -> tuple[EfficiencyTable, list[str]]:
    """The benchmark table for the x axis and a note on its protocol when it is not the same.

    Tables of the figure's protocol first; then (records that predate protocols) those whose
    protocol or the figure's is unspecified; for a custom protocol, any. None at ``length``
    is a :class:`~lra.errors.DataError` naming the ``lra-bench`` command that makes them.
    """
    tiers = [
        ([t for t in tables if t.setting.get("protocol") == protocol], None),
        (
            [t for t in tables if UNSPECIFIED in (t.setting.get("protocol"), protocol)],
            "benchmark records of protocol {p} (no benchmark record of protocol {q})",
        ),
    ]
    if protocol in ("custom", UNSPECIFIED):
        tiers.append((tables, "benchmark records of protocol {p} (training protocol {q})"))
    for candidates, note in tiers:
        table = _pick_table(candidates, length)
        if table is not None:
            found = table.setting.get("protocol")
            notes = [] if note is None else [note.format(p=found, q=protocol) + "."]
            return table, notes
    flag = f" protocol={protocol}" if protocol not in ("custom", UNSPECIFIED) else ""
    command = f"lra-bench -m model={','.join(models)} lengths=[{length}]{flag}"
    lengths = sorted({n for t in tables for n in t.lengths})
    there = (
        f" Benchmark records there are at lengths {lengths}"
        f" (protocols {', '.join(sorted({str(t.setting.get('protocol')) for t in tables}))}); "
        "figure_length=... picks one of them."
        if lengths
        else ""
    )
    raise DataError(
        f"no benchmark records (kind=bench) at length {length} for Figure 1's x axis "
        f"(training speed) of protocol {protocol}. Make them with: {command} (it writes to "
        f"results/bench, which lra-report reads by default), or set figure=false.{there}"
    )


def _figure_rows(board: Leaderboard) -> tuple[dict[str, Row], dict[str, str]]:
    chosen, missing = {}, {}
    for model in sorted({r.model for r in board.rows}):
        rows = board.rows_of(model)
        default = [r for r in rows if r.default]
        if default or len(rows) == 1:
            chosen[model] = (default or rows)[0]
        else:
            labels = ", ".join(r.label for r in rows)
            missing[model] = (
                f"several settings and none is the default ({labels}); pick one with settings=..."
            )
    return chosen, missing


def _score(row: Row, tasks) -> tuple[float, float | None, int, list[dict]]:
    """``(mean of the task means, std over seeds of the per-seed score, seeds, records)``."""
    cells = [row.cells[t] for t in tasks]
    y = statistics.fmean(c.mean for c in cells)
    per_task = [c.by_seed() for c in cells]
    seeds = set.intersection(*(set(s) for s in per_task))
    per_seed = [statistics.fmean(s[seed] for s in per_task) for seed in seeds]
    std = statistics.stdev(per_seed) if len(per_seed) > 1 else None
    return y, std, len(per_seed), [rec for c in cells for rec in c.records]


def _scores(board: Leaderboard, rows: dict[str, Row]):
    """``({model: score}, {model: why missing}, y label, tasks of y)``."""
    scores, missing = {}, {}
    if board.tiny:
        common = [t for t in board.tasks if rows and all(t in r.cells for r in rows.values())]
        label = f"Mean test accuracy (%) over {', '.join(common) or 'no common task'} ({TINY_NOTE})"
        for model, row in rows.items():
            if common:
                scores[model] = _score(row, common)
            else:
                missing[model] = "no tiny task has results for every model"
        return scores, missing, label, common
    label = "LRA score (mean test accuracy over ListOps, Text, Retrieval, Image, Pathfinder, %)"
    for model, row in rows.items():
        lacking = [t for t in board.tasks if t not in row.cells]
        if lacking:
            missing[model] = f"no LRA average (no results for {', '.join(lacking)})"
        else:
            scores[model] = _score(row, board.tasks)
    return scores, missing, label, list(board.tasks)


def _published(published, tiny: bool, models) -> tuple[list[dict], list[str]]:
    """The published points of the models drawn (:func:`lra.report.compare.published_points`)."""
    if not published:
        return [], []
    if tiny:
        return [], ["Published points not drawn: tiny-task accuracies are not LRA scores."]
    drawn = [p for p in published if p["model"] in models]
    if not drawn:
        return [], []
    lengths = sorted({str(p.get("speed_length") or "?") for p in drawn})
    hardware = sorted({str(p.get("hardware")) for p in drawn if p.get("hardware")})
    notes = [
        "Hollow circles: published LRA average against published training steps/sec of the "
        "models drawn, labelled by source (published speed at length "
        f"{', '.join(lengths)}, on {'; '.join(hardware) or 'the source hardware'}; drawn at "
        "a fixed size, memory not shown)."
    ]
    return drawn, notes


def figure1_data(
    boards: list[Leaderboard] | Leaderboard,
    tables: list[EfficiencyTable],
    *,
    length: int = DEFAULT_LENGTH,
    published: list[dict] | None = None,
    board_stats: list | None = None,
) -> Figure1Data:
    """The points, the missing models and the notes of Figure 1 (see the module docstring);
    ``board_stats`` (:func:`lra.report.uncertainty.board_stats`, one per board) gives each
    point's y its 95% interval."""
    length = int(length)
    board = figure_protocol([boards] if isinstance(boards, Leaderboard) else boards)
    rows, missing = _figure_rows(board)
    st = next((b for b in board_stats or [] if b.protocol == board.protocol), None)
    table, notes = bench_table(
        tables, length, board.protocol, sorted({r.model for r in board.rows})
    )

    # The score of the models that have a speed to be drawn at (the tiny set's common tasks
    # are those every drawable model has).
    def speed(label):
        return table.value(label, length, "train_steps_per_sec")

    fast = {m: r for m, r in rows.items() if any(speed(b) for b in table.rows_of(m) or [m])}
    scores, lacking, y_label, y_tasks = _scores(board, fast)
    missing.update(lacking)
    points = []
    benched = {table.model_of(b) for b in table.models}
    for model in sorted(set(rows) | set(missing) | benched):
        if model not in rows and model not in missing:
            missing[model] = "no training records"
        # one point per softmax path the model was benchmarked on (lra.report.efficiency)
        for bench_row in table.rows_of(model) or [model]:
            key = model if bench_row == model else bench_row
            status = table.status(bench_row, length)
            x = speed(bench_row)
            if status is not None and status != "ok":
                why = f"{status.upper()} at length {length}"
            elif x is None:
                why = f"no benchmark speed at length {length}"
            else:
                why = None
            if why:
                missing[key] = f"{missing[key]}; {why}" if key in missing else why
                continue
            if model in missing:
                continue
            windows = table.windows(bench_row, length) or [x]
            y, y_std, n_seeds, y_records = scores[model]
            path = bench_row[len(model) :] if bench_row.startswith(model) else ""
            points.append(
                Point(
                    model=model,
                    label=rows[model].label + path,
                    x=float(x),
                    x_low=min(min(windows), x),
                    x_high=max(max(windows), x),
                    y=y,
                    y_std=y_std,
                    n_seeds=n_seeds,
                    memory_bytes=table.value(bench_row, length, "peak_memory_bytes"),
                    x_record=table.cells[(bench_row, length)],
                    y_records=y_records,
                    windows=len(table.windows(bench_row, length)),
                    y_interval=None
                    if st is None
                    else st.average_interval(rows[model].label, y_tasks),
                    rounds=len(
                        table.cells[(bench_row, length)].get("train_steps_per_sec_rounds") or [1]
                    ),
                )
            )
    if not points:
        raise DataError(
            "Figure 1 has no point to draw (protocol "
            f"{board.protocol}, length {length}): "
            + "; ".join(f"{m}: {why}" for m, why in sorted(missing.items()))
            + ". Train the missing tasks (e.g. lra-train -m experiment=figure1"
            + ("_tiny" if board.tiny else "")
            + "), benchmark the missing models with lra-bench, or set figure=false."
        )
    reference, ref_notes = _published(published, board.tiny, {p.model for p in points})
    return Figure1Data(
        protocol=board.protocol,
        task_set=board.task_set,
        y_tasks=y_tasks,
        length=length,
        points=points,
        missing=missing,
        y_label=y_label,
        table=table,
        notes=notes + ref_notes,
        reference=reference,
    )
