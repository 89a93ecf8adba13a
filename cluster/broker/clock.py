"""Wall-clock milliseconds: the one place the broker's trio shell reads the time."""

from __future__ import annotations

import time


def now_ms() -> int:
    return int(time.time() * 1000)
