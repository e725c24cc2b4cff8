"""One GPU per job when a sweep runs its jobs in parallel on one machine.

``lra-train -m hydra/launcher=local_gpus ...`` (``configs/hydra/launcher/local_gpus.yaml``)
runs the jobs of a sweep in the worker processes of joblib's loky pool, ``n_jobs`` at a
time. A worker is reused for job after job, and JAX binds its GPUs once per process, when
it starts its backends, so a GPU cannot be chosen by job number (jobs 0 and 2 may share
a worker, jobs 1 and 2 may run at once). Instead :func:`pin_local_gpu`, called at the
start of every training job, makes the *process* claim a GPU slot and keep it:

* the slots are the entries of ``CUDA_VISIBLE_DEVICES`` as it was when the sweep started,
  if it is set, else ``0 .. n_jobs-1``;
* the process takes the lowest free slot by holding an exclusive, non-blocking
  ``fcntl.flock`` on ``<sweep dir>/.gpu_slots/<slot>.lock`` for the rest of its life (the
  kernel drops the lock when the process dies, however it dies, so a slot of a dead worker
  is free again);
* it sets ``CUDA_VISIBLE_DEVICES`` to that one slot and ``XLA_PYTHON_CLIENT_PREALLOCATE``
  to ``false`` (JAX would otherwise take 75% of the GPU's memory at start), before JAX
  starts a backend, and logs the slot.

A later job in the same process keeps the slot. No free slot (more workers than GPUs)
is a :class:`~lra.errors.ConfigError`. Other launchers (the basic one, submitit on SLURM,
where the scheduler gives each job its GPU) and single runs are left alone.
"""

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from lra.device.measure import jax_backends_started
from lra.errors import ConfigError
from lra.run.lock import try_flock

SLOTS_FOLDER = ".gpu_slots"
log = logging.getLogger("lra.run.cluster")

# The slot this process holds: (slot, lock file descriptor), kept open for the process's life.
_held: tuple[str, int] | None = None
# CUDA_VISIBLE_DEVICES as this process found it, before a slot replaced it.
_launch_visible: str | None = None


def _try_lock(path: Path) -> int | None:
    fd = try_flock(path)
    if fd is None:
        return None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # who holds it, for a curious user
    return fd


def claim_gpu_slot(slots_dir: str | Path, slots: list[str], wait_s: float = 0.0) -> str:
    """Claim the lowest free slot of ``slots`` for this process; return it.

    A slot is free when nobody holds ``<slots_dir>/<slot>.lock``. The lock is held until
    the process ends; if this process holds a slot already, that slot is returned. Without
    a free slot, tries again for ``wait_s`` seconds (a worker being replaced may still hold
    one), then raises :class:`ConfigError`.
    """
    global _held
    if _held is not None:
        return _held[0]
    if not slots:
        raise ConfigError("no GPU slots to claim: CUDA_VISIBLE_DEVICES is empty")
    folder = Path(slots_dir)
    folder.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_s
    while True:
        for slot in slots:
            fd = _try_lock(folder / f"{slot}.lock")
            if fd is not None:
                _held = (slot, fd)
                return slot
        if time.monotonic() >= deadline:
            raise ConfigError(
                f"no free GPU slot: all {len(slots)} slots ({','.join(slots)}) are held by "
                f"other processes (lock files in {folder}); run at most as many parallel "
                "jobs as GPUs (LRA_NUM_GPUS, hydra.launcher.n_jobs) or free a GPU"
            )
        time.sleep(0.5)


def held_slot() -> str | None:
    """The GPU slot this process holds, if any."""
    return None if _held is None else _held[0]


def _num_jobs(n_jobs) -> int:
    """joblib's meaning of ``n_jobs``: a negative value counts back from the CPU count."""
    n = int(n_jobs if n_jobs is not None else 1)
    if n < 0:
        n = (os.cpu_count() or 1) + 1 + n
    return max(n, 1)


