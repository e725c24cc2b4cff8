"""LRA Retrieval data: the AAN pairs parser, finding the files, preparing, the tiny fixture."""

import io
import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
from conftest import make_config

from lra.data import retrieval, store
from lra.data.synthetic_aan import write_aan_fixture
from lra.data.tasks import load_task, prepare_task
from lra.errors import DataError

# Documents with characters a CSV reader would treat specially (no quoting in AAN files).
ROWS = [
    ("1.0", "A00-1001", "B00-2002", 'He said "hi, there', "second ' doc \\ with, commas"),
    ("0.0", "C00-3003", "D00-4004", "caf\u00e9 \u2014 na\u00efve", '"'),
    ("1", "E00-5005", "F00-6006", "x" * 50, "short"),
]


def tsv_text(rows=ROWS, newline="\n") -> bytes:
    return "".join("\t".join(r) + newline for r in rows).encode("utf-8")


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def encoded(text: str, length: int) -> tuple[list[int], int]:
    data = text.encode("utf-8")[:length]
    return [b + 1 for b in data] + [0] * (length - len(data)), len(data)


def make_tsv_dir(folder: Path, rows=ROWS) -> Path:
    for name in retrieval.SPLIT_FILES.values():
        write(folder / name, tsv_text(rows))
    return folder


def retrieval_cfg(*overrides: str):
    return make_config("task=retrieval", *overrides).task


# --- parsing -----------------------------------------------------------------


def test_read_aan_tsv_two_byte_encoded_inputs_and_float_labels(tmp_path):
    path = write(tmp_path / "new_aan_pairs.eval.tsv", tsv_text())
    split = retrieval.read_aan_tsv(path, 64)
    assert len(split.inputs) == len(split.lengths) == 2
    assert split.inputs[0].dtype == np.uint16 and split.inputs[0].shape == (3, 64)
    assert split.lengths[0].dtype == np.int32 and split.labels.dtype == np.int32
    np.testing.assert_array_equal(split.labels, [1, 0, 1])
    for row, (_, _, _, text1, text2) in enumerate(ROWS):
        for k, text in enumerate((text1, text2)):
            tokens, length = encoded(text, 64)
            assert split.inputs[k][row].tolist() == tokens
            assert split.lengths[k][row] == length
    # Multi-byte UTF-8 characters are bytes: "café —" has more bytes than characters.
    assert split.lengths[0][1] == len(ROWS[1][3].encode("utf-8")) > len(ROWS[1][3])


def test_read_aan_tsv_truncates_to_stored_length(tmp_path):
    path = write(tmp_path / "t.tsv", tsv_text())
    split = retrieval.read_aan_tsv(path, 4)
    assert split.max_length == 4
    np.testing.assert_array_equal(split.lengths[0], [4, 4, 4])
    np.testing.assert_array_equal(split.lengths[1], [4, 1, 4])
    assert split.inputs[0][0].tolist() == [ord(c) + 1 for c in "He s"]
    assert split.inputs[1][1].tolist() == [ord('"') + 1, 0, 0, 0]


def test_read_aan_tsv_crlf_and_blank_lines(tmp_path):
    path = write(tmp_path / "t.tsv", tsv_text(newline="\r\n") + b"\n")
    split = retrieval.read_aan_tsv(path, 16)
    assert len(split) == 3
    assert split.lengths[1][2] == len("short")  # no "\r" kept


