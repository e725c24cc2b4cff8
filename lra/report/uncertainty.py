"""How sure the leaderboard is: intervals, paired comparisons, ranks and marks per protocol.

For one protocol's :class:`lra.report.leaderboard.Leaderboard` this reads each cell's
per-example test predictions (``predictions/test.npz`` beside each record,
:mod:`lra.record.predictions`, checked against the SHA-256 the record names) and runs the
statistics of :mod:`lra.report.stats` over them, all from one seeded bootstrap:

- every cell and both averages (the five-task one and the six-task one) get a 95% interval
  over seeds and test examples (:class:`BoardStats.interval`);
- each row with a five-task average gets its 95% rank interval (rank 1 = best);
- :func:`pairwise`: per task and average, each model against the reference model (default
  the Transformer) and against the best model: the difference, its interval, the bootstrap's
  p-value, Holm-adjusted within each (column, comparison) table, and rliable's probability
  of improvement;
- marks: the models not distinguishable from the best (Holm-adjusted p >= 0.05 against it),
  the cells not above chance (binomial test against the majority rate, p >= 0.05) and the
  cells at the ceiling (their interval reaches 100%);
- per task, the seeds a comparison needs to resolve ``resolve_points`` at the observed
  seed variance.

A cell whose records lack predictions (records from before they were written) gets no
interval and takes part in no comparison; :attr:`BoardStats.missing` says which and why.
Nothing here imports JAX.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lra.errors import DataError
from lra.record import predictions
from lra.report import stats
from lra.report.leaderboard import Leaderboard, Row
from lra.report.load import BASELINE, run_folders

ALPHA = 0.05
AVG5, AVG6 = "avg5", "avg6"  # column names of the two averages in BoardStats


def record_correct(record: dict) -> tuple[np.ndarray, np.ndarray]:
    """``(label int[N], correct bool[N])`` of a training record's test predictions: the file
    its record names, in the folder it was read from (or the ``run_dir`` it names)."""
    named = (record.get("predictions") or {}).get("test")
    if not named:
        raise DataError("its record names no test predictions (a run from before they existed)")
    for folder in run_folders(record):
        path = Path(folder) / named["file"]
        if path.is_file():
            rows = predictions.read(path, named["sha256"])
            order = np.argsort(rows["index"], kind="stable")
            label = rows["label"][order]
            return label, rows["pred"][order] == label
    raise DataError(f"no {named['file']} in its run folder")


@dataclass
class BoardStats:
    """The statistics of one leaderboard (percent units throughout)."""

    protocol: str
    columns: tuple[str, ...]  # the tasks shown, then AVG5 and AVG6
    bootstrap: stats.Bootstrap | None
    cells: dict = field(default_factory=dict)  # (label, task) -> stats.CellScores
    averages: dict = field(default_factory=dict)  # (label, AVG5|AVG6) -> [(label, task)]
    missing: dict = field(default_factory=dict)  # (label, task) -> why it has no interval
    majority: dict = field(default_factory=dict)  # (label, task) -> majority rate
    ranks: dict = field(default_factory=dict)  # label -> (rank, low, high)
    tied_with_best: set = field(default_factory=set)  # (label, column)
    best: dict = field(default_factory=dict)  # column -> label of the best row
    not_above_chance: set = field(default_factory=set)  # (label, task)
    at_ceiling: set = field(default_factory=set)  # (label, column)
    pairs: list[dict] = field(default_factory=list)  # pairwise.csv lines
    reference: str | None = None
    csv_names: dict = field(default_factory=dict)  # AVG5/AVG6 -> leaderboard.csv's name
    seeds_needed: list[dict] = field(default_factory=list)
    resolve_points: float = 1.0

    def has(self, label: str, column: str) -> bool:
        key = (label, column)
        return self.bootstrap is not None and (key in self.cells or key in self.averages)

    def interval(self, label: str, column: str) -> tuple[float, float] | None:
        """The 95% interval (percent) of a cell or average, None without predictions."""
        if not self.has(label, column):
            return None
        low, high = self.bootstrap.interval((label, column))
        return 100 * low, 100 * high

    def n_seeds(self, label: str, column: str) -> int | None:
        if (label, column) in self.cells:
            return self.cells[(label, column)].n_seeds
        if (label, column) in self.averages:
            return min(self.cells[k].n_seeds for k in self.averages[(label, column)])
        return None

    def average_interval(self, label: str, tasks) -> tuple[float, float] | None:
        """The interval of the mean of ``label``'s cells on ``tasks``, from the same replicates
        (Figure 1's y on the tiny tasks every plotted model has)."""
        keys = [(label, t) for t in tasks]
        if self.bootstrap is None or not all(k in self.cells for k in keys):
            return None
        mean = np.mean([self.bootstrap.replicates[k] for k in keys], axis=0)
        low, high = stats.percentile_interval(mean, self.bootstrap.confidence)
        return 100 * low, 100 * high


def _cell_scores(board: Leaderboard, row: Row, task: str) -> stats.CellScores:
    cell = row.cells[task]
    labels, correct = [], []
    for record in cell.records:
        try:
            label, right = record_correct(record)
        except DataError as err:
            raise DataError(f"seed {record.get('seed')}: {err}") from None
        labels.append(label)
        correct.append(right)
    if any(len(x) != len(labels[0]) or not np.array_equal(x, labels[0]) for x in labels):
        raise DataError("its seeds' predictions are over different test examples")
    return stats.CellScores(task, np.stack(correct), tuple(cell.seeds)), labels[0]


def _seed(protocol: str) -> int:
    return zlib.crc32(f"lra-report {protocol}".encode())


def board_stats(
    board: Leaderboard,
    *,
    reference: str | None = None,
    resolve_points: float = 1.0,
    n_resamples: int = stats.BOOTSTRAP_RESAMPLES,
) -> BoardStats:
    """The statistics of ``board``; ``reference``: the row label every model is compared with
    (None: the Transformer's default row, when there is one)."""
    columns = (*board.shown, AVG5, AVG6)
    out = BoardStats(board.protocol, columns, None, resolve_points=resolve_points)
    out.csv_names = {AVG5: board.average_name, AVG6: board.six_average_name}
    test_labels: dict[str, np.ndarray] = {}
    for row in board.rows:
        for task in board.shown:
            if task not in row.cells:
                continue
            try:
                scores, labels = _cell_scores(board, row, task)
            except DataError as err:
                out.missing[(row.label, task)] = str(err)
                continue
            first = test_labels.setdefault(task, labels)
            if len(first) != len(labels) or not np.array_equal(first, labels):
                out.missing[(row.label, task)] = "its test examples are not the other models'"
                continue
            out.cells[(row.label, task)] = scores
            out.majority[(row.label, task)] = row.cells[task].records[0].get("test_majority_rate")
    for row in board.rows:
        for name, tasks in ((AVG5, board.tasks), (AVG6, board.shown)):
            keys = [(row.label, t) for t in tasks]
            if all(k in out.cells for k in keys):
                out.averages[(row.label, name)] = keys
    if not out.cells:
        return out
    out.bootstrap = stats.bootstrap_scores(
        out.cells, out.averages, n_resamples=n_resamples, seed=_seed(board.protocol)
    )
    _marks(out, board)
    out.reference = _reference(board, reference, out)
    out.pairs = pairwise(out, board)
    for column in columns:
        out.tied_with_best |= {
            (p["model_a"], column)
            for p in out.pairs
            if p["task"] == column and p["versus"] == "best" and p["p_holm"] >= ALPHA
        }
        if column in out.best:
            out.tied_with_best.add((out.best[column], column))
    ranked = [r.label for r in board.rows if (r.label, AVG5) in out.averages]
    named = {r: (r, AVG5) for r in ranked}
    out.ranks = {
        label: rank
        for label, rank in zip(
            ranked, out.bootstrap.rank_intervals([named[r] for r in ranked]).values(), strict=True
        )
    }
    out.seeds_needed = _seeds_needed(out, board, resolve_points)
    return out


def _marks(out: BoardStats, board: Leaderboard) -> None:
    for key, cell in out.cells.items():
        majority = out.majority.get(key)
        if majority is not None and stats.above_chance(cell, float(majority)) >= ALPHA:
            out.not_above_chance.add(key)
    for key in (*out.cells, *out.averages):
        if out.bootstrap.interval(key)[1] >= 1.0 - 1e-12:
            out.at_ceiling.add(key)
    for column in out.columns:
        present = [r.label for r in board.rows if out.has(r.label, column)]
        if present:
            out.best[column] = max(present, key=lambda lb: out.bootstrap.estimate[(lb, column)])


def _reference(board: Leaderboard, reference: str | None, out: BoardStats) -> str | None:
    if reference is not None:
        if board.row(reference) is None:
            labels = ", ".join(r.label for r in board.rows)
            raise DataError(
                f"reference={reference!r}: no such row in protocol {board.protocol} "
                f"(rows: {labels})"
            )
        return reference
    return BASELINE if board.row(BASELINE) is not None else None


def _cells_of(out: BoardStats, label: str, column: str) -> list[stats.CellScores]:
    if column in (AVG5, AVG6):
        return [out.cells[k] for k in out.averages[(label, column)]]
    return [out.cells[(label, column)]]


def pairwise(out: BoardStats, board: Leaderboard) -> list[dict]:
    """The lines of ``pairwise.csv`` for one board: per column, every model against the
    reference and against the best, Holm-adjusted within each (column, versus) table."""
    lines = []
    for column in out.columns:
        for versus, other in (("reference", out.reference), ("best", out.best.get(column))):
            if other is None or not out.has(other, column):
                continue
            family = []
            for row in board.rows:
                if row.label == other or not out.has(row.label, column):
                    continue
                a, b = (row.label, column), (other, column)
                diff, low, high = out.bootstrap.difference(a, b)
                family.append(
                    {
                        "protocol": board.protocol,
                        "task": column,
                        "model_a": row.label,
                        "model_b": other,
                        "versus": versus,
                        "diff": 100 * diff,
                        "ci_low": 100 * low,
                        "ci_high": 100 * high,
                        "p_value": out.bootstrap.p_value(a, b),
                        "prob_improvement": stats.probability_of_improvement(
                            _cells_of(out, row.label, column), _cells_of(out, other, column)
                        ),
                        "n_seeds_a": out.n_seeds(row.label, column),
                        "n_seeds_b": out.n_seeds(other, column),
                    }
                )
            for line, adjusted in zip(
                family, stats.holm([f["p_value"] for f in family]), strict=True
            ):
                line["p_holm"] = adjusted
            lines += family
    return lines


def _seeds_needed(out: BoardStats, board: Leaderboard, points: float) -> list[dict]:
    lines = []
    for task in board.shown:
        cells = [c for (_, t), c in out.cells.items() if t == task]
        if not cells:
            continue
        std, dof = stats.pooled_seed_std(cells)
        n = cells[0].n_examples
        mean = float(np.mean([c.score for c in cells]))
        lines.append(
            {
                "task": task,
                "cells": len(cells),
                "seed_std": None if std is None else 100 * std,
                "dof": dof,
                "test_examples": n,
                "test_se": 100 * float(np.sqrt(mean * (1 - mean) / n)),
                "seeds": None if std is None else stats.seeds_needed(std, points / 100),
            }
        )
    return lines
