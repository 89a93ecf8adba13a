"""`dcmirror warehouse serve`: one Spark session that `dcmirror load` and `dcmirror warehouse
sql` use over its Unix socket instead of starting a JVM and a metastore each.

Shown with real processes: loads through the service load each record once (the same ledger
as standalone loads); queries answer from the running session (times printed beside the
first, standalone-size start of the service); a bad query is a clear error and the service
lives on; a second service is refused while the first holds the warehouse; SIGTERM removes
the socket; with --load-interval-ms it loads by itself; after kill -9 the socket file left behind does not fool the commands — they run
in a session of their own again.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.harness import REPO, BrokerProcess
from tests.spark.common import Feed, create_topics, run_cli, write_topology

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ANSWERED = "(answered by the warehouse service"


class Service:
    def __init__(self, topology: Path, *extra: str) -> None:
        self.lines: list[str] = []
        self.started = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", "--log-level", "WARNING", "warehouse",
                                      "serve", "--config", str(topology), *extra], cwd=REPO, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    def wait_ready(self, timeout_s: float = 300) -> float:
        return self.wait_for_line("answering on", timeout_s)

    def wait_for_line(self, text: str, timeout_s: float = 300) -> float:
        """Until a line of its output holds `text` (the timeout is a ceiling, not a delay)."""
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.lines):
            assert self.proc.poll() is None and time.monotonic() < deadline, "\n".join(self.lines)
            time.sleep(0.2)
        return time.monotonic() - self.started

    def kill_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)


def _timed(args: list[str]) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = run_cli(args)
    return done, time.monotonic() - started


def test_loads_and_queries_through_one_long_lived_session(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "broker").start()
    service: Service | None = None
    try:
        create_topics(broker.bootstrap, {"c.east.pageviews": 2})
        warehouse = tmp_path / "warehouse"
        topology = write_topology(tmp_path / "topology.toml", broker.bootstrap, warehouse, topics=r"c\..*")
        feed = Feed(broker.bootstrap)
        feed.produce("c.east.pageviews", 2, 500, source="east")

        service = Service(topology)
        ready_s = service.wait_ready()
        sock = warehouse / "warehouse.sock"
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600 and stat.S_ISSOCK(sock.stat().st_mode)

        count = ["warehouse", "sql", "--config", str(topology), "--json", "SELECT count(*) AS n FROM c_east_pageviews"]
        loaded, load_s = _timed(["load", "--config", str(topology)])
        assert loaded.returncode == 0 and ANSWERED in loaded.stderr, loaded.stdout + loaded.stderr
        assert "loaded 500 rows" in loaded.stdout, loaded.stdout
        answered, sql_s = _timed(count)
        assert answered.returncode == 0 and ANSWERED in answered.stderr, answered.stderr
        assert answered.stdout.strip().splitlines()[-1] == '[{"n":500}]'

        feed.produce("c.east.pageviews", 2, 300, source="east")
        again, again_s = _timed(["load", "--config", str(topology)])
        assert again.returncode == 0 and "loaded 300 rows" in again.stdout, again.stdout + again.stderr
        answered, sql2_s = _timed(count)
        assert answered.stdout.strip().splitlines()[-1] == '[{"n":800}]'
        twice = run_cli(["warehouse", "sql", "--config", str(topology), "--json",
                         "SELECT count(*) AS n FROM (SELECT kafka_partition, kafka_offset FROM c_east_pageviews "
                         "GROUP BY 1, 2 HAVING count(*) > 1)"])
        assert twice.stdout.strip().splitlines()[-1] == '[{"n":0}]'

        bad = run_cli(["warehouse", "sql", "--config", str(topology), "SELECT nope FROM c_east_pageviews"])
        assert bad.returncode == 1 and "nope" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
        second = run_cli(["warehouse", "serve", "--config", str(topology)], timeout_s=60)
        assert second.returncode == 1 and "is in use by dcmirror warehouse serve" in second.stderr, second.stderr
        assert service.proc.poll() is None
        print(f"\nservice ready in {ready_s:.1f} s (a JVM and metastore start); through it: load {load_s:.1f} s, "
              f"query {sql_s:.1f} s, second load {again_s:.1f} s, query {sql2_s:.1f} s")

        service.proc.send_signal(signal.SIGTERM)
        assert service.proc.wait(60) == 0, "\n".join(service.lines)
        assert not sock.exists()

        # With a load interval it loads by itself, the first at once (the Kubernetes form: no
        # timer outside); then kill -9: the socket file stays, and commands find nobody behind
        # it and run on their own.
        feed.produce("c.east.pageviews", 2, 200, source="east")
        service = Service(topology, "--load-interval-ms", "3600000")
        service.wait_for_line("scheduled load exited 0")
        assert any("loaded 200 rows" in line for line in service.lines), "\n".join(service.lines)
        service.kill_group()
        assert sock.exists()
        alone, alone_s = _timed(count)
        assert alone.returncode == 0 and ANSWERED not in alone.stderr, alone.stderr
        assert alone.stdout.strip().splitlines()[-1] == '[{"n":1000}]'
        # Its own JVM's warnings went to <warehouse>/spark.log, not to the user (issue 41: 9
        # lines before the answer of `warehouse sql`, 239 of 253 in `dcmirror load`).
        noise = [line for line in (alone.stdout + alone.stderr).splitlines()
                 if " WARN " in line or "WARNING" in line or line.startswith("\tat ") or "log4j" in line
                 or "Setting default log level" in line]
        assert not noise, noise
        assert alone.stdout.strip().splitlines() == ['[{"n":1000}]'], alone.stdout
        assert (warehouse / "spark.log").stat().st_size > 0
        print(f"after kill -9 of the service: a standalone query {alone_s:.1f} s")
    finally:
        if service is not None:
            service.kill_group()
        broker.stop()
