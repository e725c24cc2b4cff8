"""The report's tuning table and equal-budget figure (lra.report.tuning) from hand-written
``*.study.json`` files as ``lra-tune`` writes them (lra.tune.summary); no training, no Optuna."""

import csv
import io
import json
import logging
import math
import subprocess
import sys

import pytest
from test_report import store, train

from lra.report import main as report
from lra.report import tuning

TUNING_FIGURE = {"tuning.png", "tuning.svg", "tuning.pdf"}
TUNING_FILES = {"tuning.md", "tuning.csv"} | TUNING_FIGURE


def trial(number, state, value=None, params=None, seconds=2.0):
    return {
        "number": number,
        "state": state,
        "value": value if state == "COMPLETE" else None,
        "params": params or {"trainer.learning_rate": 0.01 * (number + 1)},
        "run_dir": f"/runs/t{number}",
        "seconds": seconds,
        "error": "boom" if state == "FAIL" else None,
    }


def curve_of(trials):
    out, top = [], None
    for t in trials:
        if t["state"] == "COMPLETE" and (top is None or t["value"] > top):
            top = t["value"]
        out.append({"trial": t["number"], "state": t["state"], "value": t["value"], "best": top})
    return out


def study(name, model, task, trials, best, finals=(), n_trials=None, protocol="lra_official"):
    states = [t["state"] for t in trials]
    top = next((t for t in trials if t["number"] == best), None)
    return {
        "study": name,
        "storage": f"/results/tune/{name}.journal",
        "model": model,
        "task": task,
        "protocol": protocol,
        "settings": {
            "n_trials": n_trials or len(trials),
            "sampler": "tpe",
            "pruner": "median",
            "seed": 0,
            "search_hash": "86ca0f64b6",
        },
        "search": [{"key": "trainer.learning_rate", "kind": "factor", "low": 0.1, "high": 10.0}],
        "search_files": ["configs/search/lra_official.yaml"],
        "completed": states.count("COMPLETE"),
        "pruned": states.count("PRUNED"),
        "failed": states.count("FAIL"),
        "running": states.count("RUNNING"),
        "best": None
        if top is None
        else {"trial": top["number"], "value": top["value"], "params": top["params"]},
        "trials": trials,
        "curve": curve_of(trials),
        "finals": [
            {"seed": s, "run_key": f"k{s}", "val_accuracy": 0.5, "test_accuracy": acc}
            for s, acc in finals
        ],
    }


CHOSEN = {
    "trainer.learning_rate": 0.0123456789,
    "trainer.weight_decay": 0.1,
    "task.arch.dropout": 3.431244520346599e-05,
    "trainer.warmup_steps": 2,
}
STUDIES = {
    # four completed trials; two final seeds.
    "transformer-listops_tiny-lra_official-aaaaaaaaaa": study(
        "transformer-listops_tiny-lra_official-aaaaaaaaaa",
        "transformer",
        "listops_tiny",
        [
            trial(0, "COMPLETE", 0.30, seconds=1.5),
            trial(1, "COMPLETE", 0.45, seconds=2.5),
            trial(2, "COMPLETE", 0.40, seconds=3.0),
            trial(3, "COMPLETE", 0.50, params=CHOSEN, seconds=4.0),
        ],
        best=3,
        finals=[(0, 0.40), (1, 0.44)],
    ),
    # pruned and failed trials, no finals yet.
    "performer-listops_tiny-lra_official-bbbbbbbbbb": study(
        "performer-listops_tiny-lra_official-bbbbbbbbbb",
        "performer",
        "listops_tiny",
        [
            trial(0, "PRUNED"),
            trial(1, "COMPLETE", 0.35, params={"trainer.learning_rate": 0.002}),
            trial(2, "FAIL", seconds=None),
            trial(3, "COMPLETE", 0.30),
            trial(4, "PRUNED"),
        ],
        best=1,
        n_trials=6,
    ),
    # another task, one final seed.
    "cosformer-text_tiny-lra_official-cccccccccc": study(
        "cosformer-text_tiny-lra_official-cccccccccc",
        "cosformer",
        "text_tiny",
        [trial(0, "COMPLETE", 0.60), trial(1, "COMPLETE", 0.55)],
        best=0,
        finals=[(0, 0.58)],
    ),
}


def results(tmp_path, studies=STUDIES, tune="results/tune"):
    """``tmp_path/results``: training records in runs/, the studies in ``tune``."""
    store(
        tmp_path,
        [train(m, "listops_tiny", 0, 0.5) for m in ("transformer", "performer")],
        name="results/runs",
    )
    folder = tmp_path / tune
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in studies.items():
        (folder / f"{name}.study.json").write_text(json.dumps(data, indent=2) + "\n")
    return tmp_path / "results"


