"""`dcmirror topology plan|apply FILE` against two real clusters of one topology file
(east: 2 brokers, aggregate: 1 broker), checked with confluent-kafka's AdminClient and with
a Metadata request to every broker."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from cluster.client.connection import connect_any
from tests.harness import REPO, BrokerProcess, free_port

pytestmark = pytest.mark.timeout(180)

COMMAND_TIMEOUT_S = 60

TOPICS = """
[[topics]]
cluster = "east"
name = "pageviews"
partitions = 4
replication_factor = 2
config = { "min.insync.replicas" = "2", "retention.ms" = 86400000 }

[[topics]]
cluster = "east"
name = "clicks"
partitions = 2
replication_factor = 2

[[topics]]
cluster = "aggregate"
name = "east.pageviews"
partitions = 3
config = { "cleanup.policy" = "compact", "unclean.leader.election.enable" = false }
"""


def clusters_text(east: list[int], aggregate: list[int]) -> str:
    return (f'[clusters.east]\ndatacenter = "east"\n'
            f'brokers = [{", ".join(f"{chr(34)}127.0.0.1:{p}{chr(34)}" for p in east)}]\n'
            f'data_dir = "data/east"\n\n'
            f'[clusters.aggregate]\ndatacenter = "central"\n'
            f'brokers = [{", ".join(f"{chr(34)}127.0.0.1:{p}{chr(34)}" for p in aggregate)}]\n'
            f'data_dir = "data/aggregate"\n')


class Topo:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.east_ports = [free_port(), free_port()]
        self.aggregate_ports = [free_port()]
        self.path = root / "topology.toml"
        self.topics = TOPICS
        self.write()
        self.brokers = [BrokerProcess(root / "data" / "east" / f"node-{i + 1}", port, topology=(self.path, "east", i + 1))
                        for i, port in enumerate(self.east_ports)]
        self.brokers.append(BrokerProcess(root / "data" / "aggregate" / "node-1", self.aggregate_ports[0],
                                          topology=(self.path, "aggregate", 1)))

    def write(self, extra: str = "") -> None:
        self.path.write_text(clusters_text(self.east_ports, self.aggregate_ports) + self.topics + extra)

    @property
    def east(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.east_ports)

    @property
    def aggregate(self) -> str:
        return f"127.0.0.1:{self.aggregate_ports[0]}"

    def logs(self) -> str:
        return "\n".join(f"---- {b.data_dir} ----\n{b.log_text()[-3000:]}" for b in self.brokers)


@pytest.fixture
def topo(tmp_path: Path) -> Iterator[Topo]:
    t = Topo(tmp_path)
    try:
        for b in t.brokers:
            b.start(wait_ready=False)
        for b in t.brokers:
            b.wait_ready(60)
        yield t
    finally:
        # All at once, with a short grace (as ClusterProcesses.stop): the last node of a
        # two-voter quorum cannot finish a controlled shutdown alone.
        running = [b for b in t.brokers if b.alive()]
        for b in running:
            assert b.proc is not None
            b.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 3
        for b in running:
            assert b.proc is not None
            try:
                b.proc.wait(timeout=max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                b.proc.kill()
                b.proc.wait()


def dcmirror(*args: str) -> tuple[int, str, float]:
    """(exit status, stdout + stderr, seconds)."""
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "deploy.cli", "--log-level", "WARNING", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started


def change_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line[:2] in ("+ ", "~ ", "! ", "x ")]


def summary(out: str) -> str:
    return out.strip().splitlines()[-1]


# ---- checking the live state: confluent-kafka, and every broker's own metadata -----------------


def ck_state(bootstrap: str, topics: list[str]) -> dict[str, dict[str, Any]]:
    """partitions, replica counts and topic configs (value, whether set on the topic)."""
    from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource

    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 10000})
    meta = admin.list_topics(timeout=10)
    out: dict[str, dict[str, Any]] = {}
    for name in topics:
        t = meta.topics.get(name)
        if t is None or t.error is not None:
            continue
        resource = ConfigResource("topic", name)
        futures = admin.describe_configs([resource], request_timeout=15)  # admin stays referenced
        configs = futures[resource].result(timeout=20)
        out[name] = {
            "partitions": len(t.partitions),
            "replicas": sorted({len(p.replicas) for p in t.partitions.values()}),
            "configs": {k: (c.value, c.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value) for k, c in configs.items()},
        }
    return out


def ck_set_config(bootstrap: str, topic: str, key: str, value: str) -> None:
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 10000})
    resource = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)])
    futures = admin.incremental_alter_configs([resource], request_timeout=15)
    futures[resource].result(timeout=20)


def ck_create(bootstrap: str, topic: str, partitions: int, rf: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 10000})
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=rf)],
                                  request_timeout=15)
    futures[topic].result(timeout=20)


def partitions_on_each_broker(addresses: list[str], topic: str) -> list[int]:
    """How many partitions with a leader each broker's own Metadata answer lists."""

    async def ask(address: str) -> int:
        conn = await connect_any(address, timeout_s=10)
        try:
            resp = await conn.request(3, {"topics": [{"name": topic}], "allow_auto_topic_creation": False,
                                          "include_cluster_authorized_operations": False,
                                          "include_topic_authorized_operations": False})
        finally:
            await conn.aclose()
        (t,) = resp.topics
        return 0 if t.error_code else sum(p.leader_id >= 0 for p in t.partitions)

    async def main() -> list[int]:
        return [await ask(a) for a in addresses]

    return trio.run(main)


