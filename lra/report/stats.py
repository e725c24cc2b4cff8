"""Statistics of test accuracies: intervals, paired tests, rank intervals, seeds needed.

Plain NumPy and :mod:`scipy.stats` over per-example predictions, never JAX; every resampling
is seeded, so the same predictions give the same numbers, byte for byte.

Two sources of variance (Bouthillier et al., "Accounting for Variance in Machine Learning
Benchmarks", MLSys 2021): the training seed, and the finite test set. A cell of the
leaderboard is one model on one task: ``correct: bool[S, N]``, whether seed ``s``'s selected
model classified test example ``n`` right (the same N examples, in the same order, for every
model on that task). Its score is the mean over seeds of each seed's accuracy.

- :func:`bootstrap_scores`: one stratified bootstrap (Agarwal et al., "Deep Reinforcement
  Learning at the Edge of the Statistical Precipice", NeurIPS 2021) over every cell at once,
  through :func:`scipy.stats.bootstrap` with independent samples: per task the test examples
  (one draw shared by every model on that task, so differences are paired on examples), and
  per task and list of seeds the seed indices (one draw shared by the cells of that task run
  with the same seeds, so differences are paired on seeds too; a cell of one seed keeps its
  seed). Percentile intervals of each cell,
  of each average (cells resampled per task, then averaged), of differences and of ranks all
  come from the same replicates.
- :meth:`Bootstrap.p_value`: the two-sided p-value of a difference between two cells or
  averages, from the same paired replicates: twice the smaller tail of the replicated
  difference beyond 0 (the test that inverts the percentile interval: p < 0.05 exactly when
  the 95% interval of the difference leaves out 0, up to the replicates' granularity).
- :func:`holm`: Holm's step-down adjustment of a table's p-values.
- :func:`probability_of_improvement`: ``P(X > Y) + P(X = Y)/2`` for a run of each model,
  per task (the Mann-Whitney U statistic over ``m * n``), averaged over tasks, as rliable
  defines it.
- :func:`above_chance`: a binomial test of a cell's correct count against the majority rate.
- :func:`seeds_needed`: the seeds per model a two-sided comparison needs to resolve a
  difference at the observed seed variance.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
_BATCH = 100  # replicates computed at once: bounds the memory of a 25k-example test set


@dataclass(frozen=True)
class CellScores:
    """One model on one task: ``correct: bool[S, N]`` over seeds and test examples."""

    task: str
    correct: np.ndarray
    seeds: tuple = ()  # the seeds of the rows of correct; () = 0, 1, ...

    def __post_init__(self):
        correct = np.asarray(self.correct, dtype=bool)
        if correct.ndim != 2 or 0 in correct.shape:
            raise ValueError(f"correct must be bool[seeds, examples], not {correct.shape}")
        seeds = tuple(self.seeds) or tuple(range(correct.shape[0]))
        if len(seeds) != correct.shape[0]:
            raise ValueError(f"{len(seeds)} seeds for {correct.shape[0]} rows of correct")
        object.__setattr__(self, "correct", correct)
        object.__setattr__(self, "seeds", seeds)

    @property
    def n_seeds(self) -> int:
        return self.correct.shape[0]

    @property
    def n_examples(self) -> int:
        return self.correct.shape[1]

    @property
    def seed_accuracies(self) -> np.ndarray:
        return self.correct.mean(axis=1)

    @property
    def score(self) -> float:
        """Mean over seeds of each seed's accuracy."""
        return float(self.seed_accuracies.mean())

    @property
    def per_example(self) -> np.ndarray:
        """``float[N]``: each example's fraction of seeds right."""
        return self.correct.mean(axis=0)


