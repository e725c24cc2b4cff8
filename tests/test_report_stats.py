"""The report's statistics end to end: run folders with per-example predictions in,
leaderboard.{md,csv} and pairwise.csv out (intervals, ranks, marks, Holm families).

The pure statistics are tested in test_stats.py; here the predictions are built so that each
outcome is known: the Transformer and Performer score 90% and 89% (indistinguishable),
cosFormer 50% on balanced binary labels (chance, far below), Linformer 100% on ListOps (the
ceiling, and the ListOps best) and 70% elsewhere, one seed.
"""

import csv
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from lra.record import predictions
from lra.report import main as report
from lra.report import stats
from lra.report.load import OFFICIAL_TASKS

EXAMPLES = 400
TASKS = (*OFFICIAL_TASKS, "pathx")
MODELS = {  # model -> (seeds, accuracy per task)
    "transformer": ((0, 1, 2), dict.fromkeys(TASKS, 0.90)),
    "performer": ((0, 1, 2), dict.fromkeys(TASKS, 0.89)),
    "cosformer": ((0, 1), dict.fromkeys(TASKS, 0.50)),
    "linformer": ((0,), {**dict.fromkeys(TASKS, 0.70), "listops": 1.0}),
}


def write_run(results: Path, model: str, task: str, seed: int, acc: float) -> None:
    folder = results / f"{model}-{task}-s{seed}"
    rng = np.random.default_rng(hash((model, task, seed)) % 2**32)
    label = np.arange(EXAMPLES) % 2  # balanced: majority rate 0.5
    correct = np.zeros(EXAMPLES, bool)
    correct[rng.permutation(EXAMPLES)[: round(acc * EXAMPLES)]] = True
    pred = np.where(correct, label, 1 - label)
    logits = np.eye(2, dtype=np.float16)[pred]
    named = predictions.write(
        folder / predictions.relative_path("test"),
        {"index": np.arange(EXAMPLES), "label": label, "pred": pred, "logits": logits},
    )
    record = {
        "schema_version": 1,
        "kind": "train",
        "model": model,
        "task": task,
        "seed": seed,
        "test_accuracy": named["accuracy"],
        "val_accuracy": named["accuracy"],
        "test_majority_rate": 0.5,
        "selection": "best_val",
        "code_version": "v1",
        "config_hash": f"{model}-{task}",
        "device": "cpu",
        "started_at": "2026-01-01T00:00:00+00:00",
        "run_dir": str(folder),
        "predictions": {"test": {**named, "file": predictions.relative_path("test")}},
    }
    (folder / "record.json").write_text(json.dumps(record))


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    results = tmp_path_factory.mktemp("runs")
    for model, (seeds, accs) in MODELS.items():
        for task in TASKS:
            for seed in seeds:
                write_run(results, model, task, seed, accs[task])
    out = tmp_path_factory.mktemp("report")
    report.run_report(results, out, figure=False, curves=False, show_published=False)
    board = {
        r["model"]: r for r in csv.DictReader(io.StringIO((out / "leaderboard.csv").read_text()))
    }
    pairs = list(csv.DictReader(io.StringIO((out / "pairwise.csv").read_text())))
    return results, out, board, pairs


