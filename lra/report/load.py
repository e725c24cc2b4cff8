"""The report's first step: read the records, fill in what older records lack, filter them.

The report runs in one direction: **load** (this module: read and filter records) ->
**aggregate** (:mod:`lra.report.leaderboard`, :mod:`lra.report.efficiency`,
:mod:`lra.report.figure_data`: pure data) -> **render** (:mod:`lra.report.tables`,
:mod:`lra.report.figure`, :mod:`lra.report.curves`), with :mod:`lra.report.main`
orchestrating. A module imports only modules before it in that chain.

``results_dir`` is one folder or a list of folders (default ``results/runs`` for training
records and ``results/bench`` for benchmark records), each searched recursively.

Training records (``kind="train"``) name the setting they were run with:

* ``setting``: 10 hex digits, the hash of the resolved config less the seed, paths,
  logging and device layout (records without it: :func:`lra.config.identity.result_hash`
  of their ``config``);
* ``variant``: the model name plus a suffix naming what was overridden (missing: the model);
* ``protocol``: ``lra_official``, ``transnormer`` or ``custom`` (missing: ``unspecified``);
* ``overrides``: ``{dotted key: value}`` of what was overridden (missing: ``{}``);
* ``val_source``: ``official``, ``train`` or ``test``, how the validation split was made
  (missing: ``unspecified``).

:func:`normalise` fills these in on a copy; every later step reads them from there.
"""

from datetime import UTC, datetime, timedelta
from pathlib import Path

from lra.config.identity import result_hash
from lra.errors import ConfigError, DataError
from lra.record.store import read_records

OFFICIAL_TASKS = ("listops", "text", "retrieval", "image", "pathfinder")
TASK_SETS = {
    "official": (OFFICIAL_TASKS, "pathx"),
    "tiny": (tuple(f"{t}_tiny" for t in OFFICIAL_TASKS), "pathx_tiny"),
}
TINY_NOTE = "tiny-task CPU numbers, not LRA scores"
BASELINE = "transformer"
MIB = 2**20
UNSPECIFIED = "unspecified"
PROTOCOL_ORDER = ("lra_official", "transnormer", "authors", "custom", UNSPECIFIED)
DEFAULT_RESULTS_DIRS = ("results/runs", "results/bench")
TRAIN_COMMANDS = (
    "lra-train -m experiment=figure1 (official tasks) or "
    "lra-train -m experiment=figure1_tiny (tiny CPU tasks)"
)


# ---------------------------------------------------------------- names and times


def relative_to_root(path: str | Path, root: str | Path | None) -> str | None:
    """``path`` relative to ``root`` when it lies inside it, else None."""
    if root is None:
        return None
    try:
        return str(Path(path).resolve().relative_to(Path(root).resolve()))
    except ValueError:
        return None


def record_name(record: dict, root: str | Path | None = None) -> str:
    """How a record is named in the report: its path relative to ``root``, else its file name."""
    path = record.get("path")
    if not path:
        return f"config_hash={record.get('config_hash')}"
    return relative_to_root(path, root) or Path(path).name


def run_folders(record: dict) -> list[Path]:
    """Where a training record's run files (metrics, predictions) may be: the folder the
    record was read from, when it has the run folder's name (a store that was moved or
    copied, e.g. committed results, uses its own files), then the ``run_dir`` it names."""
    run_dir = record.get("run_dir")
    folders = [Path(run_dir)] if run_dir else []
    here = Path(record["path"]).parent if record.get("path") else None
    if here is not None and (not run_dir or here.name == Path(run_dir).name):
        folders.insert(0, here)
    return folders


def started(record: dict) -> float:
    """``started_at`` as a UTC timestamp (naive times read as UTC; unparsable = oldest)."""
    try:
        when = datetime.fromisoformat(str(record.get("started_at") or ""))
    except ValueError:
        return float("-inf")
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def newest_by(records, key) -> tuple[dict, dict]:
    """Group ``records`` by ``key(record)``: ``(newest record, older records)`` per key."""
    groups: dict = {}
    for record in records:
        groups.setdefault(key(record), []).append(record)
    kept, superseded = {}, {}
    for k, group in groups.items():
        group.sort(key=lambda r: (started(r), str(r.get("path", ""))))
        kept[k], superseded[k] = group[-1], group[:-1]
    return kept, superseded


