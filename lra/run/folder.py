"""The run folder: where one run's config, checkpoints, lock and record live.

``RunFolder(results_dir, config)`` names the folder from the run identity
(:mod:`lra.config.identity`); nothing is created until :meth:`RunFolder.claim`.
``config.json`` holds the full resolved config of the run (``lra-eval`` rebuilds
the model from it); ``record.json`` is the finished run's results record.
"""

import json
from pathlib import Path

from lra.atomic import write_atomic
from lra.config.identity import result_config, run_dir, run_key
from lra.config.types import ResumeMode, allowed
from lra.errors import ConfigError, DataError
from lra.record import store
from lra.run.checkpoint import delete_checkpoints

CONFIG_FILE = "config.json"
RECORD_FILE = "record.json"
RESUME_MODES = allowed(ResumeMode)


def _read_json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise DataError(f"cannot read {path} ({err}); delete it or the run folder") from None


class RunFolder:
    """The folder of the run described by ``config`` (a resolved plain dict)."""

    def __init__(self, results_dir: str | Path, config: dict):
        self.config = config
        self.key = run_key(config)
        self.path = run_dir(results_dir, config).resolve()

    @property
    def record_path(self) -> Path:
        return self.path / RECORD_FILE

    def finished_record(self) -> dict | None:
        """The record of this run if it has finished, else None."""
        return _read_json(self.record_path)

    def claim(self, resume: str) -> None:
        """Create the folder and write ``config.json``; call while holding the lock.

        ``resume="never"`` first deletes the folder's checkpoints and record. A
        folder whose ``config.json`` differs in a result-changing key cannot be
        reached by a hash of the same keys, so it means a damaged folder.
        """
        self.path.mkdir(parents=True, exist_ok=True)
        if resume == "never":
            delete_checkpoints(self.path)
            self.record_path.unlink(missing_ok=True)
        stored = _read_json(self.path / CONFIG_FILE)
        if stored is not None and result_config(stored) != result_config(self.config):
            raise ConfigError(
                f"run folder {self.path} holds a run of another config (its {CONFIG_FILE} "
                "differs); move that folder away"
            )
        text = json.dumps(self.config, indent=2, sort_keys=True) + "\n"
        write_atomic(self.path / CONFIG_FILE, text)

    def write_record(self, record: dict) -> Path:
        return write_atomic(self.record_path, store.record_text(record))


def read_run_config(folder: str | Path) -> dict:
    """The resolved config of the run in ``folder`` (for ``lra-eval``)."""
    folder = Path(folder).expanduser().resolve()
    config = _read_json(folder / CONFIG_FILE)
    if config is None:
        raise DataError(
            f"{folder} is not a run folder (no {CONFIG_FILE}); pass run=<results_dir>/"
            "<model>-<task>-s<seed>-<hash>, the run_dir named in a training record"
        )
    return config
