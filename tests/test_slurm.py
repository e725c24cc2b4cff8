"""Sweeps on a real SLURM cluster: the single node that ``scripts/slurm_local.sh`` brings up.

``hydra/launcher=slurm`` submits each sweep job as a SLURM job (an array for several), and
these tests drive the cluster the way a scheduler and a user do: a sweep with a failing job,
pre-emption (SLURM's warning signal USR2 -> checkpoint -> submitit's requeue -> resume), a
time limit (the same, with the signal sent by SLURM before the limit, counted against
``max_num_timeout``), cancellation (``scancel``'s SIGTERM -> checkpoint; the sweep's one line
for it and exit 1; the rerun sweep resumes), and a run in two SLURM tasks
(``jax.distributed`` from SLURM's environment). Requeued jobs are released at once
(``scontrol update StartTime=now``) instead of after SLURM's begin-time delay. Without
SLURM (``sinfo`` not on PATH, or no node taking jobs) they skip, except in CI
(``CI=true``), which starts the cluster first and where they fail instead.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import SLURM, SMALL_DATA, SMALL_RUN, make_config, train_small

from lra.train.loop import train_and_evaluate

# One pytest-xdist worker for all of them with `--dist loadgroup` (the node has few cores).
# Every test here needs the node (conftest's slurm_node: skips, or fails in CI, without one).
pytestmark = [pytest.mark.xdist_group("slurm"), pytest.mark.usefixtures("slurm_node")]
BIN = Path(sys.executable).parent
# Long enough (a few seconds of steps) to be stopped in the middle by a signal.
LONG = [
    "trainer.num_steps=400",
    "trainer.log_every=50",
    "trainer.eval_every=200",
    "trainer.checkpoint_every=50",
]


def lra_sweep(data_dir, root: Path, *overrides: str, background=False):
    """``lra-train -m`` on SLURM of the small listops_tiny run, records and sweep in ``root``.

    It asks SLURM for its jobs' states every second (``LRA_SLURM_POLL_S``; 15 s by default),
    to see a cancelled job at once."""
    command = [
        str(BIN / "lra-train"),
        "-m",
        *SLURM,
        "task=listops_tiny",
        f"data_dir={data_dir}",
        f"results_dir={root / 'records'}",
        f"hydra.sweep.dir={root / 'sweep'}",
        *SMALL_DATA,
        *SMALL_RUN,
        *overrides,
    ]
    env = {**os.environ, "LRA_SLURM_POLL_S": "1"}
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, "env": env}
    if background:
        return subprocess.Popen(command, cwd=root, **pipes)
    return subprocess.run(command, cwd=root, timeout=420, **pipes)


def wait_for(predicate, proc, timeout=240.0, what="") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            pytest.fail(f"the sweep ended while waiting for {what}:\n{proc.communicate()[0]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def slurm_job_id(sweep: Path, job: int | None = None) -> str:
    """The SLURM id of a sweep's job: ``123`` for a single job, ``123_<job>`` in an array."""
    names = [p.name[: -len("_0_log.out")] for p in sweep.glob(".submitit/*/*_0_log.out")]
    if job is not None:
        names = [n for n in names if n.endswith(f"_{job}")]
    assert len(names) == 1, names
    return names[0]


