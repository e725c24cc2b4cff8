"""Sweeps through Hydra's launcher plugins: joblib (one GPU per job), submitit, SLURM config."""

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SMALL_DATA, SMALL_RUN, train_small
from hydra import compose, initialize_config_dir

from lra.config.compose import CONFIG_DIR
from lra.errors import ConfigError
from lra.run import cluster

BIN = Path(sys.executable).parent


def sweep(listops_tiny_dir, tmp_path, *overrides, env=None):
    """``lra-train -m`` of the small listops_tiny run, seeds 0 and 1, into ``tmp_path``."""
    return subprocess.run(
        [
            str(BIN / "lra-train"),
            "-m",
            "seed=0,1",
            "task=listops_tiny",
            f"data_dir={listops_tiny_dir}",
            f"results_dir={tmp_path / 'records'}",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
            *SMALL_DATA,
            *SMALL_RUN,
            *overrides,
        ],
        cwd=tmp_path,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


# The tests that use the module fixture `compiled` run on one pytest-xdist worker
# (--dist loadgroup), so it is built once, not once per worker.
COMPILED_GROUP = pytest.mark.xdist_group("launchers_compiled")


@pytest.fixture(scope="module")
def compiled(listops_tiny_dir, tmp_path_factory):
    """The small run's programs in XLA's persistent cache (conftest), so that the jobs of a
    sweep, all starting at once, load them instead of each compiling them."""
    train_small(listops_tiny_dir, tmp_path_factory.mktemp("warm-up"))
    return listops_tiny_dir


def records_in(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*/record.json"))]


@COMPILED_GROUP
def test_joblib_sweep_runs_each_parallel_job_on_its_own_gpu_slot(compiled, tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # slots: 0 .. n_jobs-1
    out = sweep(compiled, tmp_path, "hydra/launcher=local_gpus", env={"LRA_NUM_GPUS": "2"})
    assert out.returncode == 0, out.stderr
    assert "Joblib.Parallel(n_jobs=2," in out.stdout + out.stderr
    records = records_in(tmp_path / "records")
    assert sorted(r["seed"] for r in records) == [0, 1]
    assert sorted(r["cuda_visible_devices"] for r in records) == ["0", "1"]
    summary = (tmp_path / "sweep" / "summary.md").read_text()
    assert summary.count("| done |") == 2 and "2 done." in summary
    assert sorted(p.name for p in (tmp_path / "sweep" / ".gpu_slots").iterdir()) == [
        "0.lock",
        "1.lock",
    ]
    logs = [(tmp_path / "sweep" / str(job) / "lra.log").read_text() for job in (0, 1)]
    assert all("GPU slot " in log for log in logs)


@COMPILED_GROUP
def test_submitit_local_sweep_writes_every_record_and_the_summary(compiled, tmp_path):
    out = sweep(compiled, tmp_path, "hydra/launcher=submitit_local")
    assert out.returncode == 0, out.stderr
    assert sorted(r["seed"] for r in records_in(tmp_path / "records")) == [0, 1]
    summary = (tmp_path / "sweep" / "summary.md").read_text()
    assert "2 done." in summary and summary in out.stdout
    assert len(list((tmp_path / "sweep" / ".submitit").glob("*/*_result.pkl"))) == 2
    assert not (tmp_path / "sweep" / cluster.SLOTS_FOLDER).exists()  # pinning is joblib's only


@pytest.fixture
def no_held_slot(monkeypatch):
    """This process holds no slot during the test; slots claimed in it are let go after."""
    monkeypatch.setattr(cluster, "_held", None)
    fds = []
    yield fds
    if cluster._held is not None:
        fds.append(cluster._held[1])
    for fd in fds:
        os.close(fd)


def hold(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def test_a_process_claims_the_lowest_free_slot_keeps_it_and_fails_when_none_is_free(
    tmp_path, no_held_slot
):
    tmp_path.joinpath("4.lock").touch()  # a lock file left by a dead holder is free
    no_held_slot.append(hold(tmp_path / "2.lock"))  # another process holds slot 2
    assert cluster.claim_gpu_slot(tmp_path, ["2", "4"]) == "4"
    assert cluster.claim_gpu_slot(tmp_path, ["2", "4"]) == "4"  # a second job keeps it
    assert cluster.held_slot() == "4"
    no_held_slot.append(cluster._held[1])
    cluster._held = None  # as a third process: slots 2 and 4 are both held
    with pytest.raises(ConfigError, match=r"no free GPU slot: all 2 slots \(2,4\) are held"):
        cluster.claim_gpu_slot(tmp_path, ["2", "4"])


def test_a_second_process_gets_the_next_slot_and_a_dead_holders_slot_is_free(
    tmp_path, no_held_slot
):
    first = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from lra.run.cluster import claim_gpu_slot; "
            f"print(claim_gpu_slot({str(tmp_path)!r}, ['0', '1']), flush=True); "
            "sys.stdin.readline()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert first.stdout.readline().strip() == "0"
    assert cluster.claim_gpu_slot(tmp_path, ["0", "1"]) == "1"
    first.communicate("\n", timeout=30)  # the first process ends: the kernel drops its lock
    no_held_slot.append(cluster._held[1])
    cluster._held = None
    assert cluster.claim_gpu_slot(tmp_path, ["0", "1"]) == "0"


def test_slots_are_the_visible_devices_at_launch_else_one_per_job(monkeypatch):
    monkeypatch.setattr(cluster, "_launch_visible", None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 5")
    assert cluster.gpu_slots(8) == ["3", "5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # a slot was pinned: the launch value holds
    assert cluster.gpu_slots(8) == ["3", "5"]
    monkeypatch.setattr(cluster, "_launch_visible", None)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert cluster.gpu_slots(3) == ["0", "1", "2"]


def test_pinning_leaves_runs_outside_a_joblib_sweep_alone(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    assert cluster.pin_local_gpu() is None  # no Hydra run in this process
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "7"


def hydra_config(*overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=True)


def test_slurm_launcher_config_composes_with_one_gpu_per_job(monkeypatch):
    monkeypatch.setenv("LRA_SLURM_PARTITION", "gpu")
    launcher = hydra_config("hydra/launcher=slurm", "hydra.sweep.dir=/sweeps/a").hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert launcher.partition == "gpu"
    assert (launcher.gpus_per_node, launcher.tasks_per_node, launcher.nodes) == (1, 1, 1)
    assert launcher.timeout_min == 240 and launcher.max_num_timeout > 0
    assert launcher.cpus_per_task > 0 and launcher.mem_gb > 0
    assert launcher.submitit_folder == "/sweeps/a/.submitit/%j"
    monkeypatch.delenv("LRA_SLURM_PARTITION")
    assert hydra_config("hydra/launcher=slurm").hydra.launcher.partition is None


def test_local_gpus_launcher_config_runs_one_job_per_gpu(monkeypatch):
    monkeypatch.delenv("LRA_NUM_GPUS", raising=False)
    launcher = hydra_config("hydra/launcher=local_gpus").hydra.launcher
    assert launcher._target_.endswith("JoblibLauncher")
    assert launcher.n_jobs == 1 and launcher.prefer == "processes"
    monkeypatch.setenv("LRA_NUM_GPUS", "4")
    n_jobs = hydra_config("hydra/launcher=local_gpus").hydra.launcher.n_jobs
    assert n_jobs == 4 and isinstance(n_jobs, int)


def test_slurm_launcher_config_makes_a_one_gpu_sbatch_script(monkeypatch, tmp_path):
    """The script submitit would hand to sbatch, built the way the launcher builds it."""
    import submitit
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf

    (tmp_path / "srun").write_text("#!/bin/sh\n")  # submitit looks for srun: a SLURM host
    (tmp_path / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("LRA_SLURM_PARTITION", "gpu")
    cfg = hydra_config("hydra/launcher=slurm", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    params = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    del params["_target_"]
    executor = submitit.AutoExecutor(
        cluster="slurm",
        folder=params.pop("submitit_folder"),
        slurm_max_num_timeout=params.pop("max_num_timeout"),
    )
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()})
    script = executor._executor._make_submission_file_text("lra-job", "uid")
    for line in [
        "#SBATCH --partition=gpu",
        "#SBATCH --gpus-per-node=1",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --time=240",
        "#SBATCH --signal=USR2@120",
        f"#SBATCH --output={tmp_path / 'sweep'}/.submitit/%j/%j_0_log.out",
    ]:
        assert line in script.splitlines()


def test_slurm_job_board_shows_pending_running_requeued_and_done_when_they_change():
    shown = []
    board = cluster.SlurmJobBoard(show=shown.append)
    for states in [
        ("PENDING", "PENDING"),
        ("PENDING", "PENDING"),  # no change: nothing new
        ("RUNNING", "RUNNING"),
        ("COMPLETED", "PENDING"),  # 7_1 ran before: requeued
        ("COMPLETED", "CANCELLED by 0"),
    ]:
        board.update({f"7_{i}": {"State": state} for i, state in enumerate(states)})
    board.update({"8": {"State": "COMPLETED", "RestartCnt": "2"}})  # squeue's restart count
    assert shown == [
        "SLURM jobs: 2 pending (7_0, 7_1), 0 done",
        "SLURM jobs: 2 running (7_0, 7_1), 0 done",
        "SLURM jobs: 1 requeued (7_1), 1 done",
        "SLURM jobs: 1 done, 1 failed (7_1)",
        "SLURM jobs: 1 done; requeued so far: 8 2x",
    ]


def test_slurm_watcher_without_accounting_says_so_once_and_follows_the_jobs_with_squeue(
    tmp_path, monkeypatch, caplog
):
    """sacct fails where accounting is off (submitit would warn three times a poll): the
    watcher says so once and reads the states from squeue; a job gone from it has ended."""
    pytest.importorskip("submitit")
    queue = tmp_path / "queue.txt"
    fake = {
        "sacct": "echo 'Slurm accounting storage is disabled' >&2; exit 1",
        "squeue": f'echo "$@" >> {tmp_path / "squeue.args"}; cat {queue}',
    }
    for name, body in fake.items():
        (tmp_path / name).write_text(f"#!/bin/sh\n{body}\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    watcher = cluster.slurm_watcher(poll_s=0)
    shown = []
    watcher.board = cluster.SlurmJobBoard(show=shown.append)
    for job in ("7", "7_0", "7_1"):
        watcher.register_job(job)
    queue.write_text("7_[0-1]|PENDING||0\n")
    caplog.set_level("INFO", logger="lra.run.cluster")
    watcher.update()
    queue.write_text("7_0|RUNNING|vm|0\n7_1|COMPLETED|vm|1\n")
    watcher.update()
    queue.write_text("7_1|COMPLETED|vm|1\n")  # 7_0 left the queue (MinJobAge): it ended
    watcher.update()
    notices = [r.message for r in caplog.records if "sacct" in r.message]
    assert len(notices) == 1 and "accounting storage is disabled" in notices[0]
    assert "following the SLURM jobs with squeue" in notices[0]
    assert watcher.get_state("7_0", mode="cache") == "GONE"
    assert watcher.is_done("7_1", mode="cache")
    assert shown == [
        "SLURM jobs: 2 pending (7_0, 7_1), 0 done",
        "SLURM jobs: 1 running (7_0), 1 done; requeued so far: 7_1 1x",
        "SLURM jobs: 1 done, 1 failed (7_0); requeued so far: 7_1 1x",
    ]
    args = (tmp_path / "squeue.args").read_text().splitlines()
    fields = "JobArrayID:|,State:|,NodeList:|,RestartCnt:"
    assert args[0] == f"--states=all --noheader --Format={fields} --jobs=7"


def test_a_submitit_job_names_the_sweep_command_to_rerun(monkeypatch):
    from lra.run.signals import rerun_command

    monkeypatch.setattr(sys, "argv", ["/venv/bin/lra-train", "seed=1"])
    assert rerun_command() == "lra-train seed=1"
    monkeypatch.setattr(sys, "argv", ["/venv/submitit/core/_submit.py", "/sweep/.submitit/7"])
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    assert rerun_command() == "the sweep's lra-train -m command"