# ---- the lifecycle ------------------------------------------------------------------------------


def test_plan_apply_converge_and_stay_converged(topo: Topo) -> None:
    path = str(topo.path)
    ck_create(topo.east, "unmanaged", 1, 1)  # not in the file: apply must leave it alone

    # 1. Empty clusters: plan lists three creations, exit 2.
    code, out, _ = dcmirror("topology", "plan", path)
    assert code == 2, out
    assert change_lines(out) == [
        "+ create topic east/pageviews partitions=4 rf=2 min.insync.replicas=2 retention.ms=86400000",
        "+ create topic east/clicks partitions=2 rf=2",
        "+ create topic aggregate/east.pageviews partitions=3 rf=1 cleanup.policy=compact "
        "unclean.leader.election.enable=false",
    ], out
    assert summary(out) == "Plan: 3 to create, 0 to change, 0 problems.", out
    assert f"cluster east at {topo.east}: brokers 1,2; 0 of 2 declared topic(s) exist" in out

    code, out, _ = dcmirror("topology", "plan", path, "--json")
    assert code == 2, out
    doc = json.loads(out)
    assert doc["summary"] == {"create": 3, "change": 0, "problems": 0}
    assert [(c["action"], c["cluster"], c["topic"]) for c in doc["changes"]] == [
        ("create", "east", "pageviews"), ("create", "east", "clicks"), ("create", "aggregate", "east.pageviews")]

    # 2. Apply creates them, and on return every broker already lists every partition with a leader.
    code, out, _ = dcmirror("topology", "apply", path)
    assert code == 0, out + topo.logs()
    assert summary(out) == "Apply: 3 created, 0 changed, 0 failed, 0 problems (not applied).", out
    assert all(line.endswith("... done") for line in change_lines(out)), out
    assert partitions_on_each_broker(topo.east.split(","), "pageviews") == [4, 4]
    assert partitions_on_each_broker(topo.east.split(","), "clicks") == [2, 2]

    east = ck_state(topo.east, ["pageviews", "clicks", "unmanaged"])
    assert east["pageviews"]["partitions"] == 4 and east["pageviews"]["replicas"] == [2]
    assert east["pageviews"]["configs"]["min.insync.replicas"] == ("2", True)
    assert east["pageviews"]["configs"]["retention.ms"] == ("86400000", True)
    assert east["clicks"]["partitions"] == 2 and east["clicks"]["replicas"] == [2]
    assert east["clicks"]["configs"]["retention.ms"][1] is False  # nothing set on it
    agg = ck_state(topo.aggregate, ["east.pageviews"])["east.pageviews"]
    assert agg["partitions"] == 3 and agg["replicas"] == [1]
    assert agg["configs"]["cleanup.policy"] == ("compact", True)
    assert agg["configs"]["unclean.leader.election.enable"] == ("false", True)

    # 3. Nothing left to do: plan exits 0, a second apply changes nothing and says so.
    code, out, _ = dcmirror("topology", "plan", path)
    assert code == 0, out
    assert change_lines(out) == [] and "No changes." in out
    assert summary(out) == "Plan: 0 to create, 0 to change, 0 problems.", out
    code, out, _ = dcmirror("topology", "apply", path)
    assert code == 0, out
    assert "No changes. The clusters match the topology file." in out
    assert summary(out) == "Apply: 0 created, 0 changed, 0 failed, 0 problems (not applied).", out

    # An override the file does not mention (set behind its back) must survive the next apply.
    ck_set_config(topo.east, "pageviews", "segment.bytes", "1048576")

    # 4. Edit the file: more partitions for pageviews, a changed config for it, a new config
    # for clicks. The plan shows exactly those.
    topo.topics = (TOPICS
                   .replace("partitions = 4", "partitions = 6")
                   .replace('"min.insync.replicas" = "2"', '"min.insync.replicas" = "1"')
                   .replace("partitions = 2\nreplication_factor = 2",
                            'partitions = 2\nreplication_factor = 2\nconfig = { "retention.ms" = "3600000" }'))
    topo.write()
    code, out, _ = dcmirror("topology", "plan", path)
    assert code == 2, out
    assert change_lines(out) == [
        "~ add partitions to east/pageviews: 4 -> 6",
        "~ alter topic east/pageviews min.insync.replicas 2 -> 1",
        "~ alter topic east/clicks retention.ms 604800000 (default) -> 3600000",
    ], out
    assert summary(out) == "Plan: 0 to create, 3 to change, 0 problems.", out

    code, out, _ = dcmirror("topology", "apply", path)
    assert code == 0, out + topo.logs()
    assert summary(out) == "Apply: 0 created, 3 changed, 0 failed, 0 problems (not applied).", out
    assert partitions_on_each_broker(topo.east.split(","), "pageviews") == [6, 6]
    east = ck_state(topo.east, ["pageviews", "clicks", "unmanaged"])
    assert east["pageviews"]["partitions"] == 6 and east["pageviews"]["replicas"] == [2]
    assert east["pageviews"]["configs"]["min.insync.replicas"] == ("1", True)
    assert east["pageviews"]["configs"]["retention.ms"] == ("86400000", True)
    assert east["pageviews"]["configs"]["segment.bytes"] == ("1048576", True)  # incremental: kept
    assert east["clicks"]["configs"]["retention.ms"] == ("3600000", True)
    assert east["unmanaged"]["partitions"] == 1  # never deleted
    code, out, _ = dcmirror("topology", "plan", path)
    assert code == 0, out

    # 5. What apply cannot do: fewer partitions and another replication factor are problems
    # (exit 1); the config change next to them is still applied.
    topo.topics = (topo.topics.replace("partitions = 6", "partitions = 5")
                   .replace('name = "clicks"\npartitions = 2\nreplication_factor = 2',
                            'name = "clicks"\npartitions = 2\nreplication_factor = 1')
                   .replace('"cleanup.policy" = "compact"', '"cleanup.policy" = "compact,delete"'))
    topo.write()
    code, out, _ = dcmirror("topology", "plan", path)
    assert code == 1, out
    lines = change_lines(out)
    assert len(lines) == 3, out
    assert lines[0].startswith("! cannot shrink topic east/pageviews from 6 to 5 partitions"), out
    assert lines[1].startswith("! cannot change the replication factor of topic east/clicks from 2 to 1"), out
    assert "dcmirror reassign generate --topics clicks --brokers 1,2 --replication-factor 1" in lines[1]
    assert lines[2] == "~ alter topic aggregate/east.pageviews cleanup.policy compact -> compact,delete", out
    assert summary(out) == "Plan: 0 to create, 1 to change, 2 problems.", out

    code, out, _ = dcmirror("topology", "apply", path)
    assert code == 1, out
    assert summary(out) == "Apply: 0 created, 1 changed, 0 failed, 2 problems (not applied).", out
    assert ck_state(topo.east, ["pageviews"])["pageviews"]["partitions"] == 6
    assert ck_state(topo.aggregate, ["east.pageviews"])["east.pageviews"]["configs"]["cleanup.policy"] == (
        "compact,delete", True)
    code, out, _ = dcmirror("topology", "plan", path)
    assert code == 1 and summary(out) == "Plan: 0 to create, 0 to change, 2 problems.", out


