"""Pausing and resuming a flow: a record in the flow's target cluster, authorized by its brokers.

The compacted topic `dcmirror.flow-control` of a flow's target cluster holds one record per
flow that was ever paused: key the flow's name (UTF-8), value JSON
`{"paused": bool, "at_ms": int, "reason": str}` (reason at most REASON_MAX_CHARS). Writing it
is an ordinary Produce, so the target's brokers decide who may pause a flow: WRITE on that
topic (Kafka's ACLs; a principal without it gets TOPIC_AUTHORIZATION_FAILED, raised here as
FlowControlDenied naming the topic, the cluster and the ACL to add). The pause survives worker
restarts, and every worker of the flow, on any host, reads the same record.

Workers (mirror/worker.py `FlowWorker`) read the topic from its start before they join the
source group, then follow it: a short Fetch (max_wait 0) from where they are every
`flow.control.poll.ms` (default 1000) over the target admin's connections. Why a poll rather
than a second consumer: a compacted one-partition topic of a few records costs one empty
Fetch per interval, the admin's connections are already open, and a long poll there would
hold up the admin requests queued behind it (a broker answers a connection in order). The
decision — what a worker does with the records it read — is `FlowPause`, with no I/O.

The console and the CLI call `set_flow_paused` (write) and `read_flow_controls` (read) with a
client config (bootstrap.servers plus the principal's security settings), so the principal
logged in is the one the brokers check.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from cluster.client.admin import Admin, AdminError
from cluster.client.errors import KafkaError, error_name
from cluster.client.metadata import ClientCluster
from cluster.client.producer import Producer
from cluster.protocol.errors import ErrorCode
from cluster.security.connector import CLIENT_SECURITY_KEYS
from mirror import tail

log = logging.getLogger("dcmirror.mirror.flow_control")

FLOW_CONTROL_TOPIC = "dcmirror.flow-control"
FLOW_CONTROL_CONFIGS = {"cleanup.policy": "compact"}
REASON_MAX_CHARS = 200
FLOW_NAME_MAX_BYTES = 249  # as a topic name: what a flow name can sensibly be
VALUE_MAX_BYTES = 1024  # a control value larger than this is refused, not parsed
POLL_INTERVAL_MS = 1000  # default flow.control.poll.ms
READ_MAX_BYTES = 1 << 20  # per Fetch of the control topic
READS_PER_POLL_MAX = 64  # Fetches per poll: a topic of more than 64 MiB is followed over several polls
WRITE_TIMEOUT_S = 30.0
DENIED_CODES = frozenset({ErrorCode.topic_authorization_failed, ErrorCode.cluster_authorization_failed})


class FlowControlError(ValueError):
    """A control record or request that is not valid (named, with the bound it broke)."""


class FlowControlDenied(PermissionError):
    """The target's brokers refused the principal on the control topic."""

    def __init__(self, cluster: str, operation: str, code: int, what: str) -> None:
        self.cluster, self.operation, self.code = cluster, operation, code
        super().__init__(denied_message(cluster, operation, code, what))


def denied_message(cluster: str, operation: str, code: int, what: str) -> str:
    """The refusal, and the ACL that allows it (`operation`: Kafka's name, e.g. Write)."""
    where = f"cluster {cluster}" if cluster else "the target cluster"
    return (f"{what}: {where} answered {error_name(code)}: the principal needs an ACL allowing {operation} on topic "
            f"{FLOW_CONTROL_TOPIC} there (e.g. dcmirror acls add --allow-principal User:NAME --operation {operation} "
            f"--topic {FLOW_CONTROL_TOPIC} --config FILE --topology-cluster {cluster or 'TARGET'})")


