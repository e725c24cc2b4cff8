"""Tests for lra.data.text (IMDB bytes) and lra.data.image (CIFAR-10 grayscale).

Everything runs on small archives in the official formats built by
lra.data.synthetic_archives; tensorflow-datasets is made unimportable so the
archive path is what runs, and nothing touches the network.
"""

import json
import socket
import sys
import types

import numpy as np
import pytest
from conftest import make_config

from lra.data import image, synthetic_archives, text
from lra.data.archives import sha256_file
from lra.data.encoding import grayscale
from lra.data.store import prepared_dir, read_prepared
from lra.data.synthetic_archives import cifar_records, write_tar_gz
from lra.errors import DataError


@pytest.fixture(autouse=True)
def no_tfds(monkeypatch):
    """``import tensorflow_datasets`` raises ImportError, installed or not."""
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)


def closed_port_url(name: str) -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/{name}"


def leftovers(data_dir):
    """Anything under data_dir/prepared (a finished or half-written folder)."""
    root = data_dir / "prepared"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


# ----------------------------------------------------------------------------- Text (IMDB)

IMDB_MEMBERS = [
    ("aclImdb", None),
    ("aclImdb/test/pos/3_10.txt", b"Test positive three."),
    ("aclImdb/train/pos/10_8.txt", b"  Loved it.<br /><br />Again!\n"),
    ("aclImdb/train/neg/2_1.txt", "Caf\u00e9 was awful.".encode()),
    ("aclImdb/train/unsup/0_0.txt", b"unlabelled review"),
    ("aclImdb/train/pos/1_9.txt", b"Great film."),
    ("aclImdb/test/neg/0_3.txt", b"Test negative zero."),
    ("aclImdb/imdb.vocab", b"the\nand\n"),
    ("aclImdb/train/urls_pos.txt", b"http://example.com\n"),
    ("aclImdb/README", b"readme"),
]


def test_read_imdb_archive_layout(tmp_path):
    archive = write_tar_gz(tmp_path / "aclImdb_v1.tar.gz", IMDB_MEMBERS)
    got = text.read_imdb_archive(archive)
    texts, labels = got["train"]
    # sorted by path: neg/2_1, pos/10_8, pos/1_9; stripped as tfds does; unsup/vocab ignored
    assert texts == [
        "Caf\u00e9 was awful.".encode(),
        b"Loved it.<br /><br />Again!",
        b"Great film.",
    ]
    assert labels.tolist() == [0, 1, 1] and labels.dtype == np.int32
    assert got["test"][0] == [b"Test negative zero.", b"Test positive three."]
    assert got["test"][1].tolist() == [0, 1]
    # member order does not matter
    reordered = write_tar_gz(tmp_path / "rev.tar.gz", IMDB_MEMBERS[::-1])
    again = text.read_imdb_archive(reordered)
    assert again["train"][0] == texts and again["test"][0] == got["test"][0]


def test_imdb_archive_without_reviews_is_refused(tmp_path):
    archive = write_tar_gz(tmp_path / "other.tar.gz", [("aclImdb/train/pos/1_9.txt", b"x")])
    with pytest.raises(DataError, match="not the IMDB archive"):
        text.read_imdb_archive(archive)


def test_text_tiny_prepares_without_tfds(tmp_path):
    cfg = make_config("task=text_tiny", "task.source.fixture.num_per_class=20")
    folder = text.prepare(cfg.task, tmp_path, None)
    assert folder == prepared_dir(cfg.task, tmp_path)
    splits = read_prepared(folder, cfg.task.max_length, "cmd")
    train, val, test = splits["train"], splits["val"], splits["test"]
    assert len(train) == 40 and len(val) == len(test) == 40
    assert train.inputs[0].dtype == np.uint16 and train.inputs[0].shape == (40, 256)
    assert np.array_equal(val.inputs[0], test.inputs[0])
    assert sorted(train.labels.tolist()) == [0] * 20 + [1] * 20
    # tokens are the (sorted, stripped) review bytes + 1, padded with 0
    archive = next((tmp_path / "fixtures").glob("*.tar.gz"))
    texts, labels = text.read_imdb_archive(archive)["train"]
    row = np.asarray(train.inputs[0][5])
    n = int(train.lengths[0][5])
    assert n == min(len(texts[5]), 256) and bytes((row[:n] - 1).astype(np.uint8)) == texts[5][:n]
    assert not row[n:].any() and train.labels[5] == labels[5]
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["source"].startswith("synthetic fixture") and meta["stored_length"] == 512
    assert meta["counts"] == {"train": 40, "val": 40, "test": 40} and meta["val_is_test"]


