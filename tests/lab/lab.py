"""Running `dcmirror lab` from tests: `lab up` as a child process, the lab commands, and a
clean-up that always leaves nothing behind (checked)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from deploy.lab import run
from deploy.lab.network import missing_requirements
from deploy.mirror_cmd import flow_reports
from tests.harness import REPO
from tests.mirror.lab import NotReady, partition_count, wait_for
from topology import load

FENCE = "dcmirror.fence"


def skip_unless_lab_possible() -> None:
    """Skip (with the reason) where namespaces cannot be made: not root, no iproute2, a
    container without the privilege."""
    why = missing_requirements()
    if why is not None:
        pytest.skip(why)
    probe = f"dcm-{os.getpid()}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot create network namespaces here: {made.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)


def dcmirror(*args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deploy.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout_s)


class LabRun:
    """`dcmirror lab up --config FILE --work-dir DIR` as a child process."""

    def __init__(self, config: Path, work_dir: Path, *extra: str) -> None:
        self.config, self.work_dir = config, work_dir
        self.log_path = work_dir.parent / f"{work_dir.name}-up.log"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "deploy.cli", "lab", "up", "--config", str(config), "--work-dir",
                 str(work_dir), *extra], cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True)

    def log(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "---- lab up ----\n" + "\n".join(text.splitlines()[-lines:])

    def state(self) -> dict[str, Any]:
        return json.loads((self.work_dir / "lab.json").read_bytes())

    def wait_ready(self, timeout_s: float) -> LabRun:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"`lab up` exited ({self.proc.returncode}) before it was ready\n{self.log()}")
            try:
                return self.state().get("phase") == "ready"
            except (OSError, ValueError) as exc:
                raise NotReady(str(exc)) from None

        wait_for(ready, timeout_s, "lab up: ready", on_timeout=self.log)
        return self

    @property
    def topology(self) -> Path:
        return self.work_dir / "topology.toml"

    def bootstrap(self, cluster: str) -> str:
        return load(self.topology).cluster(cluster).bootstrap()

    def netns(self, host: str) -> str:
        (found,) = [h["netns"] for h in self.state()["plan"]["hosts"] if h["name"] == host]
        return str(found)

    def cli(self, *args: str) -> str:
        """`dcmirror lab ARGS --work-dir DIR`: its output (it must succeed)."""
        done = dcmirror("lab", *args, "--work-dir", str(self.work_dir))
        assert done.returncode == 0, f"dcmirror lab {' '.join(args)}: {done.returncode}\n{done.stdout}{done.stderr}"
        return done.stdout

    # In-process, what the `dcmirror lab ...` and `dcmirror mirror status` commands call (each
    # command spends seconds importing before it acts; a cut's timing should not).

    def status(self) -> dict[str, Any]:
        return run.status(self.work_dir)

    def cut(self, dc: str, *others: str, reject: bool = False) -> None:
        run.cut(self.work_dir, dc, others, reject=reject)

    def heal(self, dc: str | None = None) -> None:
        run.heal(self.work_dir, dc)

    def latency(self, latency_ms: float) -> None:
        run.set_latency(self.work_dir, latency_ms)

    def mirror_status(self) -> list[dict[str, Any]]:
        """What `dcmirror mirror status --json` prints."""
        topology = load(self.topology)
        return flow_reports(topology, list(topology.mirrors))

    def leftovers(self, prefix: str) -> list[str]:
        namespaces = [p.name for p in Path("/run/netns").glob(f"{prefix}-*")]
        links = [p.name for p in Path("/sys/class/net").glob(prefix.replace("-", "") + "h*")]
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if str(self.work_dir).encode() in (entry / "cmdline").read_bytes():
                        pids.append(entry.name)
                except OSError:
                    continue
        return namespaces + links + [f"pid {p}" for p in pids]

    def down(self) -> None:
        """`lab down`, then make sure: `lab up` gone, no namespace, link or process of the lab."""
        try:
            prefix = self.state()["prefix"]
        except (OSError, ValueError, KeyError):
            prefix = f"dcm-{self.proc.pid}"
        done = dcmirror("lab", "down", "--work-dir", str(self.work_dir), timeout_s=240)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        assert done.returncode == 0, f"lab down: {done.returncode}\n{done.stdout}{done.stderr}\n{self.log()}"
        wait_for(lambda: not self.leftovers(prefix), 15, f"nothing of lab {prefix} left",
                 on_timeout=lambda: str(self.leftovers(prefix)))


@contextmanager
def lab_running(config: Path, work_dir: Path, *extra: str, ready_timeout_s: float = 120.0) -> Iterator[LabRun]:
    lab = LabRun(config, work_dir, *extra)
    try:
        yield lab.wait_ready(ready_timeout_s)
    finally:
        lab.down()


def tcp_connect_ms(lab: LabRun, from_host: str, address: str, samples: int = 5, stat: str = "median") -> float:
    """The median (or `stat` "min") time to open a TCP connection from a lab host's namespace
    (one round trip). The minimum is what the link adds at best: a busy machine delays the
    user-space WAN's packets now and then, never below the link's own latency."""
    host, port = address.rsplit(":", 1)
    code = ("import socket, statistics, time\n"
            "t = []\n"
            f"for _ in range({samples}):\n"
            "    s = time.perf_counter()\n"
            f"    c = socket.create_connection(({host!r}, {port}), timeout=5)\n"
            "    t.append((time.perf_counter() - s) * 1000)\n"
            "    c.close()\n"
            f"print({'statistics.median(t)' if stat == 'median' else 'min(t)'})\n")
    done = subprocess.run(["ip", "netns", "exec", lab.netns(from_host), sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return float(done.stdout)


class AggregateTail:
    """A reader (in this, the root, namespace) of the aggregate's copies of the sources' topics,
    from the first offset on: how many records of each source it saw and the newest source
    timestamp (so the lag of a source written to without pause is now minus that), and the
    produce -> visible-in-the-aggregate latency of each record."""

    def __init__(self, bootstrap: str, topics: dict[str, str]) -> None:
        """topics: aggregate topic -> source name."""
        self.topics = topics
        self.newest_ms: dict[str, float] = {}
        self.counts: dict[str, int] = dict.fromkeys(topics.values(), 0)
        self.latencies: list[tuple[float, str, float]] = []  # (seen at, source, ms)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.error: BaseException | None = None
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"lab-tail-{time.monotonic_ns()}",
                                  "enable.auto.commit": False, "fetch.wait.max.ms": 20, "log_level": 2})
        assignment = [TopicPartition(t, p, 0) for t in topics for p in range(partition_count(bootstrap, t))]
        self.consumer.assign(assignment)
        self._thread = threading.Thread(target=self._run, name="aggregate-tail", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for msg in self.consumer.consume(1000, timeout=0.1):
                    if msg.error() is not None or msg.value() is None:
                        continue  # partition EOFs; fences (no key, no value)
                    seen_ms = time.time() * 1000
                    source = self.topics[msg.topic()]
                    _, ts = msg.timestamp()
                    with self._lock:
                        self.counts[source] += 1
                        self.newest_ms[source] = max(self.newest_ms.get(source, 0.0), ts)
                        self.latencies.append((time.monotonic(), source, seen_ms - ts))
        except BaseException as exc:  # reported by lag() and close()
            self.error = exc

    def lag_s(self, source: str) -> float:
        """Now minus the newest mirrored record's timestamp (inf: none yet)."""
        assert self.error is None, self.error
        with self._lock:
            newest = self.newest_ms.get(source)
        return float("inf") if newest is None else max(0.0, time.time() - newest / 1000)

    def latency_ms(self, source: str, since: float, until: float) -> list[float]:
        with self._lock:
            return [ms for at, s, ms in self.latencies if s == source and since <= at < until]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.consumer.close()
        assert self.error is None, self.error
