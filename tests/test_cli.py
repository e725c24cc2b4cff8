"""The lra-train and lra-data console scripts, run as a user would run them."""

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import SMALL_DATA, SMALL_RUN, live_processes_in_group

BIN = Path(sys.executable).parent


def cli(name, *args, cwd):
    script = BIN / name if (BIN / name).exists() else shutil.which(name)
    assert script, f"{name} is not installed; run pip install -e '.[test]'"
    return subprocess.run(
        [str(script), *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


def records_in(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*/record.json"))]


def test_help_lists_the_config_groups(tmp_path):
    out = cli("lra-train", "--help", cwd=tmp_path)
    assert out.returncode == 0
    for group in ("model:", "task:", "trainer:", "protocol: authors, lra_official, transnormer"):
        assert group in out.stdout
    # The harness's own help (app help template), not Hydra's generic one.
    assert out.stdout.startswith("lra-train: train one model on one Long-Range Arena task")
    assert "lra-data task=listops_tiny && lra-train" in out.stdout
    assert "is powered by Hydra" not in out.stdout


def test_lra_data_prepares_once(tmp_path):
    args = ["task=listops_tiny", f"data_dir={tmp_path / 'data'}", "num_workers=1", *SMALL_DATA]
    first = cli("lra-data", *args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    tsv_folder = tmp_path / "data" / "listops_tiny"
    folder = tmp_path / "data" / "prepared" / "listops_tiny"
    assert "listops_tiny data ready in " + str(folder) in first.stdout
    names = sorted(p.name for p in tsv_folder.iterdir())
    assert {"basic_train.tsv", "basic_val.tsv", "basic_test.tsv"} <= set(names)
    assert (folder / "meta.json").is_file() and (folder / "train.tokens0.npy").is_file()
    stamps = [
        (f / n).stat().st_mtime_ns
        for f, n in [(tsv_folder, "basic_train.tsv"), (folder, "meta.json")]
    ]
    second = cli("lra-data", *args, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert [
        (f / n).stat().st_mtime_ns
        for f, n in [(tsv_folder, "basic_train.tsv"), (folder, "meta.json")]
    ] == stamps


def test_train_with_overrides_prints_summary_and_writes_record(listops_tiny_dir, tmp_path):
    out = cli(
        "lra-train",
        "task=listops_tiny",
        f"data_dir={listops_tiny_dir}",
        f"results_dir={tmp_path / 'records'}",
        "seed=5",
        *SMALL_DATA,
        *SMALL_RUN,
        "trainer.progress=true",  # not a terminal here: one line per log step, no bar
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    [record] = records_in(tmp_path / "records")
    assert record["seed"] == 5 and record["config"]["trainer"]["num_steps"] == 4
    assert "test accuracy" in out.stdout and "steps/sec" in out.stdout
    assert str(tmp_path / "records") in out.stdout
    [line] = [x for x in out.stdout.splitlines() if x.startswith("step 3/4 ")]
    assert "steps/s" in line and "val 0." in line and "left " in line
    assert "\r" not in out.stderr  # no redrawn bar in a log


def test_multirun_finishes_past_failing_jobs_and_a_rerun_trains_nothing(listops_tiny_dir, tmp_path):
    common = [
        "-m",
        "seed=0,1",
        "task=listops_tiny",
        f"data_dir={listops_tiny_dir}",
        f"results_dir={tmp_path / 'records'}",
        *SMALL_DATA,
        *SMALL_RUN,
    ]
    sweep = tmp_path / "sweep"
    out = cli(
        "lra-train",
        *common,
        # A job-level failure that no config check can see: the attention registry (built-in
        # names, entry points, import paths) is consulted only when the job builds the model.
        "model.attention=softmax,no_such_mechanism",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    assert out.returncode == 1, out.stderr
    records = records_in(tmp_path / "records")
    assert sorted(r["seed"] for r in records) == [0, 1]
    summary = (sweep / "summary.md").read_text()
    assert summary in out.stdout and "2 done, 2 failed." in summary
    assert "no_such_mechanism" in summary
    rows = json.loads((sweep / "summary.json").read_text())
    assert [(r["seed"], r["status"]) for r in rows] == [
        (0, "done"),
        (0, "failed"),
        (1, "done"),
        (1, "failed"),
    ]
    assert json.loads(Path(rows[2]["record"]).read_text())["seed"] == 1
    assert "test accuracy" in (sweep / "0" / "lra.log").read_text()
    assert "no_such_mechanism" in (sweep / "1" / "lra.log").read_text()
    # After each job, the sweep's progress (lra.run.progress): ended out of the total, an ETA.
    said = out.stdout + out.stderr
    assert "sweep progress: 1/4 jobs ended (1 done), " in said and ", ETA " in said
    assert "sweep progress: 4/4 jobs ended (2 done, 2 failed), " in said
    assert said.rstrip().count("sweep progress:") == 4

    stamps = [p.stat().st_mtime_ns for p in sorted((tmp_path / "records").glob("*/record.json"))]
    again = cli("lra-train", *common, f"hydra.sweep.dir={tmp_path / 'again'}", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "2 skipped." in (tmp_path / "again" / "summary.md").read_text()
    assert "2/2 jobs ended (2 skipped), 0 device-hours spent, done" in again.stdout + again.stderr
    assert "val accuracy" not in again.stdout  # nothing was trained
    assert stamps == [
        p.stat().st_mtime_ns for p in sorted((tmp_path / "records").glob("*/record.json"))
    ]

    [seed0] = [r for r in records if r["seed"] == 0]
    evaluated = cli("lra-eval", f"run={seed0['run_dir']}", "split=test", cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr
    accuracy_line, predictions_line = evaluated.stdout.strip().splitlines()
    assert accuracy_line == f"test accuracy {seed0['test_accuracy']:.4f}"
    # lra-eval writes its own predictions file, byte-identical to the one the run wrote.
    assert predictions_line.endswith("the same as the run's)"), predictions_line
    run_dir = Path(seed0["run_dir"])
    written = run_dir / "predictions" / "eval" / "test.npz"
    assert written.read_bytes() == (run_dir / "predictions" / "test.npz").read_bytes()


@pytest.mark.parametrize("group", ["model", "task"])
def test_unknown_group_option_lists_the_available_ones(tmp_path, group):
    out = cli("lra-train", f"{group}=no_such_thing", cwd=tmp_path)
    assert out.returncode != 0
    assert f"Could not find '{group}/no_such_thing'" in out.stderr
    assert "Available options" in out.stderr


def test_missing_data_prints_the_lra_data_command(tmp_path):
    out = cli("lra-train", f"data_dir={tmp_path / 'nothing'}", cwd=tmp_path)
    assert out.returncode == 2
    assert f"lra-data task=listops_tiny data_dir={tmp_path / 'nothing'}" in out.stderr
    assert "Traceback" not in out.stderr


def test_malformed_tsv_row_names_file_and_line(listops_tiny_dir, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(listops_tiny_dir, data)
    shutil.rmtree(data / "prepared")  # read the TSVs as they are, as from an official archive
    val = data / "listops_tiny" / "basic_val.tsv"
    lines = val.read_text().splitlines()
    lines[3] = "( [MAX 2 9 ] )\tnot-a-label"
    val.write_text("\n".join(lines) + "\n")
    out = cli("lra-train", f"data_dir={data}", f"results_dir={tmp_path / 'r'}", cwd=tmp_path)
    assert out.returncode == 2
    assert str(val) in out.stderr and "line 4" in out.stderr
    assert not (tmp_path / "r").exists() or not list((tmp_path / "r").iterdir())


def test_unwritable_results_dir_is_one_clear_error(listops_tiny_dir, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = cli(
        "lra-train", f"data_dir={listops_tiny_dir}", f"results_dir={blocker / 'r'}", cwd=tmp_path
    )
    assert out.returncode == 2
    assert "not writable" in out.stderr and "results_dir=" in out.stderr
    assert "Traceback" not in out.stderr


def test_lra_data_finds_a_damaged_file_and_rebuilds_on_request(listops_tiny_dir, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(listops_tiny_dir, data)
    labels = data / "prepared" / "listops_tiny" / "val.labels.npy"
    labels.write_bytes(labels.read_bytes()[:-8])  # truncated
    args = ["task=listops_tiny", f"data_dir={data}", *SMALL_DATA]
    rebuild = f"lra-data task=listops_tiny data_dir={data} rebuild=true"
    for name in ("lra-data", "lra-train"):
        out = cli(name, *args, f"results_dir={tmp_path / 'r'}", cwd=tmp_path)
        assert out.returncode == 2, (name, out.stderr)
        assert str(labels) in out.stderr and rebuild in out.stderr, (name, out.stderr)
        assert "Traceback" not in out.stderr
    fixed = cli("lra-data", *args, "rebuild=true", cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    assert (
        labels.read_bytes()
        == (listops_tiny_dir / "prepared/listops_tiny/val.labels.npy").read_bytes()
    )


def test_sigterm_stops_pathfinder_generation_within_seconds_and_a_rerun_goes_on(tmp_path):
    args = [
        "task=pathfinder_tiny",
        f"data_dir={tmp_path}",
        "num_workers=2",
        "task.source.num_images=400",
        "task.source.images_per_batch=20",
    ]
    script = BIN / "lra-data"
    proc = subprocess.Popen(
        [str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    metadata = (
        tmp_path / "generated" / "pathfinder_tiny" / "pathfinder32" / "curv_baseline" / "metadata"
    )
    deadline = time.monotonic() + 120
    while not list(metadata.glob("*.npy")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 5
    assert proc.returncode == 130 and "Traceback" not in stderr
    assert "interrupted: finished work is kept" in stderr
    finished = {p.name: p.stat().st_mtime_ns for p in metadata.glob("*.npy")}
    assert 1 <= len(finished) < 20
    time.sleep(0.5)
    assert live_processes_in_group(proc.pid) == []  # no worker outlives the command
    again = cli("lra-data", *args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert len(list(metadata.glob("*.npy"))) == 20
    assert {name: (metadata / name).stat().st_mtime_ns for name in finished} == finished
    assert "pathfinder_tiny data ready" in again.stdout


def test_figure1_script_refuses_to_overwrite_committed_results():
    """scripts/figure1.sh --tiny writes results/local/ by default; into a folder holding
    committed results only with --overwrite, and it refuses before doing any work."""
    root = Path(__file__).resolve().parents[1]
    tracked = subprocess.run(
        ["git", "ls-files", "results/cpu-tiny"], cwd=root, capture_output=True, text=True
    )
    if tracked.returncode != 0 or not tracked.stdout.strip():
        pytest.skip("not a git checkout with committed results/cpu-tiny")
    out = subprocess.run(
        ["bash", "scripts/figure1.sh", "--tiny", "--out", "results/cpu-tiny", "--skip-train"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "LRA_BIN": "/nonexistent"},
    )
    assert out.returncode == 2
    assert "holds committed results; add --overwrite" in out.stderr
    assert "results/local/cpu-tiny" in (root / "scripts/figure1.sh").read_text()
