"""The machinery of the differential tests (test_differential*.py): the brokers as targets,
answers made comparable, the behaviours of a module with its known differences, and the raw
requests the behaviours send.

An answer is a kio response turned into plain values; what legitimately differs between two
brokers is normalized on the way (`plain`): throttle times, error message texts, cluster ids,
hosts and ports are dropped; node, member, producer and topic ids become aliases numbered by
first appearance (the same id in two places must still be the same id); lists Kafka builds
from hash maps are put in one order; fetched records are decoded batch by batch. Error codes
are always compared.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import re
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio

from cluster.client.connection import BrokerConnection
from cluster.common.secrets import Secret
from cluster.protocol.api_keys import ApiKey
from cluster.protocol.consumer_protocol import encode_assignment, encode_subscription
from cluster.protocol.record_batch import iter_headers
from cluster.protocol.records import decode_batch
from cluster.security.connector import LinkSecurity
from tests.batches import Rec, encode_batch

# Record timestamps (CreateTime): an hour ago, whole minutes, the same for both brokers of a
# run; near now, since retention (seven days) would delete older records whenever it runs.
TS = (int(time.time()) // 60 - 60) * 60_000


WAIT_S = 30.0  # bound of every wait for the broker's progress (topic leaders, coordinators)


@dataclass
class Target:
    """A broker under test: `name` is "kafka" or "dcmirror". `sasl_port`, where set, is a
    SASL_PLAINTEXT listener (PLAIN) for `connect_as`."""

    name: str
    host: str
    port: int
    logs: Callable[[], str]
    sasl_port: int = 0
    passwords: dict[str, str] = field(default_factory=dict)

    async def connect(self) -> BrokerConnection:
        return await BrokerConnection(self.host, self.port, client_id="differential").connect()

    async def connect_as(self, user: str) -> BrokerConnection:
        assert self.sasl_port, f"{self.name} has no SASL listener"
        link = LinkSecurity("SASL_PLAINTEXT", sasl_mechanism="PLAIN", username=user,
                            password=Secret(self.passwords[user]))
        return await BrokerConnection(self.host, self.sasl_port, client_id="differential", link=link).connect()


class Aliases:
    """Ids that legitimately differ between the brokers, named by first appearance."""

    def __init__(self) -> None:
        self.names: dict[tuple[str, object], str] = {}

    def __call__(self, kind: str, value: object) -> str:
        key = (kind, value)
        if key not in self.names:
            self.names[key] = f"{kind}-{sum(k == kind for k, _ in self.names) + 1}"
        return self.names[key]


DROPPED = frozenset({"throttle_time", "error_message", "batch_index_error_message", "cluster_id", "host", "port",
                     "rack"})


NODE_FIELDS = frozenset({"node_id", "leader_id", "controller_id", "broker_id"})


MEMBER_FIELDS = frozenset({"member_id", "leader"})


ZERO_UUID = uuid.UUID(int=0)


# The broker's clock, not the records' (DescribeProducers: a marker's time).
CLOCK_FIELDS = frozenset({"transaction_start_time", "last_timestamp"})


def record_batches(data: bytes, aliases: Aliases) -> list[dict[str, Any]]:
    """Fetched records, batch by batch, with the producer ids aliased. Control batches are
    left out: clients never show them, and Kafka may end a read_committed fetch just before
    a marker below the last stable offset that a second fetch returns."""
    out = []
    for pos, header in iter_headers(data):
        if header.is_control:
            continue
        _, records = decode_batch(data, pos)
        out.append({
            "base_offset": header.base_offset, "last_offset_delta": header.last_offset_delta,
            "partition_leader_epoch": header.partition_leader_epoch, "attributes": header.attributes,
            "base_timestamp": header.base_timestamp, "max_timestamp": header.max_timestamp,
            "producer_id": aliases("producer", header.producer_id) if header.producer_id >= 0 else -1,
            "producer_epoch": header.producer_epoch, "base_sequence": header.base_sequence,
            "records": [[r.offset, r.timestamp, _hex(r.key), _hex(r.value), [[k, _hex(v)] for k, v in r.headers]]
                        for r in records]})
    return out


def _hex(data: bytes | None) -> str | None:
    return None if data is None else data.hex()


def plain(value: Any, aliases: Aliases, key: str = "") -> Any:
    """A kio response (or part of one) as plain values, with the ids that legitimately
    differ replaced by aliases."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name), aliases, f.name) for f in dataclasses.fields(value)
                if f.name not in DROPPED}
    if isinstance(value, dict):
        return {k: plain(v, aliases, k) for k, v in value.items() if k not in DROPPED}
    if isinstance(value, (list, tuple)):
        if value and all(_order(v) is not None for v in value):
            value = sorted(value, key=lambda v: _order(v) or ())  # (before aliasing: aliases follow the order)
        return [plain(v, aliases, key) for v in value]
    if isinstance(value, enum.Enum):
        return f"{value.name}({value.value})" if key == "error_code" or "error" in key else value.value
    if isinstance(value, datetime.timedelta):
        return value // datetime.timedelta(milliseconds=1)
    if isinstance(value, datetime.datetime):
        ms = round(value.timestamp() * 1000)
        return "<a time>" if key in CLOCK_FIELDS and ms > 0 else ms
    if isinstance(value, uuid.UUID):
        return "zero-uuid" if value == ZERO_UUID else aliases("topic-id", value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return record_batches(bytes(value), aliases) if key == "records" else bytes(value).hex()
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        if key in CLOCK_FIELDS and value > 0:
            return "<a time>"
        if key in NODE_FIELDS and value >= 0:
            return aliases("node", value)
        if key in ("producer_id",) and value >= 0:
            return aliases("producer", value)
        return int(value)
    if isinstance(value, str) and key in MEMBER_FIELDS and value:
        return aliases("member", value)
    return value


# Lists of these are compared in this order: Kafka builds several answers from hash maps.
ORDER_KEYS = ("name", "topic", "resource_name", "group_id", "partition_index", "partition", "index",
              "partition_id", "resource_type", "pattern_type", "principal", "host", "operation", "permission_type",
              "user", "entity_type")


def _order(value: Any) -> tuple[Any, ...] | None:
    if isinstance(value, dict):
        fields = [value[k] for k in ORDER_KEYS if k in value]
    elif dataclasses.is_dataclass(value):
        fields = [getattr(value, k) for k in ORDER_KEYS if hasattr(value, k)]
    else:
        return None
    return tuple("" if v is None else v for v in fields) or None  # (a topic named by id has no name)


class Answers:
    """One behaviour's answers, step by step, normalized as they come."""

    def __init__(self, target: Target) -> None:
        self.target = target  # (for behaviours that open connections of their own)
        self.aliases = Aliases()
        self.steps: dict[str, Any] = {}

    def __setitem__(self, step: str, response: Any) -> None:
        assert step not in self.steps, f"step {step!r} twice"
        self.steps[step] = plain(response, self.aliases)

    def __getitem__(self, step: str) -> Any:
        return self.steps[step]


def differences(kafka: Any, ours: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(path, Kafka's value, dcmirror's value) wherever the two differ."""
    if isinstance(kafka, dict) and isinstance(ours, dict):
        for k in [*kafka, *(k for k in ours if k not in kafka)]:
            sub = f"{path}.{k}" if path else k
            if k not in kafka or k not in ours:
                yield sub, kafka.get(k, "<absent>"), ours.get(k, "<absent>")
            else:
                yield from differences(kafka[k], ours[k], sub)
    elif isinstance(kafka, list) and isinstance(ours, list) and len(kafka) == len(ours):
        for i, (a, b) in enumerate(zip(kafka, ours, strict=True)):
            yield from differences(a, b, f"{path}[{i}]")
    elif kafka != ours:
        yield path, kafka, ours


Scenario = Callable[[BrokerConnection, Answers], Awaitable[None]]


def batch(*values: bytes | Rec, ts: int = TS, **header: int) -> bytes:
    """One uncompressed batch; plain values get keys k0, k1, ... and timestamps ts, ts+1, ..."""
    records = [v if isinstance(v, Rec) else Rec(v, key=b"k%d" % i, timestamp=ts + i) for i, v in enumerate(values)]
    return encode_batch(records, base_timestamp=ts, **header)


def ok(code: int, what: str) -> None:
    assert code == 0, f"{what}: error {code}"


async def create_topic(conn: BrokerConnection, name: str, partitions: int = 1, **configs: str) -> None:
    resp = await conn.request(ApiKey.CREATE_TOPICS, {
        "topics": [{"name": name, "num_partitions": partitions, "replication_factor": 1, "assignments": [],
                    "configs": [{"name": k.replace("_", "."), "value": v} for k, v in configs.items()]}],
        "timeout": 30000, "validate_only": False}, version=4)
    ok(resp.topics[0].error_code, f"creating {name}")
    await wait_leaders(conn, name, range(partitions))


async def wait_leaders(conn: BrokerConnection, topic: str, partitions: range) -> None:
    """Until every partition's leader answers ListOffsets (Kafka's brokers learn a new topic
    from the metadata log a little after CreateTopics is answered)."""
    with trio.fail_after(WAIT_S):
        while True:
            resp = await list_offsets(conn, topic, {p: -1 for p in partitions})
            if all(p.error_code == 0 for t in resp.topics for p in t.partitions):
                return
            await trio.sleep(0.05)


# Answers that say "not yet, ask again": a coordinator loading, a producer id block on its way.
RETRIABLE = frozenset({14, 15, 16})


async def wait_for(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Until `check` says yes, asking again as the broker makes progress (bounded by WAIT_S)."""
    with trio.fail_after(WAIT_S):
        while not await check():
            await trio.sleep(0.05)


async def settled(request: Callable[[], Awaitable[Any]]) -> Any:
    """The first answer whose top-level error is not one to retry (bounded by WAIT_S)."""
    with trio.fail_after(WAIT_S):
        while True:
            resp = await request()
            if getattr(resp, "error_code", 0) not in RETRIABLE:
                return resp
            await trio.sleep(0.05)


async def produce(conn: BrokerConnection, topic: str, partition: int, records: bytes | None, *, acks: int = -1,
                  version: int = 8, txn: str | None = None) -> Any:
    return await conn.request(ApiKey.PRODUCE, {
        "transactional_id": txn, "acks": acks, "timeout": 10000,
        "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": records}]}]},
        version=version)


