"""Differential protocol tests: Apache Kafka is the oracle.

One broker fixture, parametrized over Kafka (tests/peers/kafka.py, a real KRaft broker) and
dcmirror, one of each per module and one at a time (Kafka's tests run first). Every
behaviour below sends byte-identical raw requests to both (our BrokerConnection; each
request names its API version, one both speak) and keeps the decoded answers; the second
broker's test compares them field by field with the first's. What
legitimately differs is normalized away before the comparison: throttle times, error
message texts, cluster ids, hosts and ports; node ids, member ids, producer ids and topic
ids become aliases numbered by first appearance, so the same id in two places must still be
the same id. Error codes are always compared.

Behaviours: produce and fetch edge cases, ListOffsets by time, the admin APIs' refusals of
bad input (topics, partitions, configs, DeleteRecords, ElectLeaders, partition
reassignments, log directories, client quotas, SCRAM credentials, UpdateFeatures,
OffsetDelete; DescribeCluster), DescribeConfigs of a topic and of the broker, classic group
errors, KIP-848 heartbeat errors, transactions and fencing per API version. ACL answers for denied
principals are in test_differential_acls.py (a SASL listener and an authorizer on both).

Known differences (KNOWN_DIFFERENCES below; each entry is asserted to still differ, so a
fixed one must leave the table):
- Kafka 4.0 lowered the default to one hour; dcmirror keeps Kafka 3's (none), so a mirror
  never refuses records a source took with a clock running ahead:
    describe_configs.topic:defaults.message.timestamp.after.max.ms.*
- a Kafka 3 topic config that Kafka 4.0 removed; dcmirror still takes it, so 3.x topic
  configs and tools keep working:
    describe_configs.topic:defaults.message.format.version
    describe_configs.topic:defaults.message.timestamp.difference.max.ms
    describe_configs.topic:defaults.message.downconversion.enable
    describe_configs.broker:names.log.message.format.version
    describe_configs.broker:names.log.message.timestamp.difference.max.ms
    describe_configs.broker:names.log.message.downconversion.enable
- dcmirror's own broker config (Kafka has none of that name):
    describe_configs.broker:names.admin.http.*
    describe_configs.broker:names.max.topic*
    describe_configs.broker:names.controller.quorum.fetch.interval.ms
    describe_configs.broker:names.controlled.shutdown.timeout.ms
    describe_configs.broker:names.leader.imbalance.per.broker.percentage
- StandardAuthorizer's config: Kafka's broker does not describe it:
    describe_configs.broker:names.super.users
    describe_configs.broker:names.allow.everyone.if.no.acl.found
- dynamic in Kafka; read-only in dcmirror, which would not act on it before a restart
  (listeners, TLS and SASL settings, connection limits, cordoned log dirs, verification):
    describe_configs.broker:names.ssl.*.read_only
    describe_configs.broker:names.sasl.enabled.mechanisms.read_only
    describe_configs.broker:names.sasl.jaas.config.read_only
    describe_configs.broker:names.sasl.mechanism.inter.broker.protocol.read_only
    describe_configs.broker:names.listener*.read_only
    describe_configs.broker:names.principal.builder.class.read_only
    describe_configs.broker:names.max.connection*.read_only
    describe_configs.broker:names.cordoned.log.dirs.read_only
    describe_configs.broker:names.transaction.partition.verification.enable.read_only
    describe_configs.broker:names.producer.id.expiration.ms.read_only
- Kafka fails on an operation byte it does not know (UNKNOWN_SERVER_ERROR); dcmirror answers
  INVALID_REQUEST:
    admin.incremental_alter_configs:topic: unknown operation.*
- Kafka stores a broker config name it does not know (for plugins); dcmirror has no plugins
  and refuses it, INVALID_CONFIG, so a misspelt name is not taken silently:
    admin.incremental_alter_configs:broker: unknown name.*
- epochs count differently: Kafka 4.3 gives a new group's first member epoch 2, dcmirror 3
  (one bump for the member, one for its subscription); clients only compare them:
    groups.consumer_heartbeat_errors:join.member_epoch
    groups.consumer_heartbeat_errors:v0 join.member_epoch
    groups.kinds:consumer member.member_epoch
- Kafka 4 converts a classic group with members to a consumer group and back (KIP-848's
  online migration, group.consumer.migration.policy); dcmirror changes a group's kind only
  when it is empty:
    groups.kinds:classic join into a consumer group.*
    groups.kinds:consumer heartbeat into a classic group.*
- IP connection-rate quotas (KIP-612): dcmirror limits no connection rates and refuses an
  ip entity with INVALID_REQUEST (docs/quotas.md), where Kafka takes it:
    admin.client_quotas:alter, an ip's connection rate.*
- Kafka alters a user's SCRAM credentials at most once per request (a second upsertion or
  deletion of the user, whatever the mechanism, is DUPLICATE_RESOURCE; a refused deletion
  answers its own error first); dcmirror refuses a (user, mechanism) given twice but takes
  a user's credentials for several mechanisms in one request, as `dcmirror users add` and
  the security tests' helper (confluent-kafka's admin client) send them:
    admin.user_scram_credentials:alter, one user twice.*
    admin.user_scram_credentials:alter, upsert and delete the same.*
"""

from __future__ import annotations

import struct
import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from cluster.client.connection import BrokerConnection
from cluster.protocol.api_keys import ApiKey
from tests.batches import Rec, encode_batch
from tests.harness import BrokerProcess
from tests.kafka.differential import (
    APPEND,
    BROKER,
    BROKER_LOGGER,
    DELETE,
    SET,
    SUBTRACT,
    TOPIC,
    TS,
    WAIT_S,
    Answers,
    Behaviours,
    Target,
    add_partitions,
    alter_configs,
    assignment,
    batch,
    cg_heartbeat,
    commit,
    coordinator,
    creatable,
    create_topic,
    create_topics,
    delete_groups,
    describe_configs,
    end_txn,
    fetch,
    heartbeat,
    incremental_alter,
    init_txn,
    join,
    joined,
    list_offsets,
    ok,
    produce,
    settled,
    sync,
    txn_batch,
    txn_offset_commit,
    wait_leaders,
)
from tests.peers.kafka import KafkaCluster

pytestmark = [pytest.mark.timeout(300)]

TARGETS = ("kafka", "dcmirror")  # Kafka first: its answers are the reference
# Both brokers get these (Kafka's names); the rest is each one's default.
COMMON_CONFIG: dict[str, Any] = {
    "auto.create.topics.enable": False,
    "group.initial.rebalance.delay.ms": 0,
    "offsets.topic.num.partitions": 3,
    "offsets.topic.replication.factor": 1,
    "transaction.state.log.num.partitions": 3,
    "transaction.state.log.replication.factor": 1,
    "transaction.state.log.min.isr": 1,
}

# behaviour:path (`*` matches anything) -> why dcmirror answers differently. Each must still
# differ; a pattern that matches nothing fails the test.
_KAFKA3_TOPIC_CONFIG = ("a Kafka 3 topic config that Kafka 4.0 removed; dcmirror still takes it, so 3.x topic "
                        "configs and tools keep working")
_OWN_CONFIG = "dcmirror's own broker config (Kafka has none of that name)"
_NOT_DYNAMIC = ("dynamic in Kafka; read-only in dcmirror, which would not act on it before a restart "
                "(listeners, TLS and SASL settings, connection limits, cordoned log dirs, verification)")
_EPOCHS = ("epochs count differently: Kafka 4.3 gives a new group's first member epoch 2, dcmirror 3 (one bump for "
           "the member, one for its subscription); clients only compare them")
_MIGRATION = ("Kafka 4 converts a classic group with members to a consumer group and back (KIP-848's online "
              "migration, group.consumer.migration.policy); dcmirror changes a group's kind only when it is empty")
_SCRAM_PER_MECHANISM = ("Kafka alters a user's SCRAM credentials at most once per request (DUPLICATE_RESOURCE, or a "
                        "refused deletion's own error first); dcmirror refuses a (user, mechanism) given twice but "
                        "takes a user's credentials for several mechanisms in one request, as `dcmirror users add` "
                        "and the security tests' helper (confluent-kafka's admin client) send them")