def test_an_unreachable_cluster_or_a_rejected_change_does_not_stop_the_rest(topo: Topo) -> None:
    """A third cluster that nobody runs, and topic configs the broker refuses together (each
    value alone passes `topology check`; the broker checks combinations): plan and
    apply name the cluster and its addresses, apply reports the refused creation, both exit 1,
    and apply still makes everything else match the file."""
    dead = free_port()
    topo.write(f'\n[clusters.west]\ndatacenter = "west"\nbrokers = ["127.0.0.1:{dead}"]\n\n'
               '[[topics]]\ncluster = "west"\nname = "pageviews"\n\n'
               '[[topics]]\ncluster = "aggregate"\nname = "bogus"\nconfig = { "min.compaction.lag.ms" = "7200000", "max.compaction.lag.ms" = "3600000" }\n')
    code, out, took = dcmirror("topology", "plan", str(topo.path), "--timeout", "5")
    assert code == 1, out
    assert f"! cannot reach cluster west at 127.0.0.1:{dead}: " in out, out
    assert summary(out) == "Plan: 4 to create, 0 to change, 1 problems.", out
    assert took < 20, took

    code, out, _ = dcmirror("topology", "apply", str(topo.path), "--timeout", "5")
    assert code == 1, out
    assert summary(out) == "Apply: 3 created, 0 changed, 1 failed, 1 problems (not applied).", out
    (failed,) = [line for line in change_lines(out) if line.startswith("x ")]
    assert failed.startswith("x create topic aggregate/bogus partitions=6 rf=1 "), out
    assert "min.compaction.lag.ms" in failed.split("FAILED: ")[1] and "INVALID_CONFIG" in failed, out
    topo.write()  # without west and bogus
    code, out, _ = dcmirror("topology", "plan", str(topo.path))
    assert code == 0, out