async def fetch(conn: BrokerConnection, topic: str, partition: int, offset: int, *, version: int = 12,
                isolation: int = 0, partition_max_bytes: int = 1 << 20, max_bytes: int = 1 << 20) -> Any:
    return await conn.request(ApiKey.FETCH, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": max_bytes, "isolation_level": isolation,
        "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": topic, "partitions": [{
            "partition": partition, "current_leader_epoch": -1, "fetch_offset": offset, "last_fetched_epoch": -1,
            "log_start_offset": -1, "partition_max_bytes": partition_max_bytes}]}],
        "forgotten_topics_data": [], "rack_id": ""}, version=version)


async def list_offsets(conn: BrokerConnection, topic: str, timestamps: dict[int, int], *, version: int = 5,
                       isolation: int = 0) -> Any:
    return await conn.request(ApiKey.LIST_OFFSETS, {
        "replica_id": -1, "isolation_level": isolation, "timeout": 10000,
        "topics": [{"name": topic, "partitions": [
            {"partition_index": p, "current_leader_epoch": -1, "timestamp": ts} for p, ts in timestamps.items()]}]},
        version=version)


def creatable(name: str, partitions: int = 1, replication: int = 1, *, assignments: list[Any] | None = None,
              **configs: str | None) -> dict[str, Any]:
    return {"name": name, "num_partitions": partitions, "replication_factor": replication,
            "assignments": assignments or [],
            "configs": [{"name": k.replace("_", "."), "value": v} for k, v in configs.items()]}


