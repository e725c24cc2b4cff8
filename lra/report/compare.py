"""Measured beside published: the leaderboard's cells next to the numbers papers print
(aggregate step, pure data; see :mod:`lra.report.load` for the chain; issue 31, part 2).

The published rows come from :mod:`lra.report.published` (one YAML file per source, helper
data shipped in the package). Models are matched by name through its explicit alias table
(:data:`lra.report.published.ALIASES`); a published row whose label no alias maps to a
harness model is listed in :attr:`Comparison.unmatched`, never guessed.

* Cell: for a leaderboard row on an official task, every published score of its model on
  that task, in :func:`source_order` (the LRA paper first, then the other sources in file
  name order, then the rows in file order). The report shows the first beside the measured
  mean, with ``measured - published`` in percentage points; ``sources.json`` lists all.
  A published ``"FAIL"`` is shown as FAIL, with no difference.
* Averages: both rules, on the measured row and on the published rows alike: LRA's
  five-task average (Tay et al. 2021, Table 1: ListOps, Text, Retrieval, Image, Pathfinder;
  Path-X left out; None if any is missing) and the six-task average of the state-space papers
  (Gu et al. 2022, Table 10: a failed Path-X counts as 50; None if any task is missing).
* Image variant: LRA's Image task is grayscale CIFAR-10, as is the harness's. A published row
  whose ``image_variant`` is ``colour`` (LRU's sCIFAR) has its Image score kept out of the
  Image cell and of both averages (:func:`comparable_scores`); the row's other tasks stay.
* Tiny tasks: published numbers are for the official tasks; none is put beside a tiny-task
  cell (:attr:`Comparison.note` says so).
* Figure 1 (:func:`published_points`): for each model drawn, a published LRA average and a
  published training speed (steps/sec) from the same source, as one hollow point labelled by
  the source.

Shapes: a :class:`Comparison` holds ``rows[row label][task] -> [Published, ...]`` (task in
``TASKS``, values in percent).
"""

from dataclasses import dataclass, field

from lra.report import published as pub
from lra.report.leaderboard import Leaderboard, Row

FIRST_SOURCE = "lra_paper"  # the benchmark's own paper comes first
TINY_PUBLISHED_NOTE = (
    "Published numbers are for the official LRA tasks; none is shown beside tiny-task cells."
)
RULES_NOTE = (
    "Two averaging rules, both shown: LRA avg (5) = mean of ListOps, Text, Retrieval, Image "
    "and Pathfinder, Path-X left out (Tay et al. 2021, Table 1); Avg (6, FAIL=50) = mean of "
    "all six tasks, a failed Path-X counting as 50 (the state-space papers' rule, e.g. Gu et "
    "al. 2022, Table 10). Either is empty when a task it needs has no number."
)


@dataclass(frozen=True)
class Published:
    """One published number beside a measured one."""

    value: float | str | None  # percent, "FAIL" or None (the source printed nothing)
    source: str  # the source id (the YAML file's stem)
    label: str  # the model as the source prints it
    table: str
    citation: str
    spread: float | None = None  # the spread the source prints beside the value
    spread_kind: str = ""

    def diff(self, measured: float | None) -> float | None:
        """``measured - published`` in percentage points; None for FAIL or a missing value."""
        if measured is None or not isinstance(self.value, int | float):
            return None
        return measured - float(self.value)

    def trace(self) -> dict:
        return {
            "value": self.value,
            "source": self.source,
            "label": self.label,
            "table": self.table,
            "citation": self.citation,
            "spread": self.spread,
            "spread_kind": self.spread_kind or None,
        }


@dataclass
class RowComparison:
    """One leaderboard row: its published numbers per task and average, all sources."""

    tasks: dict[str, list[Published]] = field(default_factory=dict)
    lra5: list[Published] = field(default_factory=list)
    six50: list[Published] = field(default_factory=list)
    measured_lra5: float | None = None
    measured_six50: float | None = None

    def first(self, task: str) -> Published | None:
        """The published number shown beside ``task`` (the first source with a value)."""
        return next((p for p in self.tasks.get(task, []) if p.value is not None), None)

    def first_average(self, rule: str) -> Published | None:
        return next(iter(self.lra5 if rule == "lra5" else self.six50), None)


@dataclass
class Comparison:
    """The published side of one leaderboard (one protocol's table)."""

    tiny: bool
    rows: dict[str, RowComparison]
    unmatched: list  # PublishedScore rows no alias maps to a harness model
    note: str = ""
    sources: list[str] = field(default_factory=list)  # source ids in source order

    def numbers(self) -> dict[str, int]:
        """``{source id: 1, ...}`` for the sources beside some row, in source order."""
        used = {
            p.source
            for r in self.rows.values()
            for p in (*[q for ps in r.tasks.values() for q in ps], *r.lra5, *r.six50)
        }
        return {s: i for i, s in enumerate([s for s in self.sources if s in used], 1)}

    @property
    def any_published(self) -> bool:
        return any(r.tasks or r.lra5 or r.six50 for r in self.rows.values())


