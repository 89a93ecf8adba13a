"""Pausing and resuming a flow (`dcmirror mirror pause|resume`, mirror/flow_control.py) with two
workers under their supervisor:

- `mirror pause` writes the flow's record into the aggregate's dcmirror.flow-control; both
  workers report it (status: paused, since when, the reason; every partition PAUSED; the gauge
  dcmirror_mirror_flow_paused 1 on their admin HTTP; an INFO line each);
- records written into the source meanwhile stay there: the target's end offsets do not move
  across two status reports of each worker after the pause took effect and the records were
  acknowledged by the source (why that bound is fair: `assert_target_still`);
- a worker killed -9 while the flow is paused comes back paused (the supervisor restarts it; it
  reads the record before it joins the group, and claims partitions without fetching them): no
  mirrored record is added;
- `mirror resume`: the workers go on where they stopped, and every source record is in the
  target exactly once, in order (tests/mirror/lab.py `compare`).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.harness import REPO
from tests.mirror.lab import (
    Flow,
    MirrorLab,
    end_offsets,
    mirrored_count,
    new_topic,
    read_topic,
    wait_for,
    write,
)

TOPIC = "pv"
PARTITIONS = 4
FLOW = "east-to-aggregate"
TARGET_TOPIC = f"east.{TOPIC}"
BEFORE, DURING = 2000, 3000  # records written before the pause, and while paused
REASON = "schema change in east, ticket 4711"
WORKERS = (f"{FLOW}-w0", f"{FLOW}-w1")


def port_pair() -> int:
    """A loopback port whose next port is free too (http.port.base: worker N on base + N)."""
    for _ in range(100):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            base = a.getsockname()[1]
            try:
                b.bind(("127.0.0.1", base + 1))
            except OSError:
                continue
            return base
    raise RuntimeError("no pair of free loopback ports")


def cli(lab: MirrorLab, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deploy.cli", "mirror", *args, "--config", str(lab.topology_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)


def live_status(lab: MirrorLab, flow: str = FLOW) -> dict[str, dict[str, Any]]:
    """The workers' status files written within the last 3 s, by worker name."""
    now_ms = time.time() * 1000
    return {name: doc for name, doc in lab.worker_status(flow).items() if now_ms - doc.get("reported_ms", 0) < 3000}


