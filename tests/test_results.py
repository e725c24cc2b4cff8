import json

import pytest

from lra.errors import DataError
from lra.record import store


def sample_record(**extra):
    record = {
        "schema_version": store.SCHEMA_VERSION,
        "kind": "train",
        "model": "transformer",
        "task": "listops_tiny",
        "seed": 0,
        "started_at": "2026-12-02T12:00:00+00:00",
        "config_hash": "abc",
        "test_accuracy": 0.5,
    }
    record.update(extra)
    return record


def test_write_record_is_complete_json_and_leaves_no_temporary(tmp_path):
    path = store.write_record(sample_record(), tmp_path / "store")
    assert json.loads(path.read_text())["test_accuracy"] == 0.5
    assert path.name.startswith("train__transformer__listops_tiny__seed0__20261202T120000Z__abc")
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    [loaded] = store.read_records(tmp_path / "store")
    assert loaded["path"] == str(path)


def test_two_records_in_the_same_second_do_not_collide(tmp_path):
    first = store.write_record(sample_record(), tmp_path)
    second = store.write_record(sample_record(), tmp_path)
    assert first != second and first.exists() and second.exists()


def test_failed_write_leaves_nothing(tmp_path):
    with pytest.raises(TypeError):
        store.write_record(sample_record(bad=object()), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_unwritable_results_dir_names_the_fix(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises(DataError, match="results_dir=") as info:
        store.ensure_writable(blocker / "records")
    assert str(blocker / "records") in str(info.value)


def test_config_hash_ignores_key_order():
    assert store.config_hash({"a": 1, "b": {"c": 2}}) == store.config_hash({"b": {"c": 2}, "a": 1})
    assert store.config_hash({"a": 1}) != store.config_hash({"a": 2})


def test_corrupt_record_is_reported_by_name(tmp_path):
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(DataError, match="broken.json"):
        store.read_records(tmp_path)
