"""The wandb and TensorBoard backends, offline: what they write, read back, and resuming.

wandb runs in offline mode (its files read back with wandb's own protobuf records);
TensorBoard event files are read back with TensorBoard's EventAccumulator, which
applies the purge a resumed writer asks for. Nothing touches the network.
"""

import json
import struct
import sys
import time
import types
import zlib
from pathlib import Path

import pytest

import lra.track
from lra.track import MissingExtra, RunInfo, open_backend

RUN_KEY = "transformer-listops_tiny-s0-0123456789"
WANDB_OPTIONS = {"project": "lra-test", "entity": None, "group": None, "name": None, "tags": []}
SUMMARY = {"test_accuracy": 0.625, "selected_step": 6, "num_params": 1234}


def run_info(run_dir, resumed_step=0, run_key=RUN_KEY) -> RunInfo:
    return RunInfo(
        run_dir=Path(run_dir),
        run_key=run_key,
        model="transformer",
        task="listops_tiny",
        seed=0,
        config={"model": {"name": "transformer"}, "seed": 0},
        resumed_step=resumed_step,
        tags=["ci"],
    )


def metrics(step: int) -> dict[str, float]:
    """The scalars of ``step``: a loss every step, a validation accuracy every 3 steps."""
    values = {"train/loss": 1.0 / step}
    if step % 3 == 0:
        values["val/accuracy"] = step / 10
    return values


def log_steps(backend, steps) -> None:
    for step in steps:
        backend.log(step, metrics(step))


# ---------------------------------------------------------------- wandb


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    """wandb in offline mode, with every folder it writes to inside ``tmp_path``.

    wandb reads its environment once per process (at its set-up), so the set-up of an
    earlier test is torn down first, and this one's after the test.
    """
    import wandb  # the test extra installs it: a missing package fails, not skips

    wandb.teardown()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("DIR", "CACHE_DIR", "CONFIG_DIR", "DATA_DIR"):
        folder = tmp_path / f"wandb-{name.lower()}"
        folder.mkdir()
        monkeypatch.setenv(f"WANDB_{name}", str(folder))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    yield
    wandb.teardown()