def source_order(rows: list) -> list:
    """``rows`` (published scores or efficiency rows, in load order) with the LRA paper's
    first, the other sources after it in their load (file name) order, stable within each."""
    ids = list(dict.fromkeys(r.source.id for r in rows))
    rank = {s: (s != FIRST_SOURCE, i) for i, s in enumerate(ids)}
    return sorted(rows, key=lambda r: rank[r.source.id])


def measured_scores(row: Row, lb: Leaderboard) -> dict:
    """``{official task: measured mean in percent}`` of a row (Path-X under ``pathx``)."""
    names = dict(zip(lb.shown, pub.TASKS, strict=True))
    return {names[t]: c.mean for t, c in row.cells.items() if t in names}


def measured_six50(row: Row, lb: Leaderboard) -> float | None:
    """The row's six-task average (a failure counting as 50; None unless all six exist)."""
    return pub.six_average_fail50(measured_scores(row, lb))


def _published(row, value, task: str | None = None) -> Published:
    spread = row.spread.get(task) if task else None
    kind = row.spread_kind if spread is not None else ""
    return Published(value, row.source.id, row.model, row.table, row.source.cited, spread, kind)


def comparable_scores(row) -> dict:
    """A published row's scores (task -> percent, ``"FAIL"`` or None) that may stand beside the
    harness's: the Image score of a row whose ``image_variant`` is not ``grayscale`` (colour
    CIFAR-10, e.g. LRU's) is None, since the harness's Image task is LRA's grayscale one (and
    with it every average that would include it)."""
    scores = dict(row.scores)
    if not row.lra_image:
        scores["image"] = None
    return scores


def compare(lb: Leaderboard, scores: list) -> Comparison:
    """The published numbers beside every row of ``lb`` (``scores``: PublishedScore rows)."""
    ordered = source_order(list(scores))
    rows = {}
    for row in lb.rows:
        mine = measured_scores(row, lb)
        found = RowComparison(
            measured_lra5=pub.lra5_average(mine),
            measured_six50=measured_six50(row, lb),
        )
        if not lb.tiny:
            for p in pub.published_for(row.model, ordered):
                scores = comparable_scores(p)
                for task, shown in zip(pub.TASKS, lb.shown, strict=True):
                    if scores.get(task) is not None:
                        found.tasks.setdefault(shown, []).append(_published(p, scores[task], task))
                lra5, six50 = pub.lra5_average(scores), pub.six_average_fail50(scores)
                if lra5 is not None:
                    found.lra5.append(_published(p, lra5))
                if six50 is not None:
                    found.six50.append(_published(p, six50))
        rows[row.label] = found
    unmatched = pub.unmatched(ordered, list(pub.ALIASES))
    note = TINY_PUBLISHED_NOTE if lb.tiny else ""
    order = list(dict.fromkeys(r.source.id for r in ordered))
    return Comparison(lb.tiny, rows, unmatched, note, order)


def unmatched_lines(rows: list) -> list[str]:
    """One line per published row no alias maps to a harness model."""
    return [f"{r.model} ({r.source.id}, {r.table})" for r in rows]


def published_points(models, scores: list, efficiency: list, length: int) -> list[dict]:
    """Figure 1's published points: per model in ``models`` and per source that prints both
    an LRA average (five tasks, :func:`~lra.report.published.lra5_average` of
    :func:`comparable_scores`; else the printed average, unless the row's Image is colour) and
    an absolute training speed (``steps_per_sec``), one point at the speed's
    length nearest ``length``. Dicts: model, label, source, citation, lra_average,
    train_steps_per_sec, speed_length, hardware."""
    points = []
    for model in sorted(set(models)):
        speeds = [
            e
            for e in source_order(pub.published_for(model, efficiency))
            if e.metric == "steps_per_sec"
        ]
        for e in speeds:
            numeric = {n: v for n, v in e.values.items() if isinstance(v, int | float)}
            if not numeric:
                continue
            near = min(numeric, key=lambda n: (abs(n - length), n))
            same = [
                s
                for s in pub.published_for(model, scores)
                if s.source.id == e.source.id and s.model == e.model
            ]
            y = next(
                (
                    v
                    for s in same
                    for v in (
                        pub.lra5_average(comparable_scores(s)),
                        s.average if s.lra_image else None,
                    )
                    if v is not None
                ),
                None,
            )
            if y is None:
                continue
            points.append(
                {
                    "model": model,
                    "label": f"{e.model} ({e.source.id})",
                    "source": e.source.id,
                    "citation": e.source.cited,
                    "lra_average": float(y),
                    "train_steps_per_sec": float(numeric[near]),
                    "speed_length": near,
                    "hardware": e.hardware,
                }
            )
    return points
