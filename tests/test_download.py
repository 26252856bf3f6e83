"""``fastqa download`` (fastqa/data/download.py) against a real HTTP server on 127.0.0.1 serving generated files:
sha256 checks, resuming a ``.part`` with Range (and from zero when the server ignores Range), atomic final
files, files already present, zip extraction, the mirror override and the command line. Nothing here reads the
real catalogue's files or reaches the internet."""
from __future__ import annotations

import gzip
import hashlib
import io
import random
import re
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cli_helpers import assert_user_error, run_cli

from fastqa.data import download as dl
from fastqa.data.download import Entry
from fastqa.errors import UserError


class _Store:
    """What the test server serves (path -> bytes), how, and what it was asked."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.no_range: set[str] = set()  # paths served whole whatever the Range header says
        self.cut: dict[str, int] = {}  # path -> bytes sent before closing the connection (once)
        self.requests: list[tuple[str, str | None, int]] = []  # (path, Range header, status)


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        store: _Store = self.server.store
        body = store.files.get(self.path)
        asked = self.headers.get("Range")
        if body is None:
            store.requests.append((self.path, asked, 404))
            self.send_error(404)
            return
        start = 0
        if asked and self.path not in store.no_range:
            start = int(re.fullmatch(r"bytes=(\d+)-", asked).group(1))
            if start >= len(body):
                store.requests.append((self.path, asked, 416))
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        store.requests.append((self.path, asked, 206 if start else 200))
        self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        payload = body[start:]
        cut = store.cut.pop(self.path, None)
        self.wfile.write(payload if cut is None else payload[:cut])

    def log_message(self, *args) -> None:
        pass


class _Server:
    def __init__(self, httpd: ThreadingHTTPServer) -> None:
        self.store: _Store = httpd.store
        self.base = f"http://127.0.0.1:{httpd.server_address[1]}"

    def url(self, path: str) -> str:
        return self.base + path


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    httpd.store = _Store()
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield _Server(httpd)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def _bytes(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _serve(server: _Server, monkeypatch, data: bytes, *, name: str = "file.bin", source: str | None = None,
           **fields) -> Entry:
    """Serve ``data`` at /demo/SOURCE and make the catalogue that one file of the dataset "demo"."""
    source = source or name
    server.store.files[f"/demo/{source}"] = data
    fields.setdefault("sha256", _sha(data))
    fields.setdefault("size", len(data))
    entry = Entry("demo", name, server.url(f"/demo/{source}"), licence="test data", **fields)
    monkeypatch.setattr(dl, "CATALOGUE", (entry,))
    return entry


DATA = _bytes(300_000)  # several of the downloader's 64 KiB reads


def test_fetches_checks_and_leaves_only_the_final_file(server, monkeypatch, tmp_path):
    _serve(server, monkeypatch, DATA)
    written = dl.download("demo", tmp_path, progress=False)
    assert written == {"demo": [tmp_path / "demo" / "file.bin"]}
    assert (tmp_path / "demo" / "file.bin").read_bytes() == DATA
    assert sorted(p.name for p in (tmp_path / "demo").iterdir()) == ["file.bin"]  # no .part, no temporary file
    assert server.store.requests == [("/demo/file.bin", None, 200)]


def test_gzipped_output_is_checked_by_its_text_and_byte_for_byte_reproducible(server, monkeypatch, tmp_path):
    text = b'{"data": [' + b", ".join(b'"%d"' % i for i in range(20_000)) + b"]}"
    _serve(server, monkeypatch, text, name="dev.json.gz", source="dev.json", gzip=True)
    out = dl.download("demo", tmp_path, progress=False)["demo"][0]
    first = out.read_bytes()
    assert gzip.decompress(first) == text
    assert first[4:8] == b"\0\0\0\0"  # mtime 0: the bytes depend on the text alone
    assert not (tmp_path / "demo" / "dev.json.part").exists()
    dl.download("demo", tmp_path, progress=False, force=True)
    assert out.read_bytes() == first
    assert len(server.store.requests) == 2


def test_resumes_a_partial_download_with_a_range_request(server, monkeypatch, tmp_path):
    _serve(server, monkeypatch, DATA)
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "file.bin.part").write_bytes(DATA[:100_000])
    dl.download("demo", tmp_path, progress=False)
    assert server.store.requests == [("/demo/file.bin", "bytes=100000-", 206)]
    assert (tmp_path / "demo" / "file.bin").read_bytes() == DATA
    assert not (tmp_path / "demo" / "file.bin.part").exists()


def test_starts_again_from_zero_when_the_server_ignores_range(server, monkeypatch, tmp_path):
    _serve(server, monkeypatch, DATA)
    server.store.no_range.add("/demo/file.bin")
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "file.bin.part").write_bytes(DATA[:100_000])
    dl.download("demo", tmp_path, progress=False)
    assert server.store.requests == [("/demo/file.bin", "bytes=100000-", 200)]
    assert (tmp_path / "demo" / "file.bin").read_bytes() == DATA  # not the first 100,000 bytes twice


def test_a_resumed_download_that_does_not_verify_is_fetched_again_from_zero(server, monkeypatch, tmp_path):
    _serve(server, monkeypatch, DATA)
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "file.bin.part").write_bytes(b"x" * 100_000)  # not a prefix of the file
    dl.download("demo", tmp_path, progress=False)
    assert server.store.requests == [("/demo/file.bin", "bytes=100000-", 206), ("/demo/file.bin", None, 200)]
    assert (tmp_path / "demo" / "file.bin").read_bytes() == DATA


def test_a_complete_part_is_checked_without_fetching_it_again(server, monkeypatch, tmp_path):
    _serve(server, monkeypatch, DATA, size=None)  # no size: the server's 416 says the part is complete
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "file.bin.part").write_bytes(DATA)
    dl.download("demo", tmp_path, progress=False)
    assert server.store.requests == [("/demo/file.bin", "bytes=300000-", 416)]
    assert (tmp_path / "demo" / "file.bin").read_bytes() == DATA


def test_a_broken_connection_keeps_the_part_and_the_next_run_resumes(server, monkeypatch, tmp_path):
    _serve(server, monkeypatch, DATA)
    server.store.cut["/demo/file.bin"] = 150_000
    with pytest.raises(UserError, match=r"closed the connection after 150,000 of 300,000 bytes.*resume"):
        dl.download("demo", tmp_path, progress=False)
    assert not (tmp_path / "demo" / "file.bin").exists()
    assert (tmp_path / "demo" / "file.bin.part").stat().st_size == 150_000
    dl.download("demo", tmp_path, progress=False)
    assert server.store.requests[-1] == ("/demo/file.bin", "bytes=150000-", 206)
    assert (tmp_path / "demo" / "file.bin").read_bytes() == DATA


def test_a_checksum_mismatch_is_one_line_with_both_digests_and_writes_nothing(server, monkeypatch, tmp_path):
    _serve(server, monkeypatch, DATA, sha256="0" * 64)
    with pytest.raises(UserError) as e:
        dl.download("demo", tmp_path, progress=False)
    message = str(e.value)
    assert "\n" not in message
    assert str(tmp_path / "demo" / "file.bin") in message
    assert f"expected sha256 {'0' * 64}, got sha256 {_sha(DATA)}" in message
    assert list((tmp_path / "demo").iterdir()) == []  # neither the final file nor the .part


def test_a_missing_file_is_one_line_naming_the_url(server, monkeypatch, tmp_path):
    entry = _serve(server, monkeypatch, DATA)
    server.store.files.clear()
    with pytest.raises(UserError, match=rf"^cannot download {re.escape(entry.url)}: HTTP 404 ") as e:
        dl.download("demo", tmp_path, progress=False)
    assert "\n" not in str(e.value)
    assert list((tmp_path / "demo").iterdir()) == []


def test_a_file_present_and_verified_is_kept_a_damaged_one_fetched_again(server, monkeypatch, tmp_path):
    _serve(server, monkeypatch, DATA)
    final = tmp_path / "demo" / "file.bin"
    dl.download("demo", tmp_path, progress=False)
    dl.download("demo", tmp_path, progress=False)
    assert len(server.store.requests) == 1  # present and verified: not fetched
    final.write_bytes(DATA[:-1] + bytes([DATA[-1] ^ 1]))  # one bit wrong
    dl.download("demo", tmp_path, progress=False)
    assert len(server.store.requests) == 2 and final.read_bytes() == DATA
    dl.download("demo", tmp_path, progress=False, force=True)
    assert len(server.store.requests) == 3


def _zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buffer.getvalue()


VECTORS = b"".join(b"word%d 0.%d -0.%d\n" % (i, i, i) for i in range(50))
HEAD = b"".join(VECTORS.splitlines(keepends=True)[:20])


def test_extracts_the_first_lines_of_a_zip_member_and_checks_them(server, monkeypatch, tmp_path):
    archive = _zip({"vectors.100d.txt": b"other\n", "vectors.50d.txt": VECTORS})
    _serve(server, monkeypatch, archive, name="vectors.top20.txt.gz", source="vectors.zip", sha256=None,
           gzip=True, member="vectors.50d.txt", head=20, output_sha256=_sha(HEAD))
    out = dl.download("demo", tmp_path, progress=False)["demo"][0]
    assert gzip.decompress(out.read_bytes()) == HEAD
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]  # the archive is gone once used
    dl.download("demo", tmp_path, progress=False)
    assert len(server.store.requests) == 1  # the output is verified by its text: nothing fetched again


def test_extracted_text_that_does_not_verify_writes_nothing(server, monkeypatch, tmp_path):
    archive = _zip({"vectors.50d.txt": VECTORS})
    _serve(server, monkeypatch, archive, name="vectors.top20.txt.gz", source="vectors.zip", sha256=None,
           gzip=True, member="vectors.50d.txt", head=20, output_sha256="f" * 64)
    with pytest.raises(UserError, match=rf"vectors.top20.txt.gz: checksum mismatch: expected sha256 f{{64}} of its "
                       rf"text, got {_sha(HEAD)}"):
        dl.download("demo", tmp_path, progress=False)
    assert list((tmp_path / "demo").iterdir()) == []


def test_a_damaged_archive_is_removed_with_one_line(server, monkeypatch, tmp_path):
    _serve(server, monkeypatch, b"not a zip archive", name="vectors.txt.gz", source="vectors.zip", sha256=None,
           gzip=True, member="vectors.50d.txt", head=20, output_sha256=_sha(HEAD))
    with pytest.raises(UserError, match=r"vectors.zip: not a readable zip archive .*removed"):
        dl.download("demo", tmp_path, progress=False)
    assert list((tmp_path / "demo").iterdir()) == []


def test_a_mirror_replaces_the_publisher(server, monkeypatch, tmp_path):
    server.store.files["/demo/file.bin"] = DATA
    entry = Entry("demo", "file.bin", "https://publisher.invalid/files/file.bin?download=1", _sha(DATA), len(DATA),
                  "test data")
    monkeypatch.setattr(dl, "CATALOGUE", (entry,))
    assert dl.source_url(entry, base_url=server.base + "/") == server.url("/demo/file.bin")
    dl.download("demo", tmp_path / "a", progress=False, base_url=server.base)
    monkeypatch.setenv(dl.ENV_BASE, server.base)
    dl.download("demo", tmp_path / "b", progress=False)
    assert (tmp_path / "a" / "demo" / "file.bin").read_bytes() == (tmp_path / "b" / "demo" / "file.bin").read_bytes()
    assert [r[0] for r in server.store.requests] == ["/demo/file.bin"] * 2


def test_progress_is_shown_only_when_asked_or_on_a_terminal(server, monkeypatch, tmp_path, capsys):
    pytest.importorskip("tqdm")
    _serve(server, monkeypatch, DATA)
    dl.download("demo", tmp_path / "quiet")  # stderr is not a terminal under pytest
    assert "100%" not in capsys.readouterr().err
    dl.download("demo", tmp_path / "shown", progress=True)
    assert re.search(r"file\.bin: 100%", capsys.readouterr().err)


def test_an_unknown_dataset_is_a_user_error_listing_the_known_ones(tmp_path):
    with pytest.raises(UserError, match=r"'squid' is not a dataset .*known: squad, glove, multi30k"):
        dl.download("squid", tmp_path)
    assert not (tmp_path / "squid").exists()


def test_the_command_prints_the_folders_and_files_for_the_recipes(server, monkeypatch, tmp_path, capsys):
    _serve(server, monkeypatch, DATA)
    rc, out, _ = run_cli(capsys, ["download", "demo", "--to", tmp_path, "--no-progress"])
    folder = (tmp_path / "demo").resolve()
    assert rc == 0
    assert out.splitlines() == [f"DEMO={folder}", f"  {folder / 'file.bin'}"]


def test_the_command_reports_a_checksum_mismatch_in_one_line(server, monkeypatch, tmp_path, capsys):
    _serve(server, monkeypatch, DATA, sha256="0" * 64)
    assert_user_error(capsys, ["download", "demo", "--to", tmp_path], rf"file\.bin: checksum mismatch: expected "
                      rf"sha256 0{{64}}, got sha256 {_sha(DATA)}")
    assert not (tmp_path / "demo" / "file.bin").exists()


def test_the_catalogue_has_the_files_the_recipes_read_each_with_a_digest():
    names = {(e.dataset, e.name) for e in dl.CATALOGUE}
    assert len(names) == len(dl.CATALOGUE)
    recipes = {("squad", "dev-v1.1.json.gz"), ("glove", "glove.6B.50d.top100k.txt.gz")}
    recipes |= {("multi30k", f"{s}.{lang}.gz") for s in ("train", "val", "test_2016_flickr") for lang in ("de", "en")}
    assert recipes <= names
    assert dl.datasets() == ["squad", "glove", "multi30k"]
    for e in dl.CATALOGUE:
        assert e.url.startswith("https://"), e
        assert e.content_sha256 is not None and re.fullmatch(r"[0-9a-f]{64}", e.content_sha256), e
        assert e.sha256 is None or re.fullmatch(r"[0-9a-f]{64}", e.sha256), e
        assert e.sha256 is not None or e.size is not None, e  # every download is checked by something
        assert Path(e.name).name == e.name and e.licence, e