def seed_order(seed):
    return (0, seed, "") if isinstance(seed, int) else (1, 0, str(seed))


def protocol_order(protocol: str):
    known = protocol in PROTOCOL_ORDER
    return (0, PROTOCOL_ORDER.index(protocol), "") if known else (1, 0, protocol)


# ---------------------------------------------------------------- records


def normalise(record: dict) -> dict:
    """A copy of a training record with ``setting``, ``variant``, ``protocol``, ``overrides``
    and ``val_source`` filled in for records that predate them (idempotent)."""
    out = dict(record)
    if not out.get("setting"):
        out["setting"] = result_hash(out.get("config") or {})
    out["variant"] = out.get("variant") or out.get("model")
    out["protocol"] = out.get("protocol") or UNSPECIFIED
    out["overrides"] = out.get("overrides") or {}
    out["val_source"] = out.get("val_source") or UNSPECIFIED
    return out


def bench_protocol(record: dict) -> str:
    """The protocol a benchmark record was measured under (its field, else its config's)."""
    config = record.get("config") if isinstance(record.get("config"), dict) else {}
    return str(record.get("protocol") or config.get("protocol") or UNSPECIFIED)


def train_records(records) -> list[dict]:
    """The training records with a test accuracy, normalised (:func:`normalise`)."""
    return [
        normalise(r)
        for r in records
        if r.get("kind", "train") == "train" and r.get("test_accuracy") is not None
    ]


def bench_records(records) -> list[dict]:
    """The benchmark records with a length, each with its ``protocol`` filled in."""
    return [
        {**r, "protocol": bench_protocol(r)}
        for r in records
        if r.get("kind") == "bench" and r.get("length") is not None
    ]


def resolve_task_set(records, tasks: str = "auto") -> str:
    """``"official"`` or ``"tiny"``: ``tasks`` itself, or for ``"auto"`` official if any exist."""
    if tasks in TASK_SETS:
        return tasks
    if tasks != "auto":
        raise ConfigError(f"tasks={tasks!r} is not one of auto, official, tiny")
    official = set(OFFICIAL_TASKS) | {TASK_SETS["official"][1]}
    return "official" if any(r["task"] in official for r in train_records(records)) else "tiny"


# ---------------------------------------------------------------- reading


def results_dirs(results_dir) -> list[Path]:
    """``results_dir`` (one folder or a list of them; None = the defaults) as resolved paths."""
    if results_dir is None:
        folders = list(DEFAULT_RESULTS_DIRS)
    elif isinstance(results_dir, str | Path):
        folders = [results_dir]
    else:
        folders = list(results_dir)
    if not folders:
        raise ConfigError("results_dir is an empty list; name at least one folder of records")
    return list(dict.fromkeys(Path(f).expanduser().resolve() for f in folders))


def common_root(folders: list[Path]) -> Path:
    """The folder record names are given relative to: the one folder, or the folders' parent."""
    if len(folders) == 1:
        return folders[0]
    parts = [f.parts for f in folders]
    shared = []
    for level in zip(*parts, strict=False):
        if len(set(level)) != 1:
            break
        shared.append(level[0])
    return Path(*shared) if shared else Path("/")


def describe_dirs(folders: list[Path]) -> str:
    return ", ".join(f"{f}{'' if f.is_dir() else ' (missing)'}" for f in folders)


def load_records(results_dir) -> list[dict]:
    """Every record in the folder(s) ``results_dir``, each file once (folders may nest)."""
    seen, records = set(), []
    for folder in results_dirs(results_dir):
        for record in read_records(folder) if folder.is_dir() else []:
            key = str(Path(record["path"]).resolve())
            if key not in seen:
                seen.add(key)
                records.append(record)
    return records


# ---------------------------------------------------------------- filters