@dataclass(frozen=True)
class FlowControl:
    """One flow's control value."""

    paused: bool
    at_ms: int
    reason: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.paused, bool):
            raise FlowControlError(f"paused must be true or false, not {self.paused!r}")
        if not isinstance(self.at_ms, int) or isinstance(self.at_ms, bool) or self.at_ms < 0:
            raise FlowControlError(f"at_ms must be a non-negative integer, not {self.at_ms!r}")
        if not isinstance(self.reason, str) or len(self.reason) > REASON_MAX_CHARS:
            raise FlowControlError(f"reason must be text of at most {REASON_MAX_CHARS} characters")

    def value(self) -> bytes:
        out = orjson.dumps({"paused": self.paused, "at_ms": self.at_ms, "reason": self.reason})
        assert len(out) <= VALUE_MAX_BYTES
        return out

    @classmethod
    def parse(cls, value: bytes) -> FlowControl:
        if len(value) > VALUE_MAX_BYTES:
            raise FlowControlError(f"a control value of {len(value)} bytes (at most {VALUE_MAX_BYTES})")
        try:
            doc = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise FlowControlError(f"a control value that is not JSON: {exc}") from None
        if not isinstance(doc, dict) or set(doc) - {"paused", "at_ms", "reason"} or "paused" not in doc \
                or "at_ms" not in doc:
            raise FlowControlError(f"a control value must be {{paused, at_ms, reason}}, not {str(doc)[:100]}")
        return cls(doc["paused"], doc["at_ms"], doc.get("reason", ""))


RUNNING = FlowControl(False, 0, "")  # a flow no control record names


def flow_key(flow: str) -> bytes:
    key = flow.encode()
    if not flow or len(key) > FLOW_NAME_MAX_BYTES:
        raise FlowControlError(f"a flow name of 1 to {FLOW_NAME_MAX_BYTES} bytes, not {flow[:60]!r}")
    return key


def clean_reason(reason: str) -> str:
    """An operator's reason as stored: one line, at most REASON_MAX_CHARS (longer is refused)."""
    text = " ".join(reason.split())
    if len(text) > REASON_MAX_CHARS:
        raise FlowControlError(f"the reason has {len(text)} characters; at most {REASON_MAX_CHARS}")
    return text


class FlowPause:
    """What a worker knows of its flow's control records, and whether it is paused (no I/O).

    The driver feeds it the records it read (`feed`), in offset order, and once it has read up
    to the high watermark asks `settle`: the last record of the flow read so far becomes the
    state (a flow with none, or a tombstone, runs). A log that was replaced (topic re-created,
    log start moved past the position) is read again from `restart`; until that read reaches
    the high watermark, the state stays what it was."""

    def __init__(self, flow: str) -> None:
        self.flow = flow
        self._key = flow_key(flow)
        self.next_offset = 0
        self.control = RUNNING  # in force
        self.since_ms: int | None = None  # paused since (the control record that paused it)
        self._latest = RUNNING  # the last record of the flow read (applied at settle)
        self._latest_since: int | None = None  # when the run of pausing records ending at it began
        self.invalid_records = 0
        self.last_invalid: str | None = None
        self.topic_id: uuid.UUID | None = None  # the incarnation of the topic read (None: not known)

    @property
    def paused(self) -> bool:
        return self.control.paused

    def feed(self, records: Iterable[tuple[int, bytes | None, bytes | None]], next_offset: int) -> None:
        """(offset, key, value) of records read, then the offset reading goes on from."""
        for offset, key, value in records:
            if offset < self.next_offset or key != self._key:
                continue
            try:
                control = RUNNING if value is None else FlowControl.parse(value)  # a tombstone: it runs
            except FlowControlError as exc:
                # Not ours to act on: the previous state stays (a broken writer cannot resume a flow).
                self.invalid_records += 1
                self.last_invalid = f"offset {offset}: {exc}"
                continue
            if not control.paused:
                self._latest_since = None
            elif not self._latest.paused:
                self._latest_since = control.at_ms
            self._latest = control
        assert next_offset >= self.next_offset, (next_offset, self.next_offset)
        self.next_offset = next_offset

    def settle(self, high_watermark: int) -> bool:
        """Apply what was read if it reaches `high_watermark`; returns whether paused flipped."""
        if self.next_offset < high_watermark:
            return False
        was = self.control.paused
        latest = self._latest
        if not latest.paused:
            self.since_ms = None
        elif not was or self.since_ms is None:
            self.since_ms = self._latest_since
        self.control = latest
        return latest.paused != was

    def restart(self, offset: int, topic_id: uuid.UUID | None = None) -> None:
        """The log was replaced: read it again from `offset` (its start; of incarnation `topic_id`)."""
        self.next_offset = offset
        self.topic_id = topic_id
        self._latest, self._latest_since = RUNNING, None

    def status(self) -> dict[str, Any]:
        return {"paused": self.paused, "since_ms": self.since_ms if self.paused else None,
                "reason": self.control.reason if self.paused else None, "at_ms": self.control.at_ms or None,
                "control_topic": FLOW_CONTROL_TOPIC, "read_offset": self.next_offset,
                "invalid_records": self.invalid_records, "last_invalid": self.last_invalid}


