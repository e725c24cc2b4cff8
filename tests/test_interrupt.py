"""Kills, stop signals and the run lock, with real processes."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import SMALL_DATA, SMALL_RUN, make_config

from lra.run.lock import RunLock, RunLocked
from lra.run.signals import Interrupted, StopSignals
from lra.train.loop import train_and_evaluate

BIN = Path(sys.executable).parent
# Long enough (about 2 s of steps) to be stopped in the middle.
LONG = [
    "trainer.num_steps=200",
    "trainer.log_every=25",
    "trainer.eval_every=100",
    "trainer.checkpoint_every=50",
]


def overrides(data_dir, results_dir) -> list[str]:
    return [f"data_dir={data_dir}", f"results_dir={results_dir}", *SMALL_DATA, *SMALL_RUN, *LONG]


def start_training(data_dir, results_dir) -> subprocess.Popen:
    return subprocess.Popen(
        [str(BIN / "lra-train"), *overrides(data_dir, results_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(predicate, proc, timeout=120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def first_checkpoint(results_dir: Path):
    return lambda: any(results_dir.glob("*/checkpoints/50/commit_success.txt"))


# The tests that use the module fixture `uninterrupted` run on one pytest-xdist worker
# (--dist loadgroup), so it is built once, not once per worker.
UNINTERRUPTED_GROUP = pytest.mark.xdist_group("interrupt_uninterrupted")


@pytest.fixture(scope="module")
def uninterrupted(listops_tiny_dir, tmp_path_factory):
    cfg = make_config(*overrides(listops_tiny_dir, tmp_path_factory.mktemp("full")))
    return train_and_evaluate(cfg)


def resumed_in_process(data_dir, results_dir) -> dict:
    return train_and_evaluate(make_config(*overrides(data_dir, results_dir)))


def assert_same_result(resumed: dict, full: dict) -> None:
    for key in ("test_accuracy", "val_accuracy", "selected_step", "history"):
        assert resumed[key] == full[key], key


@UNINTERRUPTED_GROUP
def test_sigkill_after_a_checkpoint_then_rerun_gives_the_uninterrupted_record(
    listops_tiny_dir, tmp_path, uninterrupted
):
    proc = start_training(listops_tiny_dir, tmp_path)
    wait_for(first_checkpoint(tmp_path), proc)
    proc.kill()
    proc.wait()
    assert not list(tmp_path.glob("*/record.json"))
    rerun = subprocess.run(
        [str(BIN / "lra-train"), *overrides(listops_tiny_dir, tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert rerun.returncode == 0, rerun.stderr
    assert "resuming " in rerun.stdout
    [record_path] = tmp_path.glob("*/record.json")
    record = json.loads(record_path.read_text())
    assert record["resumed_from"][0]["step"] >= 50
    assert_same_result(record, uninterrupted)


@UNINTERRUPTED_GROUP
def test_sigterm_saves_and_exits_within_seconds_with_one_line(
    listops_tiny_dir, tmp_path, uninterrupted
):
    proc = start_training(listops_tiny_dir, tmp_path)
    wait_for(first_checkpoint(tmp_path), proc)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 10
    assert proc.returncode == 128 + signal.SIGTERM
    assert "Traceback" not in stderr
    [line] = [x for x in stderr.splitlines() if x.startswith("interrupted:")]
    assert "stopped by SIGTERM at step" in line and "lra-train data_dir=" in line
    step = int(line.split(" at step ")[1].split()[0])
    [folder] = tmp_path.iterdir()
    assert (folder / "checkpoints" / str(step) / "commit_success.txt").is_file()
    assert not (folder / "record.json").exists()
    resumed = resumed_in_process(listops_tiny_dir, tmp_path)
    assert resumed["resumed_from"][0]["step"] == step
    assert_same_result(resumed, uninterrupted)


def test_signals_are_noted_and_a_second_ctrl_c_stops_at_once():
    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.requested and stop.name == "SIGUSR1"
    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.name == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert stop.deferred() is None  # Python's own Ctrl-C handler is not handed on


def test_an_earlier_handler_of_the_signal_is_deferred_until_hand_over():
    calls = []
    earlier = signal.signal(signal.SIGUSR2, lambda signum, frame: calls.append(signum))
    try:
        with StopSignals() as stop:
            os.kill(os.getpid(), signal.SIGUSR2)
            assert stop.name == "SIGUSR2" and calls == []  # noted, not yet passed on
            err = Interrupted("stopped", stop.received, stop.deferred())
        assert err.exit_code == 128 + signal.SIGUSR2
        err.hand_over()
        assert calls == [signal.SIGUSR2]
        Interrupted("stopped", signal.SIGTERM).hand_over()  # none: nothing to run
    finally:
        signal.signal(signal.SIGUSR2, earlier)


HOLD = textwrap.dedent(
    """
    import sys, time
    from lra.run.lock import RunLock
    with RunLock(sys.argv[1], "then"):
        print("held", flush=True)
        time.sleep(60)
    """
)


def test_a_second_trainer_is_refused_and_a_dead_ones_lock_taken_over(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunLocked) as info:
            with RunLock(tmp_path):
                pass
        assert f"PID {holder.pid}" in str(info.value) and "host " in str(info.value)
        assert str(tmp_path) in str(info.value)
    finally:
        holder.kill()
        holder.wait()
    with RunLock(tmp_path, "now") as lock:  # the dead holder's lock file is still there
        assert lock.took_over["pid"] == holder.pid
        assert f'"pid": {os.getpid()}' in (tmp_path / "lock").read_text()


@UNINTERRUPTED_GROUP
def test_submitit_requeue_signal_saves_first_and_the_requeued_job_resumes_there(
    listops_tiny_dir, tmp_path, uninterrupted
):
    """submitit (SLURM's time limit or pre-emption) signals USR2 and requeues the job from
    its own handler; the run must save at the next step boundary before that handler runs,
    so the requeued job goes on from the signal's step, not from the last periodic save."""
    records = tmp_path / "records"
    proc = subprocess.Popen(
        [
            str(BIN / "lra-train"),
            "-m",
            "hydra/launcher=submitit_local",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
            *overrides(listops_tiny_dir, records),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(first_checkpoint(records), proc)
    [folder] = records.iterdir()
    os.kill(json.loads((folder / "lock").read_text())["pid"], signal.SIGUSR2)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr
    text = (tmp_path / "sweep" / "0" / "lra.log").read_text()  # both attempts of the job
    stopped = [x for x in text.splitlines() if "stopped by SIGUSR2 at step" in x]
    assert len(stopped) == 1, text
    step = int(stopped[0].split(" at step ")[1].split()[0])
    assert step > 50  # past the periodic save: saved at the signal
    assert "Requeued job" in text
    record = json.loads((folder / "record.json").read_text())
    assert [r["step"] for r in record["resumed_from"]] == [step]
    assert_same_result(record, uninterrupted)
    assert "1 done." in (tmp_path / "sweep" / "summary.md").read_text()