def wandb_records(path: Path):
    """The records of a ``.wandb`` file (LevelDB log framing: 32 KiB blocks, 7-byte headers)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0)
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0:
            continue
        assert zlib.crc32(bytes([kind]) + chunk) == crc
        pending += chunk
        if kind in (1, 4):  # FULL or LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def item_key(item) -> str:
    """The name of a history or summary item (wandb fills ``key`` or ``nested_key``)."""
    return item.key or "/".join(item.nested_key)


def read_offline_run(folder: Path) -> dict:
    """Run id, history rows ({step: {name: value}}) and final summary of an offline run folder."""
    (path,) = folder.glob("run-*.wandb")
    run_id, rows, summary = None, [], {}
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id = record.run.run_id
        elif kind == "history":
            row = {item_key(item): json.loads(item.value_json) for item in record.history.item}
            rows.append(row)
        elif kind == "summary":
            for item in record.summary.update:
                summary[item_key(item)] = json.loads(item.value_json)
            for item in record.summary.remove:
                summary.pop(item_key(item), None)
    steps = [row["_step"] for row in rows]
    history = {row["_step"]: {k: v for k, v in row.items() if k[0] != "_"} for row in rows}
    user_summary = {k: v for k, v in summary.items() if k[0] != "_"}
    return {"id": run_id, "steps": steps, "history": history, "summary": user_summary}


def offline_runs(run_dir: Path, wait_seconds: float = 20.0) -> list[dict]:
    """Every offline run of ``run_dir``. wandb's writer process may still be flushing a run's
    file after ``finish()`` returns on a loaded machine: read again until each file has its
    run record (or ``wait_seconds`` pass, and the assertions then fail on what is there)."""
    deadline = time.monotonic() + wait_seconds
    while True:
        runs = [read_offline_run(f) for f in sorted((run_dir / "wandb").glob("offline-run-*"))]
        if all(run["id"] is not None for run in runs) or time.monotonic() > deadline:
            return runs
        time.sleep(0.5)


def test_wandb_run_id_is_stable_and_valid():
    from lra.track.wandb_backend import run_id

    assert run_id(RUN_KEY) == RUN_KEY
    assert run_id("My.Model-text-s3-abcdef0123") == "my-model-text-s3-abcdef0123"
    long_key = "x" * 80 + "-text-s1-abcdef0123"
    assert len(run_id(long_key)) == 64
    assert run_id(long_key).endswith("-abcdef0123")
    assert run_id(long_key) == run_id(long_key)


def test_wandb_offline_writes_history_and_summary(tmp_path, wandb_offline):
    backend = open_backend("wandb", dict(WANDB_OPTIONS), run_info(tmp_path))
    log_steps(backend, range(1, 7))
    backend.summary(SUMMARY)
    backend.close()

    (run,) = offline_runs(tmp_path)
    assert run["id"] == RUN_KEY
    assert run["steps"] == [1, 2, 3, 4, 5, 6]
    assert run["history"] == {step: metrics(step) for step in range(1, 7)}
    assert run["summary"] == {**SUMMARY, **metrics(6)}  # wandb adds the last logged row


def test_wandb_resumed_session_continues_run_without_repeating_steps(tmp_path, wandb_offline):
    first = open_backend("wandb", dict(WANDB_OPTIONS), run_info(tmp_path))
    log_steps(first, range(1, 7))
    first.close()  # stopped at step 6; the last checkpoint was at step 4

    second = open_backend("wandb", dict(WANDB_OPTIONS), run_info(tmp_path, resumed_step=4))
    log_steps(second, range(5, 9))  # 5 and 6 again, with the same values
    second.summary(SUMMARY)
    second.close()

    runs = offline_runs(tmp_path)
    assert len(runs) == 2
    assert runs[0]["id"] == runs[1]["id"] == RUN_KEY
    assert runs[0]["steps"] == [1, 2, 3, 4, 5, 6]
    assert runs[1]["steps"] == [7, 8]
    assert runs[1]["history"] == {step: metrics(step) for step in (7, 8)}
    assert runs[1]["summary"] == {**SUMMARY, **metrics(8)}


def test_wandb_sweep_jobs_in_one_process_are_separate_runs(tmp_path, wandb_offline):
    a = open_backend("wandb", dict(WANDB_OPTIONS), run_info(tmp_path / "a", run_key="m-t-s0-aaaa"))
    b = open_backend("wandb", dict(WANDB_OPTIONS), run_info(tmp_path / "b", run_key="m-t-s1-bbbb"))
    log_steps(a, [1, 2])
    log_steps(b, [1, 2, 3])
    a.close()
    b.close()

    (run_a,) = offline_runs(tmp_path / "a")
    (run_b,) = offline_runs(tmp_path / "b")
    assert (run_a["id"], run_a["steps"]) == ("m-t-s0-aaaa", [1, 2])
    assert (run_b["id"], run_b["steps"]) == ("m-t-s1-bbbb", [1, 2, 3])


def test_wandb_disabled_writes_nothing(tmp_path, wandb_offline, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    backend = open_backend("wandb", dict(WANDB_OPTIONS), run_info(tmp_path))
    log_steps(backend, [1, 2])
    backend.summary(SUMMARY)
    backend.close()
    assert not (tmp_path / "wandb").exists()


def forget_module(monkeypatch, name: str) -> None:
    """Make the next import of module ``name`` run afresh; as it was again after the test."""
    parent, _, child = name.rpartition(".")
    monkeypatch.setitem(sys.modules, name, sys.modules.get(name))
    del sys.modules[name]
    package = sys.modules[parent]
    monkeypatch.setattr(package, child, getattr(package, child, None), raising=False)


class FakeRun:
    """Stands for an online wandb run resumed on the server, whose last step was 6."""

    def __init__(self, **kwargs):
        self.init_kwargs, self.starting_step, self.disabled = kwargs, 7, False
        self.logged, self.summary, self.finished = [], {}, False

    def log(self, values, step):
        self.logged.append((step, values))

    def finish(self):
        self.finished = True


def test_wandb_online_resume_skips_the_steps_the_server_has(tmp_path, monkeypatch):
    fake = types.ModuleType("wandb")
    fake.init = FakeRun
    monkeypatch.setitem(sys.modules, "wandb", fake)
    forget_module(monkeypatch, "lra.track.wandb_backend")
    options = {**WANDB_OPTIONS, "tags": ["x"]}
    backend = open_backend("wandb", options, run_info(tmp_path, resumed_step=4))
    log_steps(backend, range(5, 9))
    backend.summary(SUMMARY)
    backend.close()

    run = backend.run
    assert [step for step, _ in run.logged] == [7, 8]
    assert run.summary == SUMMARY and run.finished
    kwargs = run.init_kwargs
    assert kwargs["id"] == RUN_KEY and kwargs["resume"] == "allow"
    assert kwargs["name"] == "transformer-listops_tiny-s0" and kwargs["tags"] == ["x", "ci"]
    assert kwargs["dir"] == str(tmp_path) and kwargs["reinit"] == "create_new"


# ---------------------------------------------------------------- TensorBoard


def tensorboard_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} as TensorBoard shows it (purged events left out)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {
        tag: [(e.step, pytest.approx(e.value)) for e in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }


def raw_scalar_steps(logdir: Path, tag: str) -> list[int]:
    """Every step written for ``tag`` in all event files, purged or not."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    steps = []
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            if any(value.tag == tag for value in event.summary.value):
                steps.append(event.step)
    return steps


