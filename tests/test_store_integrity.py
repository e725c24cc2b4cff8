"""Prepared-data integrity: the manifest in meta.json, verification at load, rebuilds."""

import hashlib
import json
import shutil

import numpy as np
import pytest
from conftest import SMALL_DATA, make_config

from lra.data import store, tasks
from lra.data.split import Split
from lra.data.tasks import load_task, prepare_command, prepare_task, rebuild_command
from lra.errors import DataError


@pytest.fixture(scope="module")
def task():
    return make_config("task=listops_tiny", *SMALL_DATA).task


@pytest.fixture
def data_dir(listops_tiny_dir, tmp_path):
    """A private copy of the session's listops_tiny data folder (safe to damage)."""
    return shutil.copytree(listops_tiny_dir, tmp_path / "data")


def _folder(task, data_dir):
    return store.prepared_dir(task, data_dir)


def _arrays(splits):
    return {
        (name, kind, i): np.asarray(a)
        for name, split in splits.items()
        for kind in ("inputs", "lengths")
        for i, a in enumerate(getattr(split, kind))
    } | {(name, "labels", 0): np.asarray(split.labels) for name, split in splits.items()}


def _assert_same(one, two):
    one, two = _arrays(one), _arrays(two)
    assert one.keys() == two.keys()
    for key in one:
        assert one[key].dtype == two[key].dtype and np.array_equal(one[key], two[key]), key


def _tiny_split(n, length, rng):
    tokens = rng.integers(1, 300, (n, length)).astype(np.uint16)
    lengths = rng.integers(1, length + 1, n).astype(np.int32)
    return Split(
        inputs=(tokens, tokens[::-1].copy()), lengths=(lengths, lengths), labels=lengths % 3
    )


def test_manifest_lists_every_file_with_its_size_and_sha256(tmp_path):
    rng = np.random.default_rng(0)
    splits = {name: _tiny_split(n, 6, rng) for name, n in (("train", 5), ("val", 3), ("test", 2))}
    folder = store.write_prepared(tmp_path / "two_inputs", splits, {"source": "test"})
    meta = json.loads((folder / store.META_FILE).read_text())
    assert meta["format_version"] == store.FORMAT_VERSION == 2
    on_disk = sorted(p.name for p in folder.iterdir() if p.name != store.META_FILE)
    assert sorted(meta["files"]) == on_disk and len(on_disk) == 3 * 5  # 2 tokens, 2 lengths, labels
    for name, entry in meta["files"].items():
        data = (folder / name).read_bytes()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    store.verify_prepared(folder, "cmd")
    _assert_same(store.read_prepared(folder, 6, "cmd"), splits)
    assert [p.name for p in tmp_path.iterdir()] == ["two_inputs"]  # no temporary folder left


def test_truncated_file_fails_at_load_naming_file_size_and_rebuild_command(task, data_dir):
    path = _folder(task, data_dir) / "train.tokens0.npy"
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 100)
    with pytest.raises(DataError) as err:
        load_task(task, data_dir)
    message = str(err.value)
    assert f"{path} is truncated (has {size - 100} bytes, expected {size})" in message
    assert message.endswith(f"rebuild it with: {rebuild_command('listops_tiny', data_dir)}")
    assert rebuild_command("listops_tiny", data_dir) == (
        f"lra-data task=listops_tiny data_dir={data_dir} rebuild=true"
    )


def test_flipped_byte_fails_with_checksum_mismatch(task, data_dir):
    path = _folder(task, data_dir) / "val.labels.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(DataError) as err:
        load_task(task, data_dir)
    message = str(err.value)
    assert f"{path} is corrupted: checksum mismatch" in message
    assert message.endswith(f"rebuild it with: {rebuild_command('listops_tiny', data_dir)}")


def test_missing_file_fails_and_sizes_are_checked_before_checksums(task, data_dir, monkeypatch):
    folder = _folder(task, data_dir)
    (folder / "test.lengths0.npy").unlink()
    longer = folder / "train.labels.npy"
    longer.write_bytes(longer.read_bytes() + b"x")
    hashed = []
    monkeypatch.setattr(store, "file_sha256", lambda path: hashed.append(path) or "0")
    with pytest.raises(DataError) as err:
        store.verify_prepared(folder, "the rebuild command")
    message = str(err.value)
    assert f"{folder / 'test.lengths0.npy'} is missing" in message
    expected = longer.stat().st_size - 1
    assert f"{longer} has {expected + 1} bytes, expected {expected}" in message
    assert message.endswith("rebuild it with: the rebuild command")
    assert hashed == []  # a size problem is reported without reading any file


def test_unlisted_file_in_the_manifest_is_damage(task, data_dir):
    folder = _folder(task, data_dir)
    meta = json.loads((folder / store.META_FILE).read_text())
    del meta["files"]["train.tokens0.npy"]
    (folder / store.META_FILE).write_text(json.dumps(meta))
    with pytest.raises(DataError, match=r"does not list train\.tokens0\.npy.*rebuild=true"):
        load_task(task, data_dir)


def test_prepare_task_on_damaged_folder_names_the_rebuild_command(task, data_dir):
    path = _folder(task, data_dir) / "train.lengths0.npy"
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(DataError) as err:
        prepare_task(task, data_dir, num_workers=1)
    assert str(err.value).endswith(f"rebuild it with: {rebuild_command('listops_tiny', data_dir)}")
    assert "truncated" in str(err.value)


def test_rebuild_prepares_again_and_equals_the_original(task, data_dir, listops_tiny_dir):
    folder = _folder(task, data_dir)
    (folder / "train.tokens0.npy").unlink()
    (folder / "val.tokens0.npy").write_bytes(b"garbage")
    assert prepare_task(task, data_dir, num_workers=1, rebuild=True) == folder
    _assert_same(load_task(task, data_dir), load_task(task, listops_tiny_dir))
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no aside folder left
    # An intact folder is prepared again too.
    before = (folder / store.META_FILE).stat().st_mtime_ns
    prepare_task(task, data_dir, num_workers=1, rebuild=True)
    assert (folder / store.META_FILE).stat().st_mtime_ns != before
    store.verify_prepared(folder, "cmd")


@pytest.mark.parametrize("error", [DataError("the source is gone"), KeyboardInterrupt()])
def test_failed_rebuild_leaves_the_original_folder(task, data_dir, monkeypatch, error):
    folder = _folder(task, data_dir)
    damaged = folder / "test.labels.npy"
    damaged.write_bytes(damaged.read_bytes()[:-4])
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def fail(task_cfg, data_dir, num_workers):
        assert not folder.exists()  # the old folder is aside while preparing
        raise error

    monkeypatch.setitem(tasks.DATASETS["listops"], "prepare", fail)
    with pytest.raises(type(error)):
        prepare_task(task, data_dir, num_workers=1, rebuild=True)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]


def test_format_version_1_is_not_prepared(task, data_dir):
    folder = _folder(task, data_dir)
    meta = json.loads((folder / store.META_FILE).read_text())
    del meta["files"]
    meta["format_version"] = 1
    (folder / store.META_FILE).write_text(json.dumps(meta))
    assert not store.is_prepared(folder)
    with pytest.raises(DataError) as err:
        store.load_prepared(task, data_dir, prepare_command("listops_tiny", data_dir))
    assert f"prepare it with: lra-data task=listops_tiny data_dir={data_dir}" in str(err.value)
    # Preparing (no rebuild needed) writes the current format again.
    prepare_task(task, data_dir, num_workers=1)
    assert store.read_meta(folder)["format_version"] == store.FORMAT_VERSION
    assert len(load_task(task, data_dir)["train"]) == 256
