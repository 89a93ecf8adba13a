"""The browser harness itself (tests/console/browser.py): Debian's Chromium opens pages a local
HTTP server serves, waits on what their JavaScript writes, takes screenshots, and axe-core finds
nothing serious on an accessible page and finds the defects planted in another."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.remote.webdriver import WebDriver

from tests.console.browser import (
    WaitTimeout,
    axe_violations,
    format_violations,
    pinned_axe_version,
    screenshot,
    start_chromium,
    text_of,
    wait_for,
)

GOOD_PAGE = """<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>Harness check: a good page</title>
<style>
  body { font-family: sans-serif; margin: 2rem; color: #1a1a1a; background: #ffffff; }
  .flow { display: inline-block; width: 18rem; margin: 1rem; padding: 1rem;
          background: #0b5394; color: #ffffff; }
  .lagging { background: #990000; }
</style></head>
<body>
<header><h1>dcmirror harness check</h1></header>
<main>
  <p id="status">loading</p>
  <div class="flow">east → aggregate: 1200 records/s</div>
  <div class="flow lagging">west → aggregate: lag 42 s</div>
  <form>
    <label for="offset">Offset</label>
    <input id="offset" name="offset" type="number" value="0">
    <button type="button">Show</button>
  </form>
</main>
<script>
  // Written later, as a live page's data arrives.
  setTimeout(() => { document.getElementById('status').textContent = 'ready: 2 flows'; }, 300);
</script>
</body></html>
"""

# Planted defects: an image without alt text, an input without a label, light grey on white.
BAD_PAGE = """<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>Harness check: a bad page</title></head>
<body>
<main>
  <h1>Planted defects</h1>
  <img src="map.png" width="120" height="60">
  <input type="text" name="topic">
  <p id="faint" style="color: #dddddd; background: #ffffff">lag 42 s on west to aggregate</p>
</main>
</body></html>
"""


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """good.html and bad.html from a thread's HTTP server on a free loopback port."""
    root = tmp_path_factory.mktemp("site")
    (root / "good.html").write_text(GOOD_PAGE)
    (root / "bad.html").write_text(BAD_PAGE)
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, name="harness-site", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_waits_for_the_page_and_screenshots_it(browser: WebDriver, site: str) -> None:
    size = browser.get_window_size()
    assert (size["width"], size["height"]) == (1400, 1000)
    browser.get(f"{site}/good.html")
    started = time.monotonic()
    status = wait_for(browser, lambda d: (text_of(d, "#status") or "").startswith("ready") and text_of(d, "#status"),
                      "the status line to say ready", timeout_s=10)
    waited = time.monotonic() - started
    assert status == "ready: 2 flows"
    assert waited < 5, f"the wait took {waited:.1f} s: it should end when the page shows the state"

    shot = screenshot(browser, "harness good page")
    assert shot.name == "harness_good_page.png" and shot.is_file()
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1024, (shot, len(data))
    assert _png_size(data) == tuple(browser.execute_script("return [innerWidth, innerHeight]"))

    browser.execute_script("document.querySelector('main').style.paddingBottom = '3000px'")
    whole = screenshot(browser, "harness-good-page-full", full_page=True)
    width, height = _png_size(whole.read_bytes())
    assert width > 1300 and height > 3000, (width, height)  # less a scroll bar


def _png_size(data: bytes) -> tuple[int, int]:
    """A PNG's width and height (its IHDR chunk)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_a_wait_that_never_ends_names_what_and_shows_the_page(browser: WebDriver, site: str) -> None:
    browser.get(f"{site}/good.html")
    with pytest.raises(WaitTimeout) as raised:
        wait_for(browser, lambda d: text_of(d, "#no-such-element"), "the missing element", timeout_s=0.3)
    message = str(raised.value)
    assert "the missing element" in message and "/good.html" in message
    assert "dcmirror harness check" in message  # the page's text excerpt


def test_axe_finds_nothing_serious_on_the_good_page(browser: WebDriver, site: str) -> None:
    browser.get(f"{site}/good.html")
    wait_for(browser, lambda d: text_of(d, "#status") == "ready: 2 flows", "the status line", timeout_s=10)
    found = axe_violations(browser)
    assert not found, "axe-core found serious violations:\n" + format_violations(found)
    assert browser.execute_script("return axe.version") == pinned_axe_version()


def test_axe_reports_the_planted_defects(browser: WebDriver, site: str) -> None:
    browser.get(f"{site}/bad.html")
    found = axe_violations(browser)
    print(format_violations(found))
    by_id = {v["id"]: v for v in found}
    assert {"image-alt", "label", "color-contrast"} <= by_id.keys(), format_violations(found)
    assert by_id["image-alt"]["impact"] == "critical" and by_id["image-alt"]["targets"] == ["img"]
    assert by_id["label"]["targets"] == ["input"]
    assert by_id["color-contrast"]["targets"] == ["#faint"]
    # Every impact asked for, and only those.
    minor = axe_violations(browser, impacts=("minor", "moderate"))
    assert all(v["impact"] in ("minor", "moderate") for v in minor)


def test_a_missing_browser_fails_naming_make_sysdeps(tmp_path: Path) -> None:
    with pytest.raises(pytest.fail.Exception, match="make sysdeps"):
        start_chromium(chromium=str(tmp_path / "chromium"))
