"""The console's long actions: a flow's disaster recovery (promote, failover, failback,
mirror/failover.py) runs in the background of the console, not in the request that asked
for it (a promotion waits until every copy has caught up).

At most one action runs per flow; a second one is refused while it does. Per flow the last
action is kept: who started it and when, its last LINES_MAX progress lines, and how it ended
(ok with the outcome's report lines, or the error's text). Everything kept is bounded.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from topology.model import MirrorSpec, Topology

log = logging.getLogger("dcmirror.console")

DR_ACTIONS = ("promote", "failover", "failback")
LINES_MAX = 50
"""Progress lines kept per flow (the newest)."""
REPORT_LINES_MAX = 200
"""Outcome lines kept (one per partition, and a first line): the rest are counted."""
LINE_CHARS_MAX = 500
DR_WAIT_S = 300.0
"""Each step's bound, as `dcmirror mirror promote|failover|failback --wait` by default."""

Say = Callable[[str], None]


class ActionRefused(ValueError):
    """An action that cannot start now (one runs on the flow, or no runner is serving)."""


@dataclass
class ActionRun:
    """One action on a flow: running while `outcome` is None."""

    flow: str
    action: str
    principal: str
    started_s: float
    lines: deque[str] = field(default_factory=lambda: deque(maxlen=LINES_MAX))
    outcome: str | None = None  # "ok" or "error"
    error: str | None = None
    report: list[str] = field(default_factory=list)
    finished_s: float | None = None

    @property
    def running(self) -> bool:
        return self.outcome is None

    def say(self, text: str) -> None:
        self.lines.append(text[:LINE_CHARS_MAX])

    def as_json(self) -> dict[str, Any]:
        return {"flow": self.flow, "action": self.action, "principal": self.principal,
                "started_s": self.started_s, "finished_s": self.finished_s, "running": self.running,
                "outcome": self.outcome, "error": self.error, "lines": list(self.lines), "report": self.report}


class ActionRunner:
    """Runs actions in its own nursery (`run`, started by the console's server beside the
    poller), at most one per flow."""

    def __init__(self) -> None:
        self.runs: dict[str, ActionRun] = {}
        self._nursery: trio.Nursery | None = None

    @property
    def serving(self) -> bool:
        return self._nursery is not None

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled (a running action is cancelled with it)."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None

    def last(self, flow: str) -> ActionRun | None:
        return self.runs.get(flow)

    def start(self, flow: str, action: str, principal: str,
              work: Callable[[Say], Awaitable[list[str]]]) -> ActionRun:
        """`work(say)` in the background; its answer is the outcome's report lines."""
        if self._nursery is None:
            raise ActionRefused("this console runs no background actions")
        current = self.runs.get(flow)
        if current is not None and current.running:
            raise ActionRefused(f"flow {flow}: {current.action} started by {current.principal} still runs; "
                                "wait until it ends")
        run = ActionRun(flow, action, principal, time.time())
        self.runs[flow] = run
        self._nursery.start_soon(self._work, run, work)
        return run

    async def _work(self, run: ActionRun, work: Callable[[Say], Awaitable[list[str]]]) -> None:
        try:
            lines = await work(run.say)
        except Exception as exc:  # noqa: BLE001 - an action's failure is its outcome, never the console's
            from mirror.failover import RETRIABLE, FailoverError

            if not isinstance(exc, (FailoverError, *RETRIABLE, trio.TooSlowError, ValueError)):
                log.exception("console: %s of flow %s failed", run.action, run.flow)
            run.error = (str(exc) or type(exc).__name__)[:LINE_CHARS_MAX]
            run.outcome = "error"
            log.info("console: %s of flow %s by %s failed: %s", run.action, run.flow, run.principal, run.error)
        else:
            run.report = [line[:LINE_CHARS_MAX] for line in lines[:REPORT_LINES_MAX]]
            if len(lines) > REPORT_LINES_MAX:
                run.report.append(f"… and {len(lines) - REPORT_LINES_MAX} more line(s): `dcmirror mirror status`")
            run.outcome = "ok"
            log.info("console: %s of flow %s by %s done", run.action, run.flow, run.principal)
        finally:
            if run.outcome is None:  # cancelled: the console stops
                run.outcome, run.error = "error", "the console stopped before the action ended"
            run.finished_s = time.time()


def worker_views(report: Mapping[str, Any] | None) -> tuple[dict[tuple[str, int], Any], dict[str, str]]:
    """What a failover knows of the source from the flow's workers' last status, as
    `dcmirror mirror failover` gathers it (mirror/failover.py `gather_worker_views`)."""
    from mirror.failover import gather_worker_views

    return gather_worker_views([report] if report else [])


def disaster_recovery(topology: Topology, flow: MirrorSpec, action: str, source: dict[str, Any] | None,
                      target: dict[str, Any], views: tuple[Mapping[tuple[str, int], Any], Mapping[str, str]],
                      wait_s: float = DR_WAIT_S) -> Callable[[Say], Awaitable[list[str]]]:
    """The work of one DR action, with the client settings of each side (the principal it
    acts as; `source` None for a failover, which asks the source only whether it answers,
    with the target's settings for the flow's source principal unknown to the session)."""
    from mirror.failover import run_action

    known, deleted = views

    async def work(say: Say) -> list[str]:
        outcome = await run_action(topology, flow, action, source=source or {}, target=target, known=known,
                                   deleted_sources=deleted, timeout_s=wait_s, say=say,
                                   client_id=f"dcmirror-console-{action}")
        return outcome.lines()

    return work