@dataclass
class Bootstrap:
    """The replicates of :func:`bootstrap_scores`: ``replicates[name]`` is ``float[R]`` for
    every cell key and average name, ``estimate[name]`` the score of the data itself."""

    estimate: dict
    replicates: dict
    confidence: float

    def interval(self, name) -> tuple[float, float]:
        """The percentile interval of ``name``'s replicates."""
        return percentile_interval(self.replicates[name], self.confidence)

    def difference(self, a, b) -> tuple[float, float, float]:
        """``(estimate, low, high)`` of ``a - b`` from the same replicates (paired on the
        test examples of each task)."""
        low, high = percentile_interval(self.replicates[a] - self.replicates[b], self.confidence)
        return self.estimate[a] - self.estimate[b], low, high

    def p_value(self, a, b) -> float:
        """Two-sided p-value of ``a - b = 0``: ``2 (k + 1) / (R + 1)``, capped at 1, where ``k``
        of the ``R`` replicated differences lie on the far side of 0 (or on it). Identical
        predictions (same seeds) give 1."""
        diff = self.replicates[a] - self.replicates[b]
        tail = min(np.count_nonzero(diff <= 0), np.count_nonzero(diff >= 0))
        return float(min(1.0, 2 * (tail + 1) / (diff.size + 1)))

    def rank_intervals(self, names: Sequence) -> dict:
        """``{name: (rank, low, high)}``: rank 1 = the highest score, ties sharing the best
        rank, of the data and as the replicates' percentile interval."""
        if not names:
            return {}
        table = np.stack([self.replicates[n] for n in names])  # [M, R]
        ranks = stats.rankdata(-table, method="min", axis=0)
        point = stats.rankdata([-self.estimate[n] for n in names], method="min")
        alpha = 100 * (1 - self.confidence) / 2
        lows = np.percentile(ranks, alpha, axis=1, method="lower")
        highs = np.percentile(ranks, 100 - alpha, axis=1, method="higher")
        return {n: (int(point[i]), int(lows[i]), int(highs[i])) for i, n in enumerate(names)}


