"""Tests for lra.data.archives: checksums, resumable downloads (local HTTP only), safe tar reads."""

import hashlib
import http.server
import socket
import threading
from pathlib import Path, PurePosixPath

import pytest

from lra.data import archives
from lra.data.synthetic_archives import write_tar_gz
from lra.errors import DataError

PAYLOAD = bytes(range(256)) * 40 + b"tail"  # 10,244 bytes
PAYLOAD_SHA = hashlib.sha256(PAYLOAD).hexdigest()


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves ``server.payload`` at any path; honours Range when ``server.ranges``;
    sends only ``server.cut`` bytes (then closes) when set; 404 for paths ending in /missing."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # keep test output clean
        pass

    def do_GET(self):
        server = self.server
        server.ranges_seen.append(self.headers.get("Range"))
        if self.path.endswith("/missing"):
            self.send_error(404, "Not Found")
            return
        body, start = server.payload, 0
        header = self.headers.get("Range")
        if server.ranges and header:
            start = int(header.split("=")[1].split("-")[0])
            if start >= len(body):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        chunk = body[start:]
        self.send_header("Content-Length", str(len(chunk)))
        self.send_header("Connection", "close")
        self.end_headers()
        if server.cut is not None:
            chunk = chunk[: server.cut]
        # Count before writing: the client can finish reading (and the test assert) before
        # this thread runs another line after the write.
        server.bytes_sent += len(chunk)
        self.wfile.write(chunk)
        self.close_connection = True


@pytest.fixture
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.payload, httpd.ranges, httpd.cut = PAYLOAD, True, None
    httpd.ranges_seen, httpd.bytes_sent = [], 0
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}/data/file.bin"
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/aclImdb_v1.tar.gz"


