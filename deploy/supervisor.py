"""When to (re)start supervised child processes: a sans-IO schedule with restart backoff.

The schedule knows nothing of processes or clocks; the shell (deploy/processes.py) tells it
what happened (``started``, ``exited``) with the time as an argument and asks it when a child
is due (``until_start``). Two kinds of children:

- a *service* (broker, mirror worker) runs all the time: whenever it exits it is restarted,
  after a backoff that doubles with every quick failure (``backoff_min_s`` .. ``backoff_max_s``)
  and falls back to the shortest once a run lasted ``healthy_run_s``;
- a *job* (the scheduled warehouse load) runs every ``interval_s``: after a successful run
  the next one starts ``interval_s`` after the previous start (at once when the run took
  longer), after a failed run it is retried with the same backoff, never later than one
  interval.

``stop(name)`` ends a child's restarts (the shell then signals it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class RestartPolicy:
    backoff_min_s: float = 0.5
    backoff_max_s: float = 10.0
    healthy_run_s: float = 60.0
    """A run at least this long counts as healthy: the next restart waits only backoff_min_s."""

    def __post_init__(self) -> None:
        assert 0 < self.backoff_min_s <= self.backoff_max_s, self
        assert self.healthy_run_s >= 0, self


@dataclass
class ChildRecord:
    """What the schedule knows of one child."""

    name: str
    interval_s: float | None
    """None for a service, else a job's period."""
    running: bool = False
    stopping: bool = False
    pid: int | None = None
    next_start_s: float = 0.0
    backoff_s: float | None = None
    """The delay chosen after the last failed (or, for services, short) run; None after a good one."""
    started_s: float | None = None
    starts: int = 0
    failures: int = 0
    """Runs that ended with a non-zero exit code, or services that exited at all unasked."""
    last_exit_code: int | None = None
    last_exit_s: float | None = None
    last_run_s: float | None = None
    """How long the last finished run lasted."""
    last_success_s: float | None = None
    """When a job last finished with exit code 0."""

    @property
    def restarts(self) -> int:
        return max(0, self.starts - 1) if self.interval_s is None else self.failures

    @property
    def job(self) -> bool:
        return self.interval_s is not None


class Schedule:
    def __init__(self, policy: RestartPolicy | None = None) -> None:
        self.policy = policy or RestartPolicy()
        self.children: dict[str, ChildRecord] = {}

    def add(self, name: str, now_s: float, *, interval_s: float | None = None, delay_s: float = 0.0) -> ChildRecord:
        """A new child, first started ``delay_s`` from now."""
        assert name not in self.children, f"child {name!r} added twice"
        assert interval_s is None or interval_s > 0, interval_s
        record = ChildRecord(name, interval_s, next_start_s=now_s + delay_s)
        self.children[name] = record
        return record

    def until_start(self, name: str, now_s: float) -> float:
        """Seconds until the child should be started: 0 means now, math.inf never (running
        or stopping)."""
        record = self.children[name]
        if record.running or record.stopping:
            return math.inf
        return max(0.0, record.next_start_s - now_s)

    def started(self, name: str, now_s: float, pid: int | None) -> None:
        record = self.children[name]
        assert not record.running, f"child {name!r} started twice"
        record.running = True
        record.pid = pid
        record.started_s = now_s
        record.starts += 1

    def _backoff(self, record: ChildRecord, run_s: float) -> float:
        if record.backoff_s is None or run_s >= self.policy.healthy_run_s:
            return self.policy.backoff_min_s
        return min(record.backoff_s * 2, self.policy.backoff_max_s)

    def exited(self, name: str, now_s: float, returncode: int) -> float:
        """The child's process ended with ``returncode``; returns the delay until its next start
        (math.inf when it is stopping)."""
        record = self.children[name]
        assert record.running, f"child {name!r} exited without running"
        assert record.started_s is not None
        run_s = max(0.0, now_s - record.started_s)
        record.running = False
        record.pid = None
        record.last_exit_code = returncode
        record.last_exit_s = now_s
        record.last_run_s = run_s
        if record.stopping:
            return math.inf
        if record.interval_s is not None and returncode == 0:
            record.backoff_s = None
            record.last_success_s = now_s
            record.next_start_s = max(now_s, record.started_s + record.interval_s)
            return record.next_start_s - now_s
        record.failures += 1
        delay = self._backoff(record, run_s)
        if record.interval_s is not None:
            delay = min(delay, record.interval_s)
        record.backoff_s = delay
        record.next_start_s = now_s + delay
        return delay

    def spawn_failed(self, name: str, now_s: float) -> float:
        """Starting the process failed (OSError): retried like a run that failed at once."""
        self.started(name, now_s, None)
        return self.exited(name, now_s, -1)

    def stop(self, name: str) -> None:
        """No more (re)starts for this child."""
        self.children[name].stopping = True