def rows_of(md):
    lines = [x for x in md.splitlines() if x.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return [
        dict(zip(head, (c.strip() for c in x.strip("|").split("|")), strict=True))
        for x in lines[1:]
    ]


def run(folder, out, **kwargs):
    return report.run_report(folder, out, tasks="tiny", curves=False, **kwargs)


# ---------------------------------------------------------------- the table


def test_report_writes_the_tuning_table_csv_and_figure(tmp_path):
    folder = results(tmp_path)
    out = tmp_path / "report"
    paths = run(folder, out)
    assert TUNING_FILES <= {p.name for p in paths}
    md = (out / "tuning.md").read_text()
    assert "validation split only" in md and "final runs alone" in md
    rows = rows_of(md)
    # sorted by (task, model, study)
    assert [(r["Task"], r["Model"]) for r in rows] == [
        ("listops_tiny", "performer"),
        ("listops_tiny", "transformer"),
        ("text_tiny", "cosformer"),
    ]
    performer, transformer, cosformer = rows
    assert transformer["Protocol"] == "lra_official"
    assert transformer["Study"] == "`transformer-listops_tiny-lra_official-aaaaaaaaaa`"
    assert transformer["Budget (n_trials)"] == "4"
    assert (transformer["Completed"], transformer["Pruned"], transformer["Failed"]) == (
        "4",
        "0",
        "0",
    )
    assert transformer["Best val acc (%)"] == "50.00" and transformer["Best trial"] == "3"
    assert transformer["Chosen values"] == (
        "trainer.learning_rate=0.01235, trainer.weight_decay=0.1, "
        "task.arch.dropout=3.431e-05, trainer.warmup_steps=2"
    )
    assert transformer["Trial seconds"] == "11.0"
    assert transformer["Final test acc (%)"] == "42.00" and transformer["Final seeds"] == "2"
    assert performer["Budget (n_trials)"] == "6"
    assert (performer["Completed"], performer["Pruned"], performer["Failed"]) == ("2", "2", "1")
    assert performer["Best val acc (%)"] == "35.00" and performer["Best trial"] == "1"
    assert performer["Chosen values"] == "trainer.learning_rate=0.002"
    assert performer["Trial seconds"] == "8.0"  # the failed trial has no duration
    assert performer["Final test acc (%)"] == "" and performer["Final seeds"] == ""
    assert cosformer["Final test acc (%)"] == "58.00" and cosformer["Final seeds"] == "1"

    table = list(csv.reader(io.StringIO((out / "tuning.csv").read_text())))
    assert tuple(table[0]) == tuning.COLUMNS
    assert table[0][:5] == ["protocol", "task", "model", "study", "n_trials"]
    assert len(table) == 1 + len(STUDIES)
    by_model = {r[2]: dict(zip(table[0], r, strict=True)) for r in table[1:]}
    assert float(by_model["transformer"]["best_val_accuracy"]) == pytest.approx(50.0)
    assert float(by_model["transformer"]["final_test_accuracy"]) == pytest.approx(42.0)
    assert by_model["performer"]["final_test_accuracy"] == ""
    assert by_model["performer"]["final_seeds"] == ""
    assert by_model["performer"]["pruned"] == "2" and by_model["performer"]["failed"] == "1"

    trace = json.loads((out / "sources.json").read_text())
    assert len(trace["tuning"]) == 3
    assert all(p.startswith("tune/") and p.endswith(".study.json") for p in trace["tuning"])


def test_tuning_files_are_reproducible(tmp_path):
    folder = results(tmp_path)
    run(folder, tmp_path / "a")
    run(folder, tmp_path / "b")
    for name in TUNING_FILES:
        first, second = (tmp_path / "a" / name).read_bytes(), (tmp_path / "b" / name).read_bytes()
        assert first and first == second, name


def test_studies_under_the_default_runs_folder_are_found_and_filters_apply(tmp_path):
    # lra-tune's results_dir is results/runs by default: its studies are in results/runs/tune.
    folder = results(tmp_path, tune="results/runs/tune")
    runs, bench = folder / "runs", folder / "bench"
    studies = tuning.load_studies([runs, bench, folder])  # nested folders: each file once
    assert [s["model"] for s in studies] == ["performer", "transformer", "cosformer"]
    assert [s["model"] for s in tuning.load_studies(runs, models=["cosformer"])] == ["cosformer"]
    assert tuning.load_studies(runs, protocols="transnormer") == []
    out = tmp_path / "o"
    paths = run([runs, bench], out, figure=False)  # figure=false: no tuning figure either
    names = {p.name for p in paths}
    assert {"tuning.md", "tuning.csv"} <= names and not names & TUNING_FIGURE
    assert not any((out / n).exists() for n in TUNING_FIGURE)
    paths = run([runs, bench], tmp_path / "o2", models=["transformer"])
    assert len(rows_of((tmp_path / "o2" / "tuning.md").read_text())) == 1


def test_no_study_files_write_nothing_new(tmp_path):
    folder = results(tmp_path, studies={})
    out = tmp_path / "report"
    paths = run(folder, out)
    assert not {p.name for p in paths} & TUNING_FILES
    assert not [p for p in out.iterdir() if p.name.startswith("tuning")]
    assert "tuning" not in json.loads((out / "sources.json").read_text())
    assert tuning.load_studies(tmp_path / "missing") == []


def test_a_broken_study_file_is_skipped_with_a_warning(tmp_path, caplog):
    folder = results(tmp_path)
    broken = folder / "tune" / "broken.study.json"
    broken.write_text('{"study": "torn", "trials": [')
    not_a_study = folder / "tune" / "other.study.json"
    not_a_study.write_text('{"name": "not a study"}\n')
    with caplog.at_level(logging.WARNING, logger="lra.report.tuning"):
        studies = tuning.load_studies(folder)
    assert len(studies) == len(STUDIES)
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert str(broken) in warned and str(not_a_study) in warned

    # Through the report: a study file that is valid JSON but no study (the report's record
    # loader already refuses any .json that is not JSON at all, before this step).
    broken.unlink()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lra.report.tuning"):
        run(folder, tmp_path / "report")
    assert str(not_a_study) in " ".join(r.getMessage() for r in caplog.records)
    assert len(rows_of((tmp_path / "report" / "tuning.md").read_text())) == len(STUDIES)


# ---------------------------------------------------------------- the figure


def running_max_of_completed(trials):
    out, top = [], None
    for t in sorted(trials, key=lambda t: t["number"]):
        if t["state"] == "COMPLETE":
            top = 100.0 * t["value"] if top is None else max(top, 100.0 * t["value"])
        out.append(top)
    return out


@pytest.mark.parametrize("name", list(STUDIES))
def test_plotted_series_is_the_running_max_of_the_completed_values(name):
    data = STUDIES[name]
    xs, ys = tuning.equal_budget_series(data)
    assert xs == list(range(1, len(data["trials"]) + 1))  # pruned and failed trials are spent
    expected = running_max_of_completed(data["trials"])
    assert [y is None for y in ys] == [e is None for e in expected]
    assert [y for y in ys if y is not None] == pytest.approx([e for e in expected if e is not None])


def test_series_ignores_a_stored_best_and_falls_back_to_the_trials():
    data = STUDIES["performer-listops_tiny-lra_official-bbbbbbbbbb"]
    assert tuning.equal_budget_series(data) == ([1, 2, 3, 4, 5], [None, 35.0, 35.0, 35.0, 35.0])
    wrong = {**data, "curve": [{**p, "best": 0.99} for p in data["curve"]]}
    assert tuning.equal_budget_series(wrong) == tuning.equal_budget_series(data)
    shuffled = {**data, "curve": list(reversed(data["curve"]))}
    assert tuning.equal_budget_series(shuffled) == tuning.equal_budget_series(data)
    assert tuning.equal_budget_series({**data, "curve": []}) == tuning.equal_budget_series(data)


def test_drawn_lines_are_the_series_one_panel_per_task():
    studies = sorted(STUDIES.values(), key=lambda s: (s["task"], s["model"]))
    fig = tuning.draw_tuning(studies)
    assert [ax.get_title() for ax in fig.axes] == ["listops_tiny", "text_tiny"]
    lines = {line.get_gid(): line for ax in fig.axes for line in ax.get_lines()}
    assert set(lines) == set(STUDIES)
    for name, data in STUDIES.items():
        xs, ys = tuning.equal_budget_series(data)
        assert list(lines[name].get_xdata()) == xs
        drawn = list(lines[name].get_ydata())
        assert [math.isnan(d) for d in drawn] == [y is None for y in ys]
        assert [d for d in drawn if not math.isnan(d)] == [y for y in ys if y is not None]
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["performer", "transformer"]


def test_importing_the_module_imports_neither_jax_nor_optuna():
    code = (
        "import sys, lra.report.tuning\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'jaxlib', 'optuna'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]"
