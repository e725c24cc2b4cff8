"""The results record and the results store.

A record is one JSON file per run (training or benchmark) in ``results_dir``,
written atomically: the JSON goes to a temporary file in the same folder, is
flushed to disk, then renamed, so a reader never sees half a record. The store
is simply the folder; :func:`read_records` loads every record in it.
"""

import hashlib
import json
import os
import subprocess
import tempfile
import uuid
from datetime import UTC, datetime
from pathlib import Path

from lra.atomic import write_atomic
from lra.errors import DataError

SCHEMA_VERSION = 1

# Keys every training record carries (benchmark records add their own).
TRAIN_RECORD_KEYS = (
    "schema_version",
    "kind",
    "model",
    "task",
    "seed",
    "setting",
    "variant",
    "protocol",
    "overrides",
    "val_source",
    "test_accuracy",
    "val_accuracy",
    "selection",
    "selected_step",
    "train_steps_per_sec",
    "eval_steps_per_sec",
    "peak_memory_bytes",
    "memory_source",
    "flops_per_step",
    "num_params",
    "device",
    "device_count",
    "code_version",
    "config_hash",
    "started_at",
    "wall_seconds",
    "config",
    "init",  # {kind: scratch} or the self-pretraining it started from (lra.train.pretrain)
)
# Keys every self-pretraining stage's record (kind "pretrain") carries: no test split field.
PRETRAIN_RECORD_KEYS = (
    *(k for k in TRAIN_RECORD_KEYS if k not in ("test_accuracy", "val_accuracy", "init")),
    "objective",
    "mask_ratio",
    "selected_val_loss",
    "final_val_loss",
    "history",
)


def utc_now() -> str:
    """The current time as an ISO-8601 UTC string with seconds."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def config_hash(config: dict) -> str:
    """A short, stable hash of a resolved config (key order does not matter)."""
    canonical = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def code_version() -> str:
    """``git describe`` of the harness checkout (``-dirty`` if modified), else the version (an
    installed wheel: no checkout of its own, whatever repository its environment sits in)."""
    root = Path(__file__).resolve().parents[2]
    if not ((root / ".git").exists() and (root / "pyproject.toml").is_file()):
        from lra import __version__

        return __version__
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=12"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        from lra import __version__

        return __version__


def ensure_writable(results_dir: str | Path) -> Path:
    """Create ``results_dir`` if needed and prove it is writable, before any work is done."""
    path = Path(results_dir).expanduser().resolve()
    hint = "Choose a writable folder with results_dir=/some/writable/dir"
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as err:
        raise DataError(f"results_dir {path} is not writable ({err.strerror}). {hint}") from None
    return path


def record_filename(record: dict) -> str:
    """``<kind>__<model>__<task>__seed<seed>__<time>__<config hash>__<random>.json``.

    The random suffix keeps two runs started in the same second from colliding.
    """
    stamp = record["started_at"].replace(":", "").replace("-", "").replace("+0000", "Z")
    return (
        f"{record['kind']}__{record['model']}__{record['task']}__seed{record['seed']}"
        f"__{stamp}__{record['config_hash']}__{uuid.uuid4().hex[:6]}.json"
    )


def record_text(record: dict) -> str:
    """The JSON text of a record as it is stored."""
    return json.dumps(record, indent=2, sort_keys=True, allow_nan=True) + "\n"


def write_record(record: dict, results_dir: str | Path) -> Path:
    """Write ``record`` atomically into ``results_dir`` under a new unique name; return the path.

    Training records live in their run folder instead (:mod:`lra.run.folder`).
    """
    folder = ensure_writable(results_dir)
    return write_atomic(folder / record_filename(record), record_text(record))


# Folders inside run folders that hold no records (checkpoints are many small files).
NOT_RECORD_DIRS = ("checkpoints",)


def _json_files(folder: Path) -> list[Path]:
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d not in NOT_RECORD_DIRS and not d.startswith(".")]
        found += [
            Path(root) / f
            for f in files
            # lra-tune's <study>.study.json files are read by lra.report.tuning, not as records
            if f.endswith(".json") and not f.startswith(".") and not f.endswith(".study.json")
        ]
    return sorted(found)


def read_records(results_dir: str | Path) -> list[dict]:
    """Every record in ``results_dir`` (recursively, run folders included), with ``path`` added."""
    records = []
    for path in _json_files(Path(results_dir)):
        with path.open() as handle:
            try:
                record = json.load(handle)
            except json.JSONDecodeError as err:
                raise DataError(f"results record {path} is not valid JSON: {err}") from None
        if isinstance(record, dict) and "schema_version" in record:
            record["path"] = str(path)
            records.append(record)
    return records
