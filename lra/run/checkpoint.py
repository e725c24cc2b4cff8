"""Checkpoints of a training run with orbax-checkpoint.

A checkpoint at step ``s`` is ``<run folder>/checkpoints/<s>/`` with three items:

* ``state``: the train state (params, optimizer state, step) as host arrays,
* ``best``: the parameters with the best validation accuracy so far (only under
  ``trainer.selection=best_val``, once a validation has run), so every checkpoint
  holds the model its run would select,
* ``progress``: JSON of everything else the loop carries (:class:`Progress`):
  history, the metrics of steps not yet logged, best-so-far, timer sums, wall
  time, resume points. The data order needs no position of its own: batch ``s``
  is a function of (seed, s), and dropout keys are ``fold_in(key, s)``.

Orbax writes each checkpoint into a temporary folder and renames it into place
when complete, so a save interrupted by a kill never becomes the latest; leftover
temporary folders are removed when the manager opens. Saves are asynchronous:
the state is copied to host memory (so buffers donated to the next step cannot
change it) and written in the background. The last ``keep`` checkpoints are kept.
"""

import dataclasses
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp

from lra.errors import LRAError

CHECKPOINT_DIR = "checkpoints"

logging.getLogger("absl").setLevel(logging.WARNING)  # orbax logs every save at INFO


class CheckpointError(LRAError):
    """A checkpoint exists but cannot be read, or the one asked for does not exist."""


@dataclass
class Progress:
    """The loop's state besides the train state; saved as JSON in every checkpoint."""

    step: int = 0
    started_at: str = ""  # when the run's first session started
    history: list = field(default_factory=list)
    pending: list = field(default_factory=list)  # metrics of steps since the last log line
    best_accuracy: float = -1.0
    best_step: int = 0
    train_steps: int = 0  # timed training steps and their seconds (speed = ratio)
    train_seconds: float = 0.0
    eval_steps: int = 0
    eval_seconds: float = 0.0
    wall_seconds: float = 0.0  # of the sessions before this one
    checkpoint_saves: int = 0
    checkpoint_seconds: float = 0.0  # time the loop was blocked by saves
    resumed_from: list = field(default_factory=list)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Progress":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def host_copy(tree):
    """A host (NumPy) copy of every array in ``tree``, never a view of a device buffer."""
    return jax.tree.map(lambda x: np.array(x, copy=True), jax.device_get(tree))


def _host_like(tree):
    return jax.tree.map(lambda x: np.empty(np.shape(x), np.asarray(x).dtype), tree)


