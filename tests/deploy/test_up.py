"""`dcmirror up` on a small topology (east: 2 brokers, aggregate: 1, one flow with one
worker), all real processes on free loopback ports: ready, topics applied, records mirrored,
a kill -9'd broker restarted by the supervisor, `status` healthy again, and SIGTERM stops
every child cleanly (each broker's log ends with a clean stop, no process left)."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from cluster.client.admin import Admin
from cluster.client.sync import SyncProducer
from deploy.demo import count_aggregate, source_offsets, streams_of
from tests.deploy.conftest import UpRun, dcmirror, pids_with, status, write_topology
from topology import load

RECORDS = 1000


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str, dump: Callable[[], str]) -> object:
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.25)
    raise AssertionError(f"not within {timeout_s:g} s: {what}; last: {last!r}\n{dump()[-6000:]}")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_up_runs_the_topology_restarts_a_killed_broker_and_stops_every_child_cleanly(
        tmp_path: Path, up_runs: Callable[[Path], UpRun]) -> None:
    config = write_topology(tmp_path, {"east": 2, "aggregate": 1}, topics=[("east", "pageviews", 3, 2)],
                            flows=[("east", "aggregate", "pageviews", 1)],  # a load scheduled, not due in the test
                            extra='[warehouse]\nsource = "aggregate"\nconfig = { "load.interval.ms" = 3600000 }\n')
    topology = load(config)
    up = up_runs(config)
    ready = up.wait_for_line("dcmirror up: ready", 120)
    print(ready)
    assert "3 nodes, 1 mirror workers" in ready
    pids = up.child_pids()
    assert set(pids) == {"broker east-1", "broker east-2", "broker aggregate-1", "mirror east-to-aggregate-w0"}
    assert all(alive(p) for p in pids.values())
    state = up.state()
    assert state["phase"] == "ready" and state["load_interval_s"] == 3600
    assert [(c["name"], c["kind"], c["starts"]) for c in state["children"] if c["name"] == "load"] == [("load", "job", 0)]
    up.wait_for_line("warehouse load (dcmirror load) every 3600 s, first in 3600 s", 1)
    for name in ("east/node-1.log", "east/node-2.log", "aggregate/node-1.log",
                 "mirror/east-to-aggregate/east-to-aggregate-w0.log"):
        assert (tmp_path / "data" / name).stat().st_size > 0, name

    async def described() -> list[tuple[int, int]]:
        async with Admin(topology.cluster("east").bootstrap()) as admin:
            meta = await admin.metadata(["pageviews"])
        (t,) = meta.topics
        return sorted((p.partition_index, len(p.replica_nodes)) for p in t.partitions)

    assert trio.run(described) == [(0, 2), (1, 2), (2, 2)]  # the file's topic, applied by up

    with SyncProducer({"bootstrap.servers": topology.cluster("east").bootstrap(), "acks": "all"}) as producer:
        for i in range(RECORDS):
            producer.produce("pageviews", f'{{"n":{i}}}'.encode(), f"user-{i % 37}".encode())
        producer.flush(60)
    offsets = trio.run(source_offsets, topology)
    assert sum(end for _, end in offsets.values()) == RECORDS
    (stream,) = streams_of(topology)

    def mirrored() -> bool:
        got = trio.run(count_aggregate, topology, stream, offsets)
        assert got.duplicates == 0, got
        return got.records == RECORDS and got.missing == 0

    wait_until(mirrored, 60, f"{RECORDS} records in aggregate east.pageviews", up.output)

    killed = pids["broker east-1"]
    os.kill(killed, signal.SIGKILL)
    print(f"kill -9 broker east-1 (pid {killed})")
    restarted = wait_until(lambda: up.child_pids().get("broker east-1") not in (None, killed), 30,
                           "the supervisor restarts broker east-1", up.output)
    assert restarted
    assert re.search(r"broker east-1: killed by SIGKILL after [\d.]+ s; restarting in 0\.5 s", up.output())

    seen: list[dict[str, Any]] = []

    def healthy() -> bool:
        code, doc = status(config)
        seen[:] = [doc]
        # partitions: the group has settled after the restart (during a rebalance the worker holds
        # fewer; leadership moving back to the restarted broker can start another one, so the
        # checks below read this same answer rather than asking again)
        return code == 0 and doc["healthy"] and doc["flows"][0]["lag_records"] == 0 \
            and doc["flows"][0]["partitions"] == 3

    wait_until(healthy, 60, "status healthy (and the flow at lag 0) after the restart", up.output)
    (doc,) = seen
    east = next(c for c in doc["clusters"] if c["cluster"] == "east")
    assert (east["brokers_up"], east["brokers_registered"], east["offline_partitions"],
            east["under_replicated_partitions"], east["topics"], east["partitions"]) == ([1, 2], [1, 2], [], [], 1, 3)
    (flow,) = doc["flows"]
    assert (flow["flow"], flow["live_workers"], flow["workers"], flow["lag_records"], flow["partitions"]) == \
        ("east-to-aggregate", 1, 1, 0, 3)
    assert doc["up"]["running"] and doc["up"]["restarts"] == 1
    assert doc["last_load"] is None and doc["load_interval_s"] == 3600
    state = {c["name"]: c for c in up.state()["children"]}
    assert state["broker east-1"]["restarts"] == 1 and state["broker east-2"]["restarts"] == 0

    all_pids = set(up.child_pids().values()) | {killed}
    started = time.monotonic()
    up.proc.send_signal(signal.SIGTERM)
    assert up.proc.wait(60) == 0, up.output()
    print(f"up stopped in {time.monotonic() - started:.1f} s")
    up.wait_for_line("all 4 processes exited cleanly", 5)
    assert not [p for p in all_pids if alive(p)]
    assert pids_with(str(config)) == []
    for node in ("east/node-1.log", "east/node-2.log", "aggregate/node-1.log"):
        text = (tmp_path / "data" / node).read_text()
        last_run = text[text.rindex(" is ready (broker epoch"):]
        assert "stopped cleanly" in last_run, f"{node} did not stop cleanly:\n{last_run[-3000:]}"
    assert up.state()["phase"] == "stopped"
    code, doc = status(config)
    assert code == 1 and doc["up"]["running"] is False
    assert "cluster east: none of the 2 brokers answers (127.0.0.1:" in "\n".join(doc["problems"])


def test_up_keeps_a_warehouse_service_only_when_asked(tmp_path: Path) -> None:
    from deploy.up_cmd import service_spec

    def topology(value: str | None) -> Path:
        setting = f'config = {{ "load.service" = "{value}" }}\n' if value is not None else ""
        return write_topology(tmp_path / str(value), {"east": 1}, extra=f'[warehouse]\nsource = "east"\n{setting}')

    spec = service_spec(load(topology("true")), "/etc/t.toml")
    assert spec is not None and spec.interval_s is None and spec.argv[4:] == [
        "warehouse", "serve", "--config", "/etc/t.toml"]
    assert spec.log_path == tmp_path / "true" / "warehouse" / "_logs" / "service.log"
    assert service_spec(load(topology("false")), "f") is None and service_spec(load(topology(None)), "f") is None
    proc = dcmirror("topology", "check", str(topology("yes")))
    assert proc.returncode == 2 and "load.service" in proc.stderr, proc.stderr


def test_up_children_and_where_their_logs_go(tmp_path: Path) -> None:
    from deploy.up_cmd import child_specs, load_interval_s, state_path

    config = write_topology(tmp_path, {"east": 2, "aggregate": 1}, flows=[("east", "aggregate", "pageviews", 2)],
                            extra='[warehouse]\nsource = "aggregate"\nconfig = { "load.interval.ms" = 90000 }\n')
    topology = load(config)
    nodes, workers, job = child_specs(topology, str(config))
    data = tmp_path / "data"
    # -P: the working directory never shadows the packages (a topology/ folder beside the file)
    assert {tuple(s.argv[:4]) for s in [*nodes, *workers]} == {(sys.executable, "-P", "-m", "deploy.cli")}
    assert [(s.name, s.argv[4:], s.log_path) for s in nodes] == [
        ("broker east-1", ["broker", "--config", str(config), "--cluster", "east", "--node", "1"],
         data / "east" / "node-1.log"),
        ("broker east-2", ["broker", "--config", str(config), "--cluster", "east", "--node", "2"],
         data / "east" / "node-2.log"),
        ("broker aggregate-1", ["broker", "--config", str(config), "--cluster", "aggregate", "--node", "1"],
         data / "aggregate" / "node-1.log")]
    assert [(s.name, s.argv[4:], s.log_path) for s in workers] == [
        (f"mirror east-to-aggregate-w{i}",
         ["mirror", "--config", str(config), "--flow", "east-to-aggregate", "--worker", str(i)],
         data / "mirror" / "east-to-aggregate" / f"east-to-aggregate-w{i}.log") for i in (0, 1)]
    assert job is not None and job.interval_s == 90.0 and job.argv[4:] == ["load", "--config", str(config)]
    assert job.log_path == tmp_path / "warehouse" / "_logs" / "load.log"
    assert state_path(topology) == data / "up.json"
    for value, expected in (("0", 0.0), ("1500", 1.5)):
        t = load(write_topology(tmp_path / value, {"east": 1},
                                extra=f'[warehouse]\nsource = "east"\nconfig = {{ "load.interval.ms" = "{value}" }}\n'))
        assert load_interval_s(t) == expected
        assert (child_specs(t, "f")[2] is None) == (expected == 0)
    bad = write_topology(tmp_path / "bad", {"east": 1},
                         extra='[warehouse]\nsource = "east"\nconfig = { "load.interval.ms" = "hourly" }\n')
    proc = dcmirror("up", "--config", str(bad))
    assert proc.returncode == 2 and "load.interval.ms" in proc.stderr and "'hourly'" in proc.stderr, proc.stderr


def topology_processes(root: Path, config: Path) -> dict[int, str]:
    """Live processes of a topology: their command line names its file, or they run in a
    directory under it (Spark's JVM, started by a load, names neither the file nor dcmirror)."""
    found = {}
    for pid in Path("/proc").iterdir():
        if not pid.name.isdigit() or int(pid.name) == os.getpid():
            continue
        try:
            state = (pid / "stat").read_text().split(") ", 1)[1][0]
            cwd = os.readlink(pid / "cwd")
            argv = (pid / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if state != "Z" and (str(config) in argv or cwd.startswith(str(root))):
            found[int(pid.name)] = argv[:160]
    return found


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kill_9_of_up_leaves_no_process_of_the_topology(tmp_path: Path, up_runs: Callable[[Path], UpRun]) -> None:
    """`dcmirror up` killed with SIGKILL while a scheduled warehouse load (Spark: a Python
    process and its JVM) is running: every broker, worker and load process stops by itself
    (deploy.lifeline), brokers with a controlled shutdown."""
    config = write_topology(tmp_path, {"east": 2, "aggregate": 1}, topics=[("east", "pageviews", 3, 2)],
                            flows=[("east", "aggregate", "pageviews", 1)],
                            extra='[warehouse]\nsource = "aggregate"\nconfig = { "load.interval.ms" = 2000 }\n')
    up = up_runs(config)
    up.wait_for_line("dcmirror up: ready", 120)
    load_log = tmp_path / "warehouse" / "_logs" / "load.log"
    wait_until(lambda: load_log.exists() and "loading aggregate" in load_log.read_text(), 120,
               "a scheduled load running", up.output)
    wait_until(lambda: any("java" in argv for argv in topology_processes(tmp_path, config).values()), 60,
               "the load's Spark JVM", up.output)
    before = topology_processes(tmp_path, config)
    print(f"{len(before)} processes of the topology before the kill:\n" + "\n".join(before.values()))
    assert len(before) >= 6, before  # 3 brokers, a worker, the load and its JVM
    os.kill(up.proc.pid, signal.SIGKILL)
    up.proc.wait(10)
    started = time.monotonic()
    wait_until(lambda: not topology_processes(tmp_path, config), 90, "every process of the topology gone",
               lambda: "\n".join(topology_processes(tmp_path, config).values()))
    print(f"all gone {time.monotonic() - started:.1f} s after kill -9 of up")
    for node in ("east/node-1.log", "east/node-2.log", "aggregate/node-1.log"):
        text = (tmp_path / "data" / node).read_text()
        assert "the supervising process is gone" in text, f"{node}:\n{text[-2000:]}"


def test_up_names_a_port_another_process_holds_and_starts_nothing(tmp_path: Path) -> None:
    """A port of the topology already taken (another `dcmirror up`, a process left from a
    killed one, a Kafka on it): `up` says which address and what of the topology wanted it,
    exits 2 and starts no process (issue 41: the default's fixed ports)."""
    import socket

    from deploy.ports import listen_addresses

    config = write_topology(tmp_path, {"east": 1, "aggregate": 1})
    wanted = listen_addresses(load(config))
    assert wanted[0].what.startswith("cluster east node 1, listener "), wanted
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind((wanted[-1].host, wanted[-1].port))
    holder.listen()
    try:
        started = time.monotonic()
        proc = dcmirror("up", "--config", str(config))
        took_s = time.monotonic() - started
    finally:
        holder.close()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"in use by another process: {wanted[-1]} ({wanted[-1].what})" in proc.stderr, proc.stderr
    assert f"dcmirror status --config {config}" in proc.stderr and "Traceback" not in proc.stderr
    assert "starting cluster" not in proc.stdout, proc.stdout
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").rglob("*.log"))
    print(f"refused in {took_s:.1f} s")