# ---- I/O: the worker's reader, and the writer of the CLI and console ---------------------


def _absent(cluster: ClientCluster) -> bool:
    info = cluster.metadata.topics.get(FLOW_CONTROL_TOPIC)
    return info is None or info.error_code == ErrorCode.unknown_topic_or_partition


async def poll(cluster: ClientCluster, pause: FlowPause, *, cluster_name: str = "") -> bool:
    """Read the control topic from where `pause` is up to its high watermark (at most
    READS_PER_POLL_MAX Fetches) and settle; returns whether paused flipped. A topic that does not
    exist holds no control record: a running flow runs, a paused one stays paused (its record
    may be missing only from the broker asked). Raises FlowControlDenied (no READ) and the
    client's errors (the caller polls again later)."""
    if cluster.metadata.partition_count(FLOW_CONTROL_TOPIC) is None:
        await cluster.refresh({FLOW_CONTROL_TOPIC})
        info = cluster.metadata.topics.get(FLOW_CONTROL_TOPIC)
        if info is not None and info.error_code in DENIED_CODES:
            raise FlowControlDenied(cluster_name, "Read", info.error_code, "reading the flow's pause state")
        if _absent(cluster):
            if pause.paused:
                # Deleted, or a broker that does not know it yet: a paused flow stays paused
                # (resume writes the topic and the record again).
                raise KafkaError(f"{FLOW_CONTROL_TOPIC} is gone from {cluster_name or 'the target'}; the flow "
                                 "stays paused until `dcmirror mirror resume`", ErrorCode.unknown_topic_or_partition)
            pause.restart(0)
            return pause.settle(0)
        if cluster.metadata.partition_count(FLOW_CONTROL_TOPIC) is None:
            raise KafkaError(f"{FLOW_CONTROL_TOPIC} in {cluster_name or 'the target'}",
                             info.error_code if info else ErrorCode.leader_not_available)
    for _ in range(READS_PER_POLL_MAX):
        topic_id = cluster.metadata.topic_id(FLOW_CONTROL_TOPIC)
        if topic_id is not None and pause.topic_id != topic_id:
            if pause.topic_id is not None:
                pause.restart(0, topic_id)  # another incarnation of the topic: from its start
            pause.topic_id = topic_id
        try:
            fetched = await tail.fetch(cluster, FLOW_CONTROL_TOPIC, 0, pause.next_offset, max_bytes=READ_MAX_BYTES)
        except KafkaError as exc:
            if exc.code in DENIED_CODES:
                raise FlowControlDenied(cluster_name, "Read", exc.code, "reading the flow's pause state") from None
            if exc.code != ErrorCode.offset_out_of_range:
                raise
            # Deleted and created again, or its start moved past us: read what it holds now.
            await cluster.refresh({FLOW_CONTROL_TOPIC})
            start, _ = await tail.offsets(cluster, FLOW_CONTROL_TOPIC, 0)
            pause.restart(start, cluster.metadata.topic_id(FLOW_CONTROL_TOPIC))
            continue
        if cluster.metadata.topic_id(FLOW_CONTROL_TOPIC) != topic_id:
            continue  # the fetch refreshed the metadata and found another incarnation: read it
        end = pause.next_offset
        records: list[tuple[int, bytes | None, bytes | None]] = []
        for b in fetched.batches:
            records.extend((r.offset, r.key, r.value) for r in b.records)
            end = max(end, b.header.base_offset + b.header.last_offset_delta + 1)
        pause.feed(records, end)
        if not fetched.batches or pause.next_offset >= fetched.high_watermark:
            return pause.settle(fetched.high_watermark)
    return False


async def ensure_topic(admin: Admin, *, cluster_name: str = "") -> None:
    """Create the control topic if it is missing (compacted, one partition, RF up to 3)."""
    meta = await admin.metadata([])
    try:
        await admin.create_topic(FLOW_CONTROL_TOPIC, 1, min(3, max(1, len(meta.brokers))), FLOW_CONTROL_CONFIGS)
    except AdminError as exc:
        if exc.code == ErrorCode.topic_already_exists:
            return
        if exc.code in DENIED_CODES:
            raise FlowControlDenied(cluster_name, "Create", exc.code, f"creating {FLOW_CONTROL_TOPIC}") from None
        raise


