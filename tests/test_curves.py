"""Learning curves (lra.report.curves) from fake records and hand-written metrics.jsonl files."""

import json
import xml.etree.ElementTree as ET

import pytest
from test_report import store, train

from lra.report import curves
from lra.report import main as report
from lra.report.leaderboard import leaderboard
from lra.track.jsonl import METRICS_FILE

TASK = "listops_tiny"
# model -> seed -> {step: val accuracy (fraction)}; seed 1 of performer lacks step 30.
VAL = {
    "transformer": {0: {10: 0.30, 20: 0.50, 30: 0.60}, 1: {10: 0.40, 20: 0.60, 30: 0.70}},
    "performer": {0: {10: 0.20, 20: 0.30, 30: 0.40}, 1: {10: 0.25, 20: 0.35}},
}


def write_metrics(folder, val, torn=False):
    """A metrics.jsonl as training writes it: train lines, val lines (some merged), summary."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, (step, acc) in enumerate(sorted(val.items())):
        train_line = {"step": step, "time": "t", "train/loss": 1.0, "train/accuracy": 0.5}
        val_line = {"val/accuracy": acc, "val/loss": 1.0}
        if i % 2:  # the same step as one object
            lines.append({**train_line, **val_line})
        else:  # or as two
            lines += [train_line, {"step": step, "time": "t", **val_line}]
    lines.append({"time": "t", "summary": {"test_accuracy": 0.5}})
    text = "".join(json.dumps(line) + "\n" for line in lines)
    if torn:
        text += '{"step": 40, "time": "t", "val/accur'
    (folder / METRICS_FILE).write_text(text)


@pytest.fixture
def runs(tmp_path):
    """Two models x two seeds on one tiny task, each record's run_dir holding its metrics."""
    records = []
    for model, seeds in VAL.items():
        for seed, val in seeds.items():
            run_dir = tmp_path / "run_dirs" / f"{model}-s{seed}"
            write_metrics(run_dir, val, torn=(model == "transformer" and seed == 1))
            records.append({**train(model, TASK, seed, 0.5), "run_dir": str(run_dir)})
    return store(tmp_path, records)


def test_learning_curves_are_the_mean_of_the_seeds_at_shared_steps(runs):
    _, records = runs
    found = curves.learning_curves(leaderboard(records, "tiny"))
    series = found.series[TASK]
    steps, acc, n = series["transformer"]
    assert (steps, n) == ([10, 20, 30], 2)
    assert acc == pytest.approx([35.0, 55.0, 65.0])  # torn line (step 40) dropped
    steps, acc, n = series["performer"]
    assert (steps, n) == ([10, 20], 2)  # step 30: only seed 0 has it
    assert acc == pytest.approx([22.5, 32.5])
    assert found.skipped == [] and found.notes() == []


def test_val_accuracy_merges_lines_of_a_step():
    lines = [
        {"step": 5, "train/loss": 1.0},
        {"step": 5, "val/accuracy": 0.5},
        {"step": 7, "train/loss": 1.0, "val/accuracy": 0.25},
        {"step": 9, "train/loss": 1.0},
        {"summary": {"val_accuracy": 0.9}},
    ]
    assert curves.val_accuracy(lines) == {5: 50.0, 7: 25.0}
    assert curves.mean_curve([{1: 10.0, 2: 20.0}, {2: 40.0}]) == ([2], [30.0], 2)


def test_run_report_draws_curves_with_sources(runs, tmp_path, capsys):
    folder, records = runs
    out = tmp_path / "report"
    paths = report.run_report(folder, out, tasks="tiny", figure=False)
    png, svg = out / "curves.png", out / "curves.svg"
    assert png in paths and svg in paths
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
    texts = " ".join(el.text or "" for el in ET.parse(svg).getroot().iter())
    assert TASK in texts and "transformer (mean of 2 seeds)" in texts
    assert "Validation accuracy (%)" in texts and "Training step" in texts
    trace = json.loads((out / "sources.json").read_text())["curves"]
    cell = trace["tasks"][TASK]["performer"]
    assert cell["seeds"] == [0, 1] and cell["n"] == 2
    assert {f.split("/")[-2] for f in cell["metrics_files"]} == {"performer-s0", "performer-s1"}
    assert set(cell["records"]) <= {r["path"].split("/")[-1] for r in records}
    assert trace["drawn"] and trace["skipped"] == []
    assert "curves:" not in capsys.readouterr().out


def test_missing_metrics_is_skipped_and_reported(tmp_path, capsys):
    ok = tmp_path / "ok"
    write_metrics(ok, {10: 0.5, 20: 0.75})
    folder, records = store(
        tmp_path,
        [
            {**train("transformer", TASK, 0, 0.5), "run_dir": str(ok)},
            {**train("transformer", TASK, 1, 0.5), "run_dir": str(tmp_path / "gone")},
            train("performer", TASK, 0, 0.5),  # an older record: no run_dir
        ],
    )
    found = curves.learning_curves(leaderboard(records, "tiny"))
    assert found.series == {TASK: {"transformer": ([10, 20], [50.0, 75.0], 1)}}
    assert [why for _, why in found.skipped] == [
        "no run_dir in the record",
        f"run folder {tmp_path / 'gone'} not found",
    ]
    out = tmp_path / "report"
    paths = report.run_report(folder, out, tasks="tiny", figure=False)
    assert out / "curves.png" in paths
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("curves:")]
    assert len(notes) == 2 and "no run_dir" in notes[0] and "not found" in notes[1]
    skipped = json.loads((out / "sources.json").read_text())["curves"]["skipped"]
    assert len(skipped) == 2


