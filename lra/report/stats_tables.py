"""The statistics as text (:mod:`lra.report.uncertainty`): the interval and marks of a
leaderboard cell, the rank column, the paired comparisons of ``leaderboard.md``,
``pairwise.csv`` and the seeds-needed table."""

from __future__ import annotations

import csv
import io

from lra.report.uncertainty import ALPHA, AVG5, AVG6, BoardStats

BEST_MARK = "*"  # not distinguishable from the column's best (Holm-adjusted p >= 0.05)
CHANCE_MARK = "~"  # not above the majority-class rate (binomial test, p >= 0.05)
CEILING_MARK = "^"  # the 95% interval reaches 100%
PAIRWISE_COLUMNS = (
    "protocol",
    "task",
    "model_a",
    "model_b",
    "diff",
    "ci_low",
    "ci_high",
    "p_value",
    "p_holm",
    "prob_improvement",
    "n_seeds_a",
    "n_seeds_b",
)


def interval_text(st: BoardStats | None, label: str, column: str) -> str:
    """`` [50.6, 56.8]`` and the cell's marks, or empty without predictions."""
    if st is None or (interval := st.interval(label, column)) is None:
        return ""
    return f" [{interval[0]:.1f}, {interval[1]:.1f}]"


def marks_text(st: BoardStats | None, label: str, column: str) -> str:
    if st is None or not st.has(label, column):
        return ""
    key = (label, column)
    return (
        (BEST_MARK if key in st.tied_with_best else "")
        + (CHANCE_MARK if key in st.not_above_chance else "")
        + (CEILING_MARK if key in st.at_ceiling else "")
    )


def rank_text(st: BoardStats | None, label: str) -> str:
    if st is None or label not in st.ranks:
        return ""
    rank, low, high = st.ranks[label]
    return f"{rank} ({low}-{high})" if low != high else f"{rank} ({low})"


def column_name(board, column: str) -> str:
    if column == AVG5:
        return "Tiny avg (not LRA)" if board.tiny else "LRA avg (5)"
    if column == AVG6:
        return "Tiny avg (6)" if board.tiny else "Avg (6)"
    return column


def legend(st: BoardStats | None, resamples: int) -> str:
    if st is None or st.bootstrap is None:
        return ""
    return (
        "[low, high] = 95% interval over seeds and test examples: a stratified bootstrap "
        f"({resamples} replicates, seeded), resampling each task's test examples and each "
        "cell's seeds (n=1: the test examples only); an average resamples per task, then "
        "averages (docs/statistics.md). Rank (95%) = rank by the five-task average and its "
        f"95% interval from the same replicates. {BEST_MARK} not distinguishable from the "
        f"column's best (paired bootstrap p >= {ALPHA} after Holm's adjustment); "
        f"{CHANCE_MARK} not above the majority-class rate (one-sided binomial test, p >= "
        f"{ALPHA}); {CEILING_MARK} at the ceiling (the interval reaches 100%)."
    )


def missing_text(st: BoardStats | None) -> list[str]:
    if st is None or not st.missing:
        return []
    items = "; ".join(
        f"{label} on {task}: {why}" for (label, task), why in sorted(st.missing.items())
    )
    return [
        f"No interval (no per-example predictions): {items}. `lra-eval run=<run folder>` "
        "writes them for a saved run; a record written since predictions exist names its own.",
        "",
    ]