def paused_metric(base: int, index: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{base + index}/metrics", timeout=5).text
    (line,) = [line for line in text.splitlines() if line.startswith("dcmirror_mirror_flow_paused{")]
    assert f'flow="{FLOW}"' in line, line
    return float(line.rsplit(" ", 1)[1])


def all_paused(lab: MirrorLab, pids: dict[str, int] | None = None, *, flow: str = FLOW,
               workers: tuple[str, ...] = WORKERS, partitions: int = PARTITIONS) -> dict[str, dict[str, Any]] | None:
    """Every worker reports the flow paused (both directions of a mirror-topics worker: each
    reads the pause on its own poll) and all `partitions` claimed and PAUSED (by the
    processes `pids` names, when given): their status documents; else None."""
    status = live_status(lab, flow)
    if set(status) != set(workers) or (pids and any(status[w].get("pid") != pids[w] for w in workers)):
        return None
    parts = [p for doc in status.values() for p in doc["partitions"]]
    if not all(doc.get("paused") and (doc.get("reverse") or {}).get("paused", True) for doc in status.values()) \
            or len(parts) != partitions \
            or any(p["state"] != "PAUSED" for p in parts):
        return None
    return status


def reports_after(lab: MirrorLab, after_ms: float, count: int, *, flow: str = FLOW,
                  workers: tuple[str, ...] = WORKERS) -> None:
    """Until each worker has written `count` status reports stamped after `after_ms`."""
    seen: dict[str, set[int]] = {w: set() for w in workers}

    def enough() -> bool:
        for name, doc in lab.worker_status(flow).items():
            if name in seen and doc.get("reported_ms", 0) > after_ms:
                seen[name].add(doc["reported_ms"])
        return all(len(s) >= count for s in seen.values())

    wait_for(enough, 30, f"{count} status reports of each worker", interval_s=0.2, on_timeout=lab.mirror_log_tail)


def assert_target_still(lab: MirrorLab, ends: dict[int, int], after_ms: float, *, flow: str = FLOW,
                        workers: tuple[str, ...] = WORKERS, cluster: str = "aggregate",
                        topic: str = TARGET_TOPIC) -> None:
    """The target's end offsets stay `ends` across two status reports of every worker after
    `after_ms` (the pause in force, the records acknowledged by the source). A fair bound: a
    worker writes its report every second from the same trio loop that mirrors, so two reports
    mean at least one full second in which both processes ran with the records available at
    the source's leader; running, the same workers copy the first BEFORE records, caught up,
    within a fetch round trip (fetch.max.wait.ms 500) plus a produce — and the check runs again
    at every report in between, not once at the end."""
    seen: dict[str, set[int]] = {w: set() for w in workers}
    deadline = time.monotonic() + 30
    while not all(len(s) >= 2 for s in seen.values()):
        assert time.monotonic() < deadline, f"no two status reports of each worker within 30 s: {seen}"
        now = end_offsets(lab.bootstrap(cluster), topic)
        assert now == ends, f"the target moved while the flow was paused: {ends} -> {now}\n{lab.mirror_log_tail()}"
        for name, doc in lab.worker_status(flow).items():
            if name in seen and doc.get("reported_ms", 0) > after_ms:
                seen[name].add(doc["reported_ms"])
        time.sleep(0.2)
    assert end_offsets(lab.bootstrap(cluster), topic) == ends


@pytest.mark.heavy
@pytest.mark.timeout(400)
def test_pause_stops_the_flow_through_a_worker_restart_and_resume_goes_on_exactly_once(
        mirror_lab: Callable[..., MirrorLab]) -> None:
    started = time.monotonic()
    lab = mirror_lab({"east": 1, "aggregate": 1})
    east = lab.bootstrap("east")
    new_topic(east, TOPIC, PARTITIONS)
    base = port_pair()
    lab.write_topology([Flow("east", "aggregate", TOPIC, workers=2, config={
        "topic.refresh.ms": "1000", "flow.control.poll.ms": "250", "http.port.base": str(base),
        "consumer.session.timeout.ms": "6000", "consumer.heartbeat.interval.ms": "500"})])
    lab.start_mirror()
    write(east, TOPIC, PARTITIONS, BEFORE, "east")
    lab.check_exactly_once(FLOW, [TOPIC], timeout_s=120)
    wait_for(lambda: {w for w, doc in live_status(lab).items() if doc["partitions"]} == set(WORKERS), 60,
             "both workers own partitions", on_timeout=lab.mirror_log_tail)
    assert [paused_metric(base, i) for i in (0, 1)] == [0.0, 0.0]
    print(f"mirroring, caught up at {time.monotonic() - started:.1f} s", flush=True)

    paused = cli(lab, "pause", "--flow", FLOW, "--reason", REASON)
    assert paused.returncode == 0, paused.stderr
    assert "PAUSED" in paused.stdout and "dcmirror.flow-control in aggregate" in paused.stdout, paused.stdout
    status = wait_for(lambda: all_paused(lab), 30, "both workers report the flow paused, every partition PAUSED",
                      interval_s=0.2, on_timeout=lab.mirror_log_tail)
    took_effect_ms = time.time() * 1000
    print(f"paused at {time.monotonic() - started:.1f} s", flush=True)
    for doc in status.values():
        assert doc["pause_reason"] == REASON and doc["flow_control"]["error"] is None, doc["flow_control"]
        assert 0 < took_effect_ms - doc["paused_since_ms"] < 60_000, doc["paused_since_ms"]
    assert [paused_metric(base, i) for i in (0, 1)] == [1.0, 1.0]
    assert lab.mirror_log().count(f"flow {FLOW} PAUSED") >= 2, lab.mirror_log_tail()
    text = cli(lab, "status")
    assert "PAUSED since" in text.stdout and REASON in text.stdout, text.stdout
    report = {f["flow"]: f for f in lab.status()}[FLOW]
    assert report["paused"] and report["paused_workers"] == 2 and report["pause_reason"] == REASON, report

    ends = end_offsets(lab.bootstrap("aggregate"), TARGET_TOPIC)
    write(east, TOPIC, PARTITIONS, DURING, "east", start=BEFORE)  # acknowledged by the source (acks=all)
    written_ms = time.time() * 1000
    assert sum(end_offsets(east, TOPIC).values()) == BEFORE + DURING
    assert_target_still(lab, ends, max(took_effect_ms, written_ms))
    print(f"target still at {time.monotonic() - started:.1f} s", flush=True)
    parts = [p for doc in live_status(lab).values() for p in doc["partitions"]]
    assert parts and all(p["source_silent_s"] is None for p in parts), "paused: the source is not asked, not silent"

    # A worker killed while paused comes back paused; the claims fence (an invisible marker
    # each) but copy nothing.
    mirrored = mirrored_count(lab.bootstrap("aggregate"), TARGET_TOPIC)
    assert mirrored == BEFORE
    victim = lab.worker_pids(FLOW)[0]
    lab.kill_worker(FLOW, 0)
    wait_for(lambda: lab.worker_pids(FLOW).get(0) not in (None, victim), 60, "the supervisor restarts w0",
             on_timeout=lab.mirror_log_tail)
    pids = {f"{FLOW}-w{i}": pid for i, pid in lab.worker_pids(FLOW).items()}
    wait_for(lambda: all_paused(lab, pids), 90, "the restarted worker reports paused, every partition PAUSED",
             interval_s=0.5, on_timeout=lab.mirror_log_tail)
    reports_after(lab, time.time() * 1000, 2)
    assert mirrored_count(lab.bootstrap("aggregate"), TARGET_TOPIC) == mirrored, "records mirrored while paused"
    print(f"restarted paused at {time.monotonic() - started:.1f} s", flush=True)

    resumed = cli(lab, "resume", "--flow", FLOW)
    assert resumed.returncode == 0, resumed.stderr
    assert "RESUMED" in resumed.stdout, resumed.stdout
    lab.check_exactly_once(FLOW, [TOPIC], timeout_s=120)
    status = live_status(lab)
    assert not any(doc["paused"] for doc in status.values()), status
    assert [paused_metric(base, i) for i in (0, 1)] == [0.0, 0.0]
    assert lab.mirror_log().count(f"flow {FLOW} RESUMED") >= 2, lab.mirror_log_tail()
    assert mirrored_count(lab.bootstrap("aggregate"), TARGET_TOPIC) == BEFORE + DURING
    print(f"resumed and checked at {time.monotonic() - started:.1f} s", flush=True)


MT_FLOW = "east-to-dr"


@pytest.mark.heavy
@pytest.mark.timeout(300)
def test_a_mirror_topics_flow_pauses_and_resumes_at_the_same_offsets(mirror_lab: Callable[..., MirrorLab]) -> None:
    """The same for a flow of mirror topics (one worker, both directions in it): paused, the
    copy stays where it was; resumed, it holds the source's records at the source's offsets."""
    started = time.monotonic()
    lab = mirror_lab({"east": 1, "dr": 1})
    east, dr = lab.bootstrap("east"), lab.bootstrap("dr")
    new_topic(east, "orders", 2)
    write(east, "orders", 2, 1000, "a")
    lab.write_topology([Flow("east", "dr", "orders", rename="{topic}", mirror_topics=True, config={
        "topic.refresh.ms": "1000", "flow.control.poll.ms": "250"})])
    lab.start_worker(MT_FLOW, 0)
    ends = end_offsets(east, "orders")
    wait_for(lambda: end_offsets(dr, "orders") == ends, 120, f"the copy at the source's ends {ends}",
             interval_s=0.3, on_timeout=lab.mirror_log_tail)
    print(f"copied at {time.monotonic() - started:.1f} s", flush=True)

    paused = cli(lab, "pause", "--flow", MT_FLOW, "--reason", REASON)
    assert paused.returncode == 0, paused.stderr
    worker = (f"{MT_FLOW}-w0",)
    status = wait_for(lambda: all_paused(lab, flow=MT_FLOW, workers=worker, partitions=2), 30,
                      "the worker reports the flow paused, both partitions PAUSED", interval_s=0.2,
                      on_timeout=lab.mirror_log_tail)
    took_effect_ms = time.time() * 1000
    (doc,) = status.values()
    assert doc["mode"] == "mirror_topics" and doc["pause_reason"] == REASON and doc["reverse"]["paused"], doc
    write(east, "orders", 2, 1500, "b", start=1000)
    assert_target_still(lab, ends, max(took_effect_ms, time.time() * 1000), flow=MT_FLOW, workers=worker,
                        cluster="dr", topic="orders")
    print(f"copy still at {time.monotonic() - started:.1f} s", flush=True)

    resumed = cli(lab, "resume", "--flow", MT_FLOW)
    assert resumed.returncode == 0, resumed.stderr
    ends = end_offsets(east, "orders")
    assert sum(ends.values()) == 2500
    wait_for(lambda: end_offsets(dr, "orders") == ends, 120, f"the copy at the source's ends {ends}",
             interval_s=0.3, on_timeout=lab.mirror_log_tail)
    assert read_topic(dr, "orders") == read_topic(east, "orders"), "the copy differs from the source"
    assert not live_status(lab, MT_FLOW)[worker[0]]["paused"]
    print(f"resumed and checked at {time.monotonic() - started:.1f} s", flush=True)