def test_text_second_prepare_does_no_work(tmp_path, monkeypatch):
    cfg = make_config("task=text_tiny", "task.source.fixture.num_per_class=5")
    folder = text.prepare(cfg.task, tmp_path, None)

    def boom(*args, **kwargs):
        raise AssertionError("prepare did work on a prepared folder")

    monkeypatch.setattr(text, "read_imdb_archive", boom)
    monkeypatch.setattr(text, "fixture_archive", boom)
    assert text.prepare(cfg.task, tmp_path, None) == folder


def official_text(archive, *extra):
    return make_config("task=text", f"task.source.archive={archive}", *extra)


def test_official_text_config_from_local_archive(tmp_path):
    archive = synthetic_archives.write_imdb_archive(tmp_path / "aclImdb_v1.tar.gz", num_per_class=6)
    cfg = official_text(archive, "task.source.sha256=null")
    folder = text.prepare(cfg.task, tmp_path / "data", 4)
    assert folder == tmp_path / "data" / "prepared" / "imdb"
    full = read_prepared(folder, 4000, "cmd")["train"]
    cut = read_prepared(folder, 1000, "cmd")["train"]  # task.max_length=1000
    assert full.inputs[0].shape == (12, 4000) and cut.inputs[0].shape == (12, 1000)
    assert np.array_equal(full.inputs[0][:, :1000], cut.inputs[0])
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["archive"] == str(archive) and len(meta["archive_sha256"]) == 64


def test_text_checksum_mismatch_prepares_nothing(tmp_path):
    archive = synthetic_archives.write_imdb_archive(tmp_path / "aclImdb_v1.tar.gz", num_per_class=3)
    cfg = official_text(archive, f"task.source.sha256={'ab' * 32}")
    with pytest.raises(DataError, match="checksum mismatch") as err:
        text.prepare(cfg.task, tmp_path / "data", None)
    assert str(archive) in str(err.value)
    assert leftovers(tmp_path / "data") == []