def squeue_state(job_id: str) -> str:
    out = subprocess.run(
        ["squeue", "--noheader", "--states=all", "--format=%T", f"--jobs={job_id}"],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def release_when_requeued(job_id: str, proc, *settings: str, timeout=120.0) -> None:
    """Let a requeued job start now instead of after SLURM's begin-time delay (and change
    its ``settings``, e.g. ``TimeLimit=5``, before it does)."""
    deadline = time.monotonic() + timeout
    while squeue_state(job_id) != "PENDING":
        assert proc.poll() is None and time.monotonic() < deadline, "the job was not requeued"
        time.sleep(0.2)
    command = ["scontrol", "update", f"JobId={job_id}", *settings, "StartTime=now"]
    subprocess.run(command, check=True)


def seconds_run(job_id: str) -> int:
    """How long the job has run, from squeue's ``[days-][hours:]minutes:seconds``."""
    used = subprocess.run(
        ["squeue", "--noheader", "--format=%M", f"--jobs={job_id}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    days, _, clock = used.rpartition("-")
    seconds = 0
    for part in clock.split(":"):
        seconds = 60 * seconds + int(part)
    return seconds + 86400 * int(days or 0)


def records_in(folder: Path) -> dict[int, dict]:
    records = [json.loads(p.read_text()) for p in folder.glob("*/record.json")]
    return {r["seed"]: r for r in records}


def checkpoint_of(records: Path, seed: int, step: int = 50):
    return lambda: any(records.glob(f"*-s{seed}-*/checkpoints/{step}/commit_success.txt"))


def assert_quiet_console(output: str) -> None:
    assert "Bypassing sacct error" not in output
    assert output.count("sacct does not answer") <= 1  # said once, where accounting is off
    assert "SLURM jobs: " in output


def assert_same_result(resumed: dict, full: dict) -> None:
    for key in ("test_accuracy", "val_accuracy", "selected_step", "history"):
        assert resumed[key] == full[key], key


@pytest.fixture(scope="module")
def uninterrupted(listops_tiny_dir, tmp_path_factory):
    """The LONG run of seeds 0 and 1, in this process, never stopped."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    return {
        seed: train_and_evaluate(
            make_config(
                "task=listops_tiny",
                f"data_dir={listops_tiny_dir}",
                f"results_dir={folder}",
                f"seed={seed}",
                *SMALL_DATA,
                *SMALL_RUN,
                *LONG,
            )
        )
        for seed in (0, 1)
    }


def resumed_once_at_the_signal(proc, output, records, sweep, uninterrupted):
    """The sweep succeeded; its one run resumed once, from a save at SLURM's warning signal
    (USR2), to the uninterrupted run's record. Returns the resume entry and the job's log."""
    assert proc.returncode == 0, output
    record = records_in(records)[0]
    [resumed] = record["resumed_from"]
    assert resumed["step"] > 50  # saved at the signal, past the periodic save
    assert_same_result(record, uninterrupted[0])
    log = (sweep / "0" / "lra.log").read_text()  # both attempts of the job
    assert f"stopped by SIGUSR2 at step {resumed['step']}" in log
    return resumed, log


def test_array_sweep_finishes_and_a_failing_job_gives_exit_1_and_its_row(
    listops_tiny_dir, tmp_path
):
    out = lra_sweep(listops_tiny_dir, tmp_path, "seed=0,1")
    assert out.returncode == 0, out.stdout
    assert sorted(records_in(tmp_path / "records")) == [0, 1]
    summary = (tmp_path / "sweep" / "summary.md").read_text()
    assert "2 done." in summary and summary in out.stdout
    assert_quiet_console(out.stdout)
    assert len(list((tmp_path / "sweep" / ".submitit").glob("*_1/*_result.pkl"))) == 1  # an array
    # Again into the same records: seed 0 is done already, the unknown mechanism fails only
    # in its job (the registry is read when the model is built).
    out = lra_sweep(
        listops_tiny_dir, tmp_path, "seed=0", "model.attention=softmax,no_such_mechanism"
    )
    assert out.returncode == 1, out.stdout
    rows = json.loads((tmp_path / "sweep" / "summary.json").read_text())
    assert [(r["job"], r["status"]) for r in rows] == [(0, "skipped"), (1, "failed")]
    assert "no_such_mechanism" in rows[1]["error"]
    assert "1 failed, 1 skipped." in out.stdout


def test_preemption_signal_checkpoints_requeues_and_resumes_to_the_same_record(
    listops_tiny_dir, tmp_path, uninterrupted
):
    """SLURM's warning signal (USR2, as before a time limit or on pre-emption) to every
    process of the job: the run saves at the next step, submitit requeues the job, and the
    requeued job resumes there and ends with the uninterrupted run's record, bit for bit."""
    records, sweep = tmp_path / "records", tmp_path / "sweep"
    proc = lra_sweep(listops_tiny_dir, tmp_path, "seed=0", *LONG, background=True)
    try:
        wait_for(checkpoint_of(records, 0), proc, what="the first checkpoint")
        job = slurm_job_id(sweep)
        subprocess.run(["scancel", "--signal=USR2", "--full", job], check=True)
        release_when_requeued(job, proc)
        output = proc.communicate(timeout=300)[0]
    finally:
        proc.kill()
    _, log = resumed_once_at_the_signal(proc, output, records, sweep, uninterrupted)
    assert "Requeued job" in log
    assert "1 done." in output
    assert f"SLURM jobs: 1 done; requeued so far: {job} 1x" in output  # its last states
    assert_quiet_console(output)
    print(output)  # the console of a pre-empted sweep, for the curious (pytest -s)


def test_time_limit_warning_checkpoints_requeues_and_the_run_finishes_within_max_num_timeout(
    listops_tiny_dir, tmp_path, uninterrupted
):
    """A job at its time limit: SLURM sends the warning signal (USR2) ``signal_delay_s``
    before the limit, the run saves at the next step, submitit counts a timeout (one of
    ``max_num_timeout``) and requeues the job, and the requeued job resumes and ends with the
    uninterrupted run's record.

    slurmctld checks time limits, and sends this signal, on a fixed 30 s pass
    (``PERIODIC_TIMEOUT`` in its source, not a slurm.conf setting): the signal comes at the
    first pass once it is due, 0-30 s later (its man page: "up to 60 seconds earlier than
    specified"). To wait for one pass only, and to find the run still training when it
    comes whatever the machine's speed, the test holds the run after its first checkpoint
    (``scancel --signal=STOP``: SLURM marks the job STOPPED) and brings the limit forward
    (``scontrol update TimeLimit``) so that the warning is due at once; SLURM sends SIGCONT
    before its warning signal, which wakes the run. The requeued job gets its 5 minutes
    back (else its warning would be due at once too) and starts without the begin-time
    delay."""
    records, sweep = tmp_path / "records", tmp_path / "sweep"
    limits = [
        "hydra.launcher.timeout_min=5",
        "hydra.launcher.signal_delay_s=120",
        "hydra.launcher.max_num_timeout=1",
    ]
    proc = lra_sweep(listops_tiny_dir, tmp_path, "seed=0", *LONG, *limits, background=True)
    job = None
    try:
        wait_for(checkpoint_of(records, 0), proc, what="the first checkpoint")
        job = slurm_job_id(sweep)
        subprocess.run(["scancel", "--signal=STOP", job], check=True)
        # The limit 61-120 s ahead: past slurmctld's next pass, and the warning (120 s
        # before the limit) due at that pass.
        minutes = seconds_run(job) // 60 + 2
        subprocess.run(["scontrol", "update", f"JobId={job}", f"TimeLimit={minutes}"], check=True)
        release_when_requeued(job, proc, "TimeLimit=5")
        output = proc.communicate(timeout=300)[0]
    finally:
        if proc.poll() is None:  # failed on the way: leave no stopped job behind
            proc.kill()
            if job is not None:
                subprocess.run(["scancel", job])
    _, log = resumed_once_at_the_signal(proc, output, records, sweep, uninterrupted)
    assert "this job is timed-out" in log  # submitit: at the time limit, not pre-empted
    assert f"Requeued job {job} (0 remaining timeouts)" in log  # max_num_timeout=1: one left
    assert f"SLURM jobs: 1 done; requeued so far: {job} 1x" in output
    assert "failed" not in output  # nor was the STOPPED job taken for ended
    assert_quiet_console(output)


def test_cancelled_job_checkpoints_and_the_rerun_sweep_resumes_it_and_skips_the_finished(
    listops_tiny_dir, tmp_path, uninterrupted
):
    records, sweep = tmp_path / "records", tmp_path / "sweep"
    proc = lra_sweep(listops_tiny_dir, tmp_path, "seed=0,1", *LONG, background=True)
    try:
        wait_for(checkpoint_of(records, 1), proc, what="job 1's first checkpoint")
        job = slurm_job_id(sweep, 1)
        subprocess.run(["scancel", job], check=True)  # SIGTERM, no requeue
        output = proc.communicate(timeout=300)[0]
    finally:
        proc.kill()
    # The sweep ends with its summary, exit 1 and one line for the cancelled job (not
    # submitit's traceback and the job's error log).
    assert proc.returncode == 1, output
    assert "Traceback" not in output and "UncompletedJobError" not in output, output
    rows = json.loads((sweep / "summary.json").read_text())
    assert [(r["seed"], r["status"]) for r in rows] == [(0, "done"), (1, "cancelled")]
    [line] = [line for line in output.splitlines() if line.startswith("job 1 (cancelled): ")]
    assert line == f"job 1 (cancelled): {rows[1]['error']}"
    assert f"SLURM job {job} was cancelled: stopped by SIGTERM at step" in line
    assert line.endswith("rerun the same command to resume"), line
    assert "1 cancelled, 1 done." in output
    assert sorted(records_in(records)) == [0]
    log = (sweep / "1" / "lra.log").read_text()
    assert "stopped by SIGTERM at step" in log and "checkpoint saved" in log
    out = lra_sweep(listops_tiny_dir, tmp_path, "seed=0,1", *LONG)
    assert out.returncode == 0, out.stdout
    rows = json.loads((sweep / "summary.json").read_text())
    assert [(r["seed"], r["status"]) for r in rows] == [(0, "skipped"), (1, "done")]
    resumed = records_in(records)[1]
    assert [r["step"] for r in resumed["resumed_from"]] != []
    assert_same_result(resumed, uninterrupted[1])


def test_two_slurm_tasks_run_one_distributed_run_with_the_losses_of_one_process(
    listops_tiny_dir, tmp_path
):
    out = lra_sweep(listops_tiny_dir, tmp_path, "seed=0", "hydra.launcher.tasks_per_node=2")
    assert out.returncode == 0, out.stdout
    [record] = records_in(tmp_path / "records").values()
    assert record["num_processes"] == 2 and record["num_devices"] == 2
    job = slurm_job_id(tmp_path / "sweep")
    task1 = (tmp_path / "sweep" / ".submitit" / job / f"{job}_1_log.out").read_text()
    assert "jax.distributed: process 1 of 2 (SLURM)" in task1
    one = train_small(listops_tiny_dir, tmp_path / "one-process", "seed=0")
    losses = [h["train_loss"] for h in record["history"] if "train_loss" in h]
    assert losses == pytest.approx([h["train_loss"] for h in one["history"]], rel=1e-5)