async def create_topics(conn: BrokerConnection, *topics: dict[str, Any], validate_only: bool = False) -> Any:
    return await conn.request(ApiKey.CREATE_TOPICS, {"topics": list(topics), "timeout": 30000,
                                                     "validate_only": validate_only}, version=4)


async def alter_configs(conn: BrokerConnection, *resources: tuple[int, str, dict[str, str | None]],
                        validate_only: bool = False) -> Any:
    return await conn.request(ApiKey.ALTER_CONFIGS, {
        "resources": [{"resource_type": t, "resource_name": n, "configs": [{"name": k, "value": v}
                                                                             for k, v in c.items()]}
                      for t, n, c in resources], "validate_only": validate_only}, version=1)


async def incremental_alter(conn: BrokerConnection, *resources: tuple[int, str, list[tuple[str, int, str | None]]],
                            validate_only: bool = False) -> Any:
    return await conn.request(ApiKey.INCREMENTAL_ALTER_CONFIGS, {
        "resources": [{"resource_type": t, "resource_name": n,
                       "configs": [{"name": k, "config_operation": op, "value": v} for k, op, v in c]}
                      for t, n, c in resources], "validate_only": validate_only}, version=0)


async def describe_configs(conn: BrokerConnection, *resources: tuple[int, str, list[str] | None],
                           synonyms: bool = False) -> Any:
    return await conn.request(ApiKey.DESCRIBE_CONFIGS, {
        "resources": [{"resource_type": t, "resource_name": n, "configuration_keys": k} for t, n, k in resources],
        "include_synonyms": synonyms}, version=2)