KNOWN_DIFFERENCES: dict[str, str] = {
    "describe_configs.topic:defaults.message.timestamp.after.max.ms.*":
        "Kafka 4.0 lowered the default to one hour; dcmirror keeps Kafka 3's (none), so a mirror never refuses "
        "records a source took with a clock running ahead",
    "describe_configs.topic:defaults.message.format.version": _KAFKA3_TOPIC_CONFIG,
    "describe_configs.topic:defaults.message.timestamp.difference.max.ms": _KAFKA3_TOPIC_CONFIG,
    "describe_configs.topic:defaults.message.downconversion.enable": _KAFKA3_TOPIC_CONFIG,
    "describe_configs.broker:names.log.message.format.version": _KAFKA3_TOPIC_CONFIG,
    "describe_configs.broker:names.log.message.timestamp.difference.max.ms": _KAFKA3_TOPIC_CONFIG,
    "describe_configs.broker:names.log.message.downconversion.enable": _KAFKA3_TOPIC_CONFIG,
    "describe_configs.broker:names.admin.http.*": _OWN_CONFIG,
    "describe_configs.broker:names.max.topic*": _OWN_CONFIG,
    "describe_configs.broker:names.controller.quorum.fetch.interval.ms": _OWN_CONFIG,
    "describe_configs.broker:names.controlled.shutdown.timeout.ms": _OWN_CONFIG,
    "describe_configs.broker:names.leader.imbalance.per.broker.percentage": _OWN_CONFIG,
    "describe_configs.broker:names.super.users": "StandardAuthorizer's config: Kafka's broker does not describe it",
    "describe_configs.broker:names.allow.everyone.if.no.acl.found":
        "StandardAuthorizer's config: Kafka's broker does not describe it",
    "describe_configs.broker:names.ssl.*.read_only": _NOT_DYNAMIC,
    "describe_configs.broker:names.sasl.enabled.mechanisms.read_only": _NOT_DYNAMIC,
    "describe_configs.broker:names.sasl.jaas.config.read_only": _NOT_DYNAMIC,
    "describe_configs.broker:names.sasl.mechanism.inter.broker.protocol.read_only": _NOT_DYNAMIC,
    "describe_configs.broker:names.listener*.read_only": _NOT_DYNAMIC,
    "describe_configs.broker:names.principal.builder.class.read_only": _NOT_DYNAMIC,
    "describe_configs.broker:names.max.connection*.read_only": _NOT_DYNAMIC,
    "describe_configs.broker:names.cordoned.log.dirs.read_only": _NOT_DYNAMIC,
    "describe_configs.broker:names.transaction.partition.verification.enable.read_only": _NOT_DYNAMIC,
    "describe_configs.broker:names.producer.id.expiration.ms.read_only": _NOT_DYNAMIC,
    "admin.incremental_alter_configs:topic: unknown operation.*":
        "Kafka fails on an operation byte it does not know (UNKNOWN_SERVER_ERROR); dcmirror answers INVALID_REQUEST",
    "admin.incremental_alter_configs:broker: unknown name.*":
        "Kafka stores a broker config name it does not know (for plugins); dcmirror has no plugins and refuses "
        "it, INVALID_CONFIG, so a misspelt name is not taken silently",
    "groups.consumer_heartbeat_errors:join.member_epoch": _EPOCHS,
    "groups.consumer_heartbeat_errors:v0 join.member_epoch": _EPOCHS,
    "groups.kinds:consumer member.member_epoch": _EPOCHS,
    "groups.kinds:classic join into a consumer group.*": _MIGRATION,
    "groups.kinds:consumer heartbeat into a classic group.*": _MIGRATION,
    "admin.client_quotas:alter, an ip's connection rate.*":
        "IP connection-rate quotas (KIP-612): dcmirror limits no connection rates and refuses an ip entity with "
        "INVALID_REQUEST (docs/quotas.md), where Kafka takes it",
    "admin.user_scram_credentials:alter, one user twice.*": _SCRAM_PER_MECHANISM,
    "admin.user_scram_credentials:alter, upsert and delete the same.*": _SCRAM_PER_MECHANISM,
}


behaviours = Behaviours(KNOWN_DIFFERENCES)


# ---- targets ---------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=TARGETS)
def target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    if request.param == "kafka":
        kafka = KafkaCluster(tmp_path_factory.mktemp("kafka") / "kafka", size=1, config=COMMON_CONFIG).start()
        node = kafka[1]
        try:
            yield Target("kafka", "127.0.0.1", node.port, node.log_text)
        finally:
            kafka.stop()
    else:
        broker = BrokerProcess(tmp_path_factory.mktemp("dcmirror") / "broker", **COMMON_CONFIG).start()
        try:
            yield Target("dcmirror", "127.0.0.1", broker.port, broker.log_text)
        finally:
            broker.stop()


# ---- produce and fetch -----------------------------------------------------------------------


@behaviours("produce.record_too_large")
async def _record_too_large(conn: BrokerConnection, a: Answers) -> None:
    await create_topic(conn, "pf-large", max_message_bytes="1000")
    a["too large"] = await produce(conn, "pf-large", 0, batch(b"x" * 2000))
    a["fits"] = await produce(conn, "pf-large", 0, batch(b"x" * 500))
    a["the one that fits"] = await fetch(conn, "pf-large", 0, 0)
    # a fetch smaller than the first batch still gets that batch whole
    a["fetch below the batch size"] = await fetch(conn, "pf-large", 0, 0, partition_max_bytes=100, max_bytes=100)


@behaviours("produce.bad_crc")
async def _bad_crc(conn: BrokerConnection, a: Answers) -> None:
    await create_topic(conn, "pf-crc")
    good = batch(b"one", b"two")
    flipped = bytearray(good)
    flipped[-1] ^= 0x01
    a["bad crc"] = await produce(conn, "pf-crc", 0, bytes(flipped))
    a["truncated"] = await produce(conn, "pf-crc", 0, good[:-3])
    bad_magic = bytearray(good)
    bad_magic[16] = 7
    a["unknown magic"] = await produce(conn, "pf-crc", 0, bytes(bad_magic))
    magic_1 = bytearray(good)
    magic_1[16] = 1
    a["magic 1"] = await produce(conn, "pf-crc", 0, bytes(magic_1))
    a["two batches"] = await produce(conn, "pf-crc", 0, good + good)
    a["batch length 5"] = await produce(conn, "pf-crc", 0, good[:8] + struct.pack(">i", 5) + good[12:])
    zstd = bytearray(good)
    zstd[22] |= 4  # compression bits of the attributes (CRC not recomputed: refused before it is read)
    a["zstd at v5"] = await produce(conn, "pf-crc", 0, bytes(zstd), version=5)
    a["no records"] = await produce(conn, "pf-crc", 0, b"")
    a["good"] = await produce(conn, "pf-crc", 0, good)
    a["log"] = await fetch(conn, "pf-crc", 0, 0)


@behaviours("fetch.out_of_range")
async def _out_of_range(conn: BrokerConnection, a: Answers) -> None:
    await create_topic(conn, "pf-range")
    ok((await produce(conn, "pf-range", 0, batch(b"a", b"b", b"c"))).responses[0].partition_responses[0].error_code,
       "produce")
    a["at the log end"] = await fetch(conn, "pf-range", 0, 3)
    a["past the log end"] = await fetch(conn, "pf-range", 0, 4)
    a["negative"] = await fetch(conn, "pf-range", 0, -1)
    a["inside the batch"] = await fetch(conn, "pf-range", 0, 1)
    a["delete records to 2"] = await conn.request(ApiKey.DELETE_RECORDS, {
        "topics": [{"name": "pf-range", "partitions": [{"partition_index": 0, "offset": 2}]}], "timeout": 10000},
        version=2)
    a["below the log start"] = await fetch(conn, "pf-range", 0, 1)
    a["at the log start"] = await fetch(conn, "pf-range", 0, 2)
    a["unknown partition"] = await fetch(conn, "pf-range", 7, 0)
    a["unknown topic"] = await fetch(conn, "pf-no-such-topic", 0, 0)


@behaviours("produce.compacted_keyless")
async def _compacted_keyless(conn: BrokerConnection, a: Answers) -> None:
    await create_topic(conn, "pf-compact", cleanup_policy="compact")
    await create_topic(conn, "pf-compact-delete", cleanup_policy="compact,delete")
    keyless = encode_batch([Rec(b"keyed", key=b"k"), Rec(b"keyless"), Rec(b"keyless too")], base_timestamp=TS)
    a["keyless"] = await produce(conn, "pf-compact", 0, keyless)
    a["keyless, compact,delete"] = await produce(conn, "pf-compact-delete", 0, keyless)
    a["keyed"] = await produce(conn, "pf-compact", 0, batch(b"v"))
    a["tombstone"] = await produce(conn, "pf-compact", 0, encode_batch([Rec(None, key=b"k")], base_timestamp=TS))


