"""The tests' Multi30k text without the local mirror: downloaded once by the project's own
downloader into a cache folder and reused; a skip with the reason when that fails too
(tests/multi30k_source.py). The "network" is a local HTTP server serving a tiny copy: a few
lines of each mirror file (made-up captions on a clone without the mirror)."""

from __future__ import annotations

import gzip
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import multi30k_source
import pytest


def _tiny_copy(folder: Path) -> dict[str, bytes]:
    """Every file the tests read, with the first lines of the mirror's copy (or made-up)."""
    mirror = multi30k_source.default_mirror()
    folder.mkdir()
    written = {}
    for name in multi30k_source.FILES:
        if (mirror / name).is_file():
            with gzip.open(mirror / name, "rb") as f:
                lines = [f.readline() for _ in range(5)]
        else:
            lines = [f"{name} caption {i} .\n".encode() for i in range(5)]
        written[name] = b"".join(lines)
        (folder / name).write_bytes(gzip.compress(written[name], mtime=0))
    return written


@pytest.fixture
def server(tmp_path):
    """``(url, requests)``: a local HTTP server of the tiny copy; the paths it was asked for."""
    files = tmp_path / "served"
    expected = _tiny_copy(files)
    requests: list[str] = []

    class Handler(SimpleHTTPRequestHandler):
        def do_GET(self):
            requests.append(self.path)
            super().do_GET()

        def log_message(self, *args):  # keep the test's output clean
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(files)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", requests, expected
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_without_a_mirror_the_files_are_downloaded_once_and_reused(tmp_path, server):
    url, requests, expected = server
    cache = tmp_path / "cache" / "transformer_nmt" / "multi30k"
    folder, reason = multi30k_source.locate(tmp_path / "no_mirror", url, cache)
    assert (folder, reason) == (cache, "")
    assert sorted(requests) == sorted(f"/{name}" for name in multi30k_source.FILES)
    for name, text in expected.items():
        assert gzip.decompress((cache / name).read_bytes()) == text
    # the next run (or test process) reuses the cache: nothing downloaded again
    assert multi30k_source.locate(tmp_path / "no_mirror", url, cache) == (cache, "")
    assert len(requests) == len(multi30k_source.FILES)


def test_a_mirror_is_used_in_place(tmp_path, server):
    url, requests, _ = server
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "train.en.gz").write_bytes(gzip.compress(b"a caption .\n"))
    assert multi30k_source.locate(mirror, url, tmp_path / "cache") == (mirror, "")
    assert requests == [] and not (tmp_path / "cache").exists()


def test_without_mirror_or_download_the_reason_names_both(tmp_path, server):
    url, requests, _ = server
    url += "/task1/raw"  # the files are not there: 404
    cache = tmp_path / "cache" / "transformer_nmt" / "multi30k"
    folder, reason = multi30k_source.locate(tmp_path / "no_mirror", url, cache)
    assert folder is None and requests == ["/task1/raw/train.en.gz"]  # stops at the first
    assert reason.startswith(f"Multi30k not found: no mirror at {tmp_path / 'no_mirror'} "
                             f"($NMT_MULTI30K_MIRROR), and the download into {cache} failed: "
                             f"could not download {url}/train.en.gz: HTTP Error 404")
    assert not (tmp_path / "cache").exists()  # a failed first download leaves no folder


def test_a_download_that_is_not_gzip_is_not_kept(tmp_path, server):
    url, _, _ = server
    served = Path(tmp_path / "served")
    (served / "train.en.gz").write_bytes(b"<html>a captive portal</html>")
    folder, reason = multi30k_source.locate(tmp_path / "no_mirror", url, tmp_path / "cache")
    assert folder is None and "train.en.gz is not a whole gzip file" in reason
    assert not (tmp_path / "cache").exists()