TOPIC, BROKER, BROKER_LOGGER = 2, 4, 8


SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


async def coordinator(conn: BrokerConnection, key: str, key_type: int = 0) -> Any:
    """FindCoordinator, once the coordinator answers (Kafka creates the internal topic on
    the first lookup, and its leader loads the partition a little later)."""
    found = await settled(lambda: conn.request(ApiKey.FIND_COORDINATOR, {"key": key, "key_type": key_type},
                                               version=2))
    if key_type == 0:
        await settled(lambda: conn.request(ApiKey.OFFSET_FETCH, {"group_id": key, "topics": []}, version=5))
    return found


def join_body(group: str, member: str = "", *, session_ms: int = 30000, protocol_type: str = "consumer",
              protocols: tuple[str, ...] = ("range",), instance: str | None = None) -> dict[str, Any]:
    """A JoinGroup v5 of the consumer protocol, subscribed to the topic `<group>-topic`
    (Kafka 4.3 reads the subscription: one it cannot parse hangs the join)."""
    metadata = encode_subscription([f"{group}-topic"]) if protocol_type == "consumer" else b"opaque"
    return {"group_id": group, "session_timeout": session_ms, "rebalance_timeout": 30000, "member_id": member,
            "group_instance_id": instance, "protocol_type": protocol_type,
            "protocols": [{"name": p, "metadata": metadata} for p in protocols]}


async def join(conn: BrokerConnection, group: str, member: str = "", **kwargs: Any) -> Any:
    return await conn.request(ApiKey.JOIN_GROUP, join_body(group, member, **kwargs), version=5)


async def joined(conn: BrokerConnection, group: str) -> Any:
    """A member of `group` that has joined and synced (generation 1)."""
    first = await join(conn, group)
    assert first.error_code == 79, f"JoinGroup without member id: {first.error_code}"  # MEMBER_ID_REQUIRED
    resp = await join(conn, group, first.member_id)
    ok(resp.error_code, "JoinGroup")
    ok((await sync(conn, group, resp.generation_id, resp.member_id, {resp.member_id: assignment(group)})).error_code,
       "SyncGroup")
    return resp


