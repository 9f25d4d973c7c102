"""The documentation site builds with no warning (``mkdocs build --strict``: no broken link, no
missing reference) and renders in a real headless Chromium, served over HTTP as a reader gets it.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from crashoverride._config.settings import FIELDS, HANDLER

ROOT = Path(__file__).resolve().parents[2]
BROWSER = next(
    (found for name in ("chromium", "chromium-browser", "google-chrome")
     if (found := shutil.which(name))), None,
)  # fmt: skip


def _build(site: Path, config: Path = ROOT / "mkdocs.yml") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = _build(out)
    assert built.returncode == 0, built.stdout + built.stderr
    return out


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(site))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)


def _browser() -> list[str]:
    if BROWSER is None:  # `make test` installs it; a missing browser is a failure, not a skip
        pytest.fail("no Chromium: install the distribution's package (apt-get install chromium)")
    return [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]


def _png_pixels(data: bytes) -> bytes:
    """The decompressed image data of a PNG (enough to tell a blank page from a drawn one)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    position, chunks = 8, []
    while position < len(data):
        (length,) = struct.unpack(">I", data[position : position + 4])
        if data[position + 4 : position + 8] == b"IDAT":
            chunks.append(data[position + 8 : position + 8 + length])
        position += 12 + length
    return zlib.decompress(b"".join(chunks))


def _dom(url: str) -> str:
    browser = _browser()
    shown = subprocess.run(
        [*browser, "--virtual-time-budget=5000", "--dump-dom", url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "<article" in shown.stdout, shown.stderr[-2000:]
    return shown.stdout


def _article(dom: str) -> str:
    return dom[dom.index("<article") : dom.index("</article>")]


def test_the_home_page_renders(served: str, tmp_path: Path) -> None:
    article = _article(_dom(served + "/"))
    assert "agentic exception handler" in article
    assert 'href="getting-started/quick-start/"' in article  # the links into the docs
    assert "make demo" in article
    shot = tmp_path / "home.png"
    subprocess.run(
        [*_browser(), f"--screenshot={shot}", "--window-size=1280,1000", served + "/"],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    assert len(set(_png_pixels(shot.read_bytes()))) > 16  # text and colours, not a blank page


def test_the_configuration_page_renders_the_generated_tables(served: str) -> None:
    article = _article(_dom(served + "/reference/configuration/"))
    assert "<table>" in article
    assert "<!-- generated:" not in article
    for field in FIELDS:  # every setting, application-wide or per handler, is a table row
        assert f"<td><code>{field.name}</code></td>" in article, field.name
    app_only = [f for f in FIELDS if f.scope != HANDLER]
    assert f"<td><code>{app_only[-1].name}</code></td>" in article
    assert "What a check's result means" in article


def test_the_search_index_holds_every_page(site: Path) -> None:
    index = json.loads((site / "search" / "search_index.json").read_text())
    locations = {doc["location"].split("#")[0] for doc in index["docs"]}
    for page in ("", "reference/configuration/", "reference/events/", "guides/fleet/",
                 "explanation/security/", "changelog/"):  # fmt: skip
        assert page in locations, page
    texts = " ".join(doc["text"] for doc in index["docs"])
    assert "patch_watch" in texts and "recovery.patch_reverted" in texts


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    # The build is strict for real: a link to a page that does not exist stops it.
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [nowhere](missing.md).\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text("site_name: t\ndocs_dir: docs\nstrict: true\n")
    built = _build(tmp_path / "site", config)
    assert built.returncode != 0
    assert "missing.md" in built.stdout + built.stderr
