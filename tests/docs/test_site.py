"""The site builds with ``mkdocs build --strict`` and every page works in headless Chromium.

Every page loads without a console error or a failed request, every link between pages (and
its #anchor) resolves, and the search box finds "in-place". Needs mkdocs-material,
mkdocstrings and playwright (the ``docs`` extra) and Debian's ``chromium``; without them the
test skips, except under CI (``CI=true``), where ``.ci/run`` installs them and it fails.
"""

from __future__ import annotations

import functools
import html
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Building the site and opening each of its ~40 pages takes a minute or two on 2 busy cores.
pytestmark = pytest.mark.timeout(600)
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium() -> str | None:
    """Debian's chromium (playwright downloads no browser here)."""
    return (
        "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else shutil.which("chromium")
    )


def missing_tools() -> list[str]:
    """What the test needs and this machine lacks, each with how to get it."""
    modules = ("mkdocs", "material", "mkdocstrings_handlers", "playwright")
    absent = [module for module in modules if importlib.util.find_spec(module) is None]
    missing = [f"{', '.join(absent)} (pip install -e '.[docs]')"] if absent else []
    if chromium() is None:
        missing.append("chromium (apt-get install chromium)")
    return missing


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built with ``mkdocs build --strict`` into a temporary directory."""
    missing = missing_tools()
    if missing:
        message = f"cannot build and browse the docs site without {', '.join(missing)}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but {message}")
        pytest.skip(message)
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,  # generous: a build takes about 10 s on a quiet machine
    )
    assert done.returncode == 0, done.stderr
    return out


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    """The site's root URL on a loopback HTTP server (search needs http, not file://)."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="docs-site")
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


@pytest.fixture(scope="module")
def browser(site: Path) -> Iterator[Any]:
    """Headless Chromium driven by playwright."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


def pages(site: Path) -> list[str]:
    """Every page of the site, as a path under its root (``guides/watchdog/``)."""
    found = []
    for path in sorted(site.rglob("index.html")):
        relative = path.parent.relative_to(site).as_posix()
        found.append("" if relative == "." else relative + "/")
    return found


def target_file(site: Path, url_path: str) -> Path:
    """The file a site-relative URL path serves."""
    path = site / unquote(url_path).lstrip("/")
    return path / "index.html" if url_path.endswith("/") or path.is_dir() else path


def test_every_page_loads_without_errors_and_its_links_resolve(
    site: Path, served: str, browser: Any
) -> None:
    """Each page loads without console errors or failed requests; its links and anchors resolve."""
    every = pages(site)
    assert {"", "quickstart/", "migrating/", "guides/in-place-recovery/", "reference/cli/"} <= set(
        every
    )
    page = browser.new_page()
    problems: list[str] = []
    current = [""]
    page.on(
        "console",
        lambda m: (
            problems.append(f"{current[0]}: console {m.type}: {m.text}")
            if m.type == "error"
            else None
        ),
    )
    page.on("pageerror", lambda e: problems.append(f"{current[0]}: page error: {e}"))
    # A request still in flight when the test moves to the next page is aborted: not a fault.
    page.on(
        "requestfailed",
        lambda r: (
            problems.append(f"{current[0]}: request failed: {r.url} ({r.failure})")
            if r.failure != "net::ERR_ABORTED"
            else None
        ),
    )
    page.on(
        "response",
        lambda r: (
            problems.append(f"{current[0]}: HTTP {r.status}: {r.url}") if r.status >= 400 else None
        ),
    )
    ids: dict[Path, set[str]] = {}
    checked = 0
    for path in every:
        current[0] = path or "/"
        response = page.goto(served + path, wait_until="load")
        assert response is not None, path
        assert response.status == 200, path
        hrefs = page.eval_on_selector_all("a[href]", "links => links.map(a => a.href)")
        for href in hrefs:
            link = urlsplit(urljoin(served + path, href))
            if f"{link.scheme}://{link.netloc}/" != served:
                continue
            target = target_file(site, link.path)
            checked += 1
            if not target.is_file():
                problems.append(f"{current[0]}: link to a missing page: {href}")
            elif link.fragment and target.suffix == ".html":
                if target not in ids:
                    ids[target] = set(re.findall(r'\bid="([^"]+)"', target.read_text()))
                if html.unescape(unquote(link.fragment)) not in {
                    html.unescape(i) for i in ids[target]
                }:
                    problems.append(f"{current[0]}: link to a missing anchor: {href}")
    page.close()
    assert checked > 10 * len(every)  # the links were found and followed
    assert problems == []


def test_the_search_box_finds_in_place_recovery(served: str, browser: Any) -> None:
    """Typing "in-place" in the search box lists the in-place recovery guide."""
    page = browser.new_page()
    page.goto(served, wait_until="load")
    page.click("input.md-search__input")
    page.keyboard.type("in-place")  # keystrokes: the search listens to keyboard events
    results = page.locator(".md-search-result__item a")
    results.first.wait_for(timeout=30_000)  # generous: the index loads in a web worker
    hrefs = results.evaluate_all("links => links.map(a => a.href)")
    page.close()
    assert any("/guides/in-place-recovery/" in href for href in hrefs), hrefs
