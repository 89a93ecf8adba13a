"""`dcmirror status` against a real 3-broker cluster (tests/harness.py processes, so nothing
restarts a killed broker behind the test's back): healthy, degraded after a kill -9 (the
broker does not answer, is fenced, every partition it replicates is under-replicated), and
healthy again once it is restarted and caught up."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cluster.client.sync import SyncProducer
from tests.deploy.conftest import UpRun, dcmirror, status, write_topology
from tests.harness import REPO, ClusterProcesses
from topology import load

PARTITIONS = 4
RECORDS = 400


def poll_status(config: Path, accept: Callable[[int, dict[str, Any]], bool], timeout_s: float,
                what: str) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    doc: dict[str, Any] = {}
    while time.monotonic() < deadline:
        code, doc = status(config)
        if accept(code, doc):
            return doc
        time.sleep(0.3)
    raise AssertionError(f"status never showed {what} within {timeout_s:g} s; last: {doc}")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_status_degraded_after_a_broker_is_killed_and_healthy_after_it_restarts(cluster_factory: Any) -> None:
    cluster: ClusterProcesses = cluster_factory(3, **{"broker.session.timeout.ms": 2000})
    config = cluster.topology_path
    with open(config, "a") as f:  # the topic the file declares, applied as `up` would
        f.write(f'\n[[topics]]\ncluster = "east"\nname = "pageviews"\npartitions = {PARTITIONS}\n'
                'replication_factor = 3\n')
    applied = subprocess.run([sys.executable, "-m", "deploy.cli", "topology", "apply", str(config)], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
    assert applied.returncode == 0, applied.stdout + applied.stderr

    doc = poll_status(config, lambda code, d: code == 0, 30, "a healthy cluster")
    (east,) = doc["clusters"]
    assert doc["healthy"] and doc["problems"] == [] and doc["flows"] == []
    assert (east["brokers_up"], east["brokers_registered"], east["topics"], east["partitions"],
            east["offline_partitions"], east["under_replicated_partitions"]) == ([1, 2, 3], [1, 2, 3], 1, 4, [], [])
    assert east["controller"] in (1, 2, 3)
    text = dcmirror("status", "--config", str(config))
    assert text.returncode == 0 and ": HEALTHY" in text.stdout, text.stdout

    victim = 3 if east["controller"] != 3 else 2
    cluster[victim].kill9()
    print(f"kill -9 broker {victim}")
    code, doc = status(config)  # at once: it does not answer
    assert code == 1 and not doc["healthy"]
    (east,) = doc["clusters"]
    assert victim not in east["brokers_up"] and len(east["brokers_up"]) == 2
    assert any(p.startswith(f"cluster east: broker {victim} (127.0.0.1:") and "does not answer" in p
               for p in doc["problems"]), doc["problems"]

    # once the controller fences it (broker.session.timeout.ms): not registered, and it left
    # the ISR of every partition (all of them: replication factor 3 on 3 brokers)
    every = [f"pageviews-{p}" for p in range(PARTITIONS)]
    doc = poll_status(config, lambda code, d: code == 1 and victim not in d["clusters"][0]["brokers_registered"]
                      and all(p in d["clusters"][0]["under_replicated_partitions"] for p in every),
                      30, f"broker {victim} fenced and {every} under-replicated")
    (east,) = doc["clusters"]
    assert east["offline_partitions"] == []
    assert len(east["brokers_registered"]) == 2
    text = dcmirror("status", "--config", str(config))
    assert text.returncode == 1, text.stdout
    assert "DEGRADED" in text.stdout and "under-replicated partition(s)" in text.stdout, text.stdout
    row = next(line.split() for line in text.stdout.splitlines() if line.strip().startswith("east "))
    assert row[2:4] == ["2/3", "2/3"], row

    cluster[victim].start()
    doc = poll_status(config, lambda code, d: code == 0, 60, "healthy after the restart")
    (east,) = doc["clusters"]
    assert (east["brokers_up"], east["brokers_registered"], east["under_replicated_partitions"]) == \
        ([1, 2, 3], [1, 2, 3], [])


def test_status_of_a_bad_topology_file_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[clusters.east]\ndatacenter = "east"\nbrokers = ["127.0.0.1:1"]\nbrokerz = 1\n')
    proc = dcmirror("status", "--config", str(bad))
    assert proc.returncode == 2 and "brokerz" in proc.stderr, proc.stderr
    proc = dcmirror("up", "--config", str(tmp_path / "missing.toml"))
    assert proc.returncode == 2 and "missing.toml" in proc.stderr, proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_status_asks_mirror_workers_over_http_from_another_host_and_names_the_one_that_stops_answering(
        tmp_path: Path, up_runs: Callable[[Path], UpRun]) -> None:
    """Workers declare their admin HTTP (`workers_http`); `dcmirror status` and `dcmirror
    mirror status` run with a copy of the topology in another directory (as on another host:
    none of the workers' status files), and get every worker's partitions, lag, throughput
    and records over HTTP. A worker stopped with SIGSTOP (its host hangs: connections open,
    nothing answers) is shown as not answering within the timeout, the others still count,
    and the command returns within its bound."""
    config = write_topology(tmp_path / "run", {"east": 1, "aggregate": 1}, topics=[("east", "pageviews", 4, 1)],
                            flows=[("east", "aggregate", "pageviews", 2)], workers_http=True)
    elsewhere = tmp_path / "operator-laptop" / "topology.toml"
    elsewhere.parent.mkdir()
    shutil.copy(config, elsewhere)
    up = up_runs(config)
    up.wait_for_line("dcmirror up: ready", 120)
    flow = load(config).mirrors[0]
    with SyncProducer({"bootstrap.servers": load(config).cluster("east").bootstrap(), "acks": "all"}) as p:
        for i in range(RECORDS):
            p.produce("pageviews", b"v%d" % i, partition=i % 4)
        p.flush(30)

    def mirror_status() -> tuple[int, list[dict[str, Any]]]:
        proc = dcmirror("mirror", "status", "--config", str(elsewhere), "--json", "--timeout", "1")
        return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1])

    deadline = time.monotonic() + 60
    while True:
        code, (report,) = mirror_status()
        if report["records"] == RECORDS and report["lag_records"] == 0:
            break
        assert time.monotonic() < deadline, f"never mirrored {RECORDS} records: {report}"
        time.sleep(0.5)
    assert code == 0 and report["via"] == "http" and report["live_workers"] == 2
    assert sorted(w["address"] for w in report["workers"]) == sorted(str(a) for a in flow.workers_http)
    assert sorted((p["topic"], p["partition"]) for w in report["workers"] for p in w["partitions"]) == [
        ("pageviews", p) for p in range(4)]
    assert all(w["reachable"] and w["last_problem"] is None for w in report["workers"])
    assert not (elsewhere.parent / "data").exists(), "status read files on the 'other host'"

    stopped = up.child_pids()["mirror east-to-aggregate-w1"]
    os.kill(stopped, signal.SIGSTOP)
    try:
        started = time.monotonic()
        code, doc = status(elsewhere)
        took_s = time.monotonic() - started
        print(f"status with one worker stopped: exit {code} in {took_s:.1f} s; problems {doc['problems']}")
        (f,) = doc["flows"]
        assert code == 1 and f["live_workers"] == 1 and f["via"] == "http"
        silent = [w for w in f["worker_states"] if not w["reachable"]]
        assert [(w["worker"], w["address"]) for w in silent] == [("east-to-aggregate-w1", str(flow.workers_http[1]))]
        assert silent[0]["error"] == "no answer within 3 s"
        assert any("1 of 2 workers reporting" in p and "east-to-aggregate-w1" in p for p in doc["problems"])
        assert took_s < 15, "status waited on the silent worker longer than its timeout"
        code, (report,) = mirror_status()
        assert code == 1 and report["live_workers"] == 1 and report["records"] > 0
    finally:
        os.kill(stopped, signal.SIGCONT)
