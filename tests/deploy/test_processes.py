"""The process shell (deploy/processes.py) with real child processes (small Python scripts):
restarts with backoff, jobs on an interval, SIGTERM then SIGKILL on stop, log files."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import trio

from deploy.processes import ChildSpec, ProcessSupervisor
from deploy.supervisor import RestartPolicy

FAST = RestartPolicy(backoff_min_s=0.2, backoff_max_s=0.4, healthy_run_s=60.0)


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_services_restart_jobs_repeat_and_stop_escalates_to_sigkill(tmp_path: Path) -> None:
    events: list[tuple[float, str, str]] = []
    started = time.monotonic()
    runs = tmp_path / "runs"

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            sup = ProcessSupervisor(nursery, FAST,
                                    on_event=lambda n, t: events.append((time.monotonic() - started, n, t)))
            # a service that dies at once with exit 3, every time
            sup.start(ChildSpec("crasher", py("import sys; print('crashing', flush=True); sys.exit(3)"),
                                tmp_path / "crasher.log"))
            # a service that runs until SIGTERM and exits 0 then
            sup.start(ChildSpec("steady", py("import signal, sys, time\n"
                                             "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
                                             "print('ready', flush=True)\ntime.sleep(600)"),
                                tmp_path / "steady.log"))
            # a service that ignores SIGTERM
            sup.start(ChildSpec("stubborn", py("import signal, time\n"
                                               "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                               "print('ready', flush=True)\ntime.sleep(600)"),
                                tmp_path / "stubborn.log"))
            # a job every 0.5 s that appends a line per run
            sup.start(ChildSpec("job", py(f"open({str(runs)!r}, 'a').write('run\\n')"), tmp_path / "job.log",
                                interval_s=0.5))
            await trio.sleep(2.6)
            crasher = sup.record("crasher")
            assert crasher.last_exit_code == 3 and crasher.starts >= 4, crasher
            steady_pid = sup.pid("steady")
            assert steady_pid is not None and alive(steady_pid)
            stubborn_pid = sup.pid("stubborn")
            assert stubborn_pid is not None
            while b"ready" not in (tmp_path / "stubborn.log").read_bytes():
                await trio.sleep(0.05)
            assert sup.record("job").failures == 0
            os.kill(steady_pid, signal.SIGKILL)  # a killed service comes back with a new pid
            with trio.fail_after(5):
                while sup.pid("steady") in (None, steady_pid):
                    await trio.sleep(0.05)
            assert sup.record("steady").restarts == 1
            while (tmp_path / "steady.log").read_bytes().count(b"ready") < 2:  # its SIGTERM handler is set
                await trio.sleep(0.05)
            # stop the crasher between two of its runs (it would otherwise die of the SIGTERM, not exit 3);
            # stop() signals before its first checkpoint, so nothing can start it in between
            while sup.record("crasher").running:
                await trio.sleep(0.01)
            t = time.monotonic()
            codes = await sup.stop(["crasher", "steady", "job"], timeout_s=5)
            assert time.monotonic() - t < 3
            assert codes["steady"] == 0 and codes["crasher"] == 3 and codes["job"] in (0, None)
            t = time.monotonic()
            codes = await sup.stop(["stubborn"], timeout_s=0.5)
            assert 0.5 <= time.monotonic() - t < 3
            assert codes["stubborn"] == -signal.SIGKILL
            assert not alive(stubborn_pid)
            snapshot = {c["name"]: c for c in sup.snapshot()}
            assert not any(c["running"] for c in snapshot.values())
            assert snapshot["steady"]["restarts"] == 1 and snapshot["crasher"]["failures"] >= 4

    trio.run(main)
    # crasher: starts at ~0, then backoff 0.2, 0.4, 0.4, ... -> at least 5 runs in 2.6 s, each logged
    crashes = (tmp_path / "crasher.log").read_text().count("crashing")
    assert crashes >= 5, crashes
    delays = [t for _, n, t in events if n == "crasher" and "restarting in" in t]
    assert [d.rsplit("restarting in ", 1)[1] for d in delays[:3]] == ["0.2 s", "0.4 s", "0.4 s"]
    # job: first run at once, then every 0.5 s: 5 or 6 runs in 2.6 s (+ the stop)
    job_runs = runs.read_text().count("run")
    assert 5 <= job_runs <= 7, job_runs
    assert any(n == "stubborn" and "SIGKILL" in t for _, n, t in events)
