"""Pathfinder / Path-X data: reading the official folder layout, splitting, preparing."""

import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import make_config
from omegaconf import OmegaConf
from PIL import Image

from lra.data import pathfinder, store
from lra.data.tasks import load_task, prepare_task
from lra.errors import ConfigError, DataError
from lra.models.heads import POOLINGS

RES = 8
# Batches 0, 2 and 10 (10 sorts after 2 only numerically), 12 images each (sample_10 after
# sample_2 only numerically).
BATCHES = (0, 2, 10)
PER_BATCH = 12


def image_for(batch: int, i: int) -> np.ndarray:
    """A distinct image per (batch, i), with black (0) pixels in every row."""
    rng = np.random.default_rng([batch, i])
    pixels = rng.integers(0, 256, (RES, RES), dtype=np.uint8)
    pixels[:, 0] = 0
    pixels[0, 1] = batch
    pixels[0, 2] = i
    return pixels


def label_for(batch: int, i: int) -> int:
    return (batch + i) % 2


def make_folder(folder: Path, batches=BATCHES, per_batch=PER_BATCH) -> Path:
    """A small pathfinder folder in the official layout (text metadata in .npy files)."""
    (folder / "metadata").mkdir(parents=True)
    for b in batches:
        (folder / "imgs" / str(b)).mkdir(parents=True)
        lines = []
        # Listed out of order: the reader sorts.
        for i in reversed(range(per_batch)):
            Image.fromarray(image_for(b, i), mode="L").save(folder / f"imgs/{b}/sample_{i}.png")
            lines.append(f"imgs/{b} sample_{i}.png {i} {label_for(b, i)} 1.0 6 2 2 0.5 1 1\n")
        (folder / "metadata" / f"{b}.npy").write_text("".join(lines))
    return folder


def expected_order(batches=BATCHES, per_batch=PER_BATCH):
    return [(b, i) for b in sorted(batches) for i in range(per_batch)]


# --- reading -----------------------------------------------------------------


def test_reads_in_numeric_order_with_black_pixels_kept(tmp_path):
    folder = make_folder(tmp_path / "pathfinder8" / "curv_baseline")
    tokens, labels, skipped = pathfinder.read_pathfinder_folder(folder, RES, num_workers=1)
    order = expected_order()
    assert skipped == 0
    assert tokens.dtype == np.uint8 and tokens.shape == (len(order), RES * RES)
    assert labels.dtype == np.int32
    for row, (b, i) in enumerate(order):
        np.testing.assert_array_equal(tokens[row], image_for(b, i).reshape(-1))
        assert labels[row] == label_for(b, i)
    assert (tokens == 0).sum(axis=1).min() >= RES  # black pixels are tokens, not padding


def test_empty_and_unreadable_images_are_skipped_with_a_warning(tmp_path):
    folder = make_folder(tmp_path / "f")
    (folder / "imgs/0/sample_3.png").write_bytes(b"")  # like the archive's sample_172.png
    (folder / "imgs/2/sample_5.png").write_bytes(b"not a png at all")
    with pytest.warns(UserWarning) as record:
        tokens, labels, skipped = pathfinder.read_pathfinder_folder(folder, RES)
    assert skipped == 2
    message = str(record[0].message)
    assert "skipped 2 of 36" in message
    assert "imgs/0/sample_3.png (empty file)" in message and "sample_5.png" in message
    kept = [o for o in expected_order() if o not in ((0, 3), (2, 5))]
    assert tokens.shape == (34, RES * RES)
    for row, (b, i) in enumerate(kept):
        np.testing.assert_array_equal(tokens[row], image_for(b, i).reshape(-1))
        assert labels[row] == label_for(b, i)


def test_too_many_bad_images_means_an_incomplete_folder(tmp_path):
    folder = make_folder(tmp_path / "f", batches=(0,), per_batch=3)
    for i in range(3):
        (folder / f"imgs/0/sample_{i}.png").unlink()
    with pytest.raises(DataError, match="incomplete"):
        pathfinder.read_pathfinder_folder(folder, RES)


def test_wrong_size_image_is_an_error_naming_the_file(tmp_path):
    folder = make_folder(tmp_path / "f")
    Image.fromarray(np.zeros((RES, RES + 2), np.uint8)).save(folder / "imgs/2/sample_7.png")
    with pytest.raises(DataError) as info:
        pathfinder.read_pathfinder_folder(folder, RES)
    message = str(info.value)
    assert "imgs/2/sample_7.png" in message
    assert f"{RES + 2}x{RES}" in message and f"expected {RES}x{RES}" in message