def test_no_metrics_at_all_draws_nothing_and_says_so_once(tmp_path, capsys):
    folder, _ = store(tmp_path, [train(m, TASK, 0, 0.5) for m in ("transformer", "performer")])
    paths = report.run_report(folder, tmp_path / "report", tasks="tiny", figure=False)
    assert not [p for p in paths if p.name.startswith("curves.")]
    assert not (tmp_path / "report" / "curves.png").exists()
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("curves:")]
    assert len(notes) == 1 and "no learning curves drawn" in notes[0]


def test_curves_false_writes_no_curves(runs, tmp_path, capsys):
    folder, _ = runs
    out = tmp_path / "report"
    paths = report.run_report(folder, out, tasks="tiny", curves=False, figure=False)
    assert not [p for p in paths if p.name.startswith("curves.")]
    assert not list(out.glob("curves.*"))
    assert "curves" not in json.loads((out / "sources.json").read_text())
    assert "curves:" not in capsys.readouterr().out


def test_report_config_turns_curves_on():
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(report.CONFIG_DIR + "/report.yaml")
    assert cfg.curves is True


def test_curves_use_the_leaderboard_records_and_a_moved_store(tmp_path):
    old, new = tmp_path / "old", tmp_path / "runs" / "transformer-s0"
    write_metrics(old, {10: 0.9})
    write_metrics(new, {10: 0.1})
    records = [
        {**train("transformer", TASK, 0, 0.5), "run_dir": str(old)},
        # newer, and its run_dir names a folder since moved (here: its own folder).
        {
            **train("transformer", TASK, 0, 0.5, started="2026-02-01T00:00:00+00:00"),
            "run_dir": "/elsewhere/transformer-s0",
            "path": str(new / "record.json"),
        },
    ]
    found = curves.learning_curves(leaderboard(records, "tiny"))
    assert found.series == {TASK: {"transformer": ([10], [10.0], 1)}}


def test_a_copied_store_reads_its_own_metrics_and_names_them_relative(tmp_path):
    # Committed results: the run folders copied out of the results_dir they ran in, which
    # still exists with other metrics; the copy's own metrics.jsonl is the record's.
    original, copy = tmp_path / "scratch" / "transformer-s0", tmp_path / "kept" / "transformer-s0"
    write_metrics(original, {10: 0.9})
    write_metrics(copy, {10: 0.1})
    record = {**train("transformer", TASK, 0, 0.5), "run_dir": str(original)}
    (copy / "record.json").write_text(json.dumps(record))
    out = tmp_path / "report"
    report.run_report(tmp_path / "kept", out, tasks="tiny", figure=False)
    trace = json.loads((out / "sources.json").read_text())["curves"]
    cell = trace["tasks"][TASK]["transformer"]
    assert cell["metrics_files"] == [f"transformer-s0/{METRICS_FILE}"]
    found = curves.learning_curves(
        leaderboard([{**record, "path": str(copy / "record.json")}], "tiny")
    )
    assert found.series == {TASK: {"transformer": ([10], [10.0], 1)}}


def test_curves_one_line_per_setting_and_one_figure_per_protocol(tmp_path):
    dirs = {name: tmp_path / "run_dirs" / name for name in ("long", "short", "other")}
    write_metrics(dirs["long"], {10: 0.5, 20: 0.7})
    write_metrics(dirs["short"], {10: 0.2, 20: 0.3})
    write_metrics(dirs["other"], {10: 0.9})
    quick = {"variant": "transformer[trainer.num_steps=20]", "setting": "1234567890"}
    folder, records = store(
        tmp_path,
        [
            {
                **train("transformer", TASK, 0, 0.5, protocol="lra_official"),
                "run_dir": str(dirs["long"]),
            },
            {
                **train("transformer", TASK, 0, 0.5, protocol="lra_official", **quick),
                "run_dir": str(dirs["short"]),
            },
            {
                **train("performer", TASK, 0, 0.5, protocol="transnormer"),
                "run_dir": str(dirs["other"]),
            },
        ],
    )
    found = curves.learning_curves(leaderboard(records, "tiny", protocol="lra_official"))
    assert found.protocol == "lra_official"
    assert found.series[TASK] == {
        "transformer": ([10, 20], [50.0, 70.0], 1),
        "transformer[trainer.num_steps=20]": ([10, 20], [20.0, 30.0], 1),
    }
    out = tmp_path / "report"
    paths = report.run_report(folder, out, tasks="tiny", figure=False)
    assert {p.name for p in paths if p.name.startswith("curves")} == {
        "curves_lra_official.png",
        "curves_lra_official.svg",
        "curves_lra_official.pdf",
        "curves_transnormer.png",
        "curves_transnormer.svg",
        "curves_transnormer.pdf",
    }
    trace = json.loads((out / "sources.json").read_text())["curves"]
    assert set(trace) == {"lra_official", "transnormer"}
    assert set(trace["transnormer"]["tasks"][TASK]) == {"performer"}