def test_text_truncated_archive_prepares_nothing(tmp_path):
    archive = synthetic_archives.write_imdb_archive(tmp_path / "full.tar.gz", num_per_class=30)
    cut = tmp_path / "aclImdb_v1.tar.gz"
    cut.write_bytes(archive.read_bytes()[: archive.stat().st_size * 2 // 3])
    cfg = official_text(cut, "task.source.sha256=null")
    with pytest.raises(DataError, match="truncated or corrupt"):
        text.prepare(cfg.task, tmp_path / "data", None)
    assert leftovers(tmp_path / "data") == []


def test_text_unsafe_member_prepares_nothing(tmp_path):
    archive = write_tar_gz(tmp_path / "a.tar.gz", [*IMDB_MEMBERS, ("../aclImdb/x.txt", b"x")])
    cfg = official_text(archive, "task.source.sha256=null")
    with pytest.raises(DataError, match=r"\.\./aclImdb/x\.txt"):
        text.prepare(cfg.task, tmp_path / "data", None)
    assert leftovers(tmp_path / "data") == []


def test_text_download_dir_and_no_network(tmp_path):
    data = tmp_path / "data"
    url = closed_port_url("aclImdb_v1.tar.gz")
    cfg = make_config("task=text", f"task.source.url={url}")
    with pytest.raises(DataError) as err:
        text.prepare(cfg.task, data, None)
    dest = data / "downloads" / "aclImdb_v1.tar.gz"
    assert f"could not download {url}" in str(err.value) and str(dest) in str(err.value)
    assert leftovers(data) == []
    # A hand-fetched archive at that place is used without the network (checksum checked).
    synthetic_archives.write_imdb_archive(dest, num_per_class=4)
    digest = sha256_file(dest)
    cfg = make_config("task=text", f"task.source.url={url}", f"task.source.sha256={digest}")
    folder = text.prepare(cfg.task, data, None)
    assert json.loads((folder / "meta.json").read_text())["archive_sha256"] == digest


def test_text_uses_tfds_when_it_provides_the_data(tmp_path, monkeypatch):
    class Source(list):
        pass

    def data_source(name, split, **kwargs):
        assert name == "imdb_reviews"
        rows = {
            "train": [{"text": b"good", "label": 1}, {"text": "bad \u00e9", "label": 0}],
            "test": [{"text": b"fine", "label": 1}],
        }
        return [Source(rows[s]) for s in split]

    monkeypatch.setitem(
        sys.modules, "tensorflow_datasets", types.SimpleNamespace(data_source=data_source)
    )
    cfg = make_config("task=text", f"task.source.url={closed_port_url('x.tar.gz')}")
    folder = text.prepare(cfg.task, tmp_path, None)
    splits = read_prepared(folder, 4000, "cmd")
    assert splits["train"].lengths[0].tolist() == [4, 6] and splits["train"].labels.tolist() == [
        1,
        0,
    ]
    assert json.loads((folder / "meta.json").read_text())["source"] == "tfds:imdb_reviews"


# ----------------------------------------------------------------------------- Image (CIFAR-10)


def cifar_archive(path, batches, image_size=2, extra=()):
    """A CIFAR-binary tarball from ``{member name: bytes}``."""
    members = [(f"cifar-10-batches-bin/{name}", data) for name, data in batches.items()]
    return write_tar_gz(path, [("cifar-10-batches-bin", None), *members, *extra])


def records(labels, size=2, seed=0):
    rng = np.random.default_rng(seed)
    labels = np.asarray(labels, np.uint8)
    images = rng.integers(0, 256, size=(len(labels), 3, size, size), dtype=np.uint8)
    return cifar_records(labels, images), images


def test_decode_records_planes_and_formula(tmp_path):
    r = np.array([[0, 10], [20, 255]], np.uint8)
    g = np.array([[0, 30], [40, 255]], np.uint8)
    b = np.array([[0, 50], [60, 0]], np.uint8)
    data = bytes([7]) + r.tobytes() + g.tobytes() + b.tobytes()
    tokens, labels = image.decode_records(data, 2, member="m", archive=tmp_path)
    expected = [
        int((0.2989 * rr + 0.5870 * gg + 0.1140 * bb) / 255 * 255.5)
        for rr, gg, bb in zip(r.ravel(), g.ravel(), b.ravel(), strict=True)
    ]
    assert labels.tolist() == [7] and tokens.dtype == np.uint8
    assert tokens[0].tolist() == expected and expected[0] == 0  # black stays 0, row major


def test_read_cifar_archive_batch_order(tmp_path):
    batches, want_labels = {}, []
    for i in (5, 3, 1, 4, 2):  # stored out of order
        labels = [(i + j) % 10 for j in range(3)]
        batches[f"data_batch_{i}.bin"] = records(labels, seed=i)[0]
    batches["test_batch.bin"], test_images = records([9, 8], seed=9)
    for i in range(1, 6):
        want_labels += [(i + j) % 10 for j in range(3)]
    archive = cifar_archive(
        tmp_path / "c.tar.gz", batches, extra=[("cifar-10-batches-bin/readme.html", b"x")]
    )
    got = image.read_cifar_archive(archive, image_size=2)
    assert got["train"][1].tolist() == want_labels
    assert got["train"][0].shape == (15, 4) and got["test"][1].tolist() == [9, 8]
    assert np.array_equal(got["test"][0], grayscale(test_images.transpose(0, 2, 3, 1)))


def test_cifar_wrong_record_size(tmp_path):
    batches = {f"data_batch_{i}.bin": records([1, 2])[0] for i in range(1, 6)}
    batches["test_batch.bin"] = records([1])[0] + b"\x00"  # one byte too many
    archive = cifar_archive(tmp_path / "c.tar.gz", batches)
    with pytest.raises(DataError) as err:
        image.read_cifar_archive(archive, image_size=2)
    assert "cifar-10-batches-bin/test_batch.bin" in str(err.value) and "13-byte" in str(err.value)


def test_cifar_missing_batch_and_bad_label(tmp_path):
    batches = {f"data_batch_{i}.bin": records([1])[0] for i in range(1, 5)}
    batches["test_batch.bin"] = records([1])[0]
    with pytest.raises(DataError, match="lacks data_batch_5.bin"):
        image.read_cifar_archive(cifar_archive(tmp_path / "a.tar.gz", batches), image_size=2)
    batches["data_batch_5.bin"] = records([12])[0]
    with pytest.raises(DataError, match="label 12"):
        image.read_cifar_archive(cifar_archive(tmp_path / "b.tar.gz", batches), image_size=2)


def test_split_train_val_is_seeded():
    train, val = image.split_train_val(1000, 0.1, 0)
    assert len(train) == 900 and len(val) == 100
    assert sorted(np.concatenate([train, val]).tolist()) == list(range(1000))
    same = image.split_train_val(1000, 0.1, 0)
    other = image.split_train_val(1000, 0.1, 1)
    assert np.array_equal(val, same[1]) and not np.array_equal(val, other[1])


TINY_IMAGE = [
    "task=image_tiny",
    "task.source.fixture.num_per_batch=20",
    "task.source.fixture.num_test=30",
]


def test_image_tiny_prepares_without_tfds(tmp_path):
    cfg = make_config(*TINY_IMAGE)
    folder = image.prepare(cfg.task, tmp_path, None)
    splits = read_prepared(folder, cfg.task.max_length, "cmd")
    assert {k: len(v) for k, v in splits.items()} == {"train": 90, "val": 10, "test": 30}
    for split in splits.values():
        tokens = split.inputs[0]
        assert tokens.dtype == np.uint8 and tokens.shape[1] == 256
        assert (split.lengths[0] == 256).all()
        assert split.labels.min() >= 0 and split.labels.max() < 10
    assert (splits["train"].inputs[0] == 0).any()  # black pixels are real tokens
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["split_seed"] == 0 and meta["image_size"] == 16 and meta["train_pool"] == 100
    assert meta["counts"] == {"train": 90, "val": 10, "test": 30}


def test_image_split_seed_changes_val(tmp_path):
    a = image.prepare(make_config(*TINY_IMAGE).task, tmp_path / "a", None)
    b = image.prepare(make_config(*TINY_IMAGE).task, tmp_path / "b", None)
    c = image.prepare(
        make_config(*TINY_IMAGE, "task.source.split_seed=1").task, tmp_path / "c", None
    )
    va, vb, vc = (read_prepared(f, 256, "cmd")["val"].inputs[0] for f in (a, b, c))
    assert np.array_equal(va, vb) and not np.array_equal(va, vc)
    assert json.loads((c / "meta.json").read_text())["split_seed"] == 1


def test_image_second_prepare_does_no_work(tmp_path, monkeypatch):
    cfg = make_config(*TINY_IMAGE)
    folder = image.prepare(cfg.task, tmp_path, None)

    def boom(*args, **kwargs):
        raise AssertionError("prepare did work on a prepared folder")

    monkeypatch.setattr(image, "read_cifar_archive", boom)
    monkeypatch.setattr(image, "fixture_archive", boom)
    assert image.prepare(cfg.task, tmp_path, None) == folder


def test_black_image_is_all_real_tokens(tmp_path):
    black = cifar_records(np.array([3], np.uint8), np.zeros((1, 3, 2, 2), np.uint8))
    batches = {f"data_batch_{i}.bin": black * 2 for i in range(1, 6)}
    batches["test_batch.bin"] = black
    archive = cifar_archive(tmp_path / "black.tar.gz", batches)
    cfg = make_config(
        "task=image_tiny",
        "task.source.fixture=null",
        f"task.source.archive={archive}",
        "task.source.image_size=2",
        "task.max_length=4",
    )
    splits = read_prepared(image.prepare(cfg.task, tmp_path / "data", None), 4, "cmd")
    test = splits["test"]
    assert test.inputs[0].tolist() == [[0, 0, 0, 0]] and test.lengths[0].tolist() == [4]
    assert test.labels.tolist() == [3]


def test_official_image_config_from_local_archive(tmp_path):
    archive = synthetic_archives.write_cifar_archive(
        tmp_path / "cifar-10-binary.tar.gz", num_per_batch=4, num_test=5, image_size=32
    )
    cfg = make_config("task=image", f"task.source.archive={archive}", "task.source.sha256=null")
    folder = image.prepare(cfg.task, tmp_path / "data", None)
    assert folder == tmp_path / "data" / "prepared" / "cifar10"
    splits = read_prepared(folder, 1024, "cmd")
    assert {k: v.inputs[0].shape for k, v in splits.items()} == {
        "train": (18, 1024),
        "val": (2, 1024),
        "test": (5, 1024),
    }


def test_image_checksum_mismatch_and_truncation_prepare_nothing(tmp_path):
    archive = synthetic_archives.write_cifar_archive(
        tmp_path / "cifar-10-binary.tar.gz", num_per_batch=4, num_test=4, image_size=32
    )
    cfg = make_config(
        "task=image", f"task.source.archive={archive}", f"task.source.sha256={'cd' * 32}"
    )
    with pytest.raises(DataError, match="checksum mismatch"):
        image.prepare(cfg.task, tmp_path / "data", None)
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(archive.read_bytes()[:-100])
    cfg = make_config("task=image", f"task.source.archive={cut}", "task.source.sha256=null")
    with pytest.raises(DataError, match="truncated or corrupt"):
        image.prepare(cfg.task, tmp_path / "data", None)
    assert leftovers(tmp_path / "data") == []


def test_image_no_network_names_url_and_destination(tmp_path):
    url = closed_port_url("cifar-10-binary.tar.gz")
    cfg = make_config("task=image", f"task.source.url={url}")
    with pytest.raises(DataError) as err:
        image.prepare(cfg.task, tmp_path, None)
    dest = tmp_path / "downloads" / "cifar-10-binary.tar.gz"
    assert f"could not download {url}" in str(err.value) and str(dest) in str(err.value)
    assert leftovers(tmp_path) == []


def test_image_uses_tfds_when_it_provides_the_data(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)

    def data_source(name, split, **kwargs):
        assert name == "cifar10"
        sizes = {"train": 20, "test": 3}
        return [
            [
                {"image": rng.integers(0, 256, (32, 32, 3), np.uint8), "label": i % 10}
                for i in range(sizes[s])
            ]
            for s in split
        ]

    monkeypatch.setitem(
        sys.modules, "tensorflow_datasets", types.SimpleNamespace(data_source=data_source)
    )
    cfg = make_config("task=image", f"task.source.url={closed_port_url('x.tar.gz')}")
    folder = image.prepare(cfg.task, tmp_path, None)
    splits = read_prepared(folder, 1024, "cmd")
    assert [len(splits[s]) for s in ("train", "val", "test")] == [18, 2, 3]
    assert json.loads((folder / "meta.json").read_text())["source"] == "tfds:cifar10"