def assignment(group: str) -> bytes:
    return encode_assignment([(f"{group}-topic", 0)])


async def sync(conn: BrokerConnection, group: str, generation: int, member: str,
               assignments: dict[str, bytes] | None = None) -> Any:
    return await conn.request(ApiKey.SYNC_GROUP, {
        "group_id": group, "generation_id": generation, "member_id": member, "group_instance_id": None,
        "protocol_type": "consumer", "protocol_name": "range",
        "assignments": [{"member_id": m, "assignment": b} for m, b in (assignments or {}).items()]}, version=3)


async def heartbeat(conn: BrokerConnection, group: str, generation: int, member: str) -> Any:
    return await conn.request(ApiKey.HEARTBEAT, {"group_id": group, "generation_id": generation,
                                                 "member_id": member, "group_instance_id": None}, version=3)


async def commit(conn: BrokerConnection, group: str, generation: int, member: str, topic: str, offset: int) -> Any:
    return await conn.request(ApiKey.OFFSET_COMMIT, {
        "group_id": group, "generation_id_or_member_epoch": generation, "member_id": member,
        "group_instance_id": None, "retention_time_ms": -1,
        "topics": [{"name": topic, "partitions": [{"partition_index": 0, "committed_offset": offset,
                                                   "committed_leader_epoch": -1, "committed_metadata": "m"}]}]},
        version=7)


async def delete_groups(conn: BrokerConnection, *groups: str) -> Any:
    return await conn.request(ApiKey.DELETE_GROUPS, {"groups_names": list(groups)}, version=1)


def cg_heartbeat(group: str, member: str = "", epoch: int = 0, *, topics: list[str] | None = None,
                 assignor: str | None = None, rebalance_ms: int = 30000, owned: list[Any] | None = None,
                 regex: str | None = None) -> dict[str, Any]:
    return {"group_id": group, "member_id": member, "member_epoch": epoch, "instance_id": None, "rack_id": None,
            "rebalance_timeout": rebalance_ms, "subscribed_topic_names": topics, "subscribed_topic_regex": regex,
            "server_assignor": assignor, "topic_partitions": owned}


CONCURRENT_TRANSACTIONS = 51


async def init_txn(conn: BrokerConnection, txn: str, *, timeout_ms: int = 60000, version: int = 3,
                   producer: tuple[int, int] = (-1, -1)) -> Any:
    """InitProducerId, again while the coordinator still finishes an earlier transaction."""
    body = {"transactional_id": txn, "transaction_timeout": timeout_ms, "producer_id": producer[0],
            "producer_epoch": producer[1]}
    with trio.fail_after(WAIT_S):
        while True:
            resp = await conn.request(ApiKey.INIT_PRODUCER_ID, body, version=version)
            if resp.error_code not in (*RETRIABLE, CONCURRENT_TRANSACTIONS):
                return resp
            await trio.sleep(0.05)


async def add_partitions(conn: BrokerConnection, txn: str, pid: int, epoch: int, partitions: dict[str, list[int]],
                         *, version: int = 3) -> Any:
    return await conn.request(ApiKey.ADD_PARTITIONS_TO_TXN, {
        "v3_and_below_transactional_id": txn, "v3_and_below_producer_id": pid, "v3_and_below_producer_epoch": epoch,
        "v3_and_below_topics": [{"name": t, "partitions": ps} for t, ps in partitions.items()]}, version=version)


async def end_txn(conn: BrokerConnection, txn: str, pid: int, epoch: int, *, commit: bool = True,
                  version: int = 3) -> Any:
    return await conn.request(ApiKey.END_TXN, {"transactional_id": txn, "producer_id": pid, "producer_epoch": epoch,
                                               "committed": commit}, version=version)


