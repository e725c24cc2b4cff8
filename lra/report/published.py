"""Published Long Range Arena results as data: loader, alias table and averaging rules.

One YAML file per source lives in ``lra/report/published_data/`` (shipped as package data).
Each file names the source it was read from (``source.read_from``: the exact URL or
repository/path@commit), the averaging rule its "Avg" column used, and per-model rows with
the scores exactly as printed: a float, the string ``"FAIL"`` (the source reports the model
did not learn the task) or ``null`` (the source has no number in that cell). A number whose
source could not be opened and read is not shipped.

Sources and their conventions (see each file's ``source`` block):

- Tay et al., "Long Range Arena: A Benchmark for Efficient Transformers", ICLR 2021,
  arXiv 2011.04006, Table 1 (scores, ``lra5``: the average leaves Path-X out) and Table 2
  (steps per second and peak memory at 1K-4K on the byte-level Text task).
- Gu et al., "Efficiently Modeling Long Sequences with Structured State Spaces", ICLR 2022,
  arXiv 2111.00396, Table 10 (``six_fail50``: six tasks, a failed Path-X counts as 50) and
  Table 3 (speed and memory relative to the Transformer at lengths 1024 and 4096).

- Orvieto et al., "Resurrecting Recurrent Neural Networks for Long Sequences", ICML 2023,
  arXiv 2303.06349, Table 3 (no average printed; its sCIFAR column is colour CIFAR-10, stored
  under ``image`` with ``image_variant: colour``).
- Ma et al., "Mega: Moving Average Equipped Gated Attention", ICLR 2023, arXiv 2209.10655,
  Table 2 (six-task average where Path-X was solved, five-task where it failed).
- Hasani et al., "Liquid Structural State-Space Models", ICLR 2023, arXiv 2209.12951, Table 1
  (its state-space rows, among them S4D-LegS/Inv/Lin as quoted from Gu et al. 2022b, the S4D
  paper; ``six_fail50``).
- Two rows read from secondary sources (``source.secondary: true``; the report's source lists
  say so): S5's own LRA row (Smith et al., ICLR 2023) from its Papers-with-Code page, and the
  Transformer with causal self-pretraining (Amos et al., ICLR 2024) as quoted in Table 1 of
  the RTF paper, arXiv 2405.06147 (``six``).

Image variant: LRA's Image task is grayscale CIFAR-10. A row whose Image column was measured on
colour CIFAR-10 (LRU's sCIFAR) says ``image_variant: colour``; the default, ``grayscale``, is
the LRA task. The score is shipped as printed; :mod:`lra.report.compare` keeps a colour score
(and every average that would include it) out of the comparison with the harness's Image task.

Units: scores and averages are test accuracies in percent (0-100), as the papers print them.
:func:`lra5_average` and :func:`six_average_fail50` take a mapping task -> percent (or
``"FAIL"`` / ``None``); a measured leaderboard row must be converted to percent first.

This module reads YAML only: nothing here imports JAX (``lra.report`` is JAX-free).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from lra.errors import DataError

TASKS = ("listops", "text", "retrieval", "image", "pathfinder", "pathx")
LRA5_TASKS = TASKS[:5]
FAIL = "FAIL"
FAIL_SCORE = 50.0
AVERAGING_RULES = ("lra5", "six_fail50", "six", "none")
METRICS = ("steps_per_sec", "peak_memory", "relative_steps_per_sec", "relative_peak_memory")
SOURCE_FIELDS = ("id", "citation", "table", "read_from")
IMAGE_VARIANTS = ("grayscale", "colour")  # LRA's Image task is grayscale CIFAR-10
SCORE_KEYS = {
    "model",
    "average",
    "notes",
    "table",
    "image_variant",
    "spread",
    "spread_kind",
    *TASKS,
}
EFFICIENCY_KEYS = {"model", "metric", "unit", "hardware", "values", "notes", "table"}

# Harness model name (configs/model/NAME.yaml) -> the labels sources print for it. Explicit:
# a label listed here maps to one harness name only; a published row whose label is not listed
# is reported by ``unmatched`` and never guessed (e.g. LRA's "Synthesizer" does not say which
# Synthesizer variant ran, so it maps to none of the three harness variants).
ALIASES: dict[str, tuple[str, ...]] = {
    "transformer": ("Transformer", "Vanilla Transformer", "XFM", "XFM‡"),
    "local": ("Local Attention", "Local Att"),
    "linformer": ("Linformer",),
    "reformer": ("Reformer",),
    "performer": ("Performer",),
    "linear_transformer": ("Linear Trans.", "Linear Transformer"),
    "nystromformer": ("Nyströmformer", "Nystromformer"),
    "ls": ("Long-Short", "LS", "Transformer-LS"),
    "cosformer": ("cosFormer",),
    "flash": ("FLASH",),
    "transnormer_t1": ("TransNormer T1",),
    "transnormer_t2": ("TransNormer T2",),
    # configs/model/s4d.yaml runs S4D-Inv (init: inv); S4D-LegS and S4D-Lin rows stay listed.
    "s4d": ("S4D-Inv",),
    "s5": ("S5",),
    "lru": ("LRU",),
    "mamba": ("Mamba",),
}


class PublishedDataError(DataError):
    """A published-results file is malformed; the message names the file and the key."""


@dataclass(frozen=True)
class Source:
    """Where a file's numbers were read: citation, table and the exact text that was read."""

    id: str
    citation: str
    table: str
    read_from: str
    arxiv: str | None
    secondary: bool = False  # read from a page quoting the paper, not from the paper

    @property
    def cited(self) -> str:
        """The citation as the report's source lists print it: a secondary source says so."""
        if not self.secondary:
            return self.citation
        return f"{self.citation} [secondary source: {self.read_from}]"


