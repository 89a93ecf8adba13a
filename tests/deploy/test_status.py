"""`dcmirror status` against a real 3-broker cluster (tests/harness.py processes, so nothing
restarts a killed broker behind the test's back): healthy, degraded after a kill -9 (the
broker does not answer, is fenced, every partition it replicates is under-replicated), and
healthy again once it is restarted and caught up."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.conftest import dcmirror, status
from tests.harness import REPO, ClusterProcesses

PARTITIONS = 4


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
