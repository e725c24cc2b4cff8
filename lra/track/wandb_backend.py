"""Weights & Biases backend (``logger=wandb``; ``pip install -e '.[wandb]'``).

One wandb run per run folder: its id comes from the run key (:func:`run_id`), so a
resumed run continues the same wandb run (``resume="allow"``), and each job of a
multirun sweep in one process gets its own run (``reinit="create_new"``, wandb 0.19.10+).
``WANDB_MODE`` (online, offline, disabled) and ``WANDB_API_KEY`` are read by wandb
itself and never overridden here.

What is written where: wandb's files go to the run folder's ``wandb/`` subfolder
(``<run folder>/wandb/run-*`` online, ``<run folder>/wandb/offline-run-*`` offline;
one such folder per session). Offline runs are uploaded later with
``wandb sync <run folder>/wandb/offline-run-*`` (every session of a resumed run lands
in the same wandb run). ``<run folder>/wandb/lra-last-step.json`` holds the last step
this backend sent to wandb.

Resuming without double steps: wandb accepts only steps that increase, and a resumed
session repeats the steps between its checkpoint and the point where the earlier
session stopped (with the same values). On opening, the backend takes the highest step
already logged to this wandb run: the run's ``starting_step`` (the next step the
server accepts, online) and ``lra-last-step.json`` (the last step sent by an earlier
session, the only record of it offline). Steps up to that one are skipped; later
ones are logged. Summary values go into ``run.summary``.
"""

import json
import re
from pathlib import Path

import wandb

from lra.atomic import write_atomic

LAST_STEP_FILE = "lra-last-step.json"
MAX_ID_LENGTH = 64


def run_id(run_key: str) -> str:
    """The wandb run id of a run key: lowercase ``[a-z0-9_-]``, at most 64 characters.

    A longer key is cut in the middle, keeping its trailing config hash.
    """
    rid = re.sub(r"[^a-z0-9_-]", "-", run_key.lower())
    if len(rid) <= MAX_ID_LENGTH:
        return rid
    head, sep, tail = rid.rpartition("-")
    if not sep or len(tail) >= MAX_ID_LENGTH // 2:
        return rid[-MAX_ID_LENGTH:]
    return head[: MAX_ID_LENGTH - len(tail) - 1] + "-" + tail


def _last_logged_step(path: Path, rid: str) -> int:
    """The last step an earlier session sent to the wandb run ``rid`` (0 if none)."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return 0
    if not isinstance(saved, dict) or saved.get("id") != rid:
        return 0
    return int(saved.get("step", 0))


class WandbBackend:
    """Logs scalars to one wandb run, skipping the steps it already holds."""

    def __init__(self, options: dict, info):
        self.id = run_id(info.run_key)
        run_dir = Path(info.run_dir)
        self.run = wandb.init(
            project=options.get("project"),
            entity=options.get("entity"),
            group=options.get("group") or info.group,
            name=options.get("name") or f"{info.model}-{info.task}-s{info.seed}",
            tags=list(options.get("tags") or []) + list(info.tags),
            config=info.config,
            id=self.id,
            resume="allow",
            dir=str(run_dir),
            reinit="create_new",
        )
        self.marker = run_dir / "wandb" / LAST_STEP_FILE
        # Nothing reaches disk with WANDB_MODE=disabled: keep no marker then.
        self.keep_marker = not getattr(self.run, "disabled", False)
        self.logged_through = max(
            int(self.run.starting_step or 0) - 1,
            _last_logged_step(self.marker, self.id) if self.keep_marker else 0,
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        step = int(step)
        if step <= self.logged_through:
            return  # logged by an earlier session, with the same values
        self.run.log(dict(metrics), step=step)
        if self.keep_marker:
            write_atomic(self.marker, json.dumps({"id": self.id, "step": step}) + "\n")

    def summary(self, values: dict) -> None:
        self.run.summary.update(dict(values))

    def close(self) -> None:
        self.run.finish()


def open_wandb(options: dict, info) -> WandbBackend:
    """The wandb backend of the run ``info`` with the options of ``configs/logger/wandb.yaml``."""
    return WandbBackend(options, info)