def test_resize_by_block_averaging(tmp_path):
    folder = make_folder(tmp_path / "f", batches=(0,), per_batch=2)
    tokens, _, _ = pathfinder.read_pathfinder_folder(folder, RES, resize_to=RES // 2)
    for row in range(2):
        blocks = image_for(0, row).astype(np.float64).reshape(RES // 2, 2, RES // 2, 2)
        expected = np.floor(blocks.mean(axis=(1, 3)) + 0.5).astype(np.uint8)
        np.testing.assert_array_equal(tokens[row], expected.reshape(-1))
    with pytest.raises(ConfigError, match="divide"):
        pathfinder.read_pathfinder_folder(folder, RES, resize_to=3)


@pytest.mark.parametrize(
    ("line", "what"),
    [("imgs/0 sample_0.png 0", "found 3"), ("imgs/0 sample_0.png 0 7 1.0", "label '7'")],
)
def test_malformed_metadata_names_file_and_line(tmp_path, line, what):
    folder = make_folder(tmp_path / "f", batches=(0,), per_batch=2)
    meta = folder / "metadata" / "0.npy"
    meta.write_text(meta.read_text() + line + "\n")
    with pytest.raises(DataError) as info:
        pathfinder.read_pathfinder_folder(folder, RES)
    assert "0.npy, line 3" in str(info.value) and what in str(info.value)


def test_missing_metadata_and_real_npy_metadata(tmp_path):
    with pytest.raises(DataError, match="no metadata"):
        pathfinder.read_pathfinder_folder(tmp_path, RES)
    folder = make_folder(tmp_path / "f", batches=(0,), per_batch=3)
    rows = [line.split() for line in (folder / "metadata/0.npy").read_text().splitlines()]
    with open(folder / "metadata/0.npy", "wb") as f:
        np.save(f, np.array(rows))  # a true .npy string array is accepted too
    tokens, labels, _ = pathfinder.read_pathfinder_folder(folder, RES)
    np.testing.assert_array_equal(labels, [label_for(0, i) for i in range(3)])
    np.testing.assert_array_equal(tokens[2], image_for(0, 2).reshape(-1))


def test_process_pool_gives_the_same_result(tmp_path, monkeypatch):
    folder = make_folder(tmp_path / "f")
    (folder / "imgs/0/sample_3.png").write_bytes(b"")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        serial = pathfinder.read_pathfinder_folder(folder, RES, num_workers=1)
        monkeypatch.setattr(pathfinder, "POOL_MIN_IMAGES", 0)
        monkeypatch.setattr(pathfinder, "DECODE_CHUNK", 7)
        pooled = pathfinder.read_pathfinder_folder(folder, RES, num_workers=2)
    np.testing.assert_array_equal(serial[0], pooled[0])
    np.testing.assert_array_equal(serial[1], pooled[1])
    assert serial[2] == pooled[2] == 1


# --- splitting and finding ---------------------------------------------------


def test_split_is_seeded_80_10_10():
    a = pathfinder.split_indices(1000, seed=3)
    b = pathfinder.split_indices(1000, seed=3)
    c = pathfinder.split_indices(1000, seed=4)
    assert {k: len(v) for k, v in a.items()} == {"train": 800, "val": 100, "test": 100}
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    assert not np.array_equal(a["val"], c["val"])
    everything = np.concatenate(list(a.values()))
    assert sorted(everything.tolist()) == list(range(1000))
    odd = pathfinder.split_indices(199_999, seed=0)
    assert {k: len(v) for k, v in odd.items()} == {"train": 160_001, "val": 19_999, "test": 19_999}


def test_permute_rows_in_place_matches_fancy_indexing():
    rng = np.random.default_rng(0)
    for n in (0, 1, 2, 17, 300):
        array = rng.integers(0, 256, (n, 5), dtype=np.uint8)
        order = rng.permutation(n)
        expected = array[order]
        pathfinder.permute_rows_in_place(array, order)
        np.testing.assert_array_equal(array, expected)


def test_find_pathfinder_dir_at_either_nesting_level(tmp_path):
    flat = make_folder(tmp_path / "a" / "pathfinder8" / "curv_baseline", per_batch=1)
    assert pathfinder.find_pathfinder_dir(tmp_path / "a", RES, "curv_baseline") == flat
    nested_root = tmp_path / "b" / "lra_release" / "lra_release"
    nested = make_folder(nested_root / "pathfinder8" / "curv_baseline", per_batch=1)
    assert pathfinder.find_pathfinder_dir(tmp_path / "b", RES, "curv_baseline") == nested
    assert pathfinder.find_pathfinder_dir(nested_root.parent, RES, "curv_baseline") == nested
    assert pathfinder.find_pathfinder_dir(tmp_path / "b", RES, "curv_contour_length_14") is None
    # A folder without metadata (e.g. a partial extraction) does not count.
    (tmp_path / "c" / "pathfinder8" / "curv_baseline" / "imgs").mkdir(parents=True)
    assert pathfinder.find_pathfinder_dir(tmp_path / "c", RES, "curv_baseline") is None


def small_cfg(*overrides: str):
    return make_config(
        "task=pathfinder",
        f"task.source.resolution={RES}",
        "task.source.difficulty=curv_baseline",
        f"task.max_length={RES * RES}",
        "task.data_subdir=pf_small",
        *overrides,
    ).task


def test_prepare_from_nested_release_then_again_does_no_work(tmp_path, monkeypatch):
    folder = make_folder(tmp_path / "lra_release" / "lra_release" / "pathfinder8" / "curv_baseline")
    (folder / "imgs/10/sample_0.png").write_bytes(b"")
    cfg = small_cfg("task.source.split_seed=5")
    with pytest.warns(UserWarning, match="skipped 1"):
        out = prepare_task(cfg, tmp_path, num_workers=1)
    meta = store.read_meta(out)
    assert meta["counts"] == {"train": 29, "val": 3, "test": 3}
    assert meta["skipped_images"] == 1 and meta["images_read"] == 35
    assert meta["source"] == str(folder) and meta["split_seed"] == 5
    assert meta["source_kind"] == "extracted lra_release"
    splits = load_task(cfg, tmp_path)
    kept = [o for o in expected_order() if o != (10, 0)]
    index = pathfinder.split_indices(35, seed=5)
    for name, split in splits.items():
        assert split.inputs[0].shape == (len(index[name]), RES * RES)
        np.testing.assert_array_equal(split.lengths[0], RES * RES)  # every pixel is real
        for row, k in enumerate(index[name]):
            b, i = kept[k]
            np.testing.assert_array_equal(split.inputs[0][row], image_for(b, i).reshape(-1))
            assert split.labels[row] == label_for(b, i)

    def fail(*args, **kwargs):
        raise AssertionError("read again")

    monkeypatch.setattr(pathfinder, "read_pathfinder_folder", fail)
    mtime = (out / "meta.json").stat().st_mtime_ns
    assert prepare_task(cfg, tmp_path, num_workers=1) == out
    assert (out / "meta.json").stat().st_mtime_ns == mtime


def test_prepare_checks_the_config(tmp_path):
    with pytest.raises(ConfigError, match="difficulty"):
        prepare_task(small_cfg("task.source.difficulty=hard"), tmp_path)
    with pytest.raises(ConfigError, match="max_length"):
        prepare_task(small_cfg("task.max_length=100"), tmp_path)
    with pytest.raises(DataError, match="metadata"):
        prepare_task(small_cfg(f"task.source.folder={tmp_path}"), tmp_path)
    assert not (tmp_path / "prepared").exists()


def test_pathfinder_tiny_prepare_end_to_end_generates_then_reads(tmp_path):
    cfg = make_config(
        "task=pathfinder_tiny", "task.source.num_images=40", "task.source.images_per_batch=20"
    ).task
    out = prepare_task(cfg, tmp_path, num_workers=1)
    meta = store.read_meta(out)
    assert meta["counts"] == {"train": 32, "val": 4, "test": 4}
    assert meta["source_kind"].startswith("generated")
    generated = tmp_path / "generated" / "pathfinder_tiny" / "pathfinder32" / "curv_baseline"
    assert meta["source"] == str(generated)
    assert len(list((generated / "metadata").glob("*.npy"))) == 2
    splits = load_task(cfg, tmp_path)
    train = splits["train"]
    assert train.inputs[0].dtype == np.uint8 and train.max_length == 16 * 16 == cfg.max_length
    assert 0 < train.labels.mean() < 1
    assert train.inputs[0].max() > 0 and (np.asarray(train.inputs[0]) == 0).any()


# --- task configs ------------------------------------------------------------

TASKS = ("pathfinder", "pathfinder_tiny", "pathx", "pathx_tiny", "retrieval", "retrieval_tiny")


@pytest.mark.parametrize("name", TASKS)
def test_task_configs_are_consistent(name):
    cfg = make_config(f"task={name}")
    task = cfg.task
    assert task.name == name
    assert task.arch.pooling in POOLINGS
    assert task.arch.positions in ("sinusoidal", "learned")
    default = OmegaConf.load(Path(__file__).parents[1] / "configs" / "trainer" / "default.yaml")
    raw = OmegaConf.load(Path(__file__).parents[1] / "configs" / "task" / f"{name}.yaml")
    assert set(raw.trainer) <= set(default)
    if task.dataset == "pathfinder":
        side = task.source.resize_to or task.source.resolution
        assert task.max_length == side * side and task.vocab_size == 256
        assert task.source.difficulty in pathfinder.DIFFICULTY_NAMES
    else:
        assert task.dual and task.vocab_size == 257
        assert task.source.stored_length >= task.max_length