def _matrix(board, st: BoardStats, versus: str, title: str) -> list[str]:
    lines_of = {(p["model_a"], p["task"]): p for p in st.pairs if p["versus"] == versus}
    if not lines_of:
        return []
    columns = [c for c in st.columns if any(t == c for _, t in lines_of)]
    head = ["Model", *(column_name(board, c) for c in columns)]
    out = [title, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in board.rows:
        values = [row.label]
        for column in columns:
            p = lines_of.get((row.label, column))
            if p is None:
                values.append("—" if st.has(row.label, column) else "")
                continue
            sig = " **" if p["p_holm"] < ALPHA else ""
            values.append(
                f"{p['diff']:+.1f} [{p['ci_low']:+.1f}, {p['ci_high']:+.1f}] "
                f"p={p['p_holm']:.3f}{sig}"
            )
        out.append("| " + " | ".join(values) + " |")
    return [*out, ""]


def pairwise_markdown(board, st: BoardStats | None) -> list[str]:
    """The paired comparisons of one protocol: against the reference and against the best."""
    if st is None or not st.pairs:
        return []
    lines = [f"### Paired comparisons: {board.protocol}", ""]
    caption = (
        "Cell: model - {other}, percentage points, [95% interval] from the same paired "
        "bootstrap (test examples shared, seeds paired where the lists match), and the "
        "two-sided bootstrap p-value adjusted for multiple comparisons by Holm's method "
        "within each column of this table; ** = p < 0.05 after the adjustment. All pairs, "
        "unadjusted p and P(A > B) (rliable's probability of improvement): pairwise.csv."
    )
    if st.reference is not None:
        lines += _matrix(
            board, st, "reference", caption.format(other=f"the reference ({st.reference})")
        )
    best = ", ".join(f"{column_name(board, c)}: {lb}" for c, lb in st.best.items())
    lines += _matrix(
        board, st, "best", caption.format(other="the column's best") + f" Best: {best}."
    )
    return lines


def seeds_markdown(board, st: BoardStats | None) -> list[str]:
    """Per task: the pooled seed spread, the test set's standard error and the seeds needed."""
    if st is None or not st.seeds_needed:
        return []
    points = st.resolve_points
    lines = [
        f"### Seeds needed: {board.protocol}",
        "",
        f"Seeds per model for a two-sided comparison (alpha 0.05, power 0.8) to resolve "
        f"{points:g} point(s) at the seed standard deviation observed here (pooled over the "
        "cells with two or more seeds); the test set's standard error (binomial, at the mean "
        "accuracy) is a floor that more seeds do not lower.",
        "",
        "| Task | Seed SD (points) | Cells (dof) | Test examples | Test SE (points) "
        "| Seeds needed |",
        "|---|---|---|---|---|---|",
    ]
    for s in st.seeds_needed:
        sd = "" if s["seed_std"] is None else f"{s['seed_std']:.2f}"
        seeds = "n/a (one seed per cell)" if s["seeds"] is None else str(s["seeds"])
        lines.append(
            f"| {s['task']} | {sd} | {s['cells']} ({s['dof']}) | {s['test_examples']} | "
            f"{s['test_se']:.2f} | {seeds} |"
        )
    return [*lines, ""]


def pairwise_csv(all_stats: list[BoardStats]) -> str:
    """``pairwise.csv``: one line per pair, the columns of :data:`PAIRWISE_COLUMNS` and
    ``versus`` (``reference``, ``best``, or ``reference+best`` for a column whose best model
    is the reference: its two families hold the same pairs, so each is written once). The
    averages are named as in ``leaderboard.csv`` (``lra_average``, ``six_average_fail50``;
    ``tiny_average``, ``tiny_six_average`` on the tiny tasks)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*PAIRWISE_COLUMNS, "versus"])
    for st in all_stats:
        versus_of: dict[tuple, list[str]] = {}
        lines: dict[tuple, dict] = {}
        for p in st.pairs:
            key = tuple(p[c] for c in ("protocol", "task", "model_a", "model_b"))
            versus_of.setdefault(key, []).append(p["versus"])
            lines.setdefault(key, p)
        for key, p in lines.items():
            row = [_csv(p[c]) for c in PAIRWISE_COLUMNS]
            row[PAIRWISE_COLUMNS.index("task")] = st.csv_names.get(p["task"], p["task"])
            writer.writerow([*row, "+".join(versus_of[key])])
    return out.getvalue()


def _csv(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(round(value, 6))
    return str(value)