async def txn_offset_commit(conn: BrokerConnection, txn: str, group: str, pid: int, epoch: int, *,
                            version: int = 3) -> Any:
    return await conn.request(ApiKey.TXN_OFFSET_COMMIT, {
        "transactional_id": txn, "group_id": group, "producer_id": pid, "producer_epoch": epoch,
        "generation_id": -1, "member_id": "", "group_instance_id": None,
        "topics": [{"name": f"{group}-topic", "partitions": [{"partition_index": 0, "committed_offset": 1,
                                                              "committed_leader_epoch": -1,
                                                              "committed_metadata": ""}]}]}, version=version)


def txn_batch(pid: int, epoch: int, seq: int, *values: bytes) -> bytes:
    return batch(*(values or (b"t",)), producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                 attributes=0x10)


def _matches(path: str, pattern: str) -> bool:
    """`*` matches anything; every other character itself (paths hold brackets)."""
    return re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), path) is not None



# ---- behaviours, answers compared -------------------------------------------------------------


def compare(name: str, kafka: dict[str, Any], ours: dict[str, Any], known_differences: Mapping[str, str]
            ) -> list[str]:
    """The unexplained differences of one behaviour, and the known ones that went away."""
    known = {p.split(":", 1)[1]: why for p, why in known_differences.items() if p.split(":", 1)[0] == name}
    seen: set[str] = set()
    problems = []
    for path, a, b in differences(kafka, ours):
        match = next((p for p in known if _matches(path, p)), None)
        if match is None:
            problems.append(f"{path}: Kafka {a!r}, dcmirror {b!r}")
        else:
            seen.add(match)
    problems += [f"{p}: listed in KNOWN_DIFFERENCES ({known[p]}) but the answers agree now" for p in known
                 if p not in seen]
    return problems


class Behaviours:
    """One test module's behaviours (`@behaviours("name")` on an `async def(conn, answers)`),
    its table of known differences (behaviour:path -> reason), and the answers each target
    gave so far: the second target's test compares with the first's."""

    def __init__(self, known_differences: Mapping[str, str]) -> None:
        self.known = known_differences
        self.scenarios: dict[str, Scenario] = {}
        self.recorded: dict[str, dict[str, Any]] = defaultdict(dict)  # behaviour -> target -> answers

    def __call__(self, name: str) -> Callable[[Scenario], Scenario]:
        def register(scenario: Scenario) -> Scenario:
            assert name not in self.scenarios, f"behaviour {name} twice"
            self.scenarios[name] = scenario
            return scenario
        return register

    @property
    def names(self) -> list[str]:
        return sorted(self.scenarios)

    async def run(self, target: Target, name: str) -> dict[str, Any]:
        answers = Answers(target)
        conn = await target.connect()
        try:
            await self.scenarios[name](conn, answers)
        finally:
            await conn.aclose()
        return answers.steps

    def check(self, target: Target, name: str) -> None:
        """Run `name` against `target`; once both targets ran it, their answers must agree
        but for the known differences, and those must still differ."""
        self.recorded[name].pop(target.name, None)
        answers = trio.run(self.run, target, name)
        self.recorded[name][target.name] = answers
        other = self.recorded[name].get("dcmirror" if target.name == "kafka" else "kafka")
        if other is None:
            if target.name == "kafka":
                return  # the reference; dcmirror's test compares
            pytest.skip(f"Kafka's answers to {name} are missing (its test failed or did not run)")
        kafka, ours = (answers, other) if target.name == "kafka" else (other, answers)
        problems = compare(name, kafka, ours, self.known)
        assert not problems, f"{name}: dcmirror answers differently from Kafka:\n  " + "\n  ".join(problems)

    def check_documented(self, docstring: str | None) -> None:
        """Every known difference names a behaviour and is listed in the module's docstring."""
        for pattern in self.known:
            assert pattern.split(":", 1)[0] in self.scenarios, f"{pattern}: no such behaviour"
            assert pattern in (docstring or ""), f"{pattern} is not in the module docstring"
