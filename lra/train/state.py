"""What the training loop carries from step to step, and what it works with.

:class:`LoopState` is the loop's one mutable state: the train state on the devices, the
best-validation parameters, the timers, the metrics of steps not yet logged and the
:class:`lra.run.checkpoint.Progress` (step, history, best so far, resume points) that a
checkpoint saves. :meth:`LoopState.checkpoint_note` builds that Progress in one call;
:meth:`LoopState.resume` builds the state from a restored one.

:class:`LoopContext` is what the loop's actions (:mod:`lra.train.hooks`) work with and
never change: the compiled steps, the data, the checkpoint manager, the stop signals,
the trackers and the progress display.
"""

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax

from lra.device.measure import WindowTimer
from lra.run.checkpoint import Checkpoints, Progress
from lra.run.signals import StopSignals
from lra.track import Trackers
from lra.track.progress import ProgressDisplay
from lra.train.compile import Compiled
from lra.train.parallel import Topology


@dataclass
class LoopState:
    """The loop's state; ``progress`` is what the last checkpoint saved (or restored), with
    ``history`` and the best so far kept current step by step."""

    train: Any  # lra.train.steps.TrainState, on the devices
    best_params: Any  # host copy of the best-validation parameters, or None
    progress: Progress
    train_timer: WindowTimer  # timed training steps (the warm-up and saves are not timed)
    eval_timer: WindowTimer  # validation (and, at the end, test) passes
    pending: list  # metrics (device arrays) of the steps since the last log line
    prior_wall: float  # wall seconds of the sessions before this one
    session_start: float  # time.perf_counter() when this session started
    timed: int | None = None  # steps in the open timing window; None before the warm-up step

    @classmethod
    def resume(cls, train, best_params, progress: Progress, session_start: float) -> "LoopState":
        """The state to continue from ``progress`` (fresh, or restored from a checkpoint)."""
        return cls(
            train=train,
            best_params=best_params,
            progress=progress,
            train_timer=WindowTimer(progress.train_steps, progress.train_seconds),
            eval_timer=WindowTimer(progress.eval_steps, progress.eval_seconds),
            pending=list(progress.pending),
            prior_wall=progress.wall_seconds,
            session_start=session_start,
        )

    def wall_seconds(self) -> float:
        """Wall time of the run so far, over all its sessions."""
        return self.prior_wall + time.perf_counter() - self.session_start

    def count_step(self) -> None:
        """Count a step into the timing window; the session's first step is the untimed
        warm-up: await it, then open the first window."""
        if self.timed is None:
            jax.block_until_ready(self.train)
            self.open_window()
        else:
            self.timed += 1

    def close_window(self) -> None:
        """Await the steps of the open timing window and add them to the train timer."""
        self.train_timer.stop(self.timed, self.train)

    def open_window(self) -> None:
        self.train_timer.start()
        self.timed = 0

    def checkpoint_note(self, step: int) -> Progress:
        """The progress after ``step``, as a checkpoint saves it (it becomes ``progress``)."""
        self.progress = dataclasses.replace(
            self.progress,
            step=step,
            pending=[{k: float(v) for k, v in m.items()} for m in jax.device_get(self.pending)],
            train_steps=self.train_timer.steps,
            train_seconds=self.train_timer.seconds,
            eval_steps=self.eval_timer.steps,
            eval_seconds=self.eval_timer.seconds,
            wall_seconds=self.wall_seconds(),
        )
        return self.progress


@dataclass
class LoopContext:
    """What the loop works with during one session."""

    trainer: Any  # cfg.trainer
    topology: Topology
    compiled: Compiled
    splits: dict  # split name -> lra.data.store split
    ckpts: Checkpoints
    stop: StopSignals
    trackers: Trackers
    display: ProgressDisplay
    learning_rate: Callable[[int], Any]  # the optimizer's schedule, for the logs
    # Select the lowest validation loss (self-pretraining) instead of the best accuracy.
    select_on_loss: bool = False
    # Called as on_validate(step, val_accuracy) after each validation (lra-tune's pruner).
    on_validate: Callable[[int, float], None] | None = None

    @property
    def num_steps(self) -> int:
        return int(self.trainer.num_steps)
