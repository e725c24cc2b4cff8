"""A SLURM sweep job that ends without a result (cancelled, timed out) is one summary row and
one line, and the sweep exits 1: the parts that need no cluster (tests/test_slurm.py runs
them on one)."""

import json

import pytest
from omegaconf import OmegaConf

from lra.run import cluster, sweep

submitit_slurm = pytest.importorskip("submitit.slurm.slurm")

INTERRUPTED = {
    "job": 1,
    "model": "transformer",
    "task": "listops_tiny",
    "seed": 1,
    "status": "interrupted",
    "test_accuracy": None,
    "steps_per_sec": None,
    "record": "",
    "error": "stopped by SIGTERM at step 111 of 400; checkpoint saved in /r/checkpoints; "
    "rerun the same command to resume",
    "overrides": ["seed=1"],
}


def end(state="CANCELLED", reason=""):
    return cluster.ClusterEnd(state, "7_1", reason, "/sweep/.submitit/7_1/7_1_0_log.err")


def test_a_cancelled_job_that_saved_its_checkpoint_is_one_line_saying_how_to_resume():
    row = sweep.cluster_end_row(1, end(), dict(INTERRUPTED), ["seed=1"])
    assert row["status"] == "cancelled"
    assert row["error"] == (
        "SLURM job 7_1 was cancelled: stopped by SIGTERM at step 111 of 400; checkpoint saved "
        "in /r/checkpoints; rerun the same command to resume"
    )
    assert {k: row[k] for k in ("job", "model", "seed")} == {
        "job": 1,
        "model": "transformer",
        "seed": 1,
    }


def test_a_job_that_left_no_row_gets_one_from_its_overrides_with_its_log():
    row = sweep.cluster_end_row(3, end("TIMEOUT"), None, ["model=performer", "seed=2"])
    assert (row["job"], row["model"], row["seed"], row["status"]) == (3, "performer", 2, "failed")
    assert row["error"].startswith("SLURM job 7_1 ended TIMEOUT (log: /sweep/.submitit/7_1/")
    assert "rerun the same command to resume it" in row["error"]
    failed = sweep.cluster_end_row(3, end("FAILED", "Job not requeued because: x."), None, [])
    assert failed["error"].startswith("SLURM job 7_1 failed (Job not requeued because: x.)")


def test_a_job_that_finished_before_slurm_ended_it_keeps_its_row():
    done = {**INTERRUPTED, "status": "done", "error": ""}
    assert sweep.cluster_end_row(1, end(), done, []) == done


def test_the_summary_shows_the_cancelled_job_and_the_sweep_fails(tmp_path, monkeypatch, capsys):
    for job, row in enumerate(
        [{**INTERRUPTED, "job": 0, "status": "done", "error": ""}, INTERRUPTED]
    ):
        (tmp_path / str(job)).mkdir()
        (tmp_path / str(job) / sweep.STATUS_FILE).write_text(json.dumps(row))
    monkeypatch.setattr(sweep, "cluster_ends", {1: (end(), ["seed=1"])})
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}, "launcher": {}}})
    sweep.SweepSummary().on_multirun_end(config)
    assert sweep.failed_jobs == 1
    out = capsys.readouterr().out
    assert "1 cancelled, 1 done." in out
    assert "job 1 (cancelled): SLURM job 7_1 was cancelled: stopped by SIGTERM" in out
    rows = json.loads((tmp_path / "summary.json").read_text())
    assert [r["status"] for r in rows] == ["done", "cancelled"]


class StateOnly:
    """A submitit watcher that knows one state and never asks SLURM."""

    def __init__(self, state):
        self.state = state

    def register_job(self, job_id):
        pass

    def get_state(self, job_id, mode="standard"):
        return self.state

    def is_done(self, job_id, mode="standard"):
        return True


def test_a_job_without_result_returns_an_empty_job_return_and_hands_over_its_end(
    tmp_path, monkeypatch
):
    job_class = submitit_slurm.SlurmJob
    monkeypatch.setattr(job_class, "results", job_class.results)  # restored after the test
    monkeypatch.setattr(job_class, "watcher", StateOnly("CANCELLED by 0"))
    monkeypatch.setattr(cluster, "RESULT_GRACE_S", 0)  # a cancelled job writes no result
    monkeypatch.setattr(sweep, "cluster_ends", {})
    cluster.end_jobs_with_rows()
    cluster.end_jobs_with_rows()  # once is enough: not wrapped twice
    job = job_class(folder=tmp_path, job_id="7_1")
    assert job._results_timeout_s == 15  # submitit's wait for a result file, elsewhere
    [ret] = job.results()
    assert ret.return_value is None and job._results_timeout_s == 0
    [(number, (ended, overrides))] = sweep.cluster_ends.items()
    assert (number, overrides) == (1, [])  # no submission to read: the array index
    assert (ended.state, ended.slurm_job, ended.reason) == ("CANCELLED", "7_1", "")


def test_a_stopped_or_suspended_job_has_not_ended():
    watcher = cluster.slurm_watcher(poll_s=1)
    states = {"1": "STOPPED", "2": "SUSPENDED", "3": "CANCELLED by 0", "4": "COMPLETED"}
    for job_id, state in states.items():
        watcher.register_job(job_id)
        watcher._info_dict[job_id] = {"State": state}
    assert [watcher.is_done(j, mode="cache") for j in states] == [False, False, True, True]
    assert watcher.board.category("1", "STOPPED") == "running"