def cell(md: str, model: str) -> list[str]:
    line = next(x for x in md.splitlines() if x.startswith(f"| {model} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_every_cell_has_its_seeds_and_an_interval_around_its_mean(reported):
    _, _, board, _ = reported
    for model, (seeds, accs) in MODELS.items():
        row = board[model]
        for task in OFFICIAL_TASKS:
            low, high = float(row[f"{task}_ci_low"]), float(row[f"{task}_ci_high"])
            assert int(row[f"{task}_n_seeds"]) == len(seeds)
            assert low <= 100 * accs[task] <= high, (model, task)
            if accs[task] < 1:  # one seed still gets the test-sample interval
                assert high - low > 2
    one_seed = board["linformer"]  # 70% of 400: binomial SE 2.3 points, 95% about +-4.5
    width = float(one_seed["text_ci_high"]) - float(one_seed["text_ci_low"])
    assert width == pytest.approx(2 * 1.96 * 100 * np.sqrt(0.7 * 0.3 / EXAMPLES), rel=0.2)
    assert (
        float(board["transformer"]["lra_average_ci_low"])
        < 90
        < float(board["transformer"]["lra_average_ci_high"])
    )


def test_ranks_come_with_intervals(reported):
    _, out, board, _ = reported
    ranks = {m: (board[m]["rank"], board[m]["rank_low"], board[m]["rank_high"]) for m in MODELS}
    assert ranks["transformer"][0] == "1" and ranks["performer"][0] == "2"
    assert ranks["transformer"][1:] == ranks["performer"][1:] == ("1", "2")
    assert ranks["linformer"] == ("3", "3", "3") and ranks["cosformer"] == ("4", "4", "4")
    md = (out / "leaderboard.md").read_text()
    assert "Rank (95%)" in md and cell(md, "transformer")[1] == "1 (1-2)"
    assert cell(md, "cosformer")[1] == "4 (4)"


def test_marks_best_chance_and_ceiling(reported):
    _, out, _, _ = reported
    md = (out / "leaderboard.md").read_text()
    performer, cosformer, linformer = (cell(md, m) for m in ("performer", "cosformer", "linformer"))
    head = cell(md, "Model")
    text, listops = head.index("text"), head.index("listops")
    assert performer[text].endswith("*") and "~" not in performer[text]  # tied with the best
    assert cosformer[text].endswith("~") and "*" not in cosformer[text]  # chance, not tied
    assert linformer[listops].endswith("*^")  # the ListOps best, at 100%
    assert cell(md, "transformer")[listops].endswith("(n=3)")  # far below 100: no mark
    assert "(n=1)" in linformer[text] and "[" in linformer[text]
    assert "95% interval" in md and "Holm" in md


def test_pairwise_has_each_pair_once_with_holm_per_family(reported):
    _, _, _, pairs = reported
    keys = [(p["protocol"], p["task"], p["model_a"], p["model_b"]) for p in pairs]
    assert len(keys) == len(set(keys))
    avg = {p["model_a"]: p for p in pairs if p["task"] == "lra_average"}
    # the average's best is the reference: one family, written once
    assert set(avg) == {"performer", "cosformer", "linformer"}
    assert {p["versus"] for p in avg.values()} == {"reference+best"}
    assert float(avg["cosformer"]["diff"]) == pytest.approx(-40, abs=0.5)
    assert float(avg["cosformer"]["ci_high"]) < 0 and float(avg["cosformer"]["p_holm"]) < 0.05
    assert float(avg["cosformer"]["prob_improvement"]) == 0
    assert float(avg["performer"]["p_holm"]) >= 0.05
    assert avg["performer"]["n_seeds_a"] == "3" and avg["linformer"]["n_seeds_a"] == "1"
    listops = [p for p in pairs if p["task"] == "listops"]
    assert {(p["versus"], p["model_b"]) for p in listops} == {
        ("reference", "transformer"),
        ("best", "linformer"),
    }
    for versus in ("reference", "best"):
        family = [p for p in listops if p["versus"] == versus]
        assert len(family) == 3
        raw = [float(p["p_value"]) for p in family]
        assert [float(p["p_holm"]) for p in family] == pytest.approx(
            stats.holm(raw), abs=1e-5
        )  # CSV: 6 decimals


def test_a_changed_predictions_file_loses_its_interval_and_says_why(reported, tmp_path):
    results, _, _, _ = reported
    copy = tmp_path / "runs"

    shutil.copytree(results, copy)
    for folder in copy.iterdir():  # the copies' records still name the original run_dir
        record = json.loads((folder / "record.json").read_text())
        record["run_dir"] = str(folder)
        (folder / "record.json").write_text(json.dumps(record))
    changed = copy / "cosformer-text-s1" / "predictions" / "test.npz"
    changed.write_bytes(changed.read_bytes() + b"\0")
    out = tmp_path / "report"
    report.run_report(copy, out, figure=False, curves=False, show_published=False)
    md = (out / "leaderboard.md").read_text()
    text = cell(md, "Model").index("text")
    assert "[" not in cell(md, "cosformer")[text] and "±" in cell(md, "cosformer")[text]
    assert "cosformer on text: seed 1:" in md and "changed after the run" in md
    board = {
        r["model"]: r for r in csv.DictReader(io.StringIO((out / "leaderboard.csv").read_text()))
    }
    assert (
        board["cosformer"]["text_ci_low"] == "" and board["cosformer"]["lra_average_ci_low"] == ""
    )
    assert board["transformer"]["text_ci_low"] != ""