def percentile_interval(values: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    alpha = 100 * (1 - confidence) / 2
    low, high = np.percentile(values, [alpha, 100 - alpha])
    return float(low), float(high)


def _multiplicities(indices: np.ndarray, n: int) -> np.ndarray:
    """``float[B, n]``: how often each of ``n`` items occurs in each row of ``indices[B, n]``."""
    rows = indices.shape[0]
    flat = (indices + n * np.arange(rows)[:, None]).ravel()
    return np.bincount(flat, minlength=rows * n).reshape(rows, n).astype(np.float64)


def bootstrap_scores(
    cells: Mapping[Hashable, CellScores],
    averages: Mapping[Hashable, Sequence[Hashable]] | None = None,
    *,
    n_resamples: int = BOOTSTRAP_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> Bootstrap:
    """The stratified bootstrap of every cell's score, and of each average (``averages``:
    name -> the cell keys it averages, equally weighted), in one :func:`scipy.stats.bootstrap`.

    The samples resampled, independently: per task, the indices of its test examples (every
    cell of a task must have as many); per task and list of two or more seeds, the indices of
    those seeds. A replicate's cell score is the mean, over the drawn seeds, of each seed's accuracy
    on the drawn examples.
    """
    averages = dict(averages or {})
    keys = list(cells)
    tasks = sorted({c.task for c in cells.values()})
    sizes = {}
    for key in keys:
        cell = cells[key]
        if sizes.setdefault(cell.task, cell.n_examples) != cell.n_examples:
            raise ValueError(
                f"{key}: {cell.n_examples} test examples on {cell.task}, another cell there "
                f"has {sizes[cell.task]}: the cells of a task must share one test set"
            )
    # One seed draw per task and list of seeds: cells run with the same seeds share it.
    draws = sorted(
        {(cells[k].task, cells[k].seeds) for k in keys if cells[k].n_seeds > 1}, key=repr
    )
    data = [np.arange(sizes[t]) for t in tasks] + [np.arange(len(seeds)) for _, seeds in draws]
    floats = {k: cells[k].correct.T.astype(np.float64) for k in keys}  # [N, S]

    def scores_of(*samples):
        flat = samples[0].ndim == 1
        samples = [np.atleast_2d(s) for s in samples]
        weights = {t: _multiplicities(samples[i], sizes[t]) / sizes[t] for i, t in enumerate(tasks)}
        drawn = dict(zip(draws, samples[len(tasks) :], strict=True))
        out = {}
        for key in keys:
            per_seed = weights[cells[key].task] @ floats[key]  # [B, S]
            if cells[key].n_seeds > 1:
                draw = drawn[(cells[key].task, cells[key].seeds)]
                per_seed = np.take_along_axis(per_seed, draw, axis=1)
            out[key] = per_seed.mean(axis=1)
        for name, members in averages.items():
            out[name] = np.mean([out[m] for m in members], axis=0)
        table = np.stack([out[k] for k in (*keys, *averages)])
        return table[:, 0] if flat else table

    def statistic(*samples, axis=-1):
        return scores_of(*samples)

    result = stats.bootstrap(
        data,
        statistic,
        n_resamples=n_resamples,
        batch=_BATCH,
        vectorized=True,
        paired=False,
        confidence_level=confidence,
        method="percentile",
        random_state=np.random.default_rng(seed),
    )
    names = [*keys, *averages]
    point = scores_of(*data)
    replicates = np.atleast_2d(result.bootstrap_distribution)
    return Bootstrap(
        estimate={n: float(point[i]) for i, n in enumerate(names)},
        replicates={n: replicates[i] for i, n in enumerate(names)},
        confidence=confidence,
    )


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment (Holm 1979): the i-th smallest of m p-values times
    ``m - i + 1`` (i from 1), made non-decreasing in that order, capped at 1."""
    p = np.asarray(p_values, dtype=float)
    if p.size == 0:
        return []
    order = np.argsort(p, kind="stable")
    scaled = (p.size - np.arange(p.size)) * p[order]
    adjusted = np.empty_like(p)
    adjusted[order] = np.minimum(1.0, np.maximum.accumulate(scaled))
    return adjusted.tolist()


def probability_of_improvement(a: Sequence[CellScores], b: Sequence[CellScores]) -> float:
    """rliable's P(X > Y): per task the probability that a run of ``a`` scores above a run of
    ``b`` (ties count half: the Mann-Whitney U over ``m * n``), averaged over tasks."""
    per_task = []
    for x, y in zip(a, b, strict=True):
        sx, sy = x.seed_accuracies, y.seed_accuracies
        u = stats.mannwhitneyu(sx, sy, alternative="two-sided", method="asymptotic").statistic
        per_task.append(float(u) / (len(sx) * len(sy)))
    return float(np.mean(per_task))


def above_chance(cell: CellScores, majority_rate: float) -> float:
    """One-sided p-value that the cell beats always predicting the majority class: a binomial
    test of its seed-mean correct count (rounded) out of its test examples."""
    k = int(round(cell.score * cell.n_examples))
    return float(stats.binomtest(k, cell.n_examples, majority_rate, alternative="greater").pvalue)


def pooled_seed_std(cells: Sequence[CellScores]) -> tuple[float | None, int]:
    """The seed standard deviation of accuracy pooled over ``cells`` (each cell's sample
    variance weighted by its degrees of freedom) and those degrees of freedom."""
    dof = sum(c.n_seeds - 1 for c in cells)
    if dof == 0:
        return None, 0
    total = sum(
        (c.n_seeds - 1) * float(np.var(c.seed_accuracies, ddof=1)) for c in cells if c.n_seeds > 1
    )
    return math.sqrt(total / dof), dof


def seeds_needed(
    seed_std: float, difference: float, *, alpha: float = 0.05, power: float = 0.8
) -> int:
    """Seeds per model for a two-sided two-sample comparison at level ``alpha`` to detect
    ``difference`` with ``power``, at a seed standard deviation of ``seed_std`` (same units):
    ``ceil(2 (z_{1-alpha/2} + z_power)^2 std^2 / difference^2)``, at least 2."""
    if difference <= 0:
        raise ValueError(f"difference must be positive, not {difference}")
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)
    return max(2, math.ceil(2 * (z * seed_std / difference) ** 2))
