"""Self-pretraining's two stages as runs: records, reuse, skip, resume after a crash or a
SIGKILL (bitwise the uninterrupted record), and no read of the test split in stage 1."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import SMALL_DATA, SMALL_RUN, make_config, train_small

from lra.run import checkpoint
from lra.train.loop import train_and_evaluate

BIN = Path(sys.executable).parent
# 8 pretraining steps (checkpoint every 3, validation every 4), then 8 fine-tuning steps.
SPT = [
    "pretrain=masked",
    "pretrain.num_steps=8",
    "pretrain.warmup_steps=2",
    "trainer.num_steps=8",
    "trainer.log_every=2",
    "trainer.eval_every=4",
    "trainer.checkpoint_every=3",
]
SAME = ("test_accuracy", "test_loss", "val_accuracy", "selected_step", "history", "init")


def spt(data_dir, results_dir, *overrides):
    return train_small(data_dir, results_dir, *SPT, *overrides)


def pretrain_record(record: dict) -> dict:
    return json.loads(Path(record["pretrain_record_path"]).read_text())


def assert_same(resumed: dict, full: dict) -> None:
    for key in SAME:
        assert resumed[key] == full[key], key
    first, again = pretrain_record(full), pretrain_record(resumed)
    for key in ("history", "selected_step", "selected_val_loss"):
        assert again[key] == first[key], key


# The tests that use the module fixture `uninterrupted` run on one pytest-xdist worker
# (--dist loadgroup), so it is built once, not once per worker.
UNINTERRUPTED_GROUP = pytest.mark.xdist_group("pretrain_runs_uninterrupted")


@pytest.fixture(scope="module")
def uninterrupted(listops_tiny_dir, tmp_path_factory):
    return spt(listops_tiny_dir, tmp_path_factory.mktemp("spt"))


@UNINTERRUPTED_GROUP
def test_two_stages_write_two_records(uninterrupted):
    from lra.record.store import PRETRAIN_RECORD_KEYS, TRAIN_RECORD_KEYS

    first = pretrain_record(uninterrupted)
    assert set(PRETRAIN_RECORD_KEYS) <= set(first) and set(TRAIN_RECORD_KEYS) <= set(uninterrupted)
    assert first["kind"] == "pretrain" and uninterrupted["kind"] == "train"
    assert "test_accuracy" not in first and "test" not in first["split_sizes"]
    assert first["num_steps"] == 8 and first["mask_ratio"] == 0.1
    assert first["train_steps_per_sec"] and first["peak_memory_bytes"]
    vals = [h["val_loss"] for h in first["history"] if "val_loss" in h]
    assert first["selected_val_loss"] == min(vals)
    init = uninterrupted["init"]
    assert init["kind"] == "masked" and init["pretrain_run"] == first["run_key"]
    assert init["pretrain_steps"] == 8 and init["selected_val_loss"] == first["selected_val_loss"]
    assert uninterrupted["variant"].startswith("transformer+spt")
    assert first["variant"].startswith("transformer+spt:pretrain")
    assert uninterrupted["setting"] != first["setting"]


def test_scratch_record_says_scratch_without_a_new_identity(listops_tiny_dir, tmp_path):
    record = train_small(listops_tiny_dir, tmp_path)
    assert record["init"] == {"kind": "scratch"}
    assert record["variant"].startswith("transformer[") and "+spt" not in record["variant"]


def test_rerun_trains_nothing_and_a_new_finetuning_setting_reuses_the_pretraining(
    listops_tiny_dir, tmp_path, monkeypatch
):
    first = spt(listops_tiny_dir, tmp_path)
    assert not first.get("pretrain_skipped")
    saves = []
    save = checkpoint.Checkpoints.save
    monkeypatch.setattr(
        checkpoint.Checkpoints,
        "save",
        lambda self, step, *a: saves.append(step) or save(self, step, *a),
    )
    again = spt(listops_tiny_dir, tmp_path)
    assert again["skipped"] and again["pretrain_skipped"] and saves == []
    other = spt(listops_tiny_dir, tmp_path, "trainer.learning_rate=0.01")
    assert other["pretrain_skipped"] and not other.get("skipped")
    assert other["init"] == first["init"] and other["run_key"] != first["run_key"]
    assert sorted(set(saves)) == [3, 6, 8]  # fine-tuning steps only: nothing pretrained again
    assert len(list(tmp_path.glob("*/record.json"))) == 3


class Crash(Exception):
    pass


@pytest.mark.parametrize("stage", ["pretrain", "finetune"])
@UNINTERRUPTED_GROUP
def test_a_crash_in_either_stage_then_rerun_gives_the_uninterrupted_record(
    listops_tiny_dir, tmp_path, monkeypatch, uninterrupted, stage
):
    save = checkpoint.Checkpoints.save

    def saving_then_crashing(self, step, *args):
        out = save(self, step, *args)
        is_pretrain = json.loads((self.folder.parent / "config.json").read_text()).get("stage")
        if step == 6 and bool(is_pretrain) == (stage == "pretrain"):
            raise Crash(step)
        return out

    monkeypatch.setattr(checkpoint.Checkpoints, "save", saving_then_crashing)
    with pytest.raises(Crash):
        spt(listops_tiny_dir, tmp_path)
    monkeypatch.setattr(checkpoint.Checkpoints, "save", save)
    resumed = spt(listops_tiny_dir, tmp_path)
    assert_same(resumed, uninterrupted)
    which = pretrain_record(resumed) if stage == "pretrain" else resumed
    assert [r["step"] for r in which["resumed_from"]] == [6]


def test_stage_one_never_reads_the_test_split(listops_tiny_dir, tmp_path, monkeypatch):
    import lra.data.store as data_store

    opened = []
    load, digest = np.load, data_store.file_sha256

    def guarded(fn):
        def wrapper(path, *args, **kw):
            opened.append(Path(path).name)
            if Path(path).name.startswith("test."):
                raise PermissionError(f"stage 1 opened {path}")
            return fn(path, *args, **kw)

        return wrapper

    monkeypatch.setattr(data_store.np, "load", guarded(load))
    monkeypatch.setattr(data_store, "file_sha256", guarded(digest))
    cfg = make_config(
        "task=listops_tiny",
        f"data_dir={listops_tiny_dir}",
        f"results_dir={tmp_path}",
        *SMALL_DATA,
        *SMALL_RUN,
        *SPT,
    )
    from lra.train import pretrain

    record = train_and_evaluate(pretrain.pretrain_config(cfg))
    assert record["kind"] == "pretrain" and set(record["split_sizes"]) == {"train", "val"}
    assert any(name.startswith("train.") for name in opened)
    assert not any(name.startswith("test.") for name in opened)


def start(data_dir, results_dir, *extra):
    args = [
        f"data_dir={data_dir}",
        f"results_dir={results_dir}",
        *SMALL_DATA,
        *SMALL_RUN,
        *SPT,
        "pretrain.num_steps=200",
        "trainer.num_steps=200",
        "trainer.checkpoint_every=50",
        "trainer.eval_every=100",
        "trainer.log_every=25",
        *extra,
    ]
    return args, subprocess.Popen(
        [str(BIN / "lra-train"), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def checkpoint_of(results_dir: Path, stage: str, step: int):
    def found():
        for done in results_dir.glob(f"*/checkpoints/{step}/commit_success.txt"):
            config = json.loads((done.parents[2] / "config.json").read_text())
            if (config.get("stage") == "pretrain") == (stage == "pretrain"):
                return True
        return False

    return found


@pytest.mark.parametrize("stage", ["pretrain", "finetune"])
def test_sigkill_in_either_stage_then_rerun_gives_the_uninterrupted_record(
    listops_tiny_dir, tmp_path, stage
):
    import time

    args, proc = start(listops_tiny_dir, tmp_path / "killed")
    wait = checkpoint_of(tmp_path / "killed", stage, 50)
    deadline = time.monotonic() + 240
    while not wait():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    rerun = subprocess.run([str(BIN / "lra-train"), *args], capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    full_args, full = start(listops_tiny_dir, tmp_path / "full")
    assert full.wait() == 0, full.communicate()

    def records(folder):
        found = {}
        for path in (tmp_path / folder).glob("*/record.json"):
            record = json.loads(path.read_text())
            found[record["kind"]] = record
        return found

    killed, whole = records("killed"), records("full")
    for kind in ("pretrain", "train"):
        for key in ("history", "selected_step", "run_key", "init", "test_accuracy", "test_loss"):
            assert killed[kind].get(key) == whole[kind].get(key), (kind, key)
    resumed = killed["pretrain" if stage == "pretrain" else "train"]["resumed_from"]
    assert resumed and resumed[0]["step"] >= 50


def test_smoke_self_pretraining_row_with_an_outside_mechanism(tmp_path):
    from test_cli import cli
    from test_smoke import EXAMPLE_CONFIGS

    out = cli(
        "lra-smoke",
        "--config-dir",
        str(EXAMPLE_CONFIGS),
        "models=[my_attention]",
        "tasks=[listops_tiny]",
        "steps=4",
        "learn_steps=4",
        'overrides=["trainer.batch_size=8","task.arch.num_layers=1","task.arch.dim=16",'
        '"task.arch.qkv_dim=16","task.arch.mlp_dim=32","task.arch.num_heads=2"]',
        f"data_dir={tmp_path / 'data'}",
        f"results_dir={tmp_path / 'smoke'}",
        cwd=tmp_path,
    )
    assert out.returncode in (0, 1), out.stderr[-3000:]  # 4 steps need not beat the majority
    table = (tmp_path / "smoke" / "smoke.md").read_text()
    (row,) = [line for line in table.splitlines() if line.startswith("| my_attention+spt ")]
    assert "| ok |" in row
    kinds = sorted(
        json.loads(p.read_text())["kind"] for p in (tmp_path / "smoke").glob("*/record.json")
    )
    assert kinds == ["pretrain", "train", "train"]


@UNINTERRUPTED_GROUP
def test_lra_eval_reproduces_a_finetuned_record(uninterrupted):
    from lra.train.evaluate import evaluate_run

    out = evaluate_run(uninterrupted["run_dir"], "test")
    assert out["accuracy"] == uninterrupted["test_accuracy"]
    assert out["loss"] == uninterrupted["test_loss"]


def test_causal_pretraining_then_finetuning(listops_tiny_dir, tmp_path):
    record = spt(listops_tiny_dir, tmp_path, "pretrain=causal", "pretrain.num_steps=2")
    first = pretrain_record(record)
    assert first["objective"] == "causal" and first["mask_ratio"] is None
    assert record["init"]["kind"] == "causal" and record["variant"].startswith(
        "transformer+spt-causal"
    )