def _as_list(value) -> list[str] | None:
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def parse_date(value, *, end: bool = False) -> float | None:
    """An ISO date or date-time as a UTC timestamp; a bare date with ``end`` means its day's end."""
    if value is None or value == "":
        return None
    text = str(value)
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            f"{'until' if end else 'since'}={text!r} is not an ISO date such as 2026-01-31 "
            "or 2026-01-31T12:00:00+00:00"
        ) from None
    when = when if when.tzinfo else when.replace(tzinfo=UTC)
    if end and "T" not in text and " " not in text:
        when += timedelta(days=1)  # until=2026-01-31 keeps the whole of that day
        return when.timestamp() - 1e-6
    return when.timestamp()


def _matches_setting(record: dict, wanted: list[str]) -> bool:
    setting, variant = record["setting"], record["variant"]
    return any(
        w == variant or w == setting or (len(w) >= 4 and setting.startswith(w)) for w in wanted
    )


def filter_records(
    records,
    *,
    models=None,
    settings=None,
    protocol=None,
    since=None,
    until=None,
    where: str = "the results",
) -> list[dict]:
    """Training and benchmark records kept by the filters (None = no filter), others dropped.

    ``models``: model names (both kinds). ``settings``: setting hashes (or a prefix of at
    least 4 hex digits) or variant names (training records). ``protocol``: one protocol name
    or a list (both kinds; benchmark records without a protocol are kept).
    ``since``/``until``: ISO dates compared with ``started_at``,
    both inclusive (both kinds). A filter that leaves no training record is an error that
    names what there is.
    """
    runs, benches = train_records(records), bench_records(records)
    wanted_models = _as_list(models)
    if wanted_models:
        present = sorted({r["model"] for r in runs + benches})
        runs = [r for r in runs if r["model"] in wanted_models]
        benches = [r for r in benches if r["model"] in wanted_models]
        if not runs and not benches:
            raise ConfigError(
                f"no records of the models {sorted(wanted_models)} in {where}; models there: "
                f"{', '.join(present) or 'none'}. Check the model names or drop models=..."
            )
    lo, hi = parse_date(since), parse_date(until, end=True)
    if lo is not None or hi is not None:
        keep = lambda r: (lo is None or started(r) >= lo) and (hi is None or started(r) <= hi)  # noqa: E731
        before = len(runs)
        runs, benches = [r for r in runs if keep(r)], [r for r in benches if keep(r)]
        if before and not runs:
            raise ConfigError(
                f"no training records started between since={since} and until={until} in "
                f"{where}; widen the dates or drop since=/until="
            )
    wanted_settings = _as_list(settings)
    if wanted_settings:
        known = sorted({(r["variant"], r["setting"]) for r in runs})
        runs = [r for r in runs if _matches_setting(r, wanted_settings)]
        if not runs:
            listed = "; ".join(f"{v} ({s})" for v, s in known[:30]) or "none"
            raise ConfigError(
                f"no training records of the settings {wanted_settings} in {where}; "
                f"variants (setting hashes) there: {listed}"
            )
    wanted_protocols = _as_list(protocol)
    if wanted_protocols:
        present = sorted({r["protocol"] for r in runs}, key=protocol_order)
        runs = [r for r in runs if r["protocol"] in wanted_protocols]
        # benchmark records of other protocols go too; those that predate protocols stay
        benches = [b for b in benches if b["protocol"] in (*wanted_protocols, UNSPECIFIED)]
        if not runs:
            raise ConfigError(
                f"no training records of protocol {', '.join(wanted_protocols)} in {where}; "
                f"protocols there: {', '.join(present) or 'none'}"
            )
    return runs + benches


def require_train_records(records, folders: list[Path], task_set: str) -> None:
    """A clear error when there is no training record on ``task_set`` to report."""
    runs = train_records(records)
    five, pathx = TASK_SETS[task_set]
    if any(r["task"] in (*five, pathx) for r in runs):
        return
    if runs:
        others = sorted({r["task"] for r in runs})
        raise DataError(
            f"no training records on the {task_set} tasks in results_dir {describe_dirs(folders)} "
            f"(records there are on: {', '.join(others)}); choose tasks=official or tasks=tiny, "
            f"or make records with {TRAIN_COMMANDS}"
        )
    raise DataError(
        f"no training records (kind=train) in results_dir {describe_dirs(folders)} (looked for "
        f"*.json records in them and their subfolders). Make them with {TRAIN_COMMANDS}, "
        "which write to results/runs, or point results_dir=[...] at the folders that hold them."
    )