@dataclass(frozen=True)
class PublishedScore:
    """One published LRA row: per-task accuracy in percent, ``"FAIL"`` or ``None``;
    ``image_variant`` (one of :data:`IMAGE_VARIANTS`) says which CIFAR-10 the Image score used."""

    model: str
    source: Source
    scores: dict
    average: float | None
    averaging: str
    notes: str
    table: str
    image_variant: str = "grayscale"
    spread: dict = field(default_factory=dict)  # task -> the printed spread, percent
    spread_kind: str = ""  # what the spread is, e.g. "standard error over 3 seeds"

    @property
    def lra_image(self) -> bool:
        """Whether the Image score (and so the printed average) is on LRA's grayscale task."""
        return self.image_variant == IMAGE_VARIANTS[0]


@dataclass(frozen=True)
class PublishedEfficiency:
    """One published speed or memory row: sequence length -> value as printed."""

    model: str
    source: Source
    metric: str
    unit: str
    hardware: str
    values: dict
    notes: str
    table: str


def _data_folder() -> Path:
    return Path(str(resources.files("lra.report") / "published_data"))


def _fail(path: Path, key: str, why: str) -> PublishedDataError:
    return PublishedDataError(f"{path}: key {key!r}: {why}")


def _number(path: Path, key: str, value, allow_fail: bool) -> float | str | None:
    if value is None:
        return None
    if allow_fail and value == FAIL:
        return FAIL
    if isinstance(value, bool) or not isinstance(value, int | float):
        allowed = 'a number, "FAIL" or null' if allow_fail else "a number or null"
        raise _fail(path, key, f"{value!r} is not {allowed}")
    if not math.isfinite(value):
        raise _fail(path, key, f"{value!r} is not finite")
    return float(value)


def _text(path: Path, key: str, value, required: bool = True) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise _fail(path, key, "missing or empty (a non-empty string is required)")
    return value


def _source(path: Path, raw) -> Source:
    if not isinstance(raw, Mapping):
        raise _fail(path, "source", "missing (a mapping with id, citation, table, read_from)")
    for name in SOURCE_FIELDS:
        _text(path, f"source.{name}", raw.get(name))
    if raw["id"] != path.stem:
        raise _fail(path, "source.id", f"{raw['id']!r} differs from the file stem {path.stem!r}")
    arxiv = raw.get("arxiv")
    secondary = raw.get("secondary", False)
    if not isinstance(secondary, bool):
        raise _fail(path, "source.secondary", f"{secondary!r} is not true or false")
    return Source(
        id=raw["id"],
        citation=raw["citation"],
        table=raw["table"],
        read_from=raw["read_from"],
        arxiv=None if arxiv is None else str(arxiv),
        secondary=secondary,
    )