@behaviours("produce.unknown_topic_or_partition")
async def _produce_unknown(conn: BrokerConnection, a: Answers) -> None:
    await create_topic(conn, "pf-known")
    a["unknown topic"] = await produce(conn, "pf-unknown", 0, batch(b"v"))
    a["unknown partition"] = await produce(conn, "pf-known", 3, batch(b"v"))
    a["invalid topic name"] = await produce(conn, "pf/bad", 0, batch(b"v"))
    a["acks 2"] = await produce(conn, "pf-known", 0, batch(b"v"), acks=2)
    a["acks 1"] = await produce(conn, "pf-known", 0, batch(b"v"), acks=1)
    for version in (3, 5, 7):
        a[f"unknown topic v{version}"] = await produce(conn, "pf-unknown", 0, batch(b"v"), version=version)


@behaviours("produce.idempotent_sequences")
async def _sequences(conn: BrokerConnection, a: Answers) -> None:
    await create_topic(conn, "pf-idem")
    init = await settled(lambda: conn.request(ApiKey.INIT_PRODUCER_ID, {
        "transactional_id": None, "transaction_timeout": 60000, "producer_id": -1, "producer_epoch": -1}, version=4))
    a["init"] = init
    pid = init.producer_id

    def b(seq: int, epoch: int = 0, *values: bytes) -> bytes:
        return batch(*(values or (b"v",)), producer_id=pid, producer_epoch=epoch, base_sequence=seq)

    a["seq 0"] = await produce(conn, "pf-idem", 0, b(0, 0, b"a", b"b"))
    a["seq 0 again (duplicate)"] = await produce(conn, "pf-idem", 0, b(0, 0, b"a", b"b"))
    a["seq 5 (gap)"] = await produce(conn, "pf-idem", 0, b(5))
    a["seq 2"] = await produce(conn, "pf-idem", 0, b(2))
    a["seq 1 (old, not cached)"] = await produce(conn, "pf-idem", 0, b(1))
    a["epoch 1 seq 3"] = await produce(conn, "pf-idem", 0, b(3, 1))
    a["epoch 1 seq 0"] = await produce(conn, "pf-idem", 0, b(0, 1))
    a["epoch 0 after epoch 1"] = await produce(conn, "pf-idem", 0, b(3, 0))
    a["unknown producer id, seq 7"] = await produce(
        conn, "pf-idem", 0, batch(b"v", producer_id=pid + 1000, producer_epoch=0, base_sequence=7))
    a["log"] = await fetch(conn, "pf-idem", 0, 0)


@behaviours("fetch.leader_epochs")
async def _leader_epochs(conn: BrokerConnection, a: Answers) -> None:
    """A client's idea of the leader epoch against the leader's (KIP-320), and fetching by
    topic id (KIP-516)."""
    await create_topic(conn, "fe-topic")
    ok((await produce(conn, "fe-topic", 0, batch(b"a", b"b"))).responses[0].partition_responses[0].error_code,
       "produce")

    async def fetch_at_epoch(epoch: int) -> Any:
        return await conn.request(ApiKey.FETCH, {
            "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "topics": [{"topic": "fe-topic", "partitions": [{
                "partition": 0, "current_leader_epoch": epoch, "fetch_offset": 0, "last_fetched_epoch": -1,
                "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}], "forgotten_topics_data": [],
            "rack_id": ""}, version=12)

    a["fetch, the leader's epoch"] = await fetch_at_epoch(0)
    a["fetch, a newer epoch"] = await fetch_at_epoch(5)

    async def end_offsets(current: int, wanted: int) -> Any:
        return await conn.request(ApiKey.OFFSET_FOR_LEADER_EPOCH, {"replica_id": -1, "topics": [{
            "topic": "fe-topic", "partitions": [{"partition": 0, "current_leader_epoch": current,
                                                 "leader_epoch": wanted}]}]}, version=3)

    a["end offset of epoch 0"] = await end_offsets(-1, 0)
    a["end offset of a newer epoch"] = await end_offsets(-1, 7)
    a["end offset, newer current epoch"] = await end_offsets(3, 0)
    a["list offsets, newer current epoch"] = await conn.request(ApiKey.LIST_OFFSETS, {
        "replica_id": -1, "isolation_level": 0, "topics": [{"name": "fe-topic", "partitions": [
            {"partition_index": 0, "current_leader_epoch": 3, "timestamp": -1}]}]}, version=5)
    metadata = await conn.request(ApiKey.METADATA, {"topics": [{"name": "fe-topic", "topic_id": None}],
                                                    "allow_auto_topic_creation": False,
                                                    "include_topic_authorized_operations": False}, version=12)
    a["metadata"] = metadata
    topic_id = metadata.topics[0].topic_id

    async def fetch_by_id(topic: uuid.UUID) -> Any:
        return await conn.request(ApiKey.FETCH, {
            "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "topics": [{"topic_id": topic, "partitions": [{
                "partition": 0, "current_leader_epoch": -1, "fetch_offset": 1, "last_fetched_epoch": -1,
                "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}], "forgotten_topics_data": [],
            "rack_id": ""}, version=13)

    a["fetch v13 by id"] = await fetch_by_id(topic_id)
    a["fetch v13, unknown id"] = await fetch_by_id(uuid.UUID(int=0x5EED))
    for label, topics in (("unknown names", [("fe-unknown", None), ("fe/bad", None)]),
                          ("unknown id", [(None, uuid.UUID(int=0x5EED))]),
                          ("names and ids", [("fe-unknown", None), (None, topic_id), (None, uuid.UUID(int=0x5EED))])):
        a[f"metadata, {label}"] = await conn.request(ApiKey.METADATA, {
            "topics": [{"name": n, "topic_id": i} for n, i in topics], "allow_auto_topic_creation": True,
            "include_topic_authorized_operations": False}, version=12)


# ---- ListOffsets -----------------------------------------------------------------------------


@behaviours("list_offsets.by_time")
async def _by_time(conn: BrokerConnection, a: Answers) -> None:
    await create_topic(conn, "lo-time")
    a["empty: earliest, latest"] = await list_offsets(conn, "lo-time", {0: -2})
    first = encode_batch([Rec(b"a", key=b"a", timestamp=TS), Rec(b"b", key=b"b", timestamp=TS + 1000),
                          Rec(b"c", key=b"c", timestamp=TS + 2000)], base_timestamp=TS)
    second = encode_batch([Rec(b"d", key=b"d", timestamp=TS + 5000), Rec(b"e", key=b"e", timestamp=TS + 3000)],
                          base_timestamp=TS + 5000)
    for records in (first, second):
        ok((await produce(conn, "lo-time", 0, records)).responses[0].partition_responses[0].error_code, "produce")
    for label, ts in (("earliest", -2), ("latest", -1), ("first record's time", TS),
                      ("between records", TS + 500), ("between batches", TS + 2500),
                      ("the max timestamp", TS + 5000), ("after every record", TS + 9999)):
        a[label] = await list_offsets(conn, "lo-time", {0: ts})
    a["max timestamp (-3) at v5"] = await list_offsets(conn, "lo-time", {0: -3})
    for version, ts in ((6, -3), (7, -3), (7, -4), (8, -4), (8, -5), (9, -5), (9, -6), (9, -7), (9, TS + 500)):
        a[f"{ts if ts < 0 else 'between records'} at v{version}"] = await list_offsets(conn, "lo-time", {0: ts},
                                                                                         version=version)
    a["read committed, latest at v9"] = await list_offsets(conn, "lo-time", {0: -1}, version=9, isolation=1)
    a["unknown partition"] = await list_offsets(conn, "lo-time", {4: -1})
    a["unknown topic"] = await list_offsets(conn, "lo-no-such-topic", {0: -1})


# ---- admin APIs: bad input -------------------------------------------------------------------


