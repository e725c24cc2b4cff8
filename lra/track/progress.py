"""Training progress for a person watching: a bar on a terminal, log lines elsewhere.

On an interactive terminal a tqdm bar shows the step, steps/s, the last training
loss and accuracy, the latest validation accuracy and tqdm's estimate of the time
left. Where stderr is not a terminal (a SLURM log, CI, a pipe) a redrawn bar is
noise, so each update is one log line instead:
``step 500/2000  loss 1.2345  acc 0.456  18.3 steps/s  val 0.512  left 1m22s``.
"""

import logging
import sys

from tqdm import tqdm

log = logging.getLogger("lra.train.loop")


def duration(seconds: float) -> str:
    """``1h02m``, ``3m07s`` or ``42s``."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class ProgressDisplay:
    """``update`` at every log step; ``close`` at the end. Silent when not ``enabled``."""

    def __init__(self, total: int, initial: int, enabled: bool, interactive: bool | None = None):
        self.total, self.enabled = total, enabled
        self.interactive = sys.stderr.isatty() if interactive is None else interactive
        self.val_accuracy: float | None = None
        self.bar = tqdm(
            total=total,
            initial=initial,
            disable=not (enabled and self.interactive),
            unit="step",
            dynamic_ncols=True,
        )

    def update(
        self,
        step: int,
        loss: float,
        accuracy: float,
        steps_per_sec: float | None,
        val_accuracy: float | None = None,
    ) -> None:
        if val_accuracy is not None:
            self.val_accuracy = val_accuracy
        val = "-" if self.val_accuracy is None else f"{self.val_accuracy:.3f}"
        rate = "-" if not steps_per_sec else f"{steps_per_sec:.2f}"
        if self.interactive:
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix(
                loss=f"{loss:.4f}", acc=f"{accuracy:.3f}", steps_per_sec=rate, val=val
            )
        elif self.enabled:
            left = duration((self.total - step) / steps_per_sec) if steps_per_sec else "-"
            log.info(
                f"step {step}/{self.total}  loss {loss:.4f}  acc {accuracy:.3f}  "
                f"{rate} steps/s  val {val}  left {left}"
            )

    def close(self) -> None:
        self.bar.close()