def expected_scalars(steps) -> dict:
    scalars = {}
    for step in steps:
        for name, value in metrics(step).items():
            scalars.setdefault(name, []).append((step, pytest.approx(value)))
    return scalars


def test_tensorboard_writes_scalars_and_summary(tmp_path):
    backend = open_backend("tensorboard", {"flush_secs": 30}, run_info(tmp_path))
    log_steps(backend, range(1, 7))
    backend.summary({**SUMMARY, "note": "text"})
    backend.close()

    scalars = tensorboard_scalars(tmp_path / "tensorboard")
    summary = {k: scalars.pop(f"summary/{k}") for k in SUMMARY}
    assert scalars == expected_scalars(range(1, 7))
    assert summary == {k: [(0, pytest.approx(v))] for k, v in SUMMARY.items()}


def test_tensorboard_resumed_writer_purges_the_repeated_steps(tmp_path):
    first = open_backend("tensorboard", {}, run_info(tmp_path))
    log_steps(first, range(1, 7))
    first.close()  # stopped at step 6; the last checkpoint was at step 4

    second = open_backend("tensorboard", {}, run_info(tmp_path, resumed_step=4))
    log_steps(second, range(5, 9))
    second.close()

    logdir = tmp_path / "tensorboard"
    assert len(list(logdir.glob("events.out.tfevents.*"))) == 2
    # Both files hold steps 5 and 6; the reader drops the first file's copies.
    assert raw_scalar_steps(logdir, "train/loss") == [1, 2, 3, 4, 5, 6, 5, 6, 7, 8]
    assert tensorboard_scalars(logdir) == expected_scalars(range(1, 9))


# ---------------------------------------------------------------- missing packages


@pytest.mark.parametrize(
    ("logger", "package", "module"),
    [
        ("wandb", "wandb", "lra.track.wandb_backend"),
        ("tensorboard", "tensorboardX", "lra.track.tensorboard_backend"),
    ],
)
def test_missing_package_names_the_extra(tmp_path, monkeypatch, logger, package, module):
    monkeypatch.setitem(sys.modules, package, None)  # importing it raises ModuleNotFoundError
    forget_module(monkeypatch, module)
    with pytest.raises(MissingExtra, match=f"needs the {package} package") as err:
        lra.track.open_backend(logger, {}, run_info(tmp_path))
    assert f"pip install -e '.[{logger}]'" in str(err.value)


def test_training_with_both_loggers_resumed_logs_each_step_once(
    listops_tiny_dir, tmp_path, wandb_offline, monkeypatch
):
    """End to end: a run killed after its step-3 checkpoint and rerun, with both loggers."""
    from test_resume import Crash, crash_after_saving
    from test_resume import run as train

    loggers = "logger=[wandb,tensorboard]"
    crash_after_saving(monkeypatch, 3)
    with pytest.raises(Crash):
        train(listops_tiny_dir, tmp_path / "records", loggers)
    monkeypatch.undo()
    record = train(listops_tiny_dir, tmp_path / "records", loggers)
    run_dir = Path(record["run_dir"])

    from lra.track.wandb_backend import run_id

    first, second = offline_runs(run_dir)
    assert first["id"] == second["id"] == run_id(record["run_key"])
    assert set(first["steps"]).isdisjoint(second["steps"])
    logged = {**first["history"], **second["history"]}
    assert sorted(logged) == [h["step"] for h in record["history"]]
    for entry in record["history"]:
        assert logged[entry["step"]]["train/loss"] == pytest.approx(entry["train_loss"])
        if "val_accuracy" in entry:
            assert logged[entry["step"]]["val/accuracy"] == entry["val_accuracy"]
    assert second["summary"]["test_accuracy"] == record["test_accuracy"]
    assert second["summary"]["selected_step"] == record["selected_step"]

    scalars = tensorboard_scalars(run_dir / "tensorboard")
    assert [step for step, _ in scalars["train/loss"]] == [h["step"] for h in record["history"]]
    assert [value for _, value in scalars["train/loss"]] == [
        h["train_loss"] for h in record["history"]
    ]


def test_a_missing_logger_package_stops_the_run_before_any_work(tmp_path, monkeypatch):
    from conftest import train_small

    monkeypatch.setattr(lra.track.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingExtra, match=r"pip install -e '\.\[tensorboard\]'"):
        train_small(tmp_path / "no-data-needed", tmp_path / "records", "logger=tensorboard")
    assert not (tmp_path / "records").exists() or not list((tmp_path / "records").iterdir())