@behaviours("admin.create_topics")
async def _create_topics(conn: BrokerConnection, a: Answers) -> None:
    for label, name in (("slash", "ct/bad"), ("dot", "."), ("dot dot", ".."), ("249 characters", "c" * 249),
                        ("250 characters", "c" * 250), ("empty", ""), ("space", "ct bad"), ("colon", "ct:bad")):
        a[f"name: {label}"] = await create_topics(conn, creatable(name), validate_only=True)
    await create_topic(conn, "ct.collide")
    a["name collides (. and _)"] = await create_topics(conn, creatable("ct_collide"))
    a["replication factor 3 of 1 broker"] = await create_topics(conn, creatable("ct-rf", replication=3))
    a["replication factor 0"] = await create_topics(conn, creatable("ct-rf0", replication=0))
    a["replication factor -2"] = await create_topics(conn, creatable("ct-rf-2", replication=-2))
    a["0 partitions"] = await create_topics(conn, creatable("ct-p0", partitions=0))
    a["-5 partitions"] = await create_topics(conn, creatable("ct-p-5", partitions=-5))
    a["defaults (-1, -1)"] = await create_topics(conn, creatable("ct-defaults", -1, -1), validate_only=True)
    a["assignments and a count"] = await create_topics(
        conn, creatable("ct-assigned", 1, -1, assignments=[{"partition_index": 0, "broker_ids": [1]}]))
    a["assignment to an unknown broker"] = await create_topics(
        conn, creatable("ct-assigned", -1, -1, assignments=[{"partition_index": 0, "broker_ids": [7]}]))
    a["assignment twice the same broker"] = await create_topics(
        conn, creatable("ct-assigned", -1, -1, assignments=[{"partition_index": 0, "broker_ids": [1, 1]}]))
    a["assignment skips partition 1"] = await create_topics(
        conn, creatable("ct-assigned", -1, -1, assignments=[{"partition_index": 0, "broker_ids": [1]},
                                                            {"partition_index": 2, "broker_ids": [1]}]))
    a["assignment of no broker"] = await create_topics(
        conn, creatable("ct-assigned", -1, -1, assignments=[{"partition_index": 0, "broker_ids": []}]))
    for label, configs in (("unknown config", {"no.such.config": "1"}),
                           ("retention.ms not a number", {"retention.ms": "soon"}),
                           ("cleanup.policy unknown", {"cleanup.policy": "forever"}),
                           ("min.insync.replicas 0", {"min.insync.replicas": "0"}),
                           ("max.message.bytes -1", {"max.message.bytes": "-1"}),
                           ("compression.type unknown", {"compression.type": "brotli"}),
                           ("null value", {"retention.ms": None}),
                           ("min.cleanable.dirty.ratio 2", {"min.cleanable.dirty.ratio": "2"}),
                           ("message.timestamp.type unknown", {"message.timestamp.type": "WallClock"}),
                           ("min.compaction.lag.ms above max", {"min.compaction.lag.ms": "10",
                                                                "max.compaction.lag.ms": "5"})):
        a[f"config: {label}"] = await create_topics(conn, creatable("ct-config", **configs))
    a["exists"] = await create_topics(conn, creatable("ct.collide"))
    a["twice in one request"] = await create_topics(conn, creatable("ct-twice"), creatable("ct-twice"))
    a["validate only"] = await create_topics(conn, creatable("ct-validated"), validate_only=True)
    a["after validate only"] = await list_offsets(conn, "ct-validated", {0: -1})
    a["good and bad together"] = await create_topics(conn, creatable("ct-good"), creatable("ct-bad", partitions=0))


@behaviours("admin.delete_topics")
async def _delete_topics(conn: BrokerConnection, a: Answers) -> None:
    await create_topic(conn, "dt-here")

    async def delete(*names: str) -> Any:
        return await conn.request(ApiKey.DELETE_TOPICS, {"topic_names": list(names), "timeout": 30000}, version=3)

    a["unknown"] = await delete("dt-unknown")
    a["twice in one request"] = await delete("dt-here", "dt-here")
    a["invalid name"] = await delete("dt/bad")
    a["known and unknown"] = await delete("dt-here", "dt-unknown")
    a["deleted"] = await delete("dt-here")


@behaviours("admin.create_partitions")
async def _create_partitions(conn: BrokerConnection, a: Answers) -> None:
    await create_topic(conn, "cp-topic", 3)

    async def grow(*topics: tuple[str, int, list[list[int]] | None], validate_only: bool = False) -> Any:
        return await conn.request(ApiKey.CREATE_PARTITIONS, {
            "topics": [{"name": n, "count": c, "assignments": None if s is None else [{"broker_ids": b} for b in s]}
                       for n, c, s in topics], "timeout": 30000, "validate_only": validate_only}, version=1)

    a["decrease"] = await grow(("cp-topic", 2, None))
    a["same count"] = await grow(("cp-topic", 3, None))
    a["unknown topic"] = await grow(("cp-unknown", 4, None))
    a["assignments of the wrong length"] = await grow(("cp-topic", 5, [[1]]))
    a["assignment to an unknown broker"] = await grow(("cp-topic", 4, [[7]]))
    a["assignment twice the same broker"] = await grow(("cp-topic", 4, [[1, 1]]))
    a["twice in one request"] = await grow(("cp-topic", 4, None), ("cp-topic", 5, None))
    a["validate only"] = await grow(("cp-topic", 4, None), validate_only=True)
    a["grow"] = await grow(("cp-topic", 4, [[1]]))
    await wait_leaders(conn, "cp-topic", range(4))
    a["after"] = await list_offsets(conn, "cp-topic", {3: -1, 4: -1})


@behaviours("admin.alter_configs")
async def _alter_configs(conn: BrokerConnection, a: Answers) -> None:
    await create_topic(conn, "ac-topic")
    a["topic: unknown config"] = await alter_configs(conn, (TOPIC, "ac-topic", {"no.such.config": "1"}))
    a["topic: bad value"] = await alter_configs(conn, (TOPIC, "ac-topic", {"retention.ms": "soon"}))
    a["topic: null value"] = await alter_configs(conn, (TOPIC, "ac-topic", {"retention.ms": None}))
    a["topic: unknown topic"] = await alter_configs(conn, (TOPIC, "ac-unknown", {"retention.ms": "1000"}))
    a["topic: ok"] = await alter_configs(conn, (TOPIC, "ac-topic", {"retention.ms": "100000"}))
    a["broker: read-only config"] = await alter_configs(conn, (BROKER, "1", {"log.dirs": "/tmp/x"}),
                                                        validate_only=True)
    a["broker: kerberos relogin"] = await alter_configs(
        conn, (BROKER, "1", {"sasl.kerberos.min.time.before.relogin": "58000"}))
    a["broker: kerberos relogin, not a number"] = await alter_configs(
        conn, (BROKER, "1", {"sasl.kerberos.min.time.before.relogin": "soon"}))
    a["broker: another broker's id"] = await alter_configs(conn, (BROKER, "42", {"log.retention.ms": "1000"}),
                                                           validate_only=True)
    a["broker: not a number"] = await alter_configs(conn, (BROKER, "1", {"log.retention.ms": "soon"}),
                                                    validate_only=True)
    a["broker: ok"] = await alter_configs(conn, (BROKER, "1", {"log.retention.ms": "604800000"}),
                                          validate_only=True)
    a["unknown resource type"] = await alter_configs(conn, (99, "x", {"a": "b"}))
    a["broker logger"] = await alter_configs(conn, (BROKER_LOGGER, "1", {"kafka": "INFO"}), validate_only=True)


