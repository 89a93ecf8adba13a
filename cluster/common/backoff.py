"""Exponential backoff with jitter for every retry loop of the cluster and its clients.

The delays are tenacity's (`wait_exponential_jitter`): the first retry waits `initial_s`,
each next one twice as long up to `max_s`, plus up to `jitter_s` of random jitter so that
many peers do not retry in step. Two shapes:

- `Backoff` for loops that run for the life of their owner (a replica fetcher, a quorum
  peer connection, a broker's registration): `await backoff.sleep()` after a failure,
  `backoff.reset()` after a success.
- `retrying(...)` (tenacity's `AsyncRetrying` on trio) for one operation retried until a
  deadline: `async for attempt in retrying(...): with attempt: ...`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_delay,
    wait_exponential_jitter,
)

log = logging.getLogger("dcmirror.retry")


class _Attempt:
    """The one field of tenacity's RetryCallState its wait strategies read."""

    __slots__ = ("attempt_number",)

    def __init__(self, attempt_number: int) -> None:
        self.attempt_number = attempt_number


class Backoff:
    """Delays of a retry loop that lives as long as its owner (see the module docstring)."""

    def __init__(self, initial_s: float, max_s: float, *, jitter_s: float | None = None) -> None:
        assert 0 <= initial_s <= max_s, (initial_s, max_s)
        self.initial_s = initial_s
        self.max_s = max_s
        self._wait = wait_exponential_jitter(multiplier=initial_s, max=max_s,
                                             jitter=initial_s if jitter_s is None else jitter_s)
        self.failures = 0

    def next_delay_s(self) -> float:
        """The wait before the next attempt; each call counts one more failure."""
        self.failures += 1
        return self.delay_s(self.failures)

    def delay_s(self, attempt: int) -> float:
        """The wait before retry number `attempt` (1: the first), for callers that count
        attempts themselves (a producer batch carries its own)."""
        if self.initial_s == 0:
            return 0.0
        delay: float = self._wait(_Attempt(max(1, attempt)))  # type: ignore[arg-type]
        return min(delay, self.max_s)

    async def sleep(self) -> None:
        await trio.sleep(self.next_delay_s())

    def reset(self) -> None:
        self.failures = 0


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    log.debug("attempt %d failed (%s); retrying", state.attempt_number, exc)


def retrying(deadline_s: float, initial_s: float, max_s: float, *,
             retry_on: Callable[[BaseException], bool]) -> AsyncRetrying:
    """Retry one operation while `retry_on(exception)` holds, until `deadline_s` has passed
    (then the last error is raised): `async for attempt in retrying(...): with attempt: ...`."""
    return AsyncRetrying(
        sleep=trio.sleep, stop=stop_after_delay(deadline_s), reraise=True,
        wait=wait_exponential_jitter(multiplier=initial_s, max=max_s, jitter=initial_s),
        retry=retry_if_exception(retry_on), before_sleep=_log_retry)