# ---- unreachable clusters, without brokers ----------------------------------------------------


def unreachable_file(tmp_path: Path, ports: list[int]) -> Path:
    path = tmp_path / "topology.toml"
    path.write_text(f'[clusters.west]\ndatacenter = "west"\n'
                    f'brokers = [{", ".join(chr(34) + f"127.0.0.1:{p}" + chr(34) for p in ports)}]\n\n'
                    '[[topics]]\ncluster = "west"\nname = "pageviews"\n')
    return path


def test_refused_connections_fail_fast_naming_cluster_and_addresses(tmp_path: Path) -> None:
    ports = [free_port(), free_port()]
    path = unreachable_file(tmp_path, ports)
    for action in ("plan", "apply"):
        code, out, took = dcmirror("topology", action, str(path))
        assert code == 1, out
        addresses = ",".join(f"127.0.0.1:{p}" for p in ports)
        assert re.search(rf"^! cannot reach cluster west at {re.escape(addresses)}: no broker of the cluster "
                         rf"is reachable: cannot reach broker 127\.0\.0\.1:{ports[0]}", out, re.M), out
        assert took < 15, (action, took)  # refused: no waiting for --timeout
    code, out, _ = dcmirror("topology", "plan", str(path), "--json")
    assert code == 1
    doc = json.loads(out)
    assert doc["clusters"][0]["reachable"] is False
    assert doc["changes"][0]["kind"] == "unreachable"


def test_a_silent_cluster_is_given_up_after_the_timeout(tmp_path: Path) -> None:
    """A listener that accepts connections and never answers: bounded by --timeout."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        port = listener.getsockname()[1]
        path = unreachable_file(tmp_path, [port])
        code, out, took = dcmirror("topology", "plan", str(path), "--timeout", "2")
    assert code == 1, out
    assert f"! cannot reach cluster west at 127.0.0.1:{port}: " in out, out
    assert took < 12, took
