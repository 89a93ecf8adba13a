"""The console's tests in a real browser: Debian's Chromium, headless, driven through Debian's
chromedriver by Selenium (`make sysdeps` installs both; Selenium Manager is never asked to
download a driver or a browser), with axe-core from npm (`make console-assets` installs the
version tests/console/package-lock.json pins into ~/.cache/dcmirror/npm, $DCMIRROR_NPM_DIR).

- `browser`: a module-scoped fixture, one headless Chromium (1400x1000) per test module.
- `screenshot(driver, name)`: a PNG of the page in the artifacts directory
  ($DCMIRROR_TEST_ARTIFACTS, else tests/artifacts/console/, which git ignores); its path.
- `axe_violations(driver)`: axe-core's violations of the page at the given impacts
  (serious and critical by default), each as {id, impact, help, helpUrl, targets}; a test
  asserts the list is empty and prints `format_violations(found)` otherwise.
- `wait_for(driver, predicate, what)`: polls the page until the predicate holds; on timeout
  it fails naming `what` with an excerpt of the page's text. The timeout is only a ceiling.
"""

from __future__ import annotations

import base64
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest
from selenium import webdriver
from selenium.common.exceptions import (
    NoSuchElementException,
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

# Selenium Manager is skipped when the Service names a driver; offline all the same, in case.
os.environ.setdefault("SE_OFFLINE", "true")

ROOT = Path(__file__).resolve().parents[2]
ASSETS = Path(__file__).resolve().parent  # package.json and package-lock.json
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WINDOW = (1400, 1000)
PAGE_LOAD_TIMEOUT_S = 30.0
DEFAULT_IMPACTS = ("serious", "critical")

T = TypeVar("T")


def npm_dir() -> Path:
    """Where `make console-assets` installs the npm packages (node_modules/ inside)."""
    configured = os.environ.get("DCMIRROR_NPM_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "dcmirror" / "npm"


def artifacts_dir() -> Path:
    """Where screenshots go: $DCMIRROR_TEST_ARTIFACTS, else tests/artifacts/console/."""
    configured = os.environ.get("DCMIRROR_TEST_ARTIFACTS")
    path = Path(configured) if configured else ROOT / "tests" / "artifacts" / "console"
    path.mkdir(parents=True, exist_ok=True)
    return path


# --- the browser ------------------------------------------------------------------------------


def chromium_options() -> Options:
    options = Options()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        "--no-sandbox",  # root in CI, in containers
        "--disable-dev-shm-usage",  # a small /dev/shm
        "--force-device-scale-factor=1",  # screenshots 1400x1000 whatever the host
        "--lang=en-US",
        "--no-first-run",
        "--no-default-browser-check",
        # It talks to nothing but the pages a test opens.
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--disable-default-apps",
        "--metrics-recording-only",
    ):
        options.add_argument(arg)
    return options


def start_chromium(chromium: str = CHROMIUM, chromedriver: str = CHROMEDRIVER) -> WebDriver:
    """A headless Chromium through Debian's chromedriver; fails (never skips) when either is
    missing, naming the make target that installs them."""
    missing = [p for p in (chromium, chromedriver) if not (Path(p).is_file() and os.access(p, os.X_OK))]
    if missing:
        pytest.fail(
            f"the console's browser tests need Debian's chromium and chromium-driver: "
            f"{', '.join(missing)} missing; run `make sysdeps` (apt-get install chromium chromium-driver)",
            pytrace=False,
        )
    options = chromium_options()
    options.binary_location = chromium
    try:
        driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    except WebDriverException as exc:
        pytest.fail(f"Chromium did not start through {chromedriver}: {exc.msg or exc}", pytrace=False)
    driver.set_page_load_timeout(PAGE_LOAD_TIMEOUT_S)
    return driver


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    """One headless Chromium per test module, quit at its end."""
    driver = start_chromium()
    try:
        yield driver
    finally:
        try:
            driver.quit()
        except WebDriverException:
            pass


# --- screenshots ------------------------------------------------------------------------------


def screenshot(driver: WebDriver, name: str, full_page: bool = False) -> Path:
    """Saves the page as <artifacts>/<name>.png (the window, or with full_page the whole
    document's height) and returns the path."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "page"
    path = artifacts_dir() / (stem if stem.endswith(".png") else stem + ".png")
    if full_page:
        metrics = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})
        size = metrics["cssContentSize"]
        shot = driver.execute_cdp_cmd(
            "Page.captureScreenshot",
            {"format": "png", "captureBeyondViewport": True,
             "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}},
        )
        path.write_bytes(base64.b64decode(shot["data"]))
    elif not driver.save_screenshot(str(path)):
        raise AssertionError(f"Chromium did not write the screenshot {path}")
    return path


# --- axe-core ---------------------------------------------------------------------------------


def pinned_axe_version() -> str:
    """axe-core's version in tests/console/package-lock.json."""
    lock = orjson.loads((ASSETS / "package-lock.json").read_bytes())
    return str(lock["packages"]["node_modules/axe-core"]["version"])


@cache
def _axe_source(directory: Path) -> tuple[str, str]:
    package = directory / "node_modules" / "axe-core"
    script = package / "axe.min.js"
    pinned = pinned_axe_version()
    try:
        installed = str(orjson.loads((package / "package.json").read_bytes())["version"])
        source = script.read_text()
    except OSError:
        pytest.fail(f"axe-core is not installed in {directory}: run `make console-assets`", pytrace=False)
    if installed != pinned:
        pytest.fail(
            f"{directory} holds axe-core {installed}, tests/console/package-lock.json pins "
            f"{pinned}: run `make console-assets`",
            pytrace=False,
        )
    return source, installed


def axe_source() -> str:
    """axe.min.js as `make console-assets` installed it (the pinned version, or a failure)."""
    return _axe_source(npm_dir())[0]


_RUN_AXE = """
const impacts = arguments[0], done = arguments[arguments.length - 1];
axe.run(document, {resultTypes: ['violations']}).then(
  (results) => done({violations: results.violations
    .filter((v) => impacts.includes(v.impact))
    .map((v) => ({id: v.id, impact: v.impact, help: v.help, helpUrl: v.helpUrl,
                  targets: v.nodes.map((n) => n.target.join(' '))}))}),
  (error) => done({error: String(error && error.stack || error)}));
"""


def axe_violations(
    driver: WebDriver, impacts: Sequence[str] = DEFAULT_IMPACTS, timeout_s: float = 30.0
) -> list[dict[str, Any]]:
    """Runs axe-core on the page's document and returns its violations of these impacts,
    each {id, impact, help, helpUrl, targets: [CSS selector of each offending node]}."""
    if not driver.execute_script("return typeof window.axe === 'object'"):
        driver.execute_script(axe_source())
    driver.set_script_timeout(timeout_s)
    result = driver.execute_async_script(_RUN_AXE, list(impacts))
    if not isinstance(result, dict) or "error" in result:
        raise AssertionError(f"axe.run failed on {driver.current_url}: {result}")
    violations: list[dict[str, Any]] = result["violations"]
    return violations


def format_violations(violations: Sequence[dict[str, Any]]) -> str:
    """One line a violation, then its nodes: for an assertion's message."""
    lines = []
    for v in violations:
        lines.append(f"{v['impact']}: {v['id']}: {v['help']} ({v['helpUrl']})")
        lines.extend(f"    {target}" for target in v["targets"])
    return "\n".join(lines)


# --- waiting on the page ----------------------------------------------------------------------


class WaitTimeout(AssertionError):
    """The page never reached the awaited state (the message says which, and shows the page)."""


def page_text(driver: WebDriver, limit: int = 1500) -> str:
    """The page's visible text, cut to `limit` characters (for failure messages)."""
    try:
        text = str(driver.find_element(By.TAG_NAME, "body").text)
    except WebDriverException as exc:
        return f"<no page text: {exc.msg or type(exc).__name__}>"
    return text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit} more characters)"


def text_of(driver: WebDriver, css: str) -> str | None:
    """The visible text of the first element matching the CSS selector, None while there is none."""
    found = driver.find_elements(By.CSS_SELECTOR, css)
    return str(found[0].text) if found else None


def wait_for(
    driver: WebDriver,
    predicate: Callable[[WebDriver], T],
    what: str,
    timeout_s: float = 30.0,
    interval_s: float = 0.05,
) -> T:
    """Polls predicate(driver) until it returns something truthy, and returns that. A missing
    or replaced element counts as not yet. After timeout_s (a generous ceiling, not a delay:
    the wait ends as soon as the page shows the state) raises WaitTimeout naming `what`,
    the page's address and an excerpt of its text."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while True:
        try:
            value = predicate(driver)
            if value:
                return value
        except (NoSuchElementException, StaleElementReferenceException) as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            break
        time.sleep(interval_s)
    try:
        url = driver.current_url
    except WebDriverException:
        url = "<unknown address>"
    because = f"\nlast error: {type(last_error).__name__}: {last_error}" if last_error else ""
    raise WaitTimeout(
        f"waited {timeout_s:g} s for {what} at {url}; the page's text:\n{page_text(driver)}{because}"
    )

