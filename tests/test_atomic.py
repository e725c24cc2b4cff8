"""lra/atomic.py: whole-or-nothing files and folders, with the modes open() and mkdir() give."""

import os
import stat

import pytest

from lra.atomic import atomic_file, atomic_folder, write_atomic


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_written_files_and_folders_get_the_umask_mode_not_tempfiles_private_one(
    tmp_path, umask_027
):
    path = write_atomic(tmp_path / "record.json", "{}")
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    assert mode(path) == mode(plain) == 0o640
    with atomic_folder(tmp_path / "prepared") as folder:
        (folder / "a").write_text("a")
    plain_dir = tmp_path / "plain_dir"
    plain_dir.mkdir()
    assert mode(tmp_path / "prepared") == mode(plain_dir) == 0o750


def test_a_failed_write_leaves_the_target_and_no_temporary_file(tmp_path):
    target = write_atomic(tmp_path / "record.json", "old")
    with pytest.raises(RuntimeError), atomic_file(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("disk full")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]
    with pytest.raises(RuntimeError), atomic_folder(tmp_path / "data") as folder:
        (folder / "part").write_text("half")
        raise RuntimeError("interrupted")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]