def _admin_of(client: Mapping[str, Any], client_id: str) -> Admin:
    return Admin(str(client["bootstrap.servers"]), client_id=client_id,
                 config={k: v for k, v in client.items() if k in CLIENT_SECURITY_KEYS})


async def set_flow_paused(client: Mapping[str, Any], flow: str, paused: bool, reason: str = "", *,
                          now_ms: int, cluster_name: str = "", client_id: str = "dcmirror-flow-control",
                          timeout_s: float = WRITE_TIMEOUT_S) -> FlowControl:
    """Pause (or resume) `flow`: write its control record into the target cluster `client`
    connects to (bootstrap.servers plus the principal's security settings), acknowledged by
    all in-sync replicas. Creates the topic first if no worker has yet (needs Create). Raises
    FlowControlError (bad name or reason), FlowControlDenied (the brokers refused the
    principal: the message names the topic, the cluster and the ACL) and the client's errors."""
    key = flow_key(flow)
    control = FlowControl(paused, now_ms, clean_reason(reason))
    async with _admin_of(client, client_id) as admin:
        meta = await admin.metadata([FLOW_CONTROL_TOPIC])
        code = next((t.error_code for t in meta.topics if t.name == FLOW_CONTROL_TOPIC), 0)
        if code in DENIED_CODES:
            raise FlowControlDenied(cluster_name, "Write", code, f"{'pausing' if paused else 'resuming'} flow {flow}")
        if code == ErrorCode.unknown_topic_or_partition:
            await ensure_topic(admin, cluster_name=cluster_name)
        await admin.cluster.wait_for_topic(FLOW_CONTROL_TOPIC, timeout_s)
    # Not idempotent: IdempotentWrite is not asked of the principal, and a retried duplicate of
    # this record is the same state again.
    config = {**client, "client.id": client_id, "acks": "all", "enable.idempotence": False,
              "max.block.ms": int(timeout_s * 1000), "delivery.timeout.ms": int(timeout_s * 1000),
              "request.timeout.ms": min(int(timeout_s * 1000), 30000), "linger.ms": 0}
    async with Producer(config) as producer:
        try:
            await producer.send_and_wait(FLOW_CONTROL_TOPIC, control.value(), key, partition=0)
        except KafkaError as exc:
            if exc.code in DENIED_CODES:
                raise FlowControlDenied(cluster_name, "Write", exc.code,
                                        f"{'pausing' if paused else 'resuming'} flow {flow}") from None
            raise
    return control


async def read_flow_controls(client: Mapping[str, Any], *, cluster_name: str = "",
                             client_id: str = "dcmirror-flow-control") -> dict[str, FlowControl]:
    """Every flow's control record in the target cluster `client` connects to (needs Read on
    the topic): flow name -> its latest state (flows never paused, or cleared, are absent)."""
    out: dict[str, FlowControl] = {}
    async with _admin_of(client, client_id) as admin:
        cluster = admin.cluster
        await cluster.refresh({FLOW_CONTROL_TOPIC})
        info = cluster.metadata.topics.get(FLOW_CONTROL_TOPIC)
        if info is not None and info.error_code in DENIED_CODES:
            raise FlowControlDenied(cluster_name, "Read", info.error_code, "reading the flows' pause state")
        if _absent(cluster):
            return out
        start, hw = await tail.offsets(cluster, FLOW_CONTROL_TOPIC, 0)
        at = start
        while at < hw:
            try:
                fetched = await tail.fetch(cluster, FLOW_CONTROL_TOPIC, 0, at, max_bytes=READ_MAX_BYTES)
            except KafkaError as exc:
                if exc.code in DENIED_CODES:
                    raise FlowControlDenied(cluster_name, "Read", exc.code, "reading the flows' pause state") from None
                raise
            if not fetched.batches:
                break
            for b in fetched.batches:
                for r in b.records:
                    if r.key is None:
                        continue
                    name = r.key.decode(errors="replace")
                    if r.value is None:
                        out.pop(name, None)
                        continue
                    try:
                        out[name] = FlowControl.parse(r.value)
                    except FlowControlError as exc:
                        log.warning("%s offset %d (flow %s): %s", FLOW_CONTROL_TOPIC, r.offset, name, exc)
                at = max(at, b.header.base_offset + b.header.last_offset_delta + 1)
    return out
