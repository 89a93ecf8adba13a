"""Supervised child processes: the trio shell around deploy.supervisor.Schedule.

    async with trio.open_nursery() as nursery:
        sup = ProcessSupervisor(nursery)
        sup.start(ChildSpec("east-1", ["dcmirror", "broker", ...], log_path=Path("east-1.log")))
        ...
        await sup.stop(["east-1"], timeout_s=30)      # SIGTERM, then SIGKILL after timeout_s

Each child gets one task that starts its process when the schedule says so, waits for it
to exit, tells the schedule and sleeps the backoff. Children run in their own session, so a
Ctrl-C in the terminal reaches only the supervisor, which stops them in its own order;
if the supervisor dies without doing so (kill -9), they stop by themselves (deploy.lifeline).
A child's output goes to its log file (appended across restarts), or to the supervisor's
own stdout/stderr without one.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from deploy import lifeline
from deploy.supervisor import ChildRecord, RestartPolicy, Schedule

log = logging.getLogger("dcmirror.supervisor")



def dcmirror_argv(*args: str) -> list[str]:
    """A dcmirror command as a child process of this one: the same Python, the installed
    package. -P: the child's working directory is not put first on sys.path, so a directory
    that holds a folder named like one of the packages (a `topology/` beside the topology
    file, as the README's `cp topology/default.toml my.toml` leaves) cannot shadow it."""
    return [sys.executable, "-P", "-m", "deploy.cli", *args]

@dataclass(frozen=True)
class ChildSpec:
    name: str
    argv: Sequence[str]
    log_path: Path | None = None
    """Where stdout and stderr go (appended); None: the supervisor's own."""
    interval_s: float | None = None
    """None: a service, restarted whenever it exits; else a job run every interval_s."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Added to the supervisor's environment."""
    cwd: Path | None = None
    """Working directory (created if missing); None: the supervisor's."""


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit {returncode}"


class ProcessSupervisor:
    """Children started in ``nursery`` (which must outlive them: stop them before leaving it)."""

    def __init__(self, nursery: trio.Nursery, policy: RestartPolicy | None = None, *,
                 on_event: Callable[[str, str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._nursery = nursery
        self.schedule = Schedule(policy)
        self.specs: dict[str, ChildSpec] = {}
        self._procs: dict[str, trio.Process] = {}
        self._wake: dict[str, trio.Event] = {}
        self._done: dict[str, trio.Event] = {}
        self._clock = clock
        self._on_event = on_event or (lambda name, text: log.info("%s: %s", name, text))

    def start(self, spec: ChildSpec, *, delay_s: float = 0.0) -> None:
        """Supervise a new child (first started after ``delay_s``)."""
        self.schedule.add(spec.name, self._clock(), interval_s=spec.interval_s, delay_s=delay_s)
        self.specs[spec.name] = spec
        self._wake[spec.name] = trio.Event()
        self._done[spec.name] = trio.Event()
        self._nursery.start_soon(self._keep, spec, name=f"supervise {spec.name}")

    def record(self, name: str) -> ChildRecord:
        return self.schedule.children[name]

    def pid(self, name: str) -> int | None:
        return self.schedule.children[name].pid

    def names(self) -> list[str]:
        return list(self.specs)

    async def _spawn(self, spec: ChildSpec) -> trio.Process:
        # The lifeline: a child whose supervisor dies (even by SIGKILL) stops by itself.
        env = dict(os.environ, PYTHONUNBUFFERED="1", **spec.env, **lifeline.child_env())
        if spec.cwd is not None:
            spec.cwd.mkdir(parents=True, exist_ok=True)
        options: dict[str, Any] = {"env": env, "start_new_session": True, "stdin": subprocess.DEVNULL,
                                   "cwd": spec.cwd, "pass_fds": (lifeline.child_fd(),)}
        if spec.log_path is None:
            return await trio.lowlevel.open_process(list(spec.argv), **options)
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(spec.log_path, "ab") as out:
            return await trio.lowlevel.open_process(list(spec.argv), stdout=out, stderr=subprocess.STDOUT, **options)

    async def _keep(self, spec: ChildSpec) -> None:
        name = spec.name
        record = self.schedule.children[name]
        try:
            while not record.stopping:
                wait_s = self.schedule.until_start(name, self._clock())
                if wait_s > 0:
                    self._wake[name] = trio.Event()
                    with trio.move_on_after(wait_s if wait_s != math.inf else 3600):
                        await self._wake[name].wait()
                    continue
                try:
                    proc = await self._spawn(spec)
                except OSError as exc:
                    delay = self.schedule.spawn_failed(name, self._clock())
                    self._on_event(name, f"could not start ({exc}); retrying in {delay:.1f} s")
                    continue
                self._procs[name] = proc
                self.schedule.started(name, self._clock(), proc.pid)
                returncode = await proc.wait()
                self._procs.pop(name, None)
                delay = self.schedule.exited(name, self._clock(), returncode)
                self._report_exit(record, returncode, delay)
        finally:
            running = self._procs.get(name)
            if running is not None and running.returncode is None:
                running.kill()  # the supervisor itself is going away (an error or cancellation): no orphans
            self._done[name].set()

    def _report_exit(self, record: ChildRecord, returncode: int, delay_s: float) -> None:
        ran = f"after {record.last_run_s:.1f} s"
        if record.stopping:
            self._on_event(record.name, f"stopped ({describe_exit(returncode)} {ran})")
        elif record.job and returncode == 0:
            self._on_event(record.name, f"finished {ran}; next run in {delay_s:.0f} s")
        else:
            self._on_event(record.name, f"{describe_exit(returncode)} {ran}; restarting in {delay_s:.1f} s")

    async def stop(self, names: Iterable[str], timeout_s: float) -> dict[str, int | None]:
        """SIGTERM the children (no restarts after), wait up to ``timeout_s`` for them to exit,
        SIGKILL the rest. Returns each child's last exit code (None: it never ran)."""
        names = list(names)
        for name in names:
            self.schedule.stop(name)
            self._wake[name].set()
            proc = self._procs.get(name)
            if proc is not None and proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        with trio.move_on_after(timeout_s):
            for name in names:
                await self._done[name].wait()
        for name in names:
            proc = self._procs.get(name)
            if not self._done[name].is_set() and proc is not None and proc.returncode is None:
                self._on_event(name, f"still running {timeout_s:g} s after SIGTERM: SIGKILL")
                proc.kill()
        for name in names:
            await self._done[name].wait()
        return {name: self.schedule.children[name].last_exit_code for name in names}

    def snapshot(self) -> list[dict[str, Any]]:
        """The children's state, for status files."""
        now = self._clock()
        out = []
        for name, spec in self.specs.items():
            r = self.schedule.children[name]
            out.append({"name": name, "kind": "job" if r.job else "service", "pid": r.pid, "running": r.running,
                        "starts": r.starts, "restarts": r.restarts, "failures": r.failures,
                        "last_exit_code": r.last_exit_code,
                        "up_s": None if not r.running or r.started_s is None else round(now - r.started_s, 3),
                        "last_run_s": r.last_run_s,
                        "log": None if spec.log_path is None else str(spec.log_path)})
        return out


async def run_until_signalled(specs: Sequence[ChildSpec], *, policy: RestartPolicy | None = None,
                              stop_timeout_s: float = 30.0) -> int:
    """Every child supervised until SIGTERM or SIGINT, then all stopped at once."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            sup = ProcessSupervisor(nursery, policy,
                                    on_event=lambda name, text: log.warning("%s: %s", name, text))
            for spec in specs:
                sup.start(spec)
            async for signum in signals:
                log.info("%s: stopping %d children", signal.Signals(signum).name, len(specs))
                break
            await sup.stop(sup.names(), stop_timeout_s)
    return 0