@behaviours("admin.incremental_alter_configs")
async def _incremental_alter_configs(conn: BrokerConnection, a: Answers) -> None:
    await create_topic(conn, "iac-topic")
    a["topic: unknown config"] = await incremental_alter(conn, (TOPIC, "iac-topic", [("no.such.config", SET, "1")]))
    a["topic: bad value"] = await incremental_alter(conn, (TOPIC, "iac-topic", [("retention.ms", SET, "soon")]))
    a["topic: append to a non-list"] = await incremental_alter(
        conn, (TOPIC, "iac-topic", [("retention.ms", APPEND, "1")]))
    a["topic: subtract from a non-list"] = await incremental_alter(
        conn, (TOPIC, "iac-topic", [("retention.ms", SUBTRACT, "1")]))
    a["topic: unknown operation"] = await incremental_alter(conn, (TOPIC, "iac-topic", [("retention.ms", 7, "1")]))
    a["topic: same config twice"] = await incremental_alter(
        conn, (TOPIC, "iac-topic", [("retention.ms", SET, "1"), ("retention.ms", SET, "2")]))
    a["topic: delete an unset config"] = await incremental_alter(
        conn, (TOPIC, "iac-topic", [("retention.ms", DELETE, None)]))
    a["topic: delete an unknown config"] = await incremental_alter(
        conn, (TOPIC, "iac-topic", [("no.such.config", DELETE, None)]))
    a["topic: unknown topic"] = await incremental_alter(conn, (TOPIC, "iac-unknown", [("retention.ms", SET, "1")]))
    a["topic: append compact"] = await incremental_alter(conn, (TOPIC, "iac-topic", [("cleanup.policy", APPEND,
                                                                                        "compact")]))
    a["topic: append a bad policy"] = await incremental_alter(
        conn, (TOPIC, "iac-topic", [("cleanup.policy", APPEND, "forever")]))
    a["topic: set null"] = await incremental_alter(conn, (TOPIC, "iac-topic", [("retention.ms", SET, None)]))
    a["topic: described"] = await describe_configs(conn, (TOPIC, "iac-topic", ["cleanup.policy", "retention.ms"]))
    a["broker: read-only config"] = await incremental_alter(conn, (BROKER, "1", [("log.dirs", SET, "/tmp/x")]),
                                                            validate_only=True)
    a["broker: kerberos relogin"] = await incremental_alter(
        conn, (BROKER, "1", [("sasl.kerberos.min.time.before.relogin", SET, "58000")]))
    a["broker: kerberos relogin described"] = await describe_configs(
        conn, (BROKER, "1", ["sasl.kerberos.min.time.before.relogin"]))
    a["broker: kerberos relogin deleted"] = await incremental_alter(
        conn, (BROKER, "1", [("sasl.kerberos.min.time.before.relogin", DELETE, None)]))
    a["broker: append to a non-list"] = await incremental_alter(
        conn, (BROKER, "1", [("log.retention.ms", APPEND, "1")]), validate_only=True)
    a["broker: another broker's id"] = await incremental_alter(
        conn, (BROKER, "42", [("log.retention.ms", SET, "1000")]), validate_only=True)
    a["broker: cluster default, per-broker config"] = await incremental_alter(
        conn, (BROKER, "", [("sasl.kerberos.min.time.before.relogin", SET, "58000")]), validate_only=True)
    a["broker: unknown name"] = await incremental_alter(
        conn, (BROKER, "1", [("no.such.broker.config", SET, "1")]), validate_only=True)


@behaviours("admin.describe_configs_errors")
async def _describe_configs_errors(conn: BrokerConnection, a: Answers) -> None:
    await create_topic(conn, "dc-topic")
    a["unknown topic"] = await describe_configs(conn, (TOPIC, "dc-unknown", None))
    a["invalid topic name"] = await describe_configs(conn, (TOPIC, "dc/bad", None))
    a["another broker"] = await describe_configs(conn, (BROKER, "42", ["log.retention.ms"]))
    a["broker name not a number"] = await describe_configs(conn, (BROKER, "one", ["log.retention.ms"]))
    a["unknown resource type"] = await describe_configs(conn, (99, "x", None))
    a["some keys, one unknown"] = await describe_configs(conn, (TOPIC, "dc-topic", ["retention.ms", "no.such"]))
    a["cluster default, nothing set"] = await describe_configs(conn, (BROKER, "", None))