def gpu_slots(n_jobs) -> list[str]:
    """The slots to share: the entries of CUDA_VISIBLE_DEVICES at launch, else 0..n_jobs-1."""
    global _launch_visible
    if _launch_visible is None:
        _launch_visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if _launch_visible.strip():
        return [s.strip() for s in _launch_visible.split(",") if s.strip()]
    return [str(i) for i in range(_num_jobs(n_jobs))]


def pin_local_gpu(wait_s: float = 30.0) -> str | None:
    """In a joblib multirun job, give this process one GPU of its own; return its slot.

    Returns None (and changes nothing) outside a Hydra multirun run by the joblib launcher.
    Call it before anything in the process starts a JAX backend.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return None
    hydra = HydraConfig.get()
    target = str(hydra.launcher.get("_target_", ""))
    if hydra.mode != RunMode.MULTIRUN or not target.endswith("JoblibLauncher"):
        return None
    if _held is not None and jax_backends_started():
        return _held[0]  # a later job of this worker: it already runs on its GPU
    if _held is None and jax_backends_started():
        log.warning(
            "JAX started its backends in this process before the job took a GPU slot; "
            "the job uses every device this process sees"
        )
        return None
    slots = gpu_slots(hydra.launcher.get("n_jobs"))
    slot = claim_gpu_slot(Path(hydra.sweep.dir) / SLOTS_FOLDER, slots, wait_s=wait_s)
    os.environ["CUDA_VISIBLE_DEVICES"] = slot
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    log.info(f"GPU slot {slot} (CUDA_VISIBLE_DEVICES={slot}), process {os.getpid()}")
    return slot


# --- Following a sweep's SLURM jobs (hydra/launcher=slurm) ------------------------------------

#: How often (at most every this many seconds) the launching process asks SLURM for the states
#: of its jobs (``$LRA_SLURM_POLL_S`` if set); submitit's own watcher backs off to once every
#: 10 minutes. A job that writes its result is seen within a second whatever this is; a job
#: that ends without one (cancelled, timed out) is seen at the next poll.
SLURM_POLL_S = 15.0
_SLURM_CATEGORIES = ("pending", "running", "requeued", "done", "failed")
# STOPPED: sent SIGSTOP (``scancel --signal=STOP``), still holding its node; not an end.
_RUNNING_STATES = {
    "RUNNING",
    "COMPLETING",
    "CONFIGURING",
    "STAGE_OUT",
    "SIGNALING",
    "RESIZING",
    "STOPPED",
}
# squeue's fields for the watcher (--Format names), as submitit's sacct columns and one more.
SQUEUE_FIELDS = ("JobArrayID", "State", "NodeList", "RestartCnt")
SQUEUE_HEADER = b"JobID|State|NodeList|RestartCnt\n"
_REQUEUED_STATES = {"REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "PREEMPTED"}
_WAITING_STATES = {"PENDING", "UNKNOWN", "READY", "SUSPENDED", "RESV_DEL_HOLD"}
# A job in any of these has not ended (submitit's own list lacks STOPPED and SUSPENDED).
_LIVE_STATES = _RUNNING_STATES | _REQUEUED_STATES | _WAITING_STATES


class SlurmJobBoard:
    """The states of a sweep's SLURM jobs, as one console line each time they change.

    A job is *pending*, *running*, *requeued* (pending again after it ran: a pre-emption or
    a time limit, see :mod:`lra.run.signals`), *done* (COMPLETED) or *failed* (any other
    end: FAILED, CANCELLED, TIMEOUT, OUT_OF_MEMORY, or gone from the queue). Jobs that were
    requeued are named at the end with how often (squeue's restart count, where known).
    """

    def __init__(self, show=None):
        self._ran: set[str] = set()
        self._last = ""
        self._show = show or log.info

    def category(self, job_id: str, state: str, restarts: int = 0) -> str:
        state = state.split()[0].upper() if state else "UNKNOWN"
        if state in _RUNNING_STATES:
            self._ran.add(job_id)
            return "running"
        if state in _REQUEUED_STATES or (state == "PENDING" and (job_id in self._ran or restarts)):
            return "requeued"
        if state in _WAITING_STATES:
            return "pending"
        return "done" if state == "COMPLETED" else "failed"

    def line(self, jobs: dict[str, dict]) -> str:
        """``SLURM jobs: 1 running (7_0), 1 requeued (7_1), 0 done`` for ``{job id: info}``
        (``info``: submitit's watcher entry, ``State`` and, from squeue, ``RestartCnt``)."""
        groups: dict[str, list[str]] = {c: [] for c in _SLURM_CATEGORIES}
        requeues = []
        for job_id in sorted(jobs, key=_job_order):
            info = jobs[job_id]
            count = str(info.get("RestartCnt", "")).strip()
            restarts = int(count) if count.isdigit() else 0
            groups[self.category(job_id, info.get("State", ""), restarts)].append(job_id)
            if restarts:
                requeues.append(f"{job_id} {restarts}x")
        parts = []
        for name, ids in groups.items():
            if not ids and name != "done":
                continue
            shown = f" ({', '.join(ids)})" if ids and name != "done" and len(ids) <= 8 else ""
            parts.append(f"{len(ids)} {name}{shown}")
        line = "SLURM jobs: " + ", ".join(parts)
        if requeues and len(requeues) <= 8:
            line += f"; requeued so far: {', '.join(requeues)}"
        return line

    def update(self, jobs: dict[str, dict]) -> None:
        """Show the line for ``jobs`` if it differs from the last one shown."""
        if not jobs:
            return
        line = self.line(jobs)
        if line != self._last:
            self._last = line
            self._show(line)


def _sweep_jobs(registered) -> list[str]:
    """The ids of a sweep's jobs among those submitit registered: not an array's own id
    (submitit registers it too, and squeue never shows it: its tasks stand for it)."""
    arrays = {j.split("_")[0] for j in registered if "_" in j}
    return [j for j in registered if j not in arrays]


def _job_order(job_id: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in job_id.split("_"))


def _squeue_command(sacct_command: list[str]) -> list[str]:
    """submitit's ``sacct ... -j A -j B`` as ``squeue``: the same jobs, finished ones too."""
    ids = [sacct_command[i + 1] for i, arg in enumerate(sacct_command[:-1]) if arg == "-j"]
    fields = ",".join(f"{name}:|" for name in SQUEUE_FIELDS)[:-1]  # no padding, "|" between
    return ["squeue", "--states=all", "--noheader", f"--Format={fields}", f"--jobs={','.join(ids)}"]


def slurm_poll_s() -> float:
    """:data:`SLURM_POLL_S`, or ``$LRA_SLURM_POLL_S`` (seconds, at least 1) where set."""
    value = os.environ.get("LRA_SLURM_POLL_S", "").strip()
    try:
        return max(1.0, float(value)) if value else SLURM_POLL_S
    except ValueError:
        raise ConfigError(f"LRA_SLURM_POLL_S={value!r} is not a number of seconds") from None


def slurm_watcher(poll_s: float | None = None):
    """A submitit job-state watcher for clusters with or without accounting.

    submitit asks ``sacct`` for the states of its jobs; where accounting is disabled (small
    clusters, ``scripts/slurm_local.sh``) every poll fails and prints three ``Bypassing sacct
    error`` warnings. This watcher says once that it follows the jobs with ``squeue``
    instead, and does so from then on: squeue shows a finished job for ``MinJobAge``
    seconds (default 300) and then forgets it, which this watcher reads as the job's end. It
    polls at most every ``poll_s`` seconds (default :func:`slurm_poll_s`) and shows the
    jobs' states (:class:`SlurmJobBoard`) whenever they change. Needs submitit
    (``pip install -e '.[cluster]'``).
    """
    import subprocess

    from submitit.slurm.slurm import SlurmInfoWatcher

    class SweepWatcher(SlurmInfoWatcher):
        def __init__(self):
            super().__init__(delay_s=max(1, round(poll_s or slurm_poll_s())))
            self.use_squeue = False
            self.board = SlurmJobBoard()
            self._seen: set[str] = set()
            self._squeue_failed = False

        def _query(self, command: list[str]) -> bytes | None:
            try:
                out = subprocess.run(command, capture_output=True, check=True, timeout=60)
            except (OSError, subprocess.SubprocessError) as err:
                if command[0] == "sacct" and not self.use_squeue:
                    self.use_squeue = True
                    why = (
                        err.stderr.decode(errors="replace").strip()
                        if getattr(err, "stderr", b"")
                        else err
                    )
                    log.info(f"sacct does not answer ({why}): following the SLURM jobs with squeue")
                    return self._query(_squeue_command(command))
                if not self._squeue_failed:  # say it once; submitit also watches result files
                    self._squeue_failed = True
                    log.warning(
                        f"cannot read the SLURM job states ({' '.join(command[:1])}): {err}"
                    )
                return None
            return out.stdout

        def is_done(self, job_id: str, mode: str = "standard") -> bool:
            state = self.get_state(job_id, mode=mode)
            return (state.split()[0].upper() if state else "UNKNOWN") not in _LIVE_STATES

        def update(self) -> None:
            command = self._make_command()
            if command is not None:
                self._num_calls += 1
                if self.use_squeue:
                    command = _squeue_command(command)
                output = self._query(command)
                if output is not None:
                    if self.use_squeue:
                        output = SQUEUE_HEADER + output
                        info = self.read_info(output)
                        self._seen |= set(info)
                        pending = self._registered - self._finished
                        for gone in (self._seen & pending) - set(info):
                            info[gone] = {"JobID": gone, "State": "GONE", "NodeList": ""}
                    else:
                        info = self.read_info(output)
                    self._output = output
                    self._info_dict.update(info)
            self._last_status_check = time.time()
            for job_id in self._registered - self._finished:
                if self.is_done(job_id, mode="cache"):
                    self._finished.add(job_id)
            jobs = {j: self._info_dict.get(j, {}) for j in _sweep_jobs(self._registered)}
            self.board.update(jobs)

    return SweepWatcher()


#: Seconds to wait for the result file of a job that SLURM says ended without one (submitit
#: waits 15 s for every job, for slow shared file systems).
RESULT_GRACE_S = 2
# SLURM's states for an end that writes no result file (squeue's and sacct's names).
_ENDED_WITHOUT_RESULT = {
    "CANCELLED",
    "TIMEOUT",
    "FAILED",
    "OUT_OF_MEMORY",
    "NODE_FAIL",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
}


@dataclass
class ClusterEnd:
    """How a sweep job ended on SLURM without a result (``lra.run.sweep.cluster_ends``).

    ``state``: SLURM's state (``CANCELLED``, ``TIMEOUT``, ...; ``FAILED`` where submitit
    ended the job with an error, ``reason``, e.g. after ``max_num_timeout`` time limits);
    ``slurm_job``: its id (``123``, or ``123_4`` in an array); ``log``: its error log.
    """

    state: str
    slurm_job: str
    reason: str
    log: str


def _job_state(job) -> str:
    state = job.watcher.get_state(job.job_id, mode="cache")
    return state.split()[0].upper() if state else "UNKNOWN"  # sacct: "CANCELLED by 0"


def _last_line(error: Exception) -> str:
    """submitit's error (for a failed job: its traceback) as its last meaningful line."""
    lines = [line.strip() for line in str(error).splitlines()]
    lines = [line for line in lines if line and set(line) != {"-"}]
    return lines[-1] if lines else type(error).__name__


def _sweep_job(job) -> tuple[int, list[str]]:
    """The sweep job number and overrides of a SLURM job of hydra-submitit-launcher.

    Read from the job's submission, the launcher's call ``(overrides, job_dir_key, job_num,
    job_id, singleton_state)``; if that cannot be read, the array index and no overrides.
    """
    try:
        args = job.submission().args
        return int(args[2]), [str(o) for o in args[0]]
    except Exception:  # noqa: BLE001 - a best guess is enough for the summary row
        _, _, index = job.job_id.partition("_")
        return int(index) if index.isdigit() else 0, []


def end_jobs_with_rows() -> None:
    """Make submitit's ``SlurmJob.results`` (in this process) not raise for a job that ends
    without a result.

    hydra-submitit-launcher waits for its jobs' results in order and raises submitit's error
    at the first job without one (cancelled with ``scancel``, killed at its time limit, out of
    memory, on a failed node, or ended by submitit after ``max_num_timeout`` time limits): a
    traceback and the job's whole error log, and no sweep summary. After this call such a
    job's result is an empty, completed ``JobReturn``, and its :class:`ClusterEnd` goes to
    ``lra.run.sweep.cluster_ends``: the summary shows it as the job's row with one line
    (:func:`lra.run.sweep.cluster_end_row`), and ``lra-train -m`` still exits 1. Nor does it
    wait 15 s for the result file of a job that SLURM says ended without one
    (:data:`RESULT_GRACE_S`). (submitit makes its array jobs as ``SlurmJob`` whatever the
    executor's ``job_class``, so the method itself is replaced, as the watcher is.)
    """
    from hydra.core.utils import JobReturn, JobStatus
    from submitit.core.utils import FailedJobError, UncompletedJobError
    from submitit.slurm.slurm import SlurmJob

    from lra.run import sweep

    if getattr(SlurmJob.results, "ends_with_rows", False):
        return
    results_or_raise = SlurmJob.results

    def results(self):
        self.wait()
        if not self._sub_jobs and not self.paths.result_pickle.exists():
            if _job_state(self) in _ENDED_WITHOUT_RESULT:
                self._results_timeout_s = RESULT_GRACE_S
        try:
            return results_or_raise(self)
        except UncompletedJobError as err:
            reason = _last_line(err) if isinstance(err, FailedJobError) else ""
            state = "FAILED" if reason else _job_state(self)
            end = ClusterEnd(state, self.job_id, reason, str(self.paths.stderr))
            number, overrides = _sweep_job(self)
            sweep.cluster_ends[number] = (end, overrides)
            return [JobReturn(overrides=overrides, status=JobStatus.COMPLETED)]

    results.ends_with_rows = True
    SlurmJob.results = results


def follow_slurm_jobs(hydra_cfg) -> bool:
    """In the process that launches a SLURM sweep, use :func:`slurm_watcher` and
    :func:`end_jobs_with_rows`; True if it did.

    ``hydra_cfg`` is the ``hydra`` config; other launchers are left alone. Call before the
    launcher submits the jobs (``SweepSummary.on_multirun_start``).
    """
    target = str(hydra_cfg.launcher.get("_target_", ""))
    if not target.endswith("SlurmLauncher"):
        return False
    from submitit.slurm.slurm import SlurmJob

    SlurmJob.watcher = slurm_watcher()
    end_jobs_with_rows()
    return True


def show_final_slurm_states(wait_s: float = 10.0) -> None:
    """At the end of a SLURM sweep, the jobs' last states (and requeues), asked now.

    A job has written its result a moment before SLURM marks it ended: waits up to
    ``wait_s`` seconds for SLURM to catch up.
    """
    try:
        from submitit.slurm.slurm import SlurmJob
    except ImportError:
        return
    watcher = SlurmJob.watcher
    if not hasattr(watcher, "board") or not watcher._registered:
        return
    deadline = time.monotonic() + wait_s
    while True:
        watcher._finished = set()  # ask for every job once more
        watcher.update()
        jobs = _sweep_jobs(watcher._registered)
        states = [watcher._info_dict.get(j, {}).get("State", "") for j in jobs]
        ended = all(s and s.split()[0] not in _RUNNING_STATES for s in states)
        if ended or time.monotonic() > deadline:
            return
        time.sleep(0.5)