class Checkpoints:
    """The orbax manager of one run folder, with the run's save cadence.

    ``every_steps`` and ``every_minutes`` (0 = off) say when :meth:`due` is true;
    ``keep`` is how many of the newest checkpoints stay on disk.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        keep: int = 2,
        every_steps: int = 0,
        every_minutes: float = 0.0,
    ):
        self.folder = Path(run_dir).resolve() / CHECKPOINT_DIR
        self.every_steps = int(every_steps)
        self.every_seconds = float(every_minutes) * 60.0
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max(1, int(keep)), create=True, cleanup_tmp_directories=True
        )
        try:
            self.manager = ocp.CheckpointManager(self.folder, options=options)
        except Exception as err:  # orbax raises its own and OS errors
            raise self._unreadable(err) from err
        self._last_save = time.monotonic()
        self.last_saved_step = self.latest_step()

    def _unreadable(self, err: BaseException, step: int | None = None) -> CheckpointError:
        where = "" if step is None else f" at step {step}"
        return CheckpointError(
            f"cannot read the checkpoint{where} in {self.folder} ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}); start this run afresh with "
            "trainer.resume=never (its checkpoints are deleted)"
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def due(self, step: int) -> bool:
        """Whether a save is due after ``step`` (by step count or by wall time)."""
        if self.every_steps and step % self.every_steps == 0:
            return True
        return bool(self.every_seconds) and time.monotonic() - self._last_save >= self.every_seconds

    def save(self, step: int, state, best_params, progress: Progress) -> float:
        """Start saving step ``step``; return the seconds the caller was blocked."""
        if step == self.last_saved_step:
            return 0.0
        start = time.perf_counter()
        items = {
            "state": ocp.args.StandardSave(host_copy(state)),
            "progress": ocp.args.JsonSave(progress.to_json()),
        }
        if best_params is not None:
            items["best"] = ocp.args.StandardSave(host_copy(best_params))
        self.manager.save(step, args=ocp.args.Composite(**items))
        self.last_saved_step = step
        self._last_save = time.monotonic()
        return time.perf_counter() - start

    def _has_best(self, step: int) -> bool:
        return (self.folder / str(step) / "best").is_dir()

    def _restore(self, step: int, **items):
        if step not in self.manager.all_steps():
            raise CheckpointError(
                f"no checkpoint at step {step} in {self.folder}; kept steps: "
                f"{', '.join(map(str, self.all_steps())) or 'none'}"
            )
        try:
            return self.manager.restore(step, args=ocp.args.Composite(**items))
        except Exception as err:
            raise self._unreadable(err, step) from err

    def restore_progress(self, step: int) -> Progress:
        data = self._restore(step, progress=ocp.args.JsonRestore())["progress"]
        return Progress.from_json(data)

    def restore(self, step: int, state_like):
        """``(state, best_params or None, progress)`` of ``step`` as host arrays."""
        progress = self.restore_progress(step)
        items = {"state": ocp.args.StandardRestore(_host_like(state_like))}
        if self._has_best(step):
            items["best"] = ocp.args.StandardRestore(_host_like(state_like.params))
        out = self._restore(step, **items)
        return out["state"], out.get("best"), progress

    def restore_params(self, step: int, state_like, *, best: bool):
        """The parameters of ``step``: the best-validation ones (``best``) or the state's."""
        if not best:
            return self._restore(step, state=ocp.args.StandardRestore(_host_like(state_like)))[
                "state"
            ].params
        if not self._has_best(step):
            raise CheckpointError(
                f"the checkpoint at step {step} in {self.folder} holds no best-validation "
                "parameters (no validation had run, or trainer.selection=last)"
            )
        like = _host_like(state_like.params)
        return self._restore(step, best=ocp.args.StandardRestore(like))["best"]

    def wait(self) -> list[int]:
        """Wait for saves in flight; return the kept steps."""
        self.manager.wait_until_finished()
        return self.all_steps()

    def close(self) -> None:
        """Wait for saves in flight, then release the manager."""
        self.manager.wait_until_finished()
        self.manager.close()


def delete_checkpoints(run_dir: str | Path) -> None:
    """Remove every checkpoint of a run folder (``trainer.resume=never``)."""
    shutil.rmtree(Path(run_dir) / CHECKPOINT_DIR, ignore_errors=True)


def start_or_resume(ckpts: Checkpoints, fresh_state, mode: str, note: dict):
    """``(state, best_params, progress)`` to start from under ``trainer.resume=mode``.

    ``auto`` continues from the newest checkpoint when there is one, ``must``
    requires one, ``never`` (whose checkpoints the run folder already deleted)
    starts afresh. ``note`` (when, where, which code) is appended to the
    progress's ``resumed_from`` when a checkpoint is restored.
    """
    step = ckpts.latest_step()
    if step is None:
        if mode == "must":
            raise CheckpointError(
                f"trainer.resume=must, but {ckpts.folder} holds no checkpoint; "
                "start the run with trainer.resume=auto"
            )
        return fresh_state, None, Progress(started_at=note.get("at", ""))
    state, best_params, progress = ckpts.restore(step, fresh_state)
    progress.resumed_from.append({"step": step, **note})
    return state, best_params, progress