@behaviours("admin.delete_records")
async def _delete_records(conn: BrokerConnection, a: Answers) -> None:
    await create_topic(conn, "dr-topic", 2)
    ok((await produce(conn, "dr-topic", 0, batch(b"a", b"b", b"c"))).responses[0].partition_responses[0].error_code,
       "produce")

    async def delete(*offsets: tuple[str, int, int]) -> Any:
        by_topic: dict[str, list[dict[str, int]]] = defaultdict(list)
        for t, p, o in offsets:
            by_topic[t].append({"partition_index": p, "offset": o})
        return await conn.request(ApiKey.DELETE_RECORDS, {
            "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()], "timeout": 10000}, version=2)

    a["beyond the high watermark"] = await delete(("dr-topic", 0, 4))
    a["unknown partition"] = await delete(("dr-topic", 9, 0))
    a["unknown topic"] = await delete(("dr-unknown", 0, 0))
    a["-2"] = await delete(("dr-topic", 0, -2))
    a["to 1"] = await delete(("dr-topic", 0, 1))
    a["below the log start"] = await delete(("dr-topic", 0, 0))
    a["-1: the high watermark"] = await delete(("dr-topic", 0, -1))
    a["empty partition, 0"] = await delete(("dr-topic", 1, 0))
    a["earliest after"] = await list_offsets(conn, "dr-topic", {0: -2, 1: -2})


@behaviours("admin.elect_leaders")
async def _elect_leaders(conn: BrokerConnection, a: Answers) -> None:
    await create_topic(conn, "el-topic")

    async def elect(election_type: int, partitions: dict[str, list[int]] | None) -> Any:
        return await conn.request(ApiKey.ELECT_LEADERS, {
            "election_type": election_type, "timeout": 10000,
            "topic_partitions": None if partitions is None else [{"topic": t, "partitions": ps}
                                                                 for t, ps in partitions.items()]}, version=1)

    a["preferred, unknown topic"] = await elect(0, {"el-unknown": [0]})
    a["preferred, unknown partition"] = await elect(0, {"el-topic": [5]})
    a["preferred, already the leader"] = await elect(0, {"el-topic": [0]})
    a["unclean, has a leader"] = await elect(1, {"el-topic": [0]})
    a["unknown election type"] = await elect(5, {"el-topic": [0]})
    every = await elect(0, None)
    # (only this behaviour's topic: which others exist depends on the behaviours run before)
    a["every partition"] = {"error_code": every.error_code,
                            "results": [r for r in every.replica_election_results if r.topic.startswith("el-")]}


@behaviours("admin.partition_reassignments")
async def _partition_reassignments(conn: BrokerConnection, a: Answers) -> None:
    await create_topic(conn, "ar-topic", 2)

    async def reassign(*partitions: tuple[str, int, list[int] | None]) -> Any:
        by_topic: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for t, p, replicas in partitions:
            by_topic[t].append({"partition_index": p, "replicas": replicas})
        return await conn.request(ApiKey.ALTER_PARTITION_REASSIGNMENTS, {
            "timeout": 10000, "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}, version=0)

    async def listed(topics: dict[str, list[int]] | None) -> Any:
        return await conn.request(ApiKey.LIST_PARTITION_REASSIGNMENTS, {
            "timeout": 10000, "topics": None if topics is None else [{"name": t, "partition_indexes": ps}
                                                                     for t, ps in topics.items()]}, version=0)

    a["unknown topic"] = await reassign(("ar-unknown", 0, [1]))
    a["unknown partition"] = await reassign(("ar-topic", 5, [1]))
    a["an unknown broker"] = await reassign(("ar-topic", 0, [7]))
    a["twice the same broker"] = await reassign(("ar-topic", 0, [1, 1]))
    a["no replicas"] = await reassign(("ar-topic", 0, []))
    a["negative broker id"] = await reassign(("ar-topic", 0, [-1]))
    a["cancel, none in progress"] = await reassign(("ar-topic", 0, None))
    a["to the replicas it has"] = await reassign(("ar-topic", 1, [1]))
    a["good and bad together"] = await reassign(("ar-topic", 0, [1]), ("ar-topic", 1, [7]), ("ar-unknown", 0, [1]))
    a["list, unknown topic"] = await listed({"ar-unknown": [0]})
    a["list, unknown partition"] = await listed({"ar-topic": [5]})
    a["list, none in progress"] = await listed({"ar-topic": [0, 1]})
    every = await listed(None)
    a["list, every partition"] = {"error_code": every.error_code,
                                  "topics": [t for t in every.topics if t.name.startswith("ar-")]}


@behaviours("admin.log_dirs")
async def _log_dirs(conn: BrokerConnection, a: Answers) -> None:
    """DescribeLogDirs and AlterReplicaLogDirs: the directories' paths and sizes are each
    broker's own; their number, errors and the partitions they hold are compared."""
    await create_topic(conn, "ld-topic", 2)

    async def describe(topics: dict[str, list[int]] | None) -> Any:
        return await conn.request(ApiKey.DESCRIBE_LOG_DIRS, {
            "topics": None if topics is None else [{"topic": t, "partitions": ps} for t, ps in topics.items()]},
            version=4)

    def held(resp: Any) -> dict[str, Any]:
        return {"error_code": resp.error_code, "results": [
            {"error_code": r.error_code, "topics": [
                {"name": t.name, "partitions": [{"partition_index": p.partition_index, "offset_lag": p.offset_lag,
                                                 "is_future_key": p.is_future_key} for p in t.partitions]}
                for t in r.topics if t.name.startswith("ld-")]} for r in resp.results]}

    every = await describe(None)
    a["every partition"] = held(every)
    a["unknown topic"] = held(await describe({"ld-unknown": [0]}))
    a["unknown partition"] = held(await describe({"ld-topic": [0, 5]}))
    a["no topics"] = held(await describe({}))
    (home,) = [r.log_dir for r in every.results]

    async def move(path: str, topics: dict[str, list[int]]) -> Any:
        return await conn.request(ApiKey.ALTER_REPLICA_LOG_DIRS, {"dirs": [{
            "path": path, "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}]}, version=2)

    a["move to an unknown dir"] = await move("/no/such/log/dir", {"ld-topic": [0]})
    a["move an unknown topic"] = await move(home, {"ld-unknown": [0]})
    a["move an unknown partition"] = await move(home, {"ld-topic": [5]})
    a["move where it is"] = await move(home, {"ld-topic": [1]})
    a["move, invalid topic name"] = await move(home, {"ld/bad": [0]})


USER, CLIENT_ID, IP = "user", "client-id", "ip"
EXACT, DEFAULT, ANY = 0, 1, 2


@behaviours("admin.client_quotas")
async def _client_quotas(conn: BrokerConnection, a: Answers) -> None:
    async def describe(*components: tuple[str, int, str | None], strict: bool = False) -> Any:
        return await conn.request(ApiKey.DESCRIBE_CLIENT_QUOTAS, {
            "components": [{"entity_type": t, "match_type": m, "match": n} for t, m, n in components],
            "strict": strict}, version=1)

    async def alter(entity: dict[str, str | None], ops: dict[str, float | None], validate_only: bool = False) -> Any:
        return await conn.request(ApiKey.ALTER_CLIENT_QUOTAS, {"entries": [{
            "entity": [{"entity_type": t, "entity_name": n} for t, n in entity.items()],
            "ops": [{"key": k, "value": 0.0 if v is None else v, "remove": v is None} for k, v in ops.items()]}],
            "validate_only": validate_only}, version=1)

    a["describe, unknown entity type"] = await describe(("nobody", EXACT, "x"))
    a["describe, unknown match type"] = await describe((USER, 7, "x"))
    a["describe, exact without a name"] = await describe((USER, EXACT, None))
    a["describe, default with a name"] = await describe((USER, DEFAULT, "x"))
    a["describe, one entity type twice"] = await describe((USER, EXACT, "x"), (USER, ANY, None))
    a["describe, ip with a user"] = await describe((IP, ANY, None), (USER, ANY, None))
    a["describe, nothing set"] = await describe((USER, ANY, None))
    a["alter, unknown entity type"] = await alter({"nobody": "x"}, {"producer_byte_rate": 1000.0})
    a["alter, no entity"] = await alter({}, {"producer_byte_rate": 1000.0})
    a["alter, unknown key"] = await alter({USER: "cq-alice"}, {"no.such.quota": 1.0})
    a["alter, ip key on a user"] = await alter({USER: "cq-alice"}, {"connection_creation_rate": 5.0})
    a["alter, user key on an ip"] = await alter({IP: "127.0.0.1"}, {"producer_byte_rate": 1000.0})
    a["alter, not an ip"] = await alter({IP: "not-an-address"}, {"connection_creation_rate": 5.0})
    a["alter, ip with a user"] = await alter({IP: "127.0.0.1", USER: "cq-alice"}, {"connection_creation_rate": 5.0})
    a["alter, not a whole number"] = await alter({USER: "cq-alice"}, {"producer_byte_rate": 1000.5})
    a["alter, negative"] = await alter({USER: "cq-alice"}, {"producer_byte_rate": -5.0})
    a["alter, zero"] = await alter({USER: "cq-alice"}, {"request_percentage": 0.0})
    a["alter, the same key twice"] = await conn.request(ApiKey.ALTER_CLIENT_QUOTAS, {"entries": [{
        "entity": [{"entity_type": USER, "entity_name": "cq-alice"}],
        "ops": [{"key": "producer_byte_rate", "value": 1.0, "remove": False},
                {"key": "producer_byte_rate", "value": 2.0, "remove": False}]}], "validate_only": False}, version=1)
    a["alter, validate only"] = await alter({USER: "cq-bob"}, {"producer_byte_rate": 1000.0}, validate_only=True)
    a["alter, an ip's connection rate"] = await alter({IP: "127.0.0.1"}, {"connection_creation_rate": 5.0},
                                                       validate_only=True)
    a["alter, remove an unset key"] = await alter({USER: "cq-carol"}, {"producer_byte_rate": None})
    a["alter, default user and client"] = await alter({USER: None, CLIENT_ID: "cq-app"},
                                                      {"consumer_byte_rate": 2048.0})
    a["alter"] = await alter({USER: "cq-alice", CLIENT_ID: "cq-app"}, {"producer_byte_rate": 1024.0})

    async def described() -> Any:
        resp = await describe((USER, ANY, None), (CLIENT_ID, EXACT, "cq-app"))
        return resp if resp.error_code or len(resp.entries or ()) >= 2 else None

    def entries(resp: Any) -> dict[str, Any]:
        """(Kafka lists the entries from a hash map: put in one order)"""
        def key(entry: Any) -> list[tuple[str, str]]:
            return sorted((e.entity_type, e.entity_name or "") for e in entry.entity)
        return {"error_code": resp.error_code, "entries": sorted(resp.entries or [], key=key)}

    with trio.fail_after(WAIT_S):  # Kafka's brokers apply quotas from the metadata log a little later
        while (found := await described()) is None:
            await trio.sleep(0.05)
    a["described"] = entries(found)
    a["described, strict"] = entries(await describe((USER, EXACT, "cq-alice"), strict=True))


SCRAM_SHA_256, SCRAM_SHA_512 = 1, 2


@behaviours("admin.user_scram_credentials")
async def _user_scram_credentials(conn: BrokerConnection, a: Answers) -> None:
    async def describe(*users: str) -> Any:
        return await conn.request(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, {
            "users": [{"name": u} for u in users]}, version=0)

    async def alter(upsert: list[tuple[str, int, int]], delete: list[tuple[str, int]] | None = None) -> Any:
        return await conn.request(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, {
            "deletions": [{"name": n, "mechanism": m} for n, m in delete or []],
            "upsertions": [{"name": n, "mechanism": m, "iterations": i, "salt": b"salt" * 4,
                            "salted_password": b"p" * (32 if m == SCRAM_SHA_256 else 64)} for n, m, i in upsert]},
            version=0)

    a["describe, unknown user"] = await describe("us-nobody")
    a["describe, one user twice"] = await describe("us-nobody", "us-nobody")
    a["describe, empty name"] = await describe("")
    a["alter, unknown mechanism"] = await alter([("us-alice", 9, 8192)])
    a["alter, mechanism 0"] = await alter([("us-alice", 0, 8192)])
    a["alter, too few iterations"] = await alter([("us-alice", SCRAM_SHA_256, 100)])
    a["alter, too many iterations"] = await alter([("us-alice", SCRAM_SHA_256, 100_000)])
    a["alter, empty name"] = await alter([("", SCRAM_SHA_256, 8192)])
    a["alter, upsert and delete the same"] = await alter([("us-bob", SCRAM_SHA_256, 8192)],
                                                         [("us-bob", SCRAM_SHA_256)])
    a["alter, one user twice"] = await alter([("us-carol", SCRAM_SHA_256, 8192), ("us-carol", SCRAM_SHA_512, 8192)])
    a["delete, not there"] = await alter([], [("us-nobody", SCRAM_SHA_256)])
    a["delete, unknown mechanism"] = await alter([], [("us-nobody", 9)])
    a["alter"] = await alter([("us-dave", SCRAM_SHA_512, 8192)])
    with trio.fail_after(WAIT_S):  # Kafka's brokers learn credentials from the metadata log a little later
        while (found := await describe("us-dave", "us-nobody")).results[0].error_code:
            await trio.sleep(0.05)
    a["described"] = found
    a["delete, another mechanism"] = await alter([], [("us-dave", SCRAM_SHA_256)])


UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE = 1, 2, 3


@behaviours("admin.update_features")
async def _update_features(conn: BrokerConnection, a: Answers) -> None:
    async def update(*features: tuple[str, int, int], validate_only: bool = True) -> Any:
        return await conn.request(ApiKey.UPDATE_FEATURES, {
            "timeout": 10000, "validate_only": validate_only,
            "feature_updates": [{"feature": f, "max_version_level": level, "upgrade_type": kind}
                                for f, level, kind in features]}, version=1)

    a["unknown feature"] = await update(("no.such.feature", 1, UPGRADE), validate_only=False)
    a["unknown feature to 0"] = await update(("no.such.feature", 0, UNSAFE_DOWNGRADE), validate_only=False)
    a["empty name"] = await update(("", 1, UPGRADE))
    a["no updates"] = await update()
    a["metadata.version above the latest"] = await update(("metadata.version", 999, UPGRADE))
    a["metadata.version 0"] = await update(("metadata.version", 0, UNSAFE_DOWNGRADE))
    a["metadata.version negative"] = await update(("metadata.version", -1, UPGRADE))
    a["unknown upgrade type"] = await update(("group.version", 1, 9))
    a["one feature twice"] = await update(("group.version", 1, UPGRADE), ("group.version", 1, UPGRADE))
    a["group.version above the latest"] = await update(("group.version", 99, UPGRADE))


@behaviours("admin.offset_delete")
async def _offset_delete(conn: BrokerConnection, a: Answers) -> None:
    await create_topic(conn, "od-group-topic")
    await create_topic(conn, "od-other")

    async def delete(group: str, topics: dict[str, list[int]]) -> Any:
        return await conn.request(ApiKey.OFFSET_DELETE, {"group_id": group, "topics": [
            {"name": t, "partitions": [{"partition_index": p} for p in ps]} for t, ps in topics.items()]}, version=0)

    a["coordinator"] = await coordinator(conn, "od-group")
    a["unknown group"] = await delete("od-no-such-group", {"od-group-topic": [0]})
    member = await joined(conn, "od-group")
    a["member"] = member
    for topic in ("od-group-topic", "od-other"):
        a[f"commit {topic}"] = await commit(conn, "od-group", member.generation_id, member.member_id, topic, 1)
    a["subscribed topic"] = await delete("od-group", {"od-group-topic": [0]})
    a["a topic it does not subscribe to"] = await delete("od-group", {"od-other": [0]})
    a["unknown topic"] = await delete("od-group", {"od-no-such-topic": [0]})
    a["unknown partition"] = await delete("od-group", {"od-group-topic": [5]})
    a["leave"] = await conn.request(ApiKey.LEAVE_GROUP, {
        "group_id": "od-group", "members": [{"member_id": member.member_id, "group_instance_id": None}]}, version=3)
    a["empty group"] = await delete("od-group", {"od-group-topic": [0]})
    a["offsets after"] = await conn.request(ApiKey.OFFSET_FETCH, {"group_id": "od-group", "topics": None}, version=5)


@behaviours("admin.describe_cluster")
async def _describe_cluster(conn: BrokerConnection, a: Answers) -> None:
    a["describe"] = await conn.request(ApiKey.DESCRIBE_CLUSTER, {"include_cluster_authorized_operations": False},
                                       version=0)
    a["with operations"] = await conn.request(ApiKey.DESCRIBE_CLUSTER, {"include_cluster_authorized_operations": True},
                                              version=0)


# ---- DescribeConfigs output --------------------------------------------------------------------


def configs_by_name(resp: Any, *, values: bool = True) -> dict[str, Any]:
    """One DescribeConfigs resource's entries by name (order is not part of the answer)."""
    (result,) = resp.results
    out: dict[str, Any] = {"error_code": result.error_code}
    for e in result.configs:
        entry = {"read_only": e.read_only, "is_sensitive": e.is_sensitive}
        if values:
            entry["config_source"] = e.config_source
            entry["value"] = e.value
            entry["synonyms"] = [(s.name, s.value, s.source) for s in e.synonyms]
        out[e.name] = entry
    return out


@behaviours("describe_configs.topic")
async def _describe_topic(conn: BrokerConnection, a: Answers) -> None:
    await create_topic(conn, "dcf-defaults")
    a["defaults"] = configs_by_name(await describe_configs(conn, (TOPIC, "dcf-defaults", None), synonyms=True))
    await create_topic(conn, "dcf-set", cleanup_policy="compact", retention_ms="1000", max_message_bytes="2000",
                       min_cleanable_dirty_ratio="0.25", segment_jitter_ms="10")
    a["set at creation"] = configs_by_name(await describe_configs(
        conn, (TOPIC, "dcf-set", ["cleanup.policy", "retention.ms", "max.message.bytes", "min.cleanable.dirty.ratio",
                                  "segment.jitter.ms", "segment.ms"]), synonyms=True))


@behaviours("describe_configs.broker")
async def _describe_broker(conn: BrokerConnection, a: Answers) -> None:
    # values and sources depend on how each broker was started (ports, directories, ids)
    a["names"] = configs_by_name(await describe_configs(conn, (BROKER, "1", None)), values=False)


# ---- classic groups ----------------------------------------------------------------------------


@behaviours("groups.classic_errors")
async def _classic_errors(conn: BrokerConnection, a: Answers) -> None:
    await create_topic(conn, "gc-group-topic")
    a["coordinator"] = await coordinator(conn, "gc-group")
    a["session timeout too short"] = await join(conn, "gc-group", session_ms=1000)
    a["session timeout too long"] = await join(conn, "gc-group", session_ms=1_900_000)
    a["no protocols"] = await join(conn, "gc-group", protocols=())
    a["empty protocol type"] = await join(conn, "gc-group", protocol_type="")
    a["unknown member, unknown group"] = await join(conn, "gc-group", "ghost")
    first = await join(conn, "gc-group")
    a["no member id"] = first
    member = first.member_id
    joined_ = await join(conn, "gc-group", member)
    a["join"] = joined_
    generation = joined_.generation_id
    a["sync, unknown member"] = await sync(conn, "gc-group", generation, "ghost")
    a["sync, illegal generation"] = await sync(conn, "gc-group", generation + 5, member)
    a["sync"] = await sync(conn, "gc-group", generation, member, {member: assignment("gc-group")})
    a["heartbeat"] = await heartbeat(conn, "gc-group", generation, member)
    a["heartbeat, illegal generation"] = await heartbeat(conn, "gc-group", generation + 5, member)
    a["heartbeat, unknown member"] = await heartbeat(conn, "gc-group", generation, "ghost")
    a["heartbeat, unknown group"] = await heartbeat(conn, "gc-no-such-group", 1, "ghost")
    a["commit, illegal generation"] = await commit(conn, "gc-group", generation + 5, member, "gc-group-topic", 1)
    a["commit, unknown member"] = await commit(conn, "gc-group", generation, "ghost", "gc-group-topic", 1)
    a["commit, unknown topic"] = await commit(conn, "gc-group", generation, member, "gc-no-such-topic", 1)
    a["commit"] = await commit(conn, "gc-group", generation, member, "gc-group-topic", 3)
    a["another protocol type"] = await join(conn, "gc-group", protocol_type="connect")
    a["delete, not empty"] = await delete_groups(conn, "gc-group")
    a["delete, unknown"] = await delete_groups(conn, "gc-no-such-group")
    a["leave, unknown member"] = await conn.request(ApiKey.LEAVE_GROUP, {
        "group_id": "gc-group", "members": [{"member_id": "ghost", "group_instance_id": None}]}, version=3)
    a["leave"] = await conn.request(ApiKey.LEAVE_GROUP, {
        "group_id": "gc-group", "members": [{"member_id": member, "group_instance_id": None}]}, version=3)
    a["offsets"] = await conn.request(ApiKey.OFFSET_FETCH, {"group_id": "gc-group", "topics": None}, version=5)
    a["delete, empty"] = await delete_groups(conn, "gc-group", "gc-group")


@behaviours("groups.consumer_heartbeat_errors")
async def _consumer_heartbeat(conn: BrokerConnection, a: Answers) -> None:
    await create_topic(conn, "gk-topic", 2)
    a["coordinator"] = await coordinator(conn, "gk-group")

    async def hb(version: int = 1, **body: Any) -> Any:
        return await conn.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, cg_heartbeat(**body), version=version)

    member = str(uuid.UUID(int=0x1234_5678_9ABC_4DEF_8000_0000_0000_0001))
    a["v1 join without member id"] = await hb(group="gk-group", topics=["gk-topic"], owned=[])
    a["join without subscription"] = await hb(group="gk-group", member=member, owned=[])
    a["join without rebalance timeout"] = await hb(group="gk-group", member=member, topics=["gk-topic"], owned=[],
                                                   rebalance_ms=-1)
    a["join without owned partitions"] = await hb(group="gk-group", member=member, topics=["gk-topic"])
    a["unknown assignor"] = await hb(group="gk-group", member=member, topics=["gk-topic"], owned=[], assignor="nope")
    a["bad regex"] = await hb(group="gk-group", member=member, regex="[", owned=[])
    a["unknown member, epoch 1"] = await hb(group="gk-group", member="ghost", epoch=1)
    a["join"] = await hb(group="gk-group", member=member, topics=["gk-topic"], owned=[])
    a["epoch from the future"] = await hb(group="gk-group", member=member, epoch=99)
    a["v0 join"] = await hb(version=0, group="gk-group-v0", topics=["gk-topic"], owned=[])
    a["leave"] = await hb(group="gk-group", member=member, epoch=-1)
    a["after leaving"] = await hb(group="gk-group", member=member, epoch=1)


@behaviours("groups.kinds")
async def _group_kinds(conn: BrokerConnection, a: Answers) -> None:
    """A group of one protocol is not a group of the other while it has members."""
    await create_topic(conn, "gm-classic-topic")
    a["coordinator"] = await coordinator(conn, "gm-classic")
    classic = await joined(conn, "gm-classic")
    a["classic member"] = classic
    a["describe"] = await conn.request(ApiKey.DESCRIBE_GROUPS, {"groups": ["gm-classic", "gm-none"],
                                                                "include_authorized_operations": False}, version=4)
    a["coordinator 2"] = await coordinator(conn, "gm-consumer")
    member = str(uuid.UUID(int=0x1234_5678_9ABC_4DEF_8000_0000_0000_0002))
    a["consumer member"] = await conn.request(
        ApiKey.CONSUMER_GROUP_HEARTBEAT, cg_heartbeat("gm-consumer", member, topics=["gm-classic-topic"], owned=[]),
        version=1)
    # (last: Kafka converts the groups, KIP-848's online migration)
    a["classic join into a consumer group"] = await join(conn, "gm-consumer")
    a["consumer heartbeat into a classic group"] = await conn.request(
        ApiKey.CONSUMER_GROUP_HEARTBEAT, cg_heartbeat("gm-classic", str(uuid.uuid4()), topics=["gm-classic-topic"],
                                                      owned=[]),
        version=1)


# ---- transactions ------------------------------------------------------------------------------


@behaviours("transactions.fencing")
async def _txn_fencing(conn: BrokerConnection, a: Answers) -> None:
    """A producer fenced by a newer InitProducerId, on every API and version it may still use."""
    await create_topic(conn, "tx-fence-topic", 2)
    a["coordinator"] = await coordinator(conn, "tx-fence", 1)
    a["group coordinator"] = await coordinator(conn, "tx-fence-group")
    first = await init_txn(conn, "tx-fence")
    a["init"] = first
    pid, old = first.producer_id, first.producer_epoch
    a["add partition 0"] = await add_partitions(conn, "tx-fence", pid, old, {"tx-fence-topic": [0]})
    a["produce"] = await produce(conn, "tx-fence-topic", 0, txn_batch(pid, old, 0), txn="tx-fence")
    a["init again (fences)"] = await init_txn(conn, "tx-fence")
    for version in (3, 5, 7, 8):
        a[f"produce v{version}, fenced, partition with state"] = await produce(
            conn, "tx-fence-topic", 0, txn_batch(pid, old, 1), txn="tx-fence", version=version)
        a[f"produce v{version}, fenced, new partition"] = await produce(
            conn, "tx-fence-topic", 1, txn_batch(pid, old, 0), txn="tx-fence", version=version)
    for version in range(4):
        a[f"add partitions v{version}, fenced"] = await add_partitions(conn, "tx-fence", pid, old,
                                                                       {"tx-fence-topic": [1]}, version=version)
        a[f"add offsets v{version}, fenced"] = await conn.request(ApiKey.ADD_OFFSETS_TO_TXN, {
            "transactional_id": "tx-fence", "producer_id": pid, "producer_epoch": old,
            "group_id": "tx-fence-group"}, version=version)
        a[f"end v{version}, fenced"] = await end_txn(conn, "tx-fence", pid, old, version=version)
        a[f"txn offset commit v{version}, fenced"] = await txn_offset_commit(conn, "tx-fence", "tx-fence-group", pid,
                                                                            old, version=version)
    for version in (3, 4):
        a[f"init v{version} with the fenced epoch"] = await init_txn(conn, "tx-fence", version=version,
                                                                     producer=(pid, old))


@behaviours("transactions.states")
async def _txn_states(conn: BrokerConnection, a: Answers) -> None:
    await create_topic(conn, "tx-state-topic", 2)
    a["coordinator"] = await coordinator(conn, "tx-state", 1)
    a["timeout above the maximum"] = await init_txn(conn, "tx-state", timeout_ms=900_001)
    a["empty transactional id"] = await conn.request(ApiKey.INIT_PRODUCER_ID, {
        "transactional_id": "", "transaction_timeout": 60000, "producer_id": -1, "producer_epoch": -1}, version=3)
    init = await init_txn(conn, "tx-state")
    a["init"] = init
    pid, epoch = init.producer_id, init.producer_epoch
    a["end without a transaction"] = await end_txn(conn, "tx-state", pid, epoch)
    a["add, unknown transactional id"] = await add_partitions(conn, "tx-nobody", pid, epoch, {"tx-state-topic": [0]})
    a["add, another producer id"] = await add_partitions(conn, "tx-state", pid + 1, epoch, {"tx-state-topic": [0]})
    a["add, unknown topic"] = await add_partitions(conn, "tx-state", pid, epoch,
                                                   {"tx-state-topic": [0], "tx-no-such-topic": [0]})
    a["add, unknown partition"] = await add_partitions(conn, "tx-state", pid, epoch, {"tx-state-topic": [0, 7]})
    a["add"] = await add_partitions(conn, "tx-state", pid, epoch, {"tx-state-topic": [0]})
    a["produce outside the transaction"] = await produce(conn, "tx-state-topic", 1, txn_batch(pid, epoch, 0),
                                                         txn="tx-state")
    a["produce"] = await produce(conn, "tx-state-topic", 0, txn_batch(pid, epoch, 0, b"a", b"b"), txn="tx-state")
    a["produce, not transactional"] = await produce(conn, "tx-state-topic", 0, batch(b"plain"))
    a["coordinator of the group"] = await coordinator(conn, "tx-state-group")
    a["offsets without AddOffsetsToTxn"] = await txn_offset_commit(conn, "tx-state", "tx-state-group", pid, epoch)
    a["offsets of another transactional id"] = await txn_offset_commit(conn, "tx-nobody", "tx-state-group", pid, epoch)
    a["add offsets"] = await conn.request(ApiKey.ADD_OFFSETS_TO_TXN, {
        "transactional_id": "tx-state", "producer_id": pid, "producer_epoch": epoch, "group_id": "tx-state-group"},
        version=3)
    a["offsets"] = await txn_offset_commit(conn, "tx-state", "tx-state-group", pid, epoch)
    a["last stable offset"] = await list_offsets(conn, "tx-state-topic", {0: -1}, isolation=1)
    a["high watermark"] = await list_offsets(conn, "tx-state-topic", {0: -1})
    a["read committed"] = await fetch(conn, "tx-state-topic", 0, 0, isolation=1)
    a["commit"] = await end_txn(conn, "tx-state", pid, epoch)
    with trio.fail_after(WAIT_S):  # the markers are written after EndTxn is answered
        while (await conn.request(ApiKey.DESCRIBE_TRANSACTIONS, {"transactional_ids": ["tx-state"]}, version=0)
               ).transaction_states[0].transaction_state != "CompleteCommit":
            await trio.sleep(0.05)
    a["commit again"] = await end_txn(conn, "tx-state", pid, epoch)
    a["abort after commit"] = await end_txn(conn, "tx-state", pid, epoch, commit=False)
    a["read committed after"] = await fetch(conn, "tx-state-topic", 0, 0, isolation=1)
    a["describe"] = await conn.request(ApiKey.DESCRIBE_TRANSACTIONS, {"transactional_ids": ["tx-state", "tx-nobody"]},
                                       version=0)
    a["producers"] = await conn.request(ApiKey.DESCRIBE_PRODUCERS, {
        "topics": [{"name": "tx-state-topic", "partition_indexes": [0, 1, 9]}]}, version=0)


@pytest.mark.parametrize("name", behaviours.names)  # noqa: PT006
def test_same_answers(target: Target, name: str) -> None:
    behaviours.check(target, name)


def test_known_differences_are_documented() -> None:
    behaviours.check_documented(__doc__)