def _score_row(path: Path, i: int, raw, source: Source, averaging: str) -> PublishedScore:
    where = f"scores[{i}]"
    if not isinstance(raw, Mapping):
        raise _fail(path, where, "a row must be a mapping")
    for key in raw:
        if key not in SCORE_KEYS:
            raise _fail(path, f"{where}.{key}", f"unknown key (tasks: {', '.join(TASKS)})")
    model = _text(path, f"{where}.model", raw.get("model"))
    scores = {t: _number(path, f"{where}.{t}", raw.get(t), allow_fail=True) for t in TASKS}
    variant = raw.get("image_variant", IMAGE_VARIANTS[0])
    if variant not in IMAGE_VARIANTS:
        raise _fail(
            path,
            f"{where}.image_variant",
            f"{variant!r} (row {model!r}) is not one of {', '.join(IMAGE_VARIANTS)}; leave it "
            "out for LRA's grayscale Image, or write colour for a colour CIFAR-10 score",
        )
    return PublishedScore(
        model=model,
        source=source,
        scores=scores,
        average=_number(path, f"{where}.average", raw.get("average"), allow_fail=False),
        averaging=averaging,
        notes=_text(path, f"{where}.notes", raw.get("notes"), required=False),
        table=_text(path, f"{where}.table", raw.get("table", source.table)),
        image_variant=variant,
        **_spread(path, where, raw),
    )


def _spread(path: Path, where: str, raw: Mapping) -> dict:
    """A row's printed spread per task (``spread: {task: percent}``) and what it is
    (``spread_kind``, required with it)."""
    spread = raw.get("spread")
    if spread is None:
        return {}
    if not isinstance(spread, Mapping) or not set(spread) <= set(TASKS):
        raise _fail(path, f"{where}.spread", f"a mapping of tasks ({', '.join(TASKS)}) to numbers")
    values = {
        t: _number(path, f"{where}.spread.{t}", v, allow_fail=False) for t, v in spread.items()
    }
    if any(v is not None and v < 0 for v in values.values()):
        raise _fail(path, f"{where}.spread", "a spread cannot be negative")
    kind = _text(path, f"{where}.spread_kind", raw.get("spread_kind"))
    return {"spread": {t: v for t, v in values.items() if v is not None}, "spread_kind": kind}


def _efficiency_row(path: Path, i: int, raw, source: Source) -> PublishedEfficiency:
    where = f"efficiency[{i}]"
    if not isinstance(raw, Mapping):
        raise _fail(path, where, "a row must be a mapping")
    for key in raw:
        if key not in EFFICIENCY_KEYS:
            raise _fail(path, f"{where}.{key}", "unknown key")
    metric = raw.get("metric")
    if metric not in METRICS:
        raise _fail(path, f"{where}.metric", f"{metric!r} is not one of {', '.join(METRICS)}")
    values = raw.get("values")
    if not isinstance(values, Mapping) or not values:
        raise _fail(path, f"{where}.values", "missing (a mapping sequence length -> value)")
    parsed = {}
    for length, value in values.items():
        if isinstance(length, bool) or not isinstance(length, int) or length <= 0:
            raise _fail(path, f"{where}.values.{length}", "a length must be a positive integer")
        parsed[length] = _number(path, f"{where}.values.{length}", value, allow_fail=True)
    return PublishedEfficiency(
        model=_text(path, f"{where}.model", raw.get("model")),
        source=source,
        metric=metric,
        unit=_text(path, f"{where}.unit", raw.get("unit"), required=False),
        hardware=_text(path, f"{where}.hardware", raw.get("hardware")),
        values=parsed,
        notes=_text(path, f"{where}.notes", raw.get("notes"), required=False),
        table=_text(path, f"{where}.table", raw.get("table", source.table)),
    )


