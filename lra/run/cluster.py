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

import fcntl
import logging
import os
import time
from pathlib import Path

from lra.device.measure import jax_backends_started
from lra.errors import ConfigError

SLOTS_FOLDER = ".gpu_slots"
log = logging.getLogger("lra.run.cluster")

# The slot this process holds: (slot, lock file descriptor), kept open for the process's life.
_held: tuple[str, int] | None = None
# CUDA_VISIBLE_DEVICES as this process found it, before a slot replaced it.
_launch_visible: str | None = None


def _try_lock(path: Path) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
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
