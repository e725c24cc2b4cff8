"""TensorBoard backend (``logger=tensorboard``; ``pip install -e '.[tensorboard]'``).

Event files are written with tensorboardX (no TensorFlow) to ``<run folder>/tensorboard/``,
one file per session; view every run of a results folder with
``tensorboard --logdir <results_dir>`` (each run folder shows as its own run).

Each logged scalar is one ``add_scalar(name, value, step)`` with the scalar names of
:mod:`lra.track`. The summary goes in at step 0 under ``summary/<key>``: numbers as
scalars, anything else as text (``add_text``).

Resuming: a session resumed from step ``S`` opens its writer with ``purge_step=S + 1``,
which writes a session-start marker at that step; TensorBoard then hides the events
of earlier files at steps ``S + 1`` and later, so the steps logged again show once. A
fresh session (``S = 0``) in a folder that already holds event files (a run restarted
from scratch) purges from step 1 the same way. The summary at step 0 is not purged:
a finished run opened again writes it a second time, with the same values.
"""

import numbers
import time
from pathlib import Path

from tensorboardX import SummaryWriter

EVENTS_FOLDER = "tensorboard"


class TensorBoardBackend:
    """Scalars of one run as TensorBoard event files."""

    def __init__(self, options: dict, info):
        self.logdir = Path(info.run_dir) / EVENTS_FOLDER
        earlier = self.logdir.is_dir() and any(self.logdir.glob("events.out.tfevents.*"))
        purge_step = info.resumed_step + 1 if info.resumed_step or earlier else None
        self.writer = SummaryWriter(
            logdir=str(self.logdir),
            flush_secs=options.get("flush_secs", 30),
            purge_step=purge_step,
            # tensorboardX names a file by the second and host only: the suffix keeps a
            # second session in the same second from overwriting the first, in order.
            filename_suffix=f".{time.time_ns()}",
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, int(step))

    def summary(self, values: dict) -> None:
        for key, value in values.items():
            if isinstance(value, numbers.Real) and not isinstance(value, bool):
                self.writer.add_scalar(f"summary/{key}", value, 0)
            else:
                self.writer.add_text(f"summary/{key}", str(value), 0)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


def open_tensorboard(options: dict, info) -> TensorBoardBackend:
    """The backend of the run ``info`` (options of ``configs/logger/tensorboard.yaml``)."""
    return TensorBoardBackend(options, info)
