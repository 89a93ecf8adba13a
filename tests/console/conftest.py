"""The console's browser tests share tests/console/browser.py's fixtures."""

from tests.console.browser import browser

__all__ = ["browser"]
