"""Honest splits: train, validation and test share no example, for every task.

Every tiny task is built offline into one tmp folder (the fixtures of
tests/test_tiny_tasks.py) and loaded through ``lra.data.tasks.load_task``, the
way a run loads it. Examples are compared two ways: by identity (the stored
split and row each example comes from, ``Split.origin`` / ``Split.rows``) and by
content (a hash of what the model sees: each input's real tokens, both inputs
for Retrieval).

Content duplicates are only tolerated where the source data itself has them
across its own splits (stored train vs stored val/test, which are the official
files for ListOps and Retrieval, the fixed splits made at preparation for
Image and Pathfinder, and IMDB's official train vs test for Text): the harness
cannot remove them without changing the benchmark's test set. The real IMDB
does hold exact duplicate reviews; the synthetic fixtures used here hold none,
so the tolerated set is computed from the stored data and is empty here. A
duplicate inside the training split is never tolerated across train and the
validation split held out of it: :func:`lra.data.split.hold_out` keeps copies
together (see test_hold_out_keeps_duplicates_on_one_side).
"""

import hashlib
import itertools

import numpy as np
import pytest
from conftest import make_config
from omegaconf import OmegaConf
from test_tiny_tasks import SMALLER

from lra.data.split import VAL_SPLIT_SEED, Split, hold_out, hold_out_indices
from lra.data.store import prepared_dir, read_prepared
from lra.data.tasks import (
    allowed_val_sources,
    effective_val_source,
    load_task,
    prepare_task,
    resolve_data_dir,
)
from lra.errors import ConfigError, DataError

SPLITS = ("train", "val", "test")
NO_VAL_SPLIT = {"text_tiny"}  # data without a validation split of its own (IMDB)


