"""Run folders, checkpoints and exact resume, in process (kills: test_interrupt.py)."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from conftest import make_config, train_small

from lra.config.identity import result_hash, run_key
from lra.run import checkpoint
from lra.run.checkpoint import CheckpointError
from lra.track.jsonl import read_metrics
from lra.train.evaluate import evaluate_run

# 8 steps, a log line every 2, validation every 4, a checkpoint every 3: the
# checkpoint at step 3 holds the metrics of a step not yet logged.
LONGER = [
    "trainer.num_steps=8",
    "trainer.log_every=2",
    "trainer.eval_every=4",
    "trainer.checkpoint_every=3",
]
SAME = ("test_accuracy", "test_loss", "val_accuracy", "final_val_accuracy", "selected_step")


def run(data_dir, results_dir, *overrides):
    return train_small(data_dir, results_dir, *LONGER, *overrides)


class Crash(Exception):
    pass


def crash_after_saving(monkeypatch, at_step: int):
    """Make the run die right after its checkpoint at ``at_step`` is saved."""
    save = checkpoint.Checkpoints.save

    def saving_then_crashing(self, step, *args):
        out = save(self, step, *args)
        if step == at_step:
            raise Crash(step)
        return out

    monkeypatch.setattr(checkpoint.Checkpoints, "save", saving_then_crashing)


def assert_same_result(resumed: dict, full: dict) -> None:
    for key in SAME:
        assert resumed[key] == full[key], key
    assert resumed["history"] == full["history"]
    assert_same_predictions(resumed, full)


def assert_same_predictions(resumed: dict, full: dict) -> None:
    """The record names the same predictions files (SHA-256 included), and the files in the
    two run folders hold the same bytes."""
    assert resumed["predictions"] == full["predictions"]
    assert sorted(full["predictions"]) == ["test", "val"]
    for named in full["predictions"].values():
        mine = (Path(resumed["run_dir"]) / named["file"]).read_bytes()
        theirs = (Path(full["run_dir"]) / named["file"]).read_bytes()
        assert mine == theirs and hashlib.sha256(mine).hexdigest() == named["sha256"]


# The tests that use the module fixture `uninterrupted` run on one pytest-xdist worker
# (--dist loadgroup), so it is built once, not once per worker.
UNINTERRUPTED_GROUP = pytest.mark.xdist_group("resume_uninterrupted")


@pytest.fixture(scope="module")
def uninterrupted(listops_tiny_dir, tmp_path_factory):
    return run(listops_tiny_dir, tmp_path_factory.mktemp("full"))


def test_run_identity_ignores_paths_logging_and_durability():
    config = make_config("task=listops_tiny")
    from omegaconf import OmegaConf

    base = OmegaConf.to_container(config, resolve=True)
    same = json.loads(json.dumps(base))
    same.update(data_dir="/elsewhere", results_dir="/other", num_workers=7)
    same["trainer"].update(progress=False, log_every=3, checkpoint_every=5, resume="never")
    assert result_hash(same) == result_hash(base)
    assert run_key(base) == f"transformer-listops_tiny-s0-{result_hash(base)}"
    other = json.loads(json.dumps(base))
    other["trainer"]["learning_rate"] = 0.01
    assert result_hash(other) != result_hash(base)
    other_seed = dict(base, seed=1)
    assert result_hash(other_seed) == result_hash(base) and run_key(other_seed) != run_key(base)


@UNINTERRUPTED_GROUP
def test_finished_run_keeps_its_folder_and_the_newest_checkpoints(uninterrupted):
    folder = Path(uninterrupted["run_dir"])
    assert folder.name == uninterrupted["run_key"]
    assert uninterrupted["record_path"] == str(folder / "record.json")
    assert json.loads((folder / "record.json").read_text())["history"] == uninterrupted["history"]
    assert json.loads((folder / "config.json").read_text()) == uninterrupted["config"]
    # saves at 3 and 6 and at the end; keep_checkpoints=2 leaves the newest two
    assert uninterrupted["checkpoint_steps"] == [6, 8]
    assert uninterrupted["checkpoint_saves"] == 3
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["6", "8"]
    assert uninterrupted["resumed_from"] == []


@pytest.mark.parametrize("crash_step", [3, 6])
@UNINTERRUPTED_GROUP
def test_resumed_run_equals_uninterrupted(
    listops_tiny_dir, tmp_path, monkeypatch, uninterrupted, crash_step
):
    crash_after_saving(monkeypatch, crash_step)
    with pytest.raises(Crash):
        run(listops_tiny_dir, tmp_path)
    monkeypatch.undo()
    resumed = run(listops_tiny_dir, tmp_path)
    assert_same_result(resumed, uninterrupted)
    assert [r["step"] for r in resumed["resumed_from"]] == [crash_step]
    assert resumed["wall_seconds"] > 0 and resumed["train_steps_per_sec"] > 0


@UNINTERRUPTED_GROUP
def test_finished_run_is_skipped_or_reevaluated_from_its_last_checkpoint(
    listops_tiny_dir, uninterrupted
):
    results_dir = Path(uninterrupted["run_dir"]).parent
    again = run(listops_tiny_dir, results_dir)
    assert again["skipped"] and again["history"] == uninterrupted["history"]
    rerun = run(listops_tiny_dir, results_dir, "trainer.skip_done=false")
    assert "skipped" not in rerun
    assert_same_result(rerun, uninterrupted)
    assert [r["step"] for r in rerun["resumed_from"]] == [8]


def test_resume_never_starts_afresh_and_must_needs_a_checkpoint(listops_tiny_dir, tmp_path):
    with pytest.raises(CheckpointError, match="trainer.resume=must.*holds no checkpoint"):
        run(listops_tiny_dir, tmp_path, "trainer.resume=must")
    first = run(listops_tiny_dir, tmp_path)
    fresh = run(listops_tiny_dir, tmp_path, "trainer.resume=never")
    assert fresh["resumed_from"] == [] and "skipped" not in fresh
    assert_same_result(fresh, first)


def test_unreadable_checkpoint_names_the_folder_and_the_way_out(
    listops_tiny_dir, tmp_path, monkeypatch
):
    crash_after_saving(monkeypatch, 6)
    with pytest.raises(Crash):
        run(listops_tiny_dir, tmp_path)
    monkeypatch.undo()
    [folder] = tmp_path.iterdir()
    for item in (folder / "checkpoints" / "6" / "state").rglob("*"):
        if item.is_file():
            item.write_bytes(b"garbage")
    with pytest.raises(CheckpointError) as info:
        run(listops_tiny_dir, tmp_path)
    assert str(folder / "checkpoints") in str(info.value)
    assert "trainer.resume=never" in str(info.value)
    assert run(listops_tiny_dir, tmp_path, "trainer.resume=never")["resumed_from"] == []


def test_a_half_written_save_never_becomes_the_latest(listops_tiny_dir, tmp_path, monkeypatch):
    crash_after_saving(monkeypatch, 3)
    with pytest.raises(Crash):
        run(listops_tiny_dir, tmp_path)
    monkeypatch.undo()
    [folder] = tmp_path.iterdir()
    ckpts = folder / "checkpoints"
    # what a kill in the middle of saving step 6 leaves: orbax's temporary folder
    shutil.copytree(ckpts / "3", ckpts / "6.orbax-checkpoint-tmp-1234")
    (ckpts / "6.orbax-checkpoint-tmp-1234" / "commit_success.txt").unlink(missing_ok=True)
    resumed = run(listops_tiny_dir, tmp_path)
    assert [r["step"] for r in resumed["resumed_from"]] == [3]
    assert not list(ckpts.glob("*tmp*"))


@UNINTERRUPTED_GROUP
def test_lra_eval_reproduces_the_record(listops_tiny_dir, uninterrupted):
    folder = uninterrupted["run_dir"]
    selected = evaluate_run(folder, "test", "selected")
    assert selected["accuracy"] == uninterrupted["test_accuracy"]
    assert selected["loss"] == uninterrupted["test_loss"]
    assert selected["best"] and selected["step"] == 8
    assert selected["predictions"]["sha256"] == uninterrupted["predictions"]["test"]["sha256"]
    assert selected["predictions"]["same_as_run"] is True
    val = evaluate_run(folder, "val", "selected")
    assert val["accuracy"] == uninterrupted["val_accuracy"]
    last = evaluate_run(folder, "val", "last")
    assert last["accuracy"] == uninterrupted["final_val_accuracy"] and not last["best"]
    assert evaluate_run(folder, "val", 8)["accuracy"] == last["accuracy"]
    with pytest.raises(CheckpointError, match="no checkpoint at step 3.*kept steps: 6, 8"):
        evaluate_run(folder, "test", 3)


def metric_lines(record: dict) -> list[dict]:
    """The run's metrics.jsonl without the fields that differ between sessions."""
    lines = read_metrics(Path(record["run_dir"]) / "metrics.jsonl")
    timing = (
        "time",
        "train/steps_per_sec",
        "train_steps_per_sec",
        "eval_steps_per_sec",
        "wall_seconds",
    )

    def untimed(line: dict) -> dict:
        return {
            k: untimed(v) if isinstance(v, dict) else v for k, v in line.items() if k not in timing
        }

    return [untimed(line) for line in lines]