def test_chunked_reading_matches_one_chunk(tmp_path, monkeypatch):
    rows = [(f"{i % 2}.0", "a", "b", f"doc {i} " * (i % 7), f"other {i}") for i in range(23)]
    path = write(tmp_path / "t.tsv", tsv_text(rows))
    whole = retrieval.read_aan_tsv(path, 32)
    monkeypatch.setattr(retrieval, "CHUNK_ROWS", 5)
    chunked = retrieval.read_aan_tsv(path, 32)
    for a, b in zip(whole.inputs + whole.lengths, chunked.inputs + chunked.lengths, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(whole.labels, chunked.labels)
    np.testing.assert_array_equal(whole.labels, [i % 2 for i in range(23)])


@pytest.mark.parametrize(
    ("row", "what"),
    [
        ("1.0\ta\tb\tonly four", "found 4"),
        ("1.0\ta\tb\ttext\twith\ttab", "found 6"),
        ("yes\ta\tb\tt1\tt2", "not a number"),
        ("2.0\ta\tb\tt1\tt2", "not 0 or 1"),
        ("0.5\ta\tb\tt1\tt2", "not 0 or 1"),
        ("nan\ta\tb\tt1\tt2", "not 0 or 1"),
    ],
)
def test_malformed_row_names_file_and_line(tmp_path, row, what):
    data = tsv_text(ROWS[:2]) + row.encode() + b"\n" + tsv_text(ROWS[2:])
    path = write(tmp_path / "bad_pairs.tsv", data)
    with pytest.raises(DataError) as info:
        retrieval.read_aan_tsv(path, 8)
    message = str(info.value)
    assert "bad_pairs.tsv" in message and "line 3" in message and what in message


def test_empty_and_missing_files(tmp_path):
    with pytest.raises(DataError, match="no rows"):
        retrieval.read_aan_tsv(write(tmp_path / "empty.tsv", b"\n"), 8)
    with pytest.raises(DataError, match="nothere.tsv"):
        retrieval.read_aan_tsv(tmp_path / "nothere.tsv", 8)


# --- finding the files -------------------------------------------------------


def test_find_tsv_dir_at_either_nesting_level(tmp_path):
    flat = make_tsv_dir(tmp_path / "a" / "tsv_data")
    assert retrieval.find_tsv_dir(tmp_path / "a") == flat
    nested = make_tsv_dir(tmp_path / "b" / "lra_release" / "lra_release" / "tsv_data")
    assert retrieval.find_tsv_dir(tmp_path / "b") == nested
    assert retrieval.find_tsv_dir(tmp_path / "b" / "lra_release") == nested
    assert retrieval.find_tsv_dir(tmp_path / "b" / "lra_release" / "lra_release") == nested
    assert retrieval.find_tsv_dir(tmp_path / "c") is None
    (flat / "new_aan_pairs.test.tsv").unlink()  # incomplete folders do not count
    assert retrieval.find_tsv_dir(tmp_path / "a") is None


def test_prepare_from_nested_release_then_again_does_no_work(tmp_path, monkeypatch):
    make_tsv_dir(tmp_path / "lra_release" / "lra_release" / "tsv_data")
    cfg = retrieval_cfg()
    out = prepare_task(cfg, tmp_path, num_workers=1)
    assert out == tmp_path / "prepared" / "aan"
    meta = store.read_meta(out)
    assert meta["counts"] == {"train": 3, "val": 3, "test": 3}
    assert meta["num_inputs"] == 2 and meta["stored_length"] == 4000
    assert meta["source_kind"] == "extracted lra_release" and "tsv_data" in meta["source"]
    assert meta["seconds"] >= 0
    splits = load_task(cfg, tmp_path)
    assert splits["val"].inputs[1].shape == (3, 4000)
    np.testing.assert_array_equal(splits["test"].labels, [1, 0, 1])

    def fail(*args, **kwargs):
        raise AssertionError("read again")

    monkeypatch.setattr(retrieval, "read_source", fail)
    mtime = (out / "meta.json").stat().st_mtime_ns
    assert prepare_task(cfg, tmp_path, num_workers=1) == out
    assert (out / "meta.json").stat().st_mtime_ns == mtime


def test_prepare_from_tsv_dir_override(tmp_path):
    folder = make_tsv_dir(tmp_path / "elsewhere", ROWS[:2])
    cfg = retrieval_cfg(f"task.source.tsv_dir={folder}", "task.source.stored_length=16")
    out = retrieval.prepare(cfg, tmp_path / "data")
    meta = store.read_meta(out)
    assert meta["source"] == str(folder) and meta["counts"]["train"] == 2
    assert meta["stored_length"] == 16
    with pytest.raises(DataError, match="new_aan_pairs"):
        retrieval.prepare(
            retrieval_cfg(f"task.source.tsv_dir={tmp_path / 'nothing'}"), tmp_path / "d2"
        )


def make_archive(path: Path, prefix: str, extra_unsafe: bool = False) -> Path:
    """A tar.gz shaped like lra_release.gz with the three AAN members among others."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:

        def add(name: str, data: bytes):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        add(f"{prefix}listops-1000/basic_val.tsv", b"Source\tTarget\n")
        for split, name in retrieval.SPLIT_FILES.items():
            rows = ROWS if split == "train" else ROWS[:2]
            add(f"{prefix}tsv_data/{name}", tsv_text(rows))
        if extra_unsafe:
            add("../evil.txt", b"x")
        add(f"{prefix}pathfinder32/curv_baseline/metadata/0.npy", b"")
    return path


@pytest.mark.parametrize("prefix", ["lra_release/", "lra_release/lra_release/"])
def test_prepare_streams_members_out_of_the_archive(tmp_path, prefix):
    archive = make_archive(tmp_path / "somewhere" / "lra_release.gz", prefix)
    out = retrieval.prepare(retrieval_cfg(f"task.source.archive={archive}"), tmp_path / "data")
    meta = store.read_meta(out)
    assert meta["counts"] == {"train": 3, "val": 2, "test": 2}
    assert meta["source"] == str(archive) and "archive" in meta["source_kind"]
    assert not (tmp_path / "data" / "lra_release").exists()  # nothing extracted


def test_prepare_finds_the_archive_in_downloads(tmp_path):
    make_archive(tmp_path / "downloads" / "lra_release.gz", "lra_release/")
    out = retrieval.prepare(retrieval_cfg(), tmp_path)
    assert store.read_meta(out)["counts"]["train"] == 3


def test_archive_problems_are_data_errors(tmp_path):
    unsafe = make_archive(tmp_path / "unsafe.gz", "lra_release/", extra_unsafe=True)
    splits = retrieval.read_archive(unsafe, 8)  # the three members come before the bad name
    assert len(splits["train"]) == 3
    other = tmp_path / "other.gz"
    with tarfile.open(other, "w:gz") as tar:
        info = tarfile.TarInfo("../evil.txt")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(DataError, match="unsafe"):
        retrieval.read_archive(other, 8)
    no_aan = tmp_path / "no_aan.gz"
    with tarfile.open(no_aan, "w:gz") as tar:
        info = tarfile.TarInfo("lra_release/listops-1000/basic_val.tsv")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(DataError, match="new_aan_pairs.train.tsv"):
        retrieval.read_archive(no_aan, 8)
    truncated = tmp_path / "truncated.gz"
    truncated.write_bytes(make_archive(tmp_path / "full.gz", "x/").read_bytes()[:200])
    with pytest.raises(DataError, match="truncated or corrupt"):
        retrieval.read_archive(truncated, 8)
    with pytest.raises(DataError, match="does not exist"):
        retrieval.prepare(retrieval_cfg(f"task.source.archive={tmp_path / 'no.gz'}"), tmp_path)


def test_missing_data_explains_the_three_options(tmp_path):
    with pytest.raises(DataError) as info:
        retrieval.prepare(retrieval_cfg(), tmp_path)
    message = str(info.value)
    assert "task.source.tsv_dir" in message
    assert "task.source.archive" in message
    assert "lra-data task=retrieval +task.source.download=true" in message
    assert retrieval.DEFAULT_URL in message
    assert not (tmp_path / "prepared").exists()


def test_download_option_calls_the_downloader(tmp_path, monkeypatch):
    from lra.data import archives

    source = make_archive(tmp_path / "src.gz", "lra_release/")
    calls = []

    def fake_download(url, dest, *, sha256, progress=True):
        calls.append((url, Path(dest), sha256))
        Path(dest).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, dest)
        return Path(dest)

    monkeypatch.setattr(archives, "download", fake_download)
    data_dir = tmp_path / "data"
    out = retrieval.prepare(retrieval_cfg("+task.source.download=true"), data_dir)
    assert calls == [(retrieval.DEFAULT_URL, data_dir / "downloads" / "lra_release.gz", None)]
    assert store.read_meta(out)["counts"]["train"] == 3


# --- the tiny variant --------------------------------------------------------


def test_fixture_format_is_deterministic_and_reused(tmp_path):
    a = write_aan_fixture(tmp_path / "a", num_train=20, num_val=6, num_test=6, seed=1)
    b = write_aan_fixture(tmp_path / "b", num_train=20, num_val=6, num_test=6, seed=1)
    c = write_aan_fixture(tmp_path / "c", num_train=20, num_val=6, num_test=6, seed=2)
    for name in retrieval.SPLIT_FILES.values():
        assert (a / name).read_bytes() == (b / name).read_bytes() != (c / name).read_bytes()
    lines = (a / "new_aan_pairs.train.tsv").read_bytes().decode("utf-8").splitlines()
    assert len(lines) == 20
    fields = [line.split("\t") for line in lines]
    assert all(len(f) == 5 for f in fields)
    assert sorted(f[0] for f in fields) == ["0.0"] * 10 + ["1.0"] * 10
    mtime = (a / "new_aan_pairs.train.tsv").stat().st_mtime_ns
    write_aan_fixture(tmp_path / "a", num_train=20, num_val=6, num_test=6, seed=1)
    assert (a / "new_aan_pairs.train.tsv").stat().st_mtime_ns == mtime
    assert json.loads((a / "fixture.json").read_text())["seed"] == 1


def test_retrieval_tiny_prepare_end_to_end(tmp_path):
    cfg = make_config("task=retrieval_tiny").task
    out = prepare_task(cfg, tmp_path, num_workers=1)
    meta = store.read_meta(out)
    fixture = cfg.source.fixture
    assert meta["counts"] == {
        "train": fixture.num_train,
        "val": fixture.num_val,
        "test": fixture.num_test,
    }
    assert "synthetic" in meta["source_kind"]
    assert (tmp_path / "fixtures" / "retrieval_tiny" / "new_aan_pairs.eval.tsv").is_file()
    splits = load_task(cfg, tmp_path)
    train = splits["train"]
    assert len(train.inputs) == 2 and train.max_length == cfg.max_length
    assert train.inputs[0].max() < cfg.vocab_size
    assert 0.4 < train.labels.mean() < 0.6
    assert (train.lengths[0] > 0).all() and (train.lengths[1] > 0).all()
