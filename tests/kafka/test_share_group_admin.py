"""The admin side of share groups (KIP-932) against a dcmirror broker process, with Kafka 4.3.1's
own tools and confluent-kafka's AdminClient: group configs (kafka-configs --entity-type groups,
ConfigResource GROUP) set, described, refused with Kafka's errors and kept over a restart;
kafka-share-groups --delete of an empty and of a non-empty share group; `dcmirror share-groups`
and `dcmirror configs --entity-type groups`; kafka-console-share-consumer reading a topic."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, Producer, ShareConsumer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from tests.cluster_helpers import wait_until
from tests.harness import REPO, BrokerProcess
from tests.peers.kafka import run_tool

pytestmark = pytest.mark.timeout(300)
SHARE_GROUPS_TOOL = "org.apache.kafka.tools.consumer.group.ShareGroupCommand"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("share-admin") / "broker", group_initial_rebalance_delay_ms=0).start()
    try:
        yield b
    finally:
        b.stop()


def tool(name: str, broker: BrokerProcess, cwd: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    done = run_tool(name, "--bootstrap-server", broker.bootstrap, *args, cwd=cwd)
    if ok:
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done


def dcmirror(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deploy.cli", *args[:1], "--bootstrap", broker.bootstrap, *args[1:]],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


def group_configs(bootstrap: str, group: str) -> dict[str, tuple[str, int]]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.GROUP, group)
    described = admin.describe_configs([resource])[resource].result(30)
    return {k: (v.value, v.source) for k, v in described.items()}


def test_group_configs_with_kafka_configs_and_the_admin_client_survive_a_restart(broker: BrokerProcess,
                                                                                 tmp_path: Path) -> None:
    group = ["--entity-type", "groups", "--entity-name", "cfg-group"]
    tool("kafka-configs", broker, tmp_path, "--alter", *group, "--add-config",
         "share.auto.offset.reset=earliest,share.record.lock.duration.ms=20000")
    out = tool("kafka-configs", broker, tmp_path, "--describe", *group).stdout
    assert "share.auto.offset.reset=earliest" in out and "share.record.lock.duration.ms=20000" in out, out
    assert "share.session.timeout.ms" not in out  # --describe: the group's own configs only, as Kafka
    # confluent-kafka's AdminClient (ConfigResource GROUP): the group's own values over the defaults
    seen = group_configs(broker.bootstrap, "cfg-group")
    assert seen["share.auto.offset.reset"] == ("earliest", 8)  # GROUP_CONFIG
    assert seen["share.record.lock.duration.ms"] == ("20000", 8)
    assert seen["share.isolation.level"] == ("read_uncommitted", 5)  # DEFAULT_CONFIG
    assert len(seen) == 17
    # bad values: Kafka's error and message, nothing changed
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for key, value, message in [
            ("share.auto.offset.reset", "sometimes", "The value must be either 'earliest', 'latest' or of the "
                                                     "format 'by_duration:<PnDTnHnMn.nS>'."),
            ("share.record.lock.duration.ms", "3600001", "share.record.lock.duration.ms must be less than or equal "
                                                         "to group.share.max.record.lock.duration.ms"),
            ("share.isolation.level", "dirty", "String must be one of: read_committed, read_uncommitted"),
            ("no.such.key", "1", "Unknown group config name: no.such.key")]:
        resource = ConfigResource(ResourceType.GROUP, "cfg-group", incremental_configs=[
            ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)])
        with pytest.raises(KafkaException) as err:
            admin.incremental_alter_configs([resource])[resource].result(30)
        assert err.value.args[0].name() == "INVALID_CONFIG" and message in err.value.args[0].str(), err.value
    refused = tool("kafka-configs", broker, tmp_path, "--alter", *group, "--add-config",
                   "share.session.timeout.ms=1000", ok=False)
    assert refused.returncode != 0
    assert "share.session.timeout.ms must be greater than or equal to group.share.min.session.timeout.ms" in (
        refused.stdout + refused.stderr)
    # dcmirror configs --entity-type groups answers the same
    mine = dcmirror(broker, "configs", "--entity-type", "groups", "--entity-name", "cfg-group", "--describe")
    assert mine.returncode == 0, mine.stderr
    assert "share.auto.offset.reset=earliest sensitive=false synonyms={DEFAULT_CONFIG:share.auto.offset.reset=latest}" \
        in mine.stdout, mine.stdout
    broker.stop()
    broker.start()
    assert group_configs(broker.bootstrap, "cfg-group")["share.auto.offset.reset"] == ("earliest", 8)
    tool("kafka-configs", broker, tmp_path, "--alter", *group, "--delete-config", "share.auto.offset.reset")
    assert group_configs(broker.bootstrap, "cfg-group")["share.auto.offset.reset"] == ("latest", 5)


def test_share_groups_are_listed_described_and_deleted_only_when_empty(broker: BrokerProcess, tmp_path: Path) -> None:
    topic, group = "share-admin-topic", "share-admin-group"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    member = ShareConsumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "log_level": 3})
    member.subscribe([topic])
    closed = False
    try:
        def assigned() -> str | None:
            member.poll(0.2)
            out = dcmirror(broker, "share-groups", "describe", group)
            return out.stdout if out.returncode == 0 and f"{topic}:0,1" in out.stdout else None

        described = wait_until(assigned, 60, "the member's assignment in dcmirror share-groups describe")
        assert f"share group {group}: state Stable, 1 member(s)" in described, described
        listed = dcmirror(broker, "share-groups", "list")
        assert listed.returncode == 0 and [group, "Stable"] in [line.split() for line in listed.stdout.splitlines()]
        state = dcmirror(broker, "share-groups", "describe", group, "--state")
        assert state.stdout.splitlines()[-1].split()[-2:] == ["Stable", "1"], state.stdout
        # a member is in: kafka-share-groups --delete and dcmirror refuse
        refused = tool(SHARE_GROUPS_TOOL, broker, tmp_path, "--delete", "--group", group, ok=False)
        assert "GroupNotEmptyException" in refused.stdout + refused.stderr, refused.stdout + refused.stderr
        mine = dcmirror(broker, "share-groups", "delete", group)
        assert mine.returncode == 1 and "has members" in mine.stderr, mine.stderr
        member.close()
        closed = True
        wait_until(lambda: "state Empty" in dcmirror(broker, "share-groups", "describe", group).stdout, 60,
                   "the share group empty once its member left")
        done = tool(SHARE_GROUPS_TOOL, broker, tmp_path, "--delete", "--group", group)
        assert "successful" in done.stdout, done.stdout
        gone = dcmirror(broker, "share-groups", "describe", group)
        assert gone.returncode == 1 and "is not a share group" in gone.stderr, gone.stderr
        assert group not in dcmirror(broker, "share-groups", "list").stdout
    finally:
        if not closed:
            member.close()


def test_kafka_console_share_consumer_reads_exactly_the_records_and_accepts_them(broker: BrokerProcess,
                                                                                 tmp_path: Path) -> None:
    """kafka-console-share-consumer (Kafka 4.3.1's ConsoleShareConsumer, a KafkaShareConsumer)
    with a share group starting at the earliest records prints each record of a 2-partition
    topic once, and accepts them: a second run gets only the two records written after it (in
    each partition an accepted record coming back would come before the new one)."""
    topic, group = "share-console-topic", "share-console-group"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    tool("kafka-configs", broker, tmp_path, "--alter", "--entity-type", "groups", "--entity-name", group,
         "--add-config", "share.auto.offset.reset=earliest")

    def write(numbers: range) -> set[str]:
        p = Producer({"bootstrap.servers": broker.bootstrap, "log_level": 3})
        for i in numbers:
            p.produce(topic, key=f"k{i}", value=f"v{i}", partition=i % 2)
        assert p.flush(30) == 0
        return {f"{i % 2}|k{i}|v{i}" for i in numbers}

    def read(count: int) -> list[str]:
        done = tool("kafka-console-share-consumer", broker, tmp_path, "--topic", topic, "--group", group,
                    "--max-messages", str(count), "--timeout-ms", "60000",
                    "--formatter-property", "print.partition=true", "--formatter-property", "print.key=true",
                    "--formatter-property", "key.separator=|")
        assert f"Processed a total of {count} messages" in done.stderr, done.stderr[-2000:]
        return [line.replace("Partition:", "").replace("\t", "|") for line in done.stdout.splitlines()]

    first = write(range(30))
    got = read(30)
    assert len(got) == 30 and set(got) == first, got
    for partition in "01":  # each partition's records in offset order
        mine = [int(line.split("|")[1][1:]) for line in got if line.startswith(partition + "|")]
        assert mine == sorted(mine), mine
    later = write(range(30, 32))
    again = read(2)
    assert set(again) == later, f"accepted records delivered again: {again}"