def test_sha256_file_and_verify(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(PAYLOAD)
    assert archives.sha256_file(path) == PAYLOAD_SHA
    assert archives.verify_sha256(path, PAYLOAD_SHA.upper()) == PAYLOAD_SHA
    with pytest.raises(DataError) as err:
        archives.verify_sha256(path, "0" * 64)
    msg = str(err.value)
    assert str(path) in msg and "0" * 64 in msg and PAYLOAD_SHA in msg and "delete" in msg


def test_download_fresh(server, tmp_path):
    dest = tmp_path / "dl" / "file.bin"
    assert archives.download(server.url, dest, sha256=PAYLOAD_SHA, progress=False) == dest
    assert dest.read_bytes() == PAYLOAD
    assert not dest.with_name("file.bin.part").exists()
    assert server.ranges_seen == [None]


def test_download_existing_file_does_no_network(tmp_path):
    dest = tmp_path / "file.bin"
    dest.write_bytes(PAYLOAD)
    url = closed_port_url()
    assert archives.download(url, dest, sha256=PAYLOAD_SHA, progress=False) == dest
    assert archives.download(url, dest, sha256=None, progress=False) == dest
    with pytest.raises(DataError, match="checksum mismatch"):
        archives.download(url, dest, sha256="1" * 64, progress=False)


def test_download_resumes_with_range(server, tmp_path):
    dest = tmp_path / "file.bin"
    part = tmp_path / "file.bin.part"
    part.write_bytes(PAYLOAD[:1000])
    archives.download(server.url, dest, sha256=PAYLOAD_SHA, progress=False)
    assert dest.read_bytes() == PAYLOAD and not part.exists()
    assert server.ranges_seen == ["bytes=1000-"]
    assert server.bytes_sent == len(PAYLOAD) - 1000


def test_download_restarts_when_server_ignores_range(server, tmp_path):
    server.ranges = False
    dest = tmp_path / "file.bin"
    (tmp_path / "file.bin.part").write_bytes(b"x" * 500)  # not even a prefix of the file
    archives.download(server.url, dest, sha256=PAYLOAD_SHA, progress=False)
    assert dest.read_bytes() == PAYLOAD
    assert server.bytes_sent == len(PAYLOAD)


def test_download_complete_part_answered_416(server, tmp_path):
    dest = tmp_path / "file.bin"
    (tmp_path / "file.bin.part").write_bytes(PAYLOAD)
    archives.download(server.url, dest, sha256=PAYLOAD_SHA, progress=False)
    assert dest.read_bytes() == PAYLOAD and server.bytes_sent == 0


def test_interrupted_download_keeps_part_and_resumes(server, tmp_path):
    dest = tmp_path / "file.bin"
    part = tmp_path / "file.bin.part"
    server.cut = 4000
    with pytest.raises(DataError) as err:
        archives.download(server.url, dest, sha256=PAYLOAD_SHA, progress=False)
    assert server.url in str(err.value) and str(dest) in str(err.value)
    assert not dest.exists() and part.read_bytes() == PAYLOAD[:4000]
    server.cut = None
    archives.download(server.url, dest, sha256=PAYLOAD_SHA, progress=False)
    assert dest.read_bytes() == PAYLOAD
    assert server.ranges_seen[-1] == "bytes=4000-"


def test_download_checksum_mismatch_leaves_nothing(server, tmp_path):
    dest = tmp_path / "file.bin"
    with pytest.raises(DataError) as err:
        archives.download(server.url, dest, sha256="ab" * 32, progress=False)
    assert "ab" * 32 in str(err.value) and PAYLOAD_SHA in str(err.value)
    assert not dest.exists() and not (tmp_path / "file.bin.part").exists()


def test_download_http_error(server, tmp_path):
    url = server.url.replace("file.bin", "missing")
    dest = tmp_path / "file.bin"
    with pytest.raises(DataError, match="404") as err:
        archives.download(url, dest, sha256=None, progress=False)
    assert url in str(err.value) and str(dest) in str(err.value)


def test_no_network_names_url_and_destination(tmp_path):
    url = closed_port_url()
    dest = tmp_path / "downloads" / "aclImdb_v1.tar.gz"
    with pytest.raises(DataError) as err:
        archives.download(url, dest, sha256=None, progress=False, timeout=5)
    msg = str(err.value)
    assert msg.startswith(f"could not download {url} (")
    assert f"fetch it by hand and put it at {dest}" in msg
    assert not dest.exists()


MEMBERS = [
    ("top", None),
    ("top/b.txt", b"bee"),
    ("top/sub/a.txt", b"ay"),
    ("./top/c.bin", b"\x00\x01"),
]


def test_iter_tar_members_regular_files_and_select(tmp_path):
    archive = write_tar_gz(tmp_path / "a.tar.gz", MEMBERS)
    got = list(archives.iter_tar_members(archive))
    assert got == [
        (PurePosixPath("top/b.txt"), b"bee"),
        (PurePosixPath("top/sub/a.txt"), b"ay"),
        (PurePosixPath("top/c.bin"), b"\x00\x01"),
    ]
    picked = archives.iter_tar_members(archive, select=lambda p: p.suffix == ".txt")
    assert [p.name for p, _ in picked] == ["b.txt", "a.txt"]


@pytest.mark.parametrize("bad", ["/etc/passwd", "top/../../evil.txt", "../x.txt"])
def test_unsafe_member_is_refused(tmp_path, bad):
    archive = write_tar_gz(tmp_path / "a.tar.gz", [*MEMBERS[:2], (bad, b"x"), MEMBERS[2]])
    with pytest.raises(DataError) as err:
        # even a member that select() would skip is refused
        list(archives.iter_tar_members(archive, select=lambda p: p.name == "b.txt"))
    assert bad in str(err.value) and str(archive) in str(err.value)


@pytest.mark.parametrize("keep", [0.2, 0.5, 0.9, 0.995])
def test_truncated_archive_is_data_error(tmp_path, keep):
    members = [(f"top/{i}.bin", bytes([i]) * 3000 + bytes(range(256)) * i) for i in range(30)]
    archive = write_tar_gz(tmp_path / "a.tar.gz", members)
    data = archive.read_bytes()
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(DataError) as err:
        list(archives.iter_tar_members(cut))
    assert str(cut) in str(err.value) and "download it again" in str(err.value)


def test_garbage_and_missing_archive(tmp_path):
    garbage = tmp_path / "g.tar.gz"
    garbage.write_bytes(b"\x1f\x8b\x08" + b"not really gzip" * 50)
    with pytest.raises(DataError, match="truncated or corrupt"):
        list(archives.iter_tar_members(garbage))
    with pytest.raises(DataError, match="does not exist"):
        list(archives.iter_tar_members(tmp_path / "absent.tar.gz"))


def test_source_archive_choices(tmp_path):
    from omegaconf import OmegaConf

    local = tmp_path / "mine.tar.gz"
    local.write_bytes(PAYLOAD)
    src = OmegaConf.create({"url": closed_port_url(), "sha256": PAYLOAD_SHA, "archive": str(local)})
    assert archives.source_archive(src, tmp_path, "x.tar.gz") == local
    src.sha256 = "2" * 64
    with pytest.raises(DataError, match="checksum mismatch"):
        archives.source_archive(src, tmp_path, "x.tar.gz")
    src.archive = str(tmp_path / "nope.tar.gz")
    with pytest.raises(DataError, match="does not exist"):
        archives.source_archive(src, tmp_path, "x.tar.gz")
    # no archive, no url: the file must already be in data_dir/downloads
    src = OmegaConf.create({"url": None, "sha256": None, "archive": None})
    with pytest.raises(DataError, match=str(Path("downloads") / "x.tar.gz")):
        archives.source_archive(src, tmp_path, "x.tar.gz")
    (tmp_path / "downloads").mkdir()
    (tmp_path / "downloads" / "x.tar.gz").write_bytes(PAYLOAD)
    assert archives.source_archive(src, tmp_path, "x.tar.gz") == tmp_path / "downloads/x.tar.gz"
