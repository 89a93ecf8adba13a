"""`dcmirror status` of a deployment where nothing answers (issue 41): DOWN, not DEGRADED;
each broker's reason said once ("connection refused", not "cannot reach broker X: all
attempts to connect to X failed"), every cluster and worker asked at once."""

from __future__ import annotations

import time
from pathlib import Path

import trio

from deploy.up_cmd import collect_status, format_status
from tests.harness import free_port
from topology import loads


def test_a_deployment_where_nothing_answers_is_down(tmp_path: Path) -> None:
    ports = [free_port() for _ in range(4)]
    topology = loads(f"""
[clusters.east]
datacenter = "east"
brokers = ["127.0.0.1:{ports[0]}", "127.0.0.1:{ports[1]}"]
[clusters.aggregate]
datacenter = "central"
brokers = ["127.0.0.1:{ports[2]}"]
[[mirrors]]
source = "east"
target = "aggregate"
topics = ".*"
workers_http = ["127.0.0.1:{ports[3]}"]
""", base_dir=tmp_path)
    started = time.monotonic()
    doc = trio.run(lambda: collect_status(topology, timeout_s=3.0))
    assert time.monotonic() - started < 10  # asked at once, each bounded
    assert doc["state"] == "DOWN" and not doc["healthy"]
    text = format_status(doc)
    assert text.splitlines()[0].endswith("DOWN (3 problem(s)): no broker and no mirror worker answers"), text
    assert doc["problems"][:2] == [
        f"cluster east: none of the 2 brokers answers (127.0.0.1:{ports[0]}: connection refused)",
        f"cluster aggregate: no broker answers (127.0.0.1:{ports[2]}: connection refused)"], doc["problems"]
    assert doc["problems"][2].endswith(f"(east-to-aggregate-w0 at 127.0.0.1:{ports[3]}: cannot connect: "
                                       "connection refused)"), doc["problems"]
    assert not any("all attempts" in p or p.count(f"127.0.0.1:{ports[0]}") > 1 for p in doc["problems"]), \
        doc["problems"]
