"""The one way the cluster's trio shells read wall-clock time.

Sans-IO cores never read a clock: they take `now_ms` as an argument. Their trio shells get
a `Clock` injected and pass `clock.now_ms()` in. Deadlines and sleeps use trio's own clock
(`trio.current_time`, `move_on_after`), which tests replace with `trio.testing.MockClock`;
a test then injects a `Clock` that reads the same MockClock, so every timer, timeout and
timestamp moves together without patching a module.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the Unix epoch (record timestamps, retention, session expiry)."""
        ...


class SystemClock:
    """The machine's wall clock: what a real broker, controller or worker uses."""

    def now_ms(self) -> int:
        return int(time.time() * 1000)


SYSTEM_CLOCK = SystemClock()
