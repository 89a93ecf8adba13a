"""Helpers for the `dcmirror up|status|demo` tests: small topology files on free ports and
`dcmirror up` as a child process whose children are found (and, on teardown, killed) by pid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import REPO, free_port


def write_topology(root: Path, sizes: dict[str, int], *, topics: list[tuple[str, str, int, int]] = (),  # type: ignore[assignment]
                   flows: list[tuple[str, str, str, int]] = (),  # type: ignore[assignment]
                   extra: str = "", workers_http: bool = False,
                   broker_config: dict[str, dict[str, str]] | None = None) -> Path:
    """clusters name -> broker count on free ports (datacenter = cluster name, data under
    root/data/NAME); topics (cluster, name, partitions, rf); flows (source, target, regex, workers),
    with workers_http: each worker's admin HTTP address declared (free loopback ports);
    broker_config: more broker configs per cluster name."""
    root.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    for name, size in sizes.items():
        ports = [free_port() for _ in range(size)]
        lines += [f"[clusters.{name}]", f'datacenter = "{name}"',
                  "brokers = [" + ", ".join(f'"127.0.0.1:{p}"' for p in ports) + "]",
                  "config = " + _inline_table({"broker.session.timeout.ms": "2000",
                                               **(broker_config or {}).get(name, {})}), ""]
    for cluster, name, partitions, rf in topics:
        lines += ["[[topics]]", f'cluster = "{cluster}"', f'name = "{name}"', f"partitions = {partitions}",
                  f"replication_factor = {rf}", ""]
    for source, target, regex, workers in flows:
        lines += ["[[mirrors]]", f'source = "{source}"', f'target = "{target}"', f"topics = {json.dumps(regex)}",
                  f"workers = {workers}", 'config = { "topic.refresh.ms" = "1000" }']
        if workers_http:  # each worker's admin HTTP on a free loopback port
            lines.append("workers_http = [" + ", ".join(f'"127.0.0.1:{free_port()}"' for _ in range(workers)) + "]")
        lines.append("")
    path = root / "topology.toml"
    path.write_text("\n".join(lines) + extra)
    return path


def _inline_table(values: dict[str, str]) -> str:
    return "{ " + ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in values.items()) + " }"


def dcmirror(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deploy.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout_s)


def status(config: Path) -> tuple[int, dict[str, Any]]:
    """`dcmirror status --config FILE --json`: (exit code, document)."""
    started = time.monotonic()
    try:
        proc = dcmirror("status", "--config", str(config), "--json", "--timeout", "3")
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"status did not finish within {exc.timeout:g} s; stdout: {_text(exc.stdout)[-2000:]!r}; "
                             f"stderr: {_text(exc.stderr)[-3000:]!r}") from None
    took_s = time.monotonic() - started
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode in (0, 1) and lines, \
        f"status exited {proc.returncode} after {took_s:.1f} s; stdout: {proc.stdout[-2000:]!r}; stderr: {proc.stderr[-3000:]!r}"
    try:
        return proc.returncode, json.loads(lines[-1])
    except json.JSONDecodeError:
        raise AssertionError(f"status printed no JSON document last: {proc.stdout[-2000:]!r}; "
                             f"stderr: {proc.stderr[-3000:]!r}") from None


def _text(out: bytes | str | None) -> str:
    return out.decode(errors="replace") if isinstance(out, bytes) else out or ""


def pids_with(text: str) -> list[int]:
    """Live (not zombie) processes whose command line mentions `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().split(") ", 1)[1][0]
        except OSError:
            continue
        if state != "Z" and text in argv and int(entry.name) != os.getpid():
            found.append(int(entry.name))
    return found


class UpRun:
    """`dcmirror up --config FILE` with its output collected (and printed on failure)."""

    def __init__(self, config: Path) -> None:
        self.config = config
        self.lines: list[str] = []
        self.proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", "up", "--config", str(config),
                                      "--timeout", "90"], cwd=REPO, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.append(raw.decode(errors="replace").rstrip())

    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for_line(self, text: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if text in line:
                    return line
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"dcmirror up never said {text!r} (exit {self.proc.poll()}):\n{self.output()[-6000:]}")

    def state(self) -> dict[str, Any]:
        """up.json (written beside the first cluster's data directory)."""
        return json.loads((self.config.parent / "data" / "up.json").read_text())

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGINT (a clean stop), then kill -9 of `up` if it outlives `timeout_s`, and of
        whatever child of this topology is left; timeout_s 0: kill -9 at once."""
        if self.proc.poll() is None and timeout_s > 0:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in pids_with(str(self.config)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def child_pids(self) -> dict[str, int]:
        return {c["name"]: c["pid"] for c in self.state()["children"] if c["pid"] is not None}


@pytest.fixture
def up_runs() -> Iterator[Callable[[Path], UpRun]]:
    made: list[UpRun] = []

    def start(config: Path) -> UpRun:
        run = UpRun(config)
        made.append(run)
        return run

    yield start
    for run in made:  # kill -9 whatever is left of a failed test: up, then its children
        run.stop(0)