@pytest.fixture(scope="module")
def tiny_data_dir(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("tiny_splits")
    for task, overrides in SMALLER.items():
        prepare_task(make_config(f"task={task}", *overrides).task, data_dir, num_workers=1)
    return data_dir


def content_hashes(split: Split) -> list[str]:
    """SHA-256 of each example's real tokens (every input, lengths included)."""
    out = []
    for i in range(len(split)):
        h = hashlib.sha256()
        for tokens, lengths in zip(split.inputs, split.lengths, strict=True):
            n = int(lengths[i])
            h.update(n.to_bytes(4, "little"))
            h.update(np.asarray(tokens[i][:n], np.int64).tobytes())
        out.append(h.hexdigest())
    return out


def identities(split: Split) -> set[tuple[str, int]]:
    assert split.origin in SPLITS and split.rows is not None
    return {(split.origin, int(row)) for row in split.rows}


def stored_splits(task_cfg, data_dir) -> dict[str, Split]:
    """The prepared folder as it is on disk (at the task's length), bypassing val_source."""
    return read_prepared(prepared_dir(task_cfg, data_dir), task_cfg.max_length, "cmd")


def source_cross_duplicates(stored: dict[str, Split], task_name: str) -> set[str]:
    """Contents the source data itself holds in two of its own splits (tolerated, see top)."""
    official = ("train", "test") if task_name in NO_VAL_SPLIT else SPLITS  # text: val is test
    hashes = {name: set(content_hashes(stored[name])) for name in official}
    return set().union(*(hashes[a] & hashes[b] for a, b in itertools.combinations(official, 2)))


def assert_rows_are_truthful(split: Split, stored: dict[str, Split]) -> None:
    """Each example is the stored row its identity names."""
    source = stored[split.origin]
    for got, want in zip(split.inputs, source.inputs, strict=True):
        assert np.array_equal(got, np.asarray(want)[split.rows])
    assert np.array_equal(split.labels, np.asarray(source.labels)[split.rows])


@pytest.mark.parametrize("task", sorted(SMALLER))
def test_train_val_test_share_no_example(task, tiny_data_dir):
    cfg = make_config(f"task={task}").task
    splits = load_task(cfg, tiny_data_dir)
    stored = stored_splits(cfg, tiny_data_dir)
    expected = "train" if task in NO_VAL_SPLIT else "official"
    assert cfg.val_source == expected == effective_val_source(cfg)
    for split in splits.values():
        assert len(split) > 0
        assert_rows_are_truthful(split, stored)
    ids = {name: identities(splits[name]) for name in SPLITS}
    hashes = {name: content_hashes(splits[name]) for name in SPLITS}
    tolerated = source_cross_duplicates(stored, task)
    for a, b in itertools.combinations(SPLITS, 2):
        assert not ids[a] & ids[b], f"{task}: {a} and {b} share stored rows"
        shared = set(hashes[a]) & set(hashes[b])
        assert shared <= tolerated, f"{task}: {a} and {b} share {len(shared)} examples"
    assert not tolerated  # the synthetic fixtures have no cross-split duplicates at all
    if task in NO_VAL_SPLIT:
        # val is held out of the stored train split and never comes from test
        assert splits["val"].origin == "train" and splits["train"].origin == "train"
        assert splits["test"].origin == "test"
        assert ids["train"] | ids["val"] == {("train", i) for i in range(len(stored["train"]))}
    else:
        # the task's own splits, as stored
        assert [splits[name].origin for name in SPLITS] == list(SPLITS)
        assert [len(splits[name]) for name in SPLITS] == [len(stored[name]) for name in SPLITS]


@pytest.mark.parametrize("fraction", [0.1, 0.25, 0.5])
def test_val_source_train_holds_out_the_stated_fraction_deterministically(fraction, tiny_data_dir):
    stored = stored_splits(make_config("task=text_tiny").task, tiny_data_dir)
    num = len(stored["train"])  # 80 synthetic reviews
    loads = [
        load_task(
            make_config("task=text_tiny", f"task.val_fraction={fraction}", f"seed={seed}").task,
            tiny_data_dir,
        )
        for seed in (0, 1, 0)
    ]
    first = loads[0]
    assert len(first["val"]) == round(num * fraction)
    assert len(first["train"]) == num - round(num * fraction)
    # the same examples on every load, whatever the run seed
    for other in loads[1:]:
        for name in SPLITS:
            assert np.array_equal(other[name].rows, first[name].rows)
            assert np.array_equal(other[name].inputs[0], first[name].inputs[0])
    # the held-out examples are the fixed permutation's first rows, not the test reviews
    order = np.random.default_rng(VAL_SPLIT_SEED).permutation(num)
    assert sorted(first["val"].rows.tolist()) == sorted(order[: round(num * fraction)].tolist())
    assert not set(content_hashes(first["val"])) & set(content_hashes(first["test"]))
    assert len(first["test"]) == len(stored["test"])


def test_a_larger_fraction_holds_out_a_superset(tiny_data_dir):
    small, large = (
        load_task(make_config("task=text_tiny", f"task.val_fraction={f}").task, tiny_data_dir)
        for f in (0.1, 0.3)
    )
    assert set(small["val"].rows.tolist()) < set(large["val"].rows.tolist())


def test_val_source_test_reproduces_the_old_behaviour(tiny_data_dir):
    cfg = make_config("task=text_tiny", "task.val_source=test").task
    splits = load_task(cfg, tiny_data_dir)
    stored = stored_splits(cfg, tiny_data_dir)
    # before task.val_source: train = all of stored train, val = the stored val (= test)
    for name in SPLITS:
        got, old = splits[name], stored[name]
        assert len(got) == len(old)
        assert np.array_equal(got.inputs[0], np.asarray(old.inputs[0]))
        assert np.array_equal(got.lengths[0], old.lengths[0])
        assert np.array_equal(got.labels, old.labels)
    assert identities(splits["val"]) == identities(splits["test"])  # and it says so
    assert effective_val_source(cfg) == "test"


def test_config_without_the_key_keeps_the_behaviour_it_was_run_with():
    # an old run's config (evaluate, resume) predates task.val_source
    text, listops = (
        OmegaConf.create(
            {
                k: v
                for k, v in OmegaConf.to_container(make_config(f"task={t}").task).items()
                if k not in ("val_source", "val_fraction")
            }
        )
        for t in ("text_tiny", "listops_tiny")
    )
    assert effective_val_source(text) == "test"
    assert effective_val_source(listops) == "official"


def test_every_task_file_sets_val_source_and_val_fraction():
    for task in ("listops", "text", "retrieval", "image", "pathfinder", "pathx"):
        for name in (task, f"{task}_tiny"):
            cfg = make_config(f"task={name}").task
            assert "val_source" in cfg and "val_fraction" in cfg, name
            assert cfg.val_source in allowed_val_sources(cfg), name
            assert effective_val_source(cfg) == cfg.val_source
            if cfg.val_source == "train":
                assert 0 < cfg.val_fraction < 1
            else:
                assert cfg.val_fraction is None


BAD = [
    ("text_tiny", ["task.val_source=validation"], "task.val_source='validation'", "train, test"),
    ("text_tiny", ["task.val_source=official"], "task.val_source='official'", "train, test"),
    ("listops_tiny", ["task.val_source=train"], "task.val_source='train'", "allowed: official"),
    ("image_tiny", ["task.val_source=test"], "task.val_source='test'", "allowed: official"),
    ("text_tiny", ["task.val_fraction=0"], "task.val_fraction=0", "between 0 and 1"),
    ("text_tiny", ["task.val_fraction=1.0"], "task.val_fraction=1.0", "between 0 and 1"),
    ("text_tiny", ["task.val_fraction=-0.1"], "task.val_fraction=-0.1", "between 0 and 1"),
    ("text_tiny", ["task.val_fraction=1.5"], "task.val_fraction=1.5", "between 0 and 1"),
    ("text_tiny", ["task.val_fraction=null"], "task.val_fraction=None", "between 0 and 1"),
    ("text_tiny", ["task.val_fraction=half"], "task.val_fraction='half'", "between 0 and 1"),
    ("retrieval_tiny", ["task.val_fraction=0.2"], "task.val_fraction=0.2", "allowed: null"),
]


@pytest.mark.parametrize(("task", "overrides", "names", "allowed"), BAD)
def test_bad_values_fail_with_one_clear_line_before_any_data_is_read(
    task, overrides, names, allowed, tmp_path
):
    cfg = make_config(f"task={task}", *overrides).task
    with pytest.raises(ConfigError) as err:
        load_task(cfg, tmp_path)  # an empty data_dir: the config is checked first
    message = str(err.value)
    assert names in message and allowed in message and "\n" not in message
    with pytest.raises(ConfigError):  # lra-data refuses the same config before any work
        prepare_task(cfg, tmp_path / "data", num_workers=1)
    assert not (tmp_path / "data").exists()


def test_a_fraction_too_small_for_the_data_is_a_config_error(tiny_data_dir):
    cfg = make_config("task=text_tiny", "task.val_fraction=0.001").task  # 0 of 80 reviews
    with pytest.raises(ConfigError, match=r"task\.val_fraction=0\.001 cannot split"):
        load_task(cfg, tiny_data_dir)


def test_other_values_still_work_under_test_source(tiny_data_dir):
    # val_fraction is only read with val_source=train: overriding the source alone is enough
    cfg = make_config("task=text_tiny", "task.val_source=test", "task.val_fraction=7").task
    assert len(load_task(cfg, tiny_data_dir)["train"]) == 80


def _split(rows: list[list[int]]) -> Split:
    tokens = np.array(rows, np.uint8)
    return Split(
        inputs=(tokens,),
        lengths=(np.full(len(rows), tokens.shape[1], np.int32),),
        labels=np.zeros(len(rows), np.int32),
    ).with_origin("train")


def test_hold_out_keeps_duplicates_on_one_side():
    # rows 0..9 distinct, then copies of every one of them: a copy is never trained on while
    # its twin is validated on, whichever rows the permutation picks
    rows = [[i, i + 1] for i in range(10)]
    split = _split(rows + rows)
    train, val = hold_out(split, 0.2)
    train_rows, val_rows = hold_out_indices(split, 0.2)
    assert len(val) == 8 and len(train) == 12  # 4 picked rows + their 4 copies
    assert sorted([*train_rows, *val_rows]) == list(range(20))
    assert not set(content_hashes(train)) & set(content_hashes(val))
    assert {r % 10 for r in val.rows} == {r % 10 for r in val_rows}


def test_hold_out_does_not_depend_on_anything_but_the_split_fraction_and_seed():
    split = _split([[i, 0] for i in range(50)])
    a, b = hold_out_indices(split, 0.1), hold_out_indices(split, 0.1)
    c = hold_out_indices(split, 0.1, seed=VAL_SPLIT_SEED + 1)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[1], c[1])
    assert len(a[1]) == 5 and np.all(np.diff(a[0]) > 0) and np.all(np.diff(a[1]) > 0)


# ----------------------------------------------------------------------------- data_dir


def test_data_dir_that_is_a_file_is_refused_before_any_work(tmp_path):
    path = tmp_path / "data.tar"
    path.write_bytes(b"not a folder")
    for given in (path, path / "inside"):
        with pytest.raises(DataError) as err:
            resolve_data_dir(given)
        message = str(err.value)
        assert str(path) in message and "point data_dir at a folder" in message
        assert "\n" not in message
    assert path.read_bytes() == b"not a folder"


def test_default_data_dir_from_the_environment_is_checked_too(tmp_path, monkeypatch):
    path = tmp_path / "lra-data"
    path.write_text("")
    monkeypatch.setenv("LRA_DATA_DIR", str(path))
    with pytest.raises(DataError, match=r"\$LRA_DATA_DIR"):
        resolve_data_dir(None)


def test_data_dir_folders_missing_or_present_resolve(tmp_path):
    assert resolve_data_dir(tmp_path) == tmp_path.resolve()
    assert resolve_data_dir(tmp_path / "new" / "sub") == (tmp_path / "new" / "sub").resolve()
    assert not (tmp_path / "new").exists()  # resolving creates nothing