@UNINTERRUPTED_GROUP
def test_metrics_file_holds_every_logged_step_and_the_summary(uninterrupted):
    lines = metric_lines(uninterrupted)
    *steps, last = lines
    assert [line["step"] for line in steps] == [h["step"] for h in uninterrupted["history"]]
    for line, entry in zip(steps, uninterrupted["history"], strict=True):
        assert line["train/loss"] == entry["train_loss"]
        assert line.get("val/accuracy") == entry.get("val_accuracy")
        assert 0 <= line["train/learning_rate"] < 1 and 0 <= line["train/accuracy"] <= 1
    rates = [line["train/learning_rate"] for line in steps]
    assert rates[0] == 0.0 and rates[1] > 0  # warm-up: step 1 is taken at rate 0, as optax does
    for key in ("test_accuracy", "val_accuracy", "selected_step", "num_params"):
        assert last["summary"][key] == uninterrupted[key]


@UNINTERRUPTED_GROUP
def test_a_resumed_run_logs_each_step_once(listops_tiny_dir, tmp_path, monkeypatch, uninterrupted):
    crash_after_saving(monkeypatch, 3)  # steps 4 and (logged) 4 come again after the resume
    with pytest.raises(Crash):
        run(listops_tiny_dir, tmp_path, "trainer.checkpoint_every=3")
    monkeypatch.undo()
    resumed = run(listops_tiny_dir, tmp_path)
    assert metric_lines(resumed) == metric_lines(uninterrupted)