def load_file(path: Path) -> tuple[list[PublishedScore], list[PublishedEfficiency]]:
    """Parse and check one source file; raise :class:`PublishedDataError` naming file and key."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise PublishedDataError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(raw, Mapping):
        raise _fail(path, "source", "the file must be a mapping with source and scores")
    for key in raw:
        if key not in ("source", "averaging", "scores", "efficiency"):
            raise _fail(path, key, "unknown top-level key")
    source = _source(path, raw.get("source"))
    averaging = raw.get("averaging")
    if averaging not in AVERAGING_RULES:
        raise _fail(path, "averaging", f"{averaging!r} is not one of {', '.join(AVERAGING_RULES)}")
    scores_raw = raw.get("scores") or []
    efficiency_raw = raw.get("efficiency") or []
    if not isinstance(scores_raw, list) or not isinstance(efficiency_raw, list):
        raise _fail(path, "scores", "scores and efficiency must be lists of rows")
    scores = [_score_row(path, i, r, source, averaging) for i, r in enumerate(scores_raw)]
    seen: set[tuple[str, str]] = set()
    for i, row in enumerate(scores):
        if (row.model, row.table) in seen:
            raise _fail(path, f"scores[{i}].model", f"duplicate model {row.model!r}")
        seen.add((row.model, row.table))
    efficiency = [_efficiency_row(path, i, r, source) for i, r in enumerate(efficiency_raw)]
    seen_eff: set[tuple[str, str, str]] = set()
    for i, row in enumerate(efficiency):
        key = (row.model, row.metric, row.table)
        if key in seen_eff:
            raise _fail(path, f"efficiency[{i}].model", f"duplicate model {row.model!r}")
        seen_eff.add(key)
    return scores, efficiency


def load_published(folder=None) -> tuple[list[PublishedScore], list[PublishedEfficiency]]:
    """Every published row in ``folder`` (``None``: the package data), files in name order."""
    folder = _data_folder() if folder is None else Path(folder)
    scores: list[PublishedScore] = []
    efficiency: list[PublishedEfficiency] = []
    for path in sorted(folder.glob("*.yaml")):
        s, e = load_file(path)
        scores.extend(s)
        efficiency.extend(e)
    return scores, efficiency


def _label_to_name() -> dict[str, str]:
    return {label: name for name, labels in ALIASES.items() for label in labels}


def published_for(model_name: str, rows: Iterable) -> list:
    """The published rows (scores or efficiency) whose label the alias table maps to the model."""
    labels = set(ALIASES.get(model_name, ()))
    return [row for row in rows if row.model in labels]


def unmatched(rows: Iterable, model_names: Iterable[str]) -> list:
    """Rows whose label maps to none of ``model_names`` through the alias table."""
    names = set(model_names)
    mapping = _label_to_name()
    return [row for row in rows if mapping.get(row.model) not in names]


def _cells(scores: Mapping, tasks: Iterable[str], fail_as: float | None) -> list[float] | None:
    out = []
    for task in tasks:
        value = scores.get(task)
        if value is None:
            return None
        if value == FAIL:
            if fail_as is None:
                return None
            value = fail_as
        out.append(float(value))
    return out


def lra5_average(scores: Mapping) -> float | None:
    """LRA's average (Tay et al. 2021, Table 1): mean of the five tasks other than Path-X, in
    percent; ``None`` if any of them is missing or FAIL."""
    cells = _cells(scores, LRA5_TASKS, fail_as=None)
    return None if cells is None else sum(cells) / len(cells)


def six_average_fail50(scores: Mapping) -> float | None:
    """The state-space papers' average (e.g. Gu et al. 2022, Table 10): mean of all six tasks,
    a FAIL counting as 50 (chance on the binary Path-X); ``None`` if any task is missing."""
    cells = _cells(scores, TASKS, fail_as=FAIL_SCORE)
    return None if cells is None else sum(cells) / len(cells)


def six_average(scores: Mapping) -> float | None:
    """Mean of all six tasks; ``None`` if any is missing or FAIL."""
    cells = _cells(scores, TASKS, fail_as=None)
    return None if cells is None else sum(cells) / len(cells)


def average(scores: Mapping, rule: str) -> float | None:
    """The average of ``scores`` under ``rule`` (one of :data:`AVERAGING_RULES`)."""
    if rule == "lra5":
        return lra5_average(scores)
    if rule == "six_fail50":
        return six_average_fail50(scores)
    if rule == "six":
        return six_average(scores)
    if rule == "none":
        return None
    raise ValueError(f"unknown averaging rule {rule!r}; one of {', '.join(AVERAGING_RULES)}")
