"""lra.report.stats against plain references: the normal-approximation interval of a
binomial proportion, hand-computed Holm, the two-sample sample-size formula; paired tests on
identical and on clearly different predictions. Plain NumPy, no training."""

import math
import subprocess
import sys

import numpy as np
import pytest

from lra.report import stats


def _cell(rng, rate, seeds=1, examples=1000, task="t"):
    return stats.CellScores(task=task, correct=rng.random((seeds, examples)) < rate)


def test_one_seed_interval_matches_the_binomial_normal_approximation():
    rng = np.random.default_rng(0)
    cell = _cell(rng, 0.7)
    boot = stats.bootstrap_scores({"a": cell}, n_resamples=4000, seed=1)
    p, n = cell.score, cell.n_examples
    half = 1.959964 * math.sqrt(p * (1 - p) / n)
    low, high = boot.interval("a")
    assert boot.estimate["a"] == pytest.approx(p)
    assert low == pytest.approx(p - half, abs=0.006)
    assert high == pytest.approx(p + half, abs=0.006)


def test_seed_resampling_widens_the_interval_of_a_noisy_model():
    """Five seeds whose accuracies spread by 20 points: the interval must cover the seed
    spread (resampled seeds), not only the test-sample error of the pooled examples."""
    rng = np.random.default_rng(0)
    rates = [0.5, 0.55, 0.6, 0.65, 0.7]
    correct = np.stack([rng.random(2000) < r for r in rates])
    boot = stats.bootstrap_scores({"a": stats.CellScores("t", correct)}, seed=2)
    low, high = boot.interval("a")
    pooled_half = 1.96 * math.sqrt(0.6 * 0.4 / (5 * 2000))
    seed_half = 1.96 * np.std(correct.mean(axis=1), ddof=1) / math.sqrt(5)
    assert high - low > 2 * pooled_half * 3
    assert high - low == pytest.approx(2 * seed_half, rel=0.35)


def test_identical_predictions_differ_by_zero_with_p_one():
    rng = np.random.default_rng(3)
    correct = rng.random((3, 500)) < 0.6
    cells = {"a": stats.CellScores("t", correct), "b": stats.CellScores("t", correct.copy())}
    boot = stats.bootstrap_scores(cells, seed=0)
    assert boot.difference("a", "b") == (0.0, 0.0, 0.0)
    assert boot.p_value("a", "b") == 1.0


def test_a_ten_point_difference_over_five_seeds_survives_holm():
    rng = np.random.default_rng(4)
    cells = {
        "good": _cell(rng, 0.70, seeds=5),
        "bad": _cell(rng, 0.60, seeds=5),
        "bad2": _cell(rng, 0.60, seeds=5),
    }
    boot = stats.bootstrap_scores(cells, seed=0)
    diff, low, high = boot.difference("good", "bad")
    assert diff == pytest.approx(0.10, abs=0.02)
    assert low > 0
    raw = [boot.p_value("good", "bad"), boot.p_value("good", "bad2"), boot.p_value("bad", "bad2")]
    adjusted = stats.holm(raw)
    assert adjusted[0] < 0.05 and adjusted[1] < 0.05
    assert adjusted[2] > 0.05  # two draws of the same rate
    ranks = boot.rank_intervals(list(cells))
    assert ranks["good"] == (1, 1, 1)
    assert ranks["bad"][1:] == (2, 3)


def test_averages_are_resampled_per_task_then_averaged():
    rng = np.random.default_rng(5)
    cells = {("a", "x"): _cell(rng, 0.9, task="x"), ("a", "y"): _cell(rng, 0.5, task="y")}
    boot = stats.bootstrap_scores(cells, {"avg": [("a", "x"), ("a", "y")]}, seed=0)
    assert boot.estimate["avg"] == pytest.approx(
        (cells[("a", "x")].score + cells[("a", "y")].score) / 2
    )
    mean = (boot.replicates[("a", "x")] + boot.replicates[("a", "y")]) / 2
    np.testing.assert_allclose(boot.replicates["avg"], mean)
    low, high = boot.interval("avg")
    # two independent tasks: the average's interval is narrower than the noisier task's
    y_low, y_high = boot.interval(("a", "y"))
    assert high - low < y_high - y_low


def test_cells_of_one_task_must_share_its_test_set():
    rng = np.random.default_rng(6)
    cells = {"a": _cell(rng, 0.5, examples=100), "b": _cell(rng, 0.5, examples=99)}
    with pytest.raises(ValueError, match="must share one test set"):
        stats.bootstrap_scores(cells)


def test_holm_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> monotone
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert stats.holm([]) == []


def test_probability_of_improvement():
    rng = np.random.default_rng(7)
    high, low = _cell(rng, 0.9, seeds=3), _cell(rng, 0.3, seeds=3)
    assert stats.probability_of_improvement([high], [low]) == 1.0
    assert stats.probability_of_improvement([low], [high]) == 0.0
    assert stats.probability_of_improvement([high], [high]) == 0.5
    assert stats.probability_of_improvement([high, low], [low, high]) == 0.5


def test_above_chance_is_a_binomial_test_against_the_majority_rate():
    chance = stats.CellScores("t", np.arange(1000)[None] % 2 == 0)  # 50.0%
    solved = stats.CellScores("t", np.arange(1000)[None] % 10 < 7)  # 70.0%
    assert stats.above_chance(chance, 0.5) > 0.4
    assert stats.above_chance(solved, 0.5) < 1e-6


def test_seeds_needed_follows_the_two_sample_formula():
    # 2 (1.95996 + 0.84162)^2 = 15.70 -> 16 seeds to resolve one std at 80% power
    assert stats.seeds_needed(1.0, 1.0) == 16
    assert stats.seeds_needed(0.5, 1.0) == 4
    assert stats.seeds_needed(0.01, 1.0) == 2
    with pytest.raises(ValueError, match="positive"):
        stats.seeds_needed(1.0, 0.0)


def test_pooled_seed_std():
    a = stats.CellScores("t", np.array([[1, 1, 0, 0], [1, 1, 1, 0]], dtype=bool))
    one = stats.CellScores("t", np.ones((1, 4), dtype=bool))
    std, dof = stats.pooled_seed_std([a, one])
    assert dof == 1
    assert std == pytest.approx(np.std([0.5, 0.75], ddof=1))
    assert stats.pooled_seed_std([one]) == (None, 0)


def test_the_report_statistics_do_not_import_jax():
    code = (
        "import sys; import lra.report.stats, lra.report.uncertainty, lra.report.stats_tables; "
        "print('jax' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
