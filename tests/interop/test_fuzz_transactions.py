"""Semantic fuzzing of the transaction APIs against a real broker process.

Every request is well formed (kio entities of an advertised version, on one plain
connection); its ARGUMENTS are garbage or adversarial: unknown, empty, very long and
non-ASCII transactional ids, random and negative producer ids, epochs at 32767/-1/-32768,
transaction timeouts of 0, negative and huge, unknown topics, negative and huge partition
numbers, EndTxn without a transaction, AddOffsetsToTxn for random groups, TxnOffsetCommit
with bogus generations and member ids, WriteTxnMarkers for partitions and producers that do
not exist, DescribeProducers of unknown partitions, ListTransactions with weird state
filters, DescribeTransactions of unknown ids — interleaved in random order with calls that
drive two transactional ids through real transactions, races of two right calls for one id
from two connections, and a third id with a 1-300 ms timeout that the broker aborts by itself.

What must hold:
- every request gets one well-formed answer within IO_TIMEOUT_S on the same connection, and
  every error code in it is a Kafka error code;
- the answer is the one Kafka gives. A model of each driven transactional id follows
  Kafka's TransactionCoordinator (core/.../transaction/TransactionCoordinator.scala,
  KafkaApis.handle*Txn*): INVALID_TRANSACTION_TIMEOUT, INVALID_PRODUCER_ID_MAPPING,
  PRODUCER_FENCED (INVALID_PRODUCER_EPOCH for old versions), CONCURRENT_TRANSACTIONS,
  INVALID_TXN_STATE, TRANSACTIONAL_ID_NOT_FOUND, UNKNOWN_TOPIC_OR_PARTITION,
  OPERATION_NOT_ATTEMPTED, ... and the producer id/epoch/state that DescribeTransactions
  shows. In particular no garbage call is answered NONE where Kafka refuses it;
- known deviations that are refusals either way (a different error code) are tolerated and
  counted; each has an exact, strict-xfail reproduction at the end of this file, as have
  the broker bugs the fuzzer found (their triggers are not generated in the main test so
  that it stays green and keeps fuzzing everything else);
- the broker process stays up, its log has no traceback / internal error, it restarts
  cleanly and still knows every driven transactional id;
- afterwards librdkafka (confluent-kafka) transactional producers commit, abort and send
  offsets correctly on that broker, with a fuzzed transactional id too, and read_committed
  consumers read exactly the committed records.

Cases are derandomized (the same every run, like tests/interop/test_fuzz_broker.py; 200
examples, DCMIRROR_FUZZ_TXN_EXAMPLES=N for more); DCMIRROR_FUZZ_EXPLORE=1 draws fresh ones
(add --hypothesis-seed=N to pick them), and a failure prints the sequence of calls with
their answers (hypothesis notes) and a blob to replay it with @reproduce_failure. Every
example uses fresh transactional ids, so a replay starts from the same model state whatever
ran before; what an example draws never depends on the broker's answers (hypothesis needs
that), though a race or a timer may still answer differently on a replay.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import struct
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader
from kio.serial.readers import (
    read_compact_string,
    read_int16,
    read_int32,
    read_int64,
    read_unsigned_varint,
)

from cluster.broker.broker import SUPPORTED_APIS
from cluster.protocol import messages
from tests.harness import BrokerProcess
from tests.interop.clients import ck_create_topic

pytestmark = pytest.mark.timeout(240)

FIND_COORDINATOR = 10
INIT_PRODUCER_ID = 22
ADD_PARTITIONS = 24
ADD_OFFSETS = 25
END_TXN = 26
WRITE_MARKERS = 27
TXN_OFFSET_COMMIT = 28
DESCRIBE_PRODUCERS = 61
DESCRIBE_TXNS = 65
LIST_TXNS = 66

E = ErrorCode
KNOWN_CODES = frozenset(int(c) for c in ErrorCode)
IO_TIMEOUT_S = 10.0
MAX_TIMEOUT_MS = 900_000
TOPIC = "fz"
TOPIC_PARTITIONS = 3
STATE_PARTITIONS = 3
OFFSETS = "__consumer_offsets"
TXN_STATE = "__transaction_state"
OFFSET_METADATA_MAX = 4096
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)

# The newest version of each API whose Kafka semantics the model knows (AddPartitionsToTxn v4+
# is broker to broker and batched, EndTxn v5 / TxnOffsetCommit v4 carry transaction version 2,
# FindCoordinator v4 batches keys): newer advertised versions are not sent.
MODELLED_VERSIONS = {FIND_COORDINATOR: 3, INIT_PRODUCER_ID: 4, ADD_PARTITIONS: 3, ADD_OFFSETS: 3, END_TXN: 3,
                     WRITE_MARKERS: 1, TXN_OFFSET_COMMIT: 3, DESCRIBE_PRODUCERS: 0, DESCRIBE_TXNS: 0, LIST_TXNS: 1}

BROKER_CONFIG: dict[str, Any] = {
    "offsets.topic.num.partitions": 1,
    "transaction.state.log.num.partitions": STATE_PARTITIONS,
    "transaction.max.timeout.ms": MAX_TIMEOUT_MS,
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": 100,
    "group.initial.rebalance.delay.ms": 0,
    "auto.create.topics.enable": False,
    "offset.metadata.max.bytes": OFFSET_METADATA_MAX,
}

# Kafka's TransactionState names (TransactionMetadata.scala, TransactionState.AllStates).
KAFKA_STATES = frozenset({"Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit",
                          "CompleteAbort", "Dead", "PrepareEpochFence"})
IDLE = frozenset({"Empty", "CompleteCommit", "CompleteAbort"})
PREPARE = {"PrepareCommit": "CompleteCommit", "PrepareAbort": "CompleteAbort"}

# Deviations from Kafka that are refusals either way; tolerated by the main test, counted,
# and reproduced exactly (strict xfail) in test_known_deviation below.
DEVIATIONS = {
    "D": "PRODUCER_FENCED not down-converted to INVALID_PRODUCER_EPOCH for AddPartitionsToTxn/AddOffsetsToTxn v0-1 "
         "and InitProducerId v3",
    "E": "empty transactional id answered INVALID_PRODUCER_ID_MAPPING / TRANSACTIONAL_ID_NOT_FOUND, not INVALID_REQUEST",
    "F": "InitProducerId(known producer id, stale epoch) on an open/preparing transaction: PRODUCER_FENCED "
         "(Kafka aborts it / answers CONCURRENT_TRANSACTIONS; the broker is stricter)",
    "G": "AddPartitionsToTxn of a '__' topic: INVALID_TOPIC_EXCEPTION (Kafka: TOPIC_AUTHORIZATION_FAILED for "
         "internal topics, UNKNOWN_TOPIC_OR_PARTITION for unknown ones)",
    "H": "EndTxn with the opposite result while markers are being written: CONCURRENT_TRANSACTIONS, not INVALID_TXN_STATE",
    "I": "DescribeProducers of an invalid topic name: UNKNOWN_TOPIC_OR_PARTITION, not INVALID_TOPIC_EXCEPTION",
    "J": "ListTransactions reports the state filter 'PrepareEpochFence' as unknown",
    "T": "the transaction timeout is truncated by 1 ms for many values (1001 -> 1000): float seconds in txn_handlers._ms",
    "M": "InitProducerId retry (producer id + previous epoch) keeps the old state and timeout (Kafka: Empty, new timeout)",
    "N": "TxnOffsetCommit with a member id and generation -1 to an empty group: UNKNOWN_MEMBER_ID (Kafka accepts)",
}


def name(code: int) -> str:
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"UNKNOWN-CODE-{code}"


def short(s: str | None) -> str:
    if s is None:
        return "None"
    return repr(s) if len(s) <= 40 else f"{s[:24]!r}...<{len(s)} chars>"


# ---- the wire ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Described:
    """One entry of a DescribeTransactions answer (kio cannot read its -1 start time)."""

    error_code: int
    transactional_id: str
    state: str
    timeout_ms: int
    start_ms: int
    producer_id: int
    producer_epoch: int
    partitions: frozenset[tuple[str, int]]


def _skip_tags(buf: bytes, pos: int) -> int:
    n, size = read_unsigned_varint(buf, pos)
    pos += size
    for _ in range(n):
        _, size = read_unsigned_varint(buf, pos)
        pos += size
        length, size = read_unsigned_varint(buf, pos)
        pos += size + length
    return pos


def parse_describe_transactions(frame: bytes) -> list[Described]:
    """DescribeTransactions v0 response body (after the correlation id and header tags)."""
    pos = _skip_tags(frame, 4)
    _, size = read_int32(frame, pos)
    pos += size
    n, size = read_unsigned_varint(frame, pos)
    pos += size
    out = []
    for _ in range(n - 1):
        error, size = read_int16(frame, pos)
        pos += size
        txn_id, size = read_compact_string(frame, pos)
        pos += size
        state, size = read_compact_string(frame, pos)
        pos += size
        timeout, size = read_int32(frame, pos)
        pos += size
        start, size = read_int64(frame, pos)
        pos += size
        pid, size = read_int64(frame, pos)
        pos += size
        epoch, size = read_int16(frame, pos)
        pos += size
        topics, size = read_unsigned_varint(frame, pos)
        pos += size
        parts: set[tuple[str, int]] = set()
        for _ in range(topics - 1):
            topic, size = read_compact_string(frame, pos)
            pos += size
            count, size = read_unsigned_varint(frame, pos)
            pos += size
            for _ in range(count - 1):
                p, size = read_int32(frame, pos)
                pos += size
                parts.add((topic, p))
            pos = _skip_tags(frame, pos)
        pos = _skip_tags(frame, pos)
        out.append(Described(error, txn_id, state, timeout, start, pid, epoch, frozenset(parts)))
    pos = _skip_tags(frame, pos)
    assert pos == len(frame), f"{len(frame) - pos} trailing bytes in a DescribeTransactions answer"
    return out


def error_codes(value: Any) -> list[int]:
    """Every error code field anywhere in a decoded kio response."""
    out: list[int] = []
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if f.metadata.get("kafka_type") == "error_code":
                out.append(int(v))
            elif isinstance(v, tuple):
                for x in v:
                    out += error_codes(x)
            elif dataclasses.is_dataclass(v):
                out += error_codes(v)
    return out


class Wire:
    """One connection that speaks exact API versions (no negotiation), one request at a time."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker
        self.sock = socket.create_connection(("127.0.0.1", broker.port), timeout=IO_TIMEOUT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.corr = 0
        self.calls: Counter[str] = Counter()
        self.last_request = ""

    def close(self) -> None:
        self.sock.close()

    def _recv(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError(f"connection closed after {len(buf)} of {n} bytes")
            buf += chunk
        return bytes(buf)

    def call(self, api: int, version: int, body: dict[str, Any]) -> Any:
        self.send(api, version, body)
        return self.receive(api, version)

    def send(self, api: int, version: int, body: dict[str, Any]) -> None:
        self.corr += 1
        data = messages.encode_request(api, version, self.corr, b"fuzz-txn", body)
        self.calls[f"{api}v{version}"] += 1
        self.last_request = f"API {api} v{version} {str(body)[:300]}"
        try:
            self.sock.sendall(data)
        except OSError as exc:
            pytest.fail(f"{self.last_request}: send failed ({exc!r})\n{log_tail(self.broker)}")

    def receive(self, api: int, version: int) -> Any:
        """The answer to the request sent last (one in flight per connection here)."""
        t0 = time.monotonic()
        try:
            (size,) = struct.unpack(">i", self._recv(4))
            assert 4 <= size <= 64 << 20, f"answer declares {size} bytes"
            frame = self._recv(size)
        except (OSError, EOFError) as exc:
            pytest.fail(f"{self.last_request}: no answer after {time.monotonic() - t0:.1f}s ({exc!r})\n"
                        f"{log_tail(self.broker)}")
        (corr,) = struct.unpack_from(">i", frame)
        assert corr == self.corr, f"answer to correlation id {corr}, expected {self.corr}"
        try:
            if api == DESCRIBE_TXNS:
                described = parse_describe_transactions(frame)
                codes = [d.error_code for d in described]
                value: Any = described
            else:
                cls = messages.response_schema(api, version)
                offset = 4
                if cls.__flexible__:
                    offset = _skip_tags(frame, 4)
                value, size = entity_reader(cls)(frame, offset)
                assert offset + size == len(frame), f"{len(frame) - offset - size} trailing bytes"
                codes = error_codes(value)
        except Exception as exc:
            pytest.fail(f"API {api} v{version}: malformed answer ({exc!r}): {frame[:200].hex()}")
        unknown = [c for c in codes if c not in KNOWN_CODES]
        assert not unknown, f"API {api} v{version} answered unknown error codes {unknown}"
        return value


def log_tail(broker: BrokerProcess, n: int = 4000) -> str:
    return "---- broker log ----\n" + broker.log_text()[-n:]


class Health:
    """The broker process runs and logged no traceback / internal error since the last check."""

    MARKERS = ("Traceback", "internal error", "nhandled exception", "Exception in", "CRITICAL")

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker
        self.seen = 0

    def check(self) -> None:
        proc = self.broker.proc
        assert proc is not None and proc.poll() is None, (
            f"broker exited with {proc and proc.returncode}\n{log_tail(self.broker)}")
        text = self.broker.log_text()
        new, self.seen = text[self.seen:], len(text)
        bad = [m for m in self.MARKERS if m in new]
        if bad:
            pytest.fail(f"the broker logged {bad}:\n{new[-8000:]}")


def wait_for_coordinator(wire: Wire) -> None:
    """FindCoordinator creates __transaction_state; then InitProducerId works."""
    deadline = time.monotonic() + 30
    while True:
        r = wire.call(FIND_COORDINATOR, 2, {"key": "warmup", "key_type": 1})
        if r.error_code == E.none:
            i = wire.call(INIT_PRODUCER_ID, 4, {"transactional_id": "warmup", "transaction_timeout": 60_000})
            if i.error_code == E.none:
                return
        assert time.monotonic() < deadline, f"no transaction coordinator: {r}"
        time.sleep(0.1)


def describe(wire: Wire, *txn_ids: str) -> list[Described]:
    got = wire.call(DESCRIBE_TXNS, 0, {"transactional_ids": list(txn_ids)})
    assert [d.transactional_id for d in got] == list(txn_ids)
    return got


def wait_state(wire: Wire, txn_id: str, states: set[str], timeout_s: float = 10.0) -> Described:
    deadline = time.monotonic() + timeout_s
    while True:
        (d,) = describe(wire, txn_id)
        if d.error_code == E.none and d.state in states:
            return d
        assert time.monotonic() < deadline, f"{short(txn_id)} never reached {states}: {d}"
        time.sleep(0.02)


def read_values(bootstrap: str, isolation: str, expect: int, idle_s: float = 1.5) -> list[bytes]:
    """Everything a fresh consumer of TOPIC reads: until it has `expect` records and then
    nothing more for `idle_s` (so that one record too many is seen too)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex[:8]}",
                  "isolation.level": isolation, "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(TOPIC, p, 0) for p in range(TOPIC_PARTITIONS)])
    out: list[bytes] = []
    deadline = time.monotonic() + 60
    last = time.monotonic()
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None:
                if len(out) >= expect and time.monotonic() - last > idle_s:
                    break
                continue
            error = m.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(error)
            out.append(m.value() or b"")
            last = time.monotonic()
    finally:
        c.close()
    return out


def code_of(api: int, r: Any) -> int:
    """The error code of a one-transaction answer (AddPartitionsToTxn: the same for every partition)."""
    if api == ADD_PARTITIONS:
        codes = {int(p.partition_error_code) for t in r.results_by_topic_v3_and_below for p in t.results_by_partition}
        assert len(codes) == 1, f"one transaction, one error code: {r}"
        return codes.pop()
    return int(r.error_code)


def kafka_valid_topic(topic: str) -> bool:
    """org.apache.kafka.common.internals.Topic.validate."""
    return (0 < len(topic) <= 249 and topic not in (".", "..")
            and all(c.isascii() and (c.isalnum() or c in "._-") for c in topic))


# ---- the model -----------------------------------------------------------------------------


def broker_ms(ms: int) -> int:
    """The timeout the broker keeps for `ms` (bug T: txn_handlers._ms goes through a float
    number of seconds and truncates: 1001 ms -> 1000, 513309 -> 513308)."""
    return int(timedelta(milliseconds=ms).total_seconds() * 1000)


@dataclass(frozen=True)
class Txn:
    """What Kafka's coordinator holds for a transactional id (pid -1: never initialized)."""

    txn_id: str
    pid: int = -1
    epoch: int = -1
    last: int = -1  # Kafka's lastProducerEpoch
    ours_last: int = -1  # the broker's (bug C): the main test never probes where the two differ
    timeout_ms: int = 0
    state: str = "None"
    partitions: frozenset[tuple[str, int]] = frozenset()

    @property
    def initialized(self) -> bool:
        return self.pid >= 0

    def candidates(self) -> list[Txn]:
        """A Prepare* transaction may have written all its markers since: Complete* then."""
        if self.state in PREPARE:
            return [self, replace(self, state=PREPARE[self.state], partitions=frozenset())]
        return [self]

    def matches(self, d: Described) -> bool:
        return (d.error_code == E.none and d.state == self.state and d.producer_id == self.pid
                and d.producer_epoch == self.epoch and d.timeout_ms in (self.timeout_ms, broker_ms(self.timeout_ms))
                and d.partitions == self.partitions
                and (d.start_ms >= 0 if self.state == "Ongoing" or self.state in PREPARE else True)
                and (d.start_ms == -1 if self.state == "Empty" else True))


Result = Callable[[Any], Txn] | None  # the next model from the answer (None: unchanged)
Expect = dict[int, tuple[Result, str | None]]  # allowed code -> (next model, deviation label or None)


def exact(*codes: int, result: Result = None) -> Expect:
    return {int(c): (result, None) for c in codes}


def fenced(old_version: bool, mapped_by_broker: bool = False) -> Expect:
    """PRODUCER_FENCED, which Kafka down-converts to INVALID_PRODUCER_EPOCH for old versions."""
    if not old_version:
        return exact(E.producer_fenced)
    if mapped_by_broker:
        return exact(E.invalid_producer_epoch)
    return {int(E.invalid_producer_epoch): (None, None), int(E.producer_fenced): (None, "D")}


def exp_init(t: Txn, version: int, timeout: int, pid: int, epoch: int) -> Expect:
    """TransactionCoordinator.handleInitProducerId / prepareInitProducerIdTransit (never sent
    with a malformed (pid, epoch) pair, an empty id, or the bug-C epoch)."""
    if not 0 < timeout <= MAX_TIMEOUT_MS:
        return exact(E.invalid_transaction_timeout)
    expected = pid >= 0
    old = version < 4
    if not t.initialized:
        return exact(E.none, result=lambda r: Txn(t.txn_id, r.producer_id, 0, -1, -1, timeout, "Empty"))
    if expected and pid != t.pid:
        return fenced(old)
    stale = {c: (None, "F") for c in fenced(old)} if expected and epoch != t.epoch else {}
    if t.state in PREPARE:
        return {**stale, **exact(E.concurrent_transactions)}
    if t.state == "Ongoing":
        aborting = replace(t, epoch=t.epoch + 1, last=-1, ours_last=t.epoch, state="PrepareAbort")
        return {**stale, **exact(E.concurrent_transactions, result=lambda r: aborting)}
    fresh = replace(t, state="Empty", partitions=frozenset(), timeout_ms=timeout)
    if not expected:
        return exact(E.none, result=lambda r: replace(fresh, epoch=t.epoch + 1, last=-1, ours_last=t.epoch))
    if epoch == t.epoch:
        return exact(E.none, result=lambda r: replace(fresh, epoch=t.epoch + 1, last=t.epoch, ours_last=t.epoch))
    if epoch == t.last:
        return exact(E.none, result=lambda r: fresh)  # a retry: same epoch (and see "M")
    return fenced(old)


def exp_add(t: Txn, pid: int, epoch: int, parts: frozenset[tuple[str, int]], old: bool) -> Expect:
    """TransactionCoordinator.handleAddPartitionsToTransaction (after KafkaApis' topic checks)."""
    if t.txn_id == "":
        return {int(E.invalid_request): (None, None), int(E.invalid_producer_id_mapping): (None, "E")}
    if not t.initialized or pid != t.pid:
        return exact(E.invalid_producer_id_mapping)
    if epoch != t.epoch:
        return fenced(old)
    if t.state in PREPARE:
        return exact(E.concurrent_transactions)
    if t.state == "Ongoing" and parts <= t.partitions:
        return exact(E.none)
    base = t.partitions if t.state == "Ongoing" else frozenset()
    return exact(E.none, result=lambda r: replace(t, state="Ongoing", partitions=base | parts))


def exp_end(t: Txn, pid: int, epoch: int, commit: bool, old: bool) -> Expect:
    """TransactionCoordinator.endTransaction(isFromClient = true)."""
    if t.txn_id == "":
        return {int(E.invalid_request): (None, None), int(E.invalid_producer_id_mapping): (None, "E")}
    if not t.initialized or pid != t.pid:
        return exact(E.invalid_producer_id_mapping)
    if epoch != t.epoch:
        return fenced(old, mapped_by_broker=True)
    if t.state == "Ongoing":
        target = "PrepareCommit" if commit else "PrepareAbort"
        return exact(E.none, result=lambda r: replace(t, state=target))
    if t.state == ("CompleteCommit" if commit else "CompleteAbort"):
        return exact(E.none)
    if t.state == ("PrepareCommit" if commit else "PrepareAbort"):
        return exact(E.concurrent_transactions)
    if t.state in PREPARE:
        return {int(E.invalid_txn_state): (None, None), int(E.concurrent_transactions): (None, "H")}
    return exact(E.invalid_txn_state)


# ---- argument strategies ------------------------------------------------------------------

WEIRD_TEXT = st.one_of(
    st.text(min_size=1, max_size=12),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x1F), min_size=1, max_size=4),
    st.sampled_from(["é☃💥", " ", "\x00", "-", ".", "a/b", "null", "%s%n", "__transaction_state"]),
    st.integers(200, 20_000).map(lambda n: "x" * n),
    st.integers(100, 3_000).map(lambda n: "€" * n),
)
LONG_NAME = st.integers(250, 2_000).map(lambda n: "t" * n)
TOPIC_NAMES = st.one_of(
    st.just(TOPIC), st.just(TOPIC), st.just(TOPIC), st.just(TOPIC),
    st.sampled_from(["nope", "", OFFSETS, TXN_STATE, "__nope", "a b", ".", "fz-missing", "FZ"]),
    LONG_NAME, st.text(max_size=8),
)
PARTITION_INDEXES = st.one_of(
    st.integers(0, TOPIC_PARTITIONS - 1), st.integers(0, TOPIC_PARTITIONS - 1),
    st.sampled_from([TOPIC_PARTITIONS, -1, INT32[0], INT32[1], 1000]), st.integers(*INT32),
)
TIMEOUTS_VALID = st.integers(300_000, MAX_TIMEOUT_MS)  # never times out during the test
TIMEOUTS_INVALID = st.one_of(
    st.sampled_from([0, -1, INT32[0], MAX_TIMEOUT_MS + 1, INT32[1]]),
    st.integers(INT32[0], 0), st.integers(MAX_TIMEOUT_MS + 1, INT32[1]),
)
GROUPS = st.one_of(st.just("g"), st.just(""), WEIRD_TEXT, st.integers(0, 5).map(lambda n: f"grp-{n}"))
INIT_PAIRS = st.sampled_from(["none", "none", "own", "own", "last", "stale", "other", "max"])
TOPIC_LISTS = st.lists(st.tuples(TOPIC_NAMES, st.lists(PARTITION_INDEXES, max_size=4)), max_size=3)
FZ_PARTITIONS = st.lists(st.integers(0, TOPIC_PARTITIONS - 1), min_size=1, max_size=3)
GENERATIONS = st.one_of(st.just(-1), st.sampled_from([0, 1, -5, INT32[1], INT32[0]]), st.integers(*INT32))
MEMBERS = st.one_of(st.just(""), WEIRD_TEXT)
INSTANCES = st.one_of(st.none(), st.just(""), WEIRD_TEXT)
OFFSET_LISTS = st.lists(st.tuples(TOPIC_NAMES, st.lists(st.tuples(
    PARTITION_INDEXES, st.integers(*INT64),
    st.one_of(st.none(), st.just(""), st.integers(4000, 5000).map(lambda n: "m" * n), st.text(max_size=8)),
), min_size=1, max_size=3)), min_size=1, max_size=2)


def _versions(api: int) -> st.SearchStrategy[int]:
    lo, hi = SUPPORTED_APIS[api]
    return st.integers(lo, min(hi, MODELLED_VERSIONS[api]))


# Everything an op may draw when op_drive runs it, drawn up front whatever the op: which op
# fits depends on the broker (markers finish when they do), and hypothesis needs the shape
# of what an example draws not to.
DRIVE_ARGS = st.fixed_dictionaries({
    **{f"version of {api}": _versions(api) for api in (INIT_PRODUCER_ID, ADD_PARTITIONS, ADD_OFFSETS, END_TXN,
                                                        TXN_OFFSET_COMMIT, DESCRIBE_TXNS)},
    "timeout": TIMEOUTS_VALID, "chaos timeout": st.integers(1, 300), "init pair": INIT_PAIRS,
    "pid": st.integers(0, INT64[1]), "epoch": st.integers(0, 32767), "topics": TOPIC_LISTS,
    "fz partitions": FZ_PARTITIONS, "group": GROUPS, "commit": st.booleans(), "generation": GENERATIONS,
    "member": MEMBERS, "instance": INSTANCES, "offsets": OFFSET_LISTS,
})


def topic_exists(topic: str, partition: int) -> bool:
    sizes = {TOPIC: TOPIC_PARTITIONS, OFFSETS: 1, TXN_STATE: STATE_PARTITIONS}
    return topic in sizes and 0 <= partition < sizes[topic]


# ---- one example: a random sequence of calls -------------------------------------------------


class Session:
    """What the examples share: the broker, its connection, and what was learned."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker
        self.wire = Wire(broker)
        self.wire2 = Wire(broker)  # a second client, for races on one transactional id
        self.health = Health(broker)
        self.deviations: Counter[str] = Counter()
        self.pids: dict[int, str] = {}  # every producer id handed out -> to whom
        self.final: dict[str, Txn] = {}  # the settled model of every driven id
        self.examples = 0
        self.ops: Counter[str] = Counter()
        # Producer ids that got garbage markers / offsets with any epoch: a real producer
        # may be fenced on those partitions afterwards (as in Kafka), so the final check
        # with librdkafka does not reuse their transactional ids.
        self.tainted: set[int] = set()
        self.visited: Counter[str] = Counter()  # model states reached (a coverage check)

    def count_timeout(self, t: Txn, d: Described) -> None:
        if d.timeout_ms != t.timeout_ms:
            self.deviations["T"] += 1


class Example:
    def __init__(self, s: Session, data: st.DataObject) -> None:
        self.s = s
        self.data = data
        s.examples += 1
        prefix = f"x{s.examples}-{uuid.uuid4().hex[:6]}-"
        weird = data.draw(WEIRD_TEXT, label="weird id")
        self.ids = {"a": prefix + "a", "b": prefix + "w" + weird, "ghost": prefix + "ghost", "empty": "",
                    "chaos": prefix + "chaos"}
        self.models = {"a": Txn(self.ids["a"]), "b": Txn(self.ids["b"])}
        self.chaos = (-1, -1)  # the chaos id's producer id and epoch as last answered
        self.driving: str | None = None  # op_drive: the next op moves this id's transaction on
        self.bundle: dict[str, Any] | None = None  # and draws from these

    # -- helpers --

    def draw(self, strategy: st.SearchStrategy[Any], label: str) -> Any:
        if self.bundle is not None:  # op_drive drew it already (DRIVE_ARGS)
            return self.bundle[label]
        return self.data.draw(strategy, label=label)

    def call(self, api: int, version: int, body: dict[str, Any], what: str) -> Any:
        note(what)
        self.s.ops[what.split("(")[0]] += 1
        return self.s.wire.call(api, version, body)

    def model(self, key: str) -> Txn:
        return self.models.get(key) or Txn(self.ids[key])

    def version(self, api: int) -> int:
        return int(self.draw(_versions(api), f"version of {api}"))

    def target(self, choices: list[str]) -> str:
        return self.driving or str(self.draw(st.sampled_from(choices), "target"))

    def pid_epoch(self, key: str) -> tuple[int, int]:
        """A producer id and epoch to send for `key`: right, stale, someone else's or garbage."""
        t = self.model(key)
        pid, epoch = (t.pid, t.epoch) if key != "chaos" else self.chaos
        if self.driving or self.draw(st.booleans(), "right producer"):
            return pid, epoch
        others = [m.pid for k, m in self.models.items() if k != key and m.initialized]
        kind = self.draw(st.sampled_from(["own", "own", "own", "other", "minus1", "random", "negative"]), "pid kind")
        if kind == "other" and others:
            pid = others[0]
        elif kind == "minus1":
            pid = -1
        elif kind == "random":
            pid = self.draw(st.integers(0, INT64[1]), "pid")
        elif kind == "negative":
            pid = self.draw(st.integers(INT64[0], -2), "pid")
        ekind = self.draw(st.sampled_from(["own", "own", "own", "plus1", "minus1", "last", "max", "min", "random"]),
                          "epoch kind")
        epoch = {"own": epoch, "plus1": epoch + 1, "minus1": epoch - 1, "last": t.last, "max": 32767,
                 "min": -32768}.get(ekind, epoch)
        if ekind == "random":
            epoch = self.draw(st.integers(-32768, 32767), "epoch")
        return pid, max(-32768, min(32767, epoch))

    def resolve(self, key: str, expect: Callable[[Txn], Expect], code: int, answer: Any, what: str) -> Txn:
        """Check `code` against what Kafka answers in every state the model may be in, and
        move the model on. Returns the new model."""
        t = self.model(key)
        matches = []
        for cand in t.candidates():
            allowed = expect(cand)
            if code in allowed:
                matches.append((cand, *allowed[code]))
        if not matches:
            wanted = sorted({name(c) for cand in t.candidates() for c in expect(cand)})
            pytest.fail(f"{what}: answered {name(code)}; Kafka answers {wanted} (model {t})")
        matches.sort(key=lambda m: m[2] is not None)  # exact before tolerated
        cand, result, deviation = matches[0]
        if deviation:
            self.s.deviations[deviation] += 1
        if len(matches) > 1:
            assert all(m[1] is None for m in matches), f"ambiguous model for {what}"
            new = t
        else:
            new = cand if result is None else result(answer)
        if key in self.models:
            self.models[key] = new
            self.s.visited[new.state] += 1
        return new

    def observe(self, key: str, possible: list[tuple[Txn, str | None]], what: str) -> None:
        """DescribeTransactions decides between states the answer codes cannot tell apart."""
        (d,) = describe(self.s.wire, self.ids[key])
        for t, deviation in possible:
            if t.matches(d):
                self.s.count_timeout(t, d)
                self.models[key] = t
                if deviation:
                    self.s.deviations[deviation] += 1
                return
        pytest.fail(f"after {what}: DescribeTransactions shows {d}; expected one of {[p for p, _ in possible]}")

    # -- the operations --

    def op_init(self) -> None:
        key = self.target(["a", "a", "b", "b", "chaos", "none"])
        version = self.version(INIT_PRODUCER_ID)
        if key == "none":  # an idempotent producer: always a new producer id
            timeout = self.draw(st.one_of(TIMEOUTS_VALID, TIMEOUTS_INVALID), "timeout")
            r = self.call(INIT_PRODUCER_ID, version, {"transactional_id": None, "transaction_timeout": timeout},
                          f"InitProducerId(v{version}, null id, timeout {timeout})")
            assert (r.error_code, r.producer_epoch) == (E.none, 0), r
            assert r.producer_id not in self.s.pids, f"producer id {r.producer_id} handed out twice"
            self.s.pids[r.producer_id] = "idempotent"
            return
        txn_id = self.ids[key]
        t = self.model(key)
        if key == "chaos":
            short_timeout = st.integers(1, 300)
            timeout = self.draw(short_timeout if self.driving else st.one_of(short_timeout, TIMEOUTS_INVALID),
                                "chaos timeout")
        elif self.driving:
            timeout = self.draw(TIMEOUTS_VALID, "timeout")
        else:
            timeout = self.draw(st.one_of(TIMEOUTS_VALID, TIMEOUTS_VALID, TIMEOUTS_INVALID), "timeout")
        pid, epoch = -1, -1
        if version >= 3 and key != "chaos":
            kind = self.draw(INIT_PAIRS, "init pair")
            if kind != "none":
                # Never a malformed pair (bug B): both -1, or a producer id >= 0 with an epoch >= 0.
                pid = t.pid if t.initialized and kind != "other" else self.draw(st.integers(0, INT64[1]), "pid")
                epoch = {"own": t.epoch, "last": t.last, "max": 32767}.get(
                    kind, self.draw(st.integers(0, 32767), "epoch"))
                epoch = epoch if epoch >= 0 else max(t.epoch, 0)
                if t.initialized and pid == t.pid and epoch == t.ours_last and t.last != t.ours_last:
                    epoch = t.epoch  # bug C: the broker would hand the bumped epoch to this zombie
        what = f"InitProducerId(v{version}, {key}={short(txn_id)}, timeout {timeout}, pid {pid}, epoch {epoch})"
        body = {"transactional_id": txn_id, "transaction_timeout": timeout, "producer_id": pid,
                "producer_epoch": epoch}
        r = self.call(INIT_PRODUCER_ID, version, body, what)
        code = int(r.error_code)
        note(f"  -> {name(code)} pid {r.producer_id} epoch {r.producer_epoch}")
        if code != E.none:
            assert (r.producer_id, r.producer_epoch) == (-1, -1), f"{what}: refused but {r}"
        if key == "chaos":
            allowed = {E.none, E.invalid_transaction_timeout, E.concurrent_transactions, E.producer_fenced,
                       E.invalid_producer_epoch}
            assert code in allowed, f"{what}: {name(code)}"
            if not 0 < timeout <= MAX_TIMEOUT_MS:
                assert code == E.invalid_transaction_timeout, f"{what}: {name(code)}"
            if code == E.none:
                self.chaos = (r.producer_id, r.producer_epoch)
                owner = self.s.pids.setdefault(r.producer_id, txn_id)
                assert owner == txn_id, f"producer id {r.producer_id} of {short(owner)} handed to {short(txn_id)}"
            return
        retry = t.initialized and t.state in IDLE and pid == t.pid and epoch == t.last and epoch != t.epoch \
            and 0 < timeout <= MAX_TIMEOUT_MS
        new = self.resolve(key, lambda c: exp_init(c, version, timeout, pid, epoch), code, r, what)
        if code == E.none:
            assert (r.producer_id, r.producer_epoch) == (new.pid, new.epoch), f"{what}: {r}, model {new}"
            owner = self.s.pids.setdefault(r.producer_id, txn_id)
            assert owner == txn_id, f"producer id {r.producer_id} of {short(owner)} handed to {short(txn_id)}"
            if retry:
                # Kafka moves to Empty with the new timeout; the broker keeps what it had ("M").
                self.observe(key, [(new, None), (replace(t, epoch=new.epoch), "M")], what)

    def op_add_partitions(self) -> None:
        key = self.target(["a", "a", "a", "b", "b", "ghost", "empty", "chaos"])
        version = self.version(ADD_PARTITIONS)
        pid, epoch = self.pid_epoch(key)
        topics = self.draw(TOPIC_LISTS, "topics")
        fz_partitions = self.draw(FZ_PARTITIONS, "fz partitions")
        if self.driving or self.draw(st.integers(0, 9), "just fz") < 6:
            topics = [(TOPIC, fz_partitions)]
        txn_id = self.ids[key]
        what = f"AddPartitionsToTxn(v{version}, {key}={short(txn_id)}, pid {pid}, epoch {epoch}, " \
               f"{[(short(n), ps) for n, ps in topics]})"
        r = self.call(ADD_PARTITIONS, version, {
            "v3_and_below_transactional_id": txn_id, "v3_and_below_producer_id": pid,
            "v3_and_below_producer_epoch": epoch,
            "v3_and_below_topics": [{"name": n, "partitions": ps} for n, ps in topics]}, what)
        got: dict[tuple[str, int], int] = {}
        for tr in r.results_by_topic_v3_and_below:
            for pr in tr.results_by_partition:
                assert (tr.name, pr.partition_index) not in got, f"{what}: twice in {r}"
                got[(tr.name, pr.partition_index)] = int(pr.partition_error_code)
        wanted = {(n, p) for n, ps in topics for p in ps}
        assert set(got) == wanted, f"{what}: answered for {sorted(got)}"
        note(f"  -> {sorted({name(c) for c in got.values()})}")
        screen: dict[tuple[str, int], Expect] = {}
        for n, p in wanted:
            if n in (OFFSETS, TXN_STATE):
                screen[(n, p)] = {int(E.topic_authorization_failed): (None, None),
                                  int(E.invalid_topic_exception): (None, "G")}
            elif not topic_exists(n, p):
                screen[(n, p)] = exact(E.unknown_topic_or_partition)
                if n.startswith("__"):
                    screen[(n, p)][int(E.invalid_topic_exception)] = (None, "G")
        if screen:  # KafkaApis: nothing is attempted
            for tp, code in got.items():
                allowed = screen.get(tp, exact(E.operation_not_attempted))
                assert code in allowed, f"{what}: {tp} answered {name(code)}, Kafka {[name(c) for c in allowed]}"
                label = allowed[code][1]
                if label:
                    self.s.deviations[label] += 1
            return
        if not wanted:  # nothing to answer with: look at the transaction instead
            if key in self.models and self.models[key].initialized:
                t = self.models[key]
                possible: list[tuple[Txn, str | None]] = []
                for cand in t.candidates():
                    possible.append((cand, None))
                    ok = exp_add(cand, pid, epoch, frozenset(), version < 2).get(int(E.none))
                    if ok is not None and ok[0] is not None:
                        possible.append((ok[0](None), None))
                self.observe(key, possible, what)
            return
        codes = set(got.values())
        assert len(codes) == 1, f"{what}: one transaction, one error code: {got}"
        code = codes.pop()
        if key == "chaos":
            assert code in {E.none, E.invalid_producer_id_mapping, E.producer_fenced, E.invalid_producer_epoch,
                            E.concurrent_transactions}, f"{what}: {name(code)}"
            return
        parts = frozenset(wanted)
        self.resolve(key, lambda c: exp_add(c, pid, epoch, parts, version < 2), code, r, what)

    def op_add_offsets(self) -> None:
        key = self.target(["a", "a", "b", "ghost", "empty", "chaos"])
        version = self.version(ADD_OFFSETS)
        pid, epoch = self.pid_epoch(key)
        group = self.draw(GROUPS, "group")
        txn_id = self.ids[key]
        what = f"AddOffsetsToTxn(v{version}, {key}={short(txn_id)}, pid {pid}, epoch {epoch}, group {short(group)})"
        r = self.call(ADD_OFFSETS, version, {"transactional_id": txn_id, "producer_id": pid, "producer_epoch": epoch,
                                             "group_id": group}, what)
        code = int(r.error_code)
        note(f"  -> {name(code)}")
        if key == "chaos":
            assert code in {E.none, E.invalid_producer_id_mapping, E.producer_fenced, E.invalid_producer_epoch,
                            E.concurrent_transactions}, f"{what}: {name(code)}"
            return
        parts = frozenset({(OFFSETS, 0)})
        self.resolve(key, lambda c: exp_add(c, pid, epoch, parts, version < 2), code, r, what)

    def op_end_txn(self) -> None:
        key = self.target(["a", "a", "a", "b", "b", "ghost", "empty", "chaos"])
        version = self.version(END_TXN)
        pid, epoch = self.pid_epoch(key)
        commit = self.draw(st.booleans(), "commit")
        txn_id = self.ids[key]
        what = f"EndTxn(v{version}, {key}={short(txn_id)}, pid {pid}, epoch {epoch}, " \
               f"{'commit' if commit else 'abort'})"
        r = self.call(END_TXN, version, {"transactional_id": txn_id, "producer_id": pid, "producer_epoch": epoch,
                                         "committed": commit}, what)
        code = int(r.error_code)
        note(f"  -> {name(code)}")
        if key == "chaos":
            assert code in {E.none, E.invalid_producer_id_mapping, E.producer_fenced, E.invalid_producer_epoch,
                            E.concurrent_transactions, E.invalid_txn_state}, f"{what}: {name(code)}"
            return
        self.resolve(key, lambda c: exp_end(c, pid, epoch, commit, version < 2), code, r, what)

    def op_txn_offset_commit(self) -> None:
        key = self.target(["a", "b", "ghost", "empty", "chaos"])
        version = self.version(TXN_OFFSET_COMMIT)
        pid, epoch = self.pid_epoch(key)
        group = self.draw(GROUPS, "group")
        generation = self.draw(GENERATIONS, "generation")
        member = self.draw(MEMBERS, "member")
        instance = self.draw(INSTANCES, "instance")
        if version < 3 or self.driving:
            generation, member, instance = -1, "", None  # not in these versions (or as a real producer sends)
        topics = self.draw(OFFSET_LISTS, "offsets")
        txn_id = self.ids[key]
        self.s.tainted.add(pid)
        what = f"TxnOffsetCommit(v{version}, {key}={short(txn_id)}, group {short(group)}, pid {pid}, epoch {epoch}, " \
               f"generation {generation}, member {short(member)}, instance {short(instance)}, " \
               f"{[(short(n), [(p, o, len(m or '')) for p, o, m in ps]) for n, ps in topics]})"
        r = self.call(TXN_OFFSET_COMMIT, version, {
            "transactional_id": txn_id, "group_id": group, "producer_id": pid, "producer_epoch": epoch,
            "generation_id": generation, "member_id": member, "group_instance_id": instance,
            "topics": [{"name": n, "partitions": [
                {"partition_index": p, "committed_offset": o, "committed_leader_epoch": -1, "committed_metadata": m}
                for p, o, m in ps]} for n, ps in topics]}, what)
        answered = [(t.name, [p.partition_index for p in t.partitions]) for t in r.topics]
        assert answered == [(n, [p for p, _, _ in ps]) for n, ps in topics], f"{what}: answered {answered}"
        note(f"  -> {[[name(int(p.error_code)) for p in t.partitions] for t in r.topics]}")
        def allowed_for(n: str, p: int, meta: str | None) -> Expect:
            if not topic_exists(n, p):
                return exact(E.unknown_topic_or_partition)
            if group == "":
                return exact(E.invalid_group_id)
            # Kafka verifies the producer with its transaction coordinator first (KIP-890:
            # CoordinatorRuntime.scheduleTransactionalWriteOperation), then checks the member.
            verification = (E.invalid_producer_id_mapping, E.invalid_producer_epoch, E.producer_fenced,
                            E.invalid_txn_state)
            if generation >= 0:
                # No member ever joined these groups (old coordinator: UNKNOWN_MEMBER_ID, new: ILLEGAL_GENERATION).
                return exact(E.unknown_member_id, E.illegal_generation, *verification)
            # Accepted by the group (Kafka's "simple group" path), then stored in the producer's
            # transaction; Kafka >= 3.6 verifies the producer with its coordinator first.
            if len((meta or "").encode()) > OFFSET_METADATA_MAX:
                allowed = exact(E.offset_metadata_too_large, *verification)
            else:
                allowed = exact(E.none, E.producer_fenced, E.invalid_producer_epoch, E.invalid_producer_id_mapping,
                                E.invalid_txn_state)
            if member or instance is not None:
                allowed[int(E.unknown_member_id)] = (None, "N")
            return allowed

        # A partition named twice: either entry's outcome (Kafka keeps one of them in a map).
        expected: dict[tuple[str, int], Expect] = {}
        for n, ps in topics:
            for p, _, meta in ps:
                expected[(n, p)] = {**expected.get((n, p), {}), **allowed_for(n, p, meta)}
        for t in r.topics:
            for pr in t.partitions:
                code = int(pr.error_code)
                allowed = expected[(t.name, pr.partition_index)]
                assert code in allowed, (
                    f"{what}: {short(t.name)}-{pr.partition_index} answered {name(code)}, "
                    f"Kafka {[name(c) for c in allowed]}")
                if allowed[code][1]:
                    self.s.deviations[str(allowed[code][1])] += 1

    def op_write_markers(self) -> None:
        pids = [m.pid for m in self.models.values() if m.initialized] + [self.chaos[0]]
        markers = self.draw(st.lists(st.fixed_dictionaries({
            "producer_id": st.one_of(st.sampled_from(pids), st.integers(10**12, INT64[1]), st.just(-1),
                                     st.integers(INT64[0], -2)),
            "producer_epoch": st.one_of(st.sampled_from([-1, 0, 1, 32767, -32768]), st.integers(-32768, 32767)),
            "transaction_result": st.booleans(),
            "coordinator_epoch": st.one_of(st.sampled_from([0, -1, INT32[1]]), st.integers(*INT32)),
            "topics": st.lists(st.tuples(
                st.one_of(st.just(TOPIC), st.sampled_from([OFFSETS, TXN_STATE, "nope", ""]), LONG_NAME),
                st.lists(st.one_of(st.integers(0, TOPIC_PARTITIONS), PARTITION_INDEXES), max_size=3)), max_size=3),
        }), max_size=3), "markers")
        self.s.tainted.update(m["producer_id"] for m in markers)
        what = "WriteTxnMarkers(v1, " + str([(m["producer_id"], m["producer_epoch"], m["transaction_result"],
                                              m["coordinator_epoch"], [(short(n), ps) for n, ps in m["topics"]])
                                             for m in markers]) + ")"
        r = self.call(WRITE_MARKERS, 1, {"markers": [
            {**m, "topics": [{"name": n, "partition_indexes": ps} for n, ps in m["topics"]]} for m in markers]}, what)
        note(f"  -> {[[(t.name[:20], [(p.partition_index, name(int(p.error_code))) for p in t.partitions]) for t in m.topics] for m in r.markers]}")
        assert [m.producer_id for m in r.markers] == [m["producer_id"] for m in markers], f"{what}: {r}"
        for got, m in zip(r.markers, markers, strict=True):
            codes = {(t.name, p.partition_index): int(p.error_code) for t in got.topics for p in t.partitions}
            assert set(codes) == {(n, p) for n, ps in m["topics"] for p in ps}, f"{what}: {got}"
            for (n, p), code in codes.items():
                if not topic_exists(n, p):
                    assert code == E.unknown_topic_or_partition, f"{what}: {n}-{p} answered {name(code)}"

    def op_describe_producers(self) -> None:
        topics = self.draw(st.lists(st.tuples(TOPIC_NAMES, st.lists(PARTITION_INDEXES, max_size=4)), max_size=3),
                           "topics")
        what = f"DescribeProducers({[(short(n), ps) for n, ps in topics]})"
        r = self.call(DESCRIBE_PRODUCERS, 0, {"topics": [{"name": n, "partition_indexes": ps} for n, ps in topics]},
                      what)
        assert [(t.name, [p.partition_index for p in t.partitions]) for t in r.topics] == topics, f"{what}: {r}"
        for t in r.topics:
            for p in t.partitions:
                code = int(p.error_code)
                if not kafka_valid_topic(t.name):
                    assert code in (E.invalid_topic_exception, E.unknown_topic_or_partition), f"{what}: {name(code)}"
                    if code == E.unknown_topic_or_partition:
                        self.s.deviations["I"] += 1
                elif topic_exists(t.name, p.partition_index):
                    assert code == E.none, f"{what}: {t.name}-{p.partition_index} answered {name(code)}"
                else:
                    assert code == E.unknown_topic_or_partition, f"{what}: {t.name}-{p.partition_index} {name(code)}"
                if code != E.none:
                    assert not p.active_producers, f"{what}: producers of a refused partition: {p}"

    def op_describe_transactions(self) -> None:
        keys = [self.driving] if self.driving else self.draw(
            st.lists(st.sampled_from(["a", "a", "b", "b", "ghost", "empty", "chaos"]), max_size=5), "describe")
        what = f"DescribeTransactions({keys})"
        note(what)
        self.s.ops["DescribeTransactions"] += 1
        got = describe(self.s.wire, *(self.ids[k] for k in keys))
        for key, d in zip(keys, got, strict=True):
            if key == "empty":
                assert d.error_code in (E.invalid_request, E.transactional_id_not_found), f"{what}: {d}"
                if d.error_code != E.invalid_request:
                    self.s.deviations["E"] += 1
            elif key == "ghost" or (key in self.models and not self.models[key].initialized):
                assert d.error_code == E.transactional_id_not_found, f"{what}: {d}"
            elif key == "chaos":
                assert d.error_code in (E.none, E.transactional_id_not_found), f"{what}: {d}"
                if d.error_code == E.none:
                    assert d.state in KAFKA_STATES and d.producer_id == self.chaos[0], f"{what}: {d}, {self.chaos}"
            else:
                for cand in self.models[key].candidates():
                    if cand.matches(d):
                        self.s.count_timeout(cand, d)
                        self.models[key] = cand
                        self.s.visited[cand.state] += 1
                        break
                else:
                    pytest.fail(f"{what}: {key} is {d}; model {self.models[key].candidates()}")

    def op_list_transactions(self) -> None:
        version = self.version(LIST_TXNS)
        states = self.draw(st.lists(st.one_of(st.sampled_from(sorted(KAFKA_STATES)),
                                               st.sampled_from(["", "ongoing", "bogus", "EMPTY", "Empty "]),
                                               WEIRD_TEXT), max_size=4), "state filters")
        pids = [m.pid for m in self.models.values() if m.initialized]
        pid_filters = self.draw(st.lists(st.one_of(st.sampled_from(pids or [-1]), st.just(-1),
                                                   st.integers(*INT64)), max_size=3), "pid filters")
        duration = self.draw(st.one_of(st.just(-1), st.just(0), st.integers(*INT64)), "duration")
        what = f"ListTransactions(v{version}, states {[short(s) for s in states]}, pids {pid_filters}, " \
               f"duration {duration if version >= 1 else '-'})"
        r = self.call(LIST_TXNS, version, {"state_filters": states, "producer_id_filters": pid_filters,
                                           "duration_filter": duration}, what)
        assert r.error_code == E.none, f"{what}: {name(int(r.error_code))}"
        unknown = set(r.unknown_state_filters)
        kafka_unknown = set(states) - KAFKA_STATES
        if "PrepareEpochFence" in unknown and "PrepareEpochFence" in states:
            self.s.deviations["J"] += 1
            unknown.discard("PrepareEpochFence")
        assert unknown == kafka_unknown, f"{what}: unknown filters {sorted(unknown)}, Kafka {sorted(kafka_unknown)}"
        listed = {}
        for ts in r.transaction_states:
            assert ts.transaction_state in KAFKA_STATES, f"{what}: {ts}"
            assert not states or ts.transaction_state in states, f"{what}: {ts} is not in the state filter"
            assert not pid_filters or ts.producer_id in pid_filters, f"{what}: {ts} is not in the producer filter"
            assert ts.transactional_id not in listed, f"{what}: listed twice: {ts}"
            listed[ts.transactional_id] = ts
        for key, t in self.models.items():
            if not t.initialized:
                assert t.txn_id not in listed, f"{what}: lists uninitialized {short(t.txn_id)}"
                continue
            cands = t.candidates()
            entry = listed.get(t.txn_id)
            if entry is not None:
                assert any((entry.producer_id, entry.transaction_state) == (c.pid, c.state) for c in cands), (
                    f"{what}: lists {entry}; model {cands}")
            if version == 0 or duration == -1:  # (Kafka also lists idle ids for a duration filter: no check)
                for c in cands:
                    if (not states or c.state in states) and (not pid_filters or c.pid in pid_filters):
                        if len(cands) == 1:
                            assert entry is not None, f"{what}: {key} {short(t.txn_id)} ({c.state}) not listed"

    def op_find_coordinator(self) -> None:
        version = self.version(FIND_COORDINATOR)
        key = self.ids[self.draw(st.sampled_from(list(self.ids)), "key")]
        key_type = self.draw(st.one_of(st.just(1), st.just(1), st.just(0), st.integers(-128, -1), st.integers(3, 127)),
                             "key type")
        what = f"FindCoordinator(v{version}, {short(key)}, type {key_type if version else '-'})"
        r = self.call(FIND_COORDINATOR, version, {"key": key, "key_type": key_type}, what)
        code = int(r.error_code)
        if version == 0 or key_type in (0, 1):
            if version > 0 and key_type == 1:
                assert code == E.none, f"{what}: {name(code)}"
            if code == E.none:
                assert (r.node_id, r.host, r.port) == (1, "127.0.0.1", self.s.broker.port), f"{what}: {r}"
        else:
            assert code == E.invalid_request, f"{what}: {name(code)}"

    def op_drive(self) -> None:
        """A right call for the next step of a's or b's transaction, so that the garbage meets
        every state (each op still draws its version and other arguments)."""
        key = str(self.draw(st.sampled_from(["a", "a", "b", "chaos"]), "drive"))
        pick = int(self.draw(st.integers(0, 59), "drive op"))
        bundle = self.data.draw(DRIVE_ARGS, label="drive args")
        t = self.model(key)
        if key == "chaos":  # a short timeout, then a partition: the broker aborts it by itself
            op = "op_add_partitions" if self.chaos[0] >= 0 and pick % 2 else "op_init"
        elif not t.initialized:
            op = "op_init"
        elif t.state in PREPARE:
            op = "op_describe_transactions"
        elif t.state == "Ongoing":
            ops = ["op_end_txn", "op_end_txn", "op_add_partitions", "op_add_offsets", "op_txn_offset_commit"]
            op = ops[pick % len(ops)]
        else:
            ops = ["op_add_partitions", "op_add_partitions", "op_add_offsets", "op_init"]
            op = ops[pick % len(ops)]
        self.driving, self.bundle = key, bundle
        try:
            getattr(self, op)()
        finally:
            self.driving, self.bundle = None, None

    RaceRequest = tuple[str, int, int, dict[str, Any], Callable[[Txn], Expect]]

    def race_request(self, t: Txn, kind: str) -> RaceRequest:
        """A right request of `kind` for `t` as it is now: (label, api, version, body, Kafka's answers)."""
        txn_id, pid, epoch = t.txn_id, t.pid, t.epoch
        if kind in ("commit", "abort"):
            v = self.version(END_TXN)
            return (f"EndTxn(v{v}, {kind})", END_TXN, v, {"transactional_id": txn_id, "producer_id": pid,
                                                           "producer_epoch": epoch, "committed": kind == "commit"},
                    lambda c: exp_end(c, pid, epoch, kind == "commit", v < 2))
        if kind == "add":
            v = self.version(ADD_PARTITIONS)
            ps = self.draw(st.lists(st.integers(0, TOPIC_PARTITIONS - 1), min_size=1, max_size=2), "race partitions")
            wanted = frozenset((TOPIC, p) for p in ps)
            return (f"AddPartitionsToTxn(v{v}, {ps})", ADD_PARTITIONS, v, {
                "v3_and_below_transactional_id": txn_id, "v3_and_below_producer_id": pid,
                "v3_and_below_producer_epoch": epoch, "v3_and_below_topics": [{"name": TOPIC, "partitions": ps}]},
                lambda c: exp_add(c, pid, epoch, wanted, v < 2))
        if kind == "offsets":
            v = self.version(ADD_OFFSETS)
            return (f"AddOffsetsToTxn(v{v})", ADD_OFFSETS, v, {"transactional_id": txn_id, "producer_id": pid,
                                                                "producer_epoch": epoch, "group_id": "race"},
                    lambda c: exp_add(c, pid, epoch, frozenset({(OFFSETS, 0)}), v < 2))
        # A new instance (no producer id: a KIP-360 pair could meet bug C in a race).
        v = self.version(INIT_PRODUCER_ID)
        timeout = int(self.draw(TIMEOUTS_VALID, "timeout"))
        return (f"InitProducerId(v{v}, timeout {timeout})", INIT_PRODUCER_ID, v, {
            "transactional_id": txn_id, "transaction_timeout": timeout, "producer_id": -1, "producer_epoch": -1},
            lambda c: exp_init(c, v, timeout, -1, -1))

    def op_race(self) -> None:
        """Two right calls for one transactional id from two connections at once. The answers
        must be those of one of the two serial orders, the second call possibly refused with
        CONCURRENT_TRANSACTIONS while the first one's state is being written; what
        DescribeTransactions shows afterwards must be the outcome of that order."""
        key = str(self.draw(st.sampled_from(["a", "b"]), "race target"))
        t = self.models[key]
        if not t.initialized:
            return
        kinds = ["commit", "abort", "add", "add", "offsets", "init"]
        first = self.race_request(t, self.draw(st.sampled_from(kinds), "race 1"))
        second = self.race_request(t, self.draw(st.sampled_from(kinds), "race 2"))
        what = f"race on {key}={short(t.txn_id)} ({t.state}): {first[0]} || {second[0]}"
        note(what)
        self.s.ops["race"] += 1
        self.s.wire.send(*first[1:4])
        self.s.wire2.send(*second[1:4])
        r1 = self.s.wire.receive(first[1], first[2])
        r2 = self.s.wire2.receive(second[1], second[2])
        c1, c2 = code_of(first[1], r1), code_of(second[1], r2)
        note(f"  -> {name(c1)} || {name(c2)}")

        def step(req: Example.RaceRequest, state: Txn, code: int, r: Any) -> Txn | None:
            """The state after `req` answered `code` in `state` (None: Kafka would not answer that)."""
            allowed = req[4](state)
            if code not in allowed:
                return None
            result = allowed[code][0]
            new = state if result is None else result(r)
            if req[1] == INIT_PRODUCER_ID and code == E.none and (r.producer_id, r.producer_epoch) != (new.pid, new.epoch):
                return None
            return new

        finals: list[Txn] = []
        for (x, rx, cx), (y, ry, cy) in (((first, r1, c1), (second, r2, c2)), ((second, r2, c2), (first, r1, c1))):
            for c in t.candidates():
                mid = step(x, c, cx, rx)
                if mid is None:
                    continue
                if cy == E.concurrent_transactions and mid != c:
                    finals.append(mid)  # y arrived while x's new state was being written
                for m in mid.candidates():
                    end = step(y, m, cy, ry)
                    if end is not None:
                        finals.append(end)
        if not finals:
            pytest.fail(f"{what}: answered {name(c1)} || {name(c2)}; no serial order gives that in Kafka (model {t})")
        possible: list[tuple[Txn, str | None]] = []
        for f in finals:
            possible += [(c, None) for c in f.candidates() if (c, None) not in possible]
        self.observe(key, possible, what)
        self.s.visited[self.models[key].state] += 1

    def op_pause(self) -> None:
        """Let timers run: chaos transactions time out, markers finish."""
        ms = self.draw(st.sampled_from([0, 20, 150, 400]), "pause ms")
        note(f"pause {ms} ms")
        time.sleep(ms / 1000)

    OPS = ["op_init", "op_init", "op_init", "op_add_partitions", "op_add_partitions", "op_add_partitions",
           "op_add_offsets", "op_end_txn", "op_end_txn", "op_end_txn", "op_txn_offset_commit", "op_write_markers",
           "op_describe_producers", "op_describe_transactions", "op_describe_transactions", "op_list_transactions",
           "op_find_coordinator", "op_pause", "op_race", "op_race", "op_drive", "op_drive", "op_drive", "op_drive", "op_drive"]

    def run(self) -> None:
        steps = self.draw(st.integers(5, 30), "steps")
        for _ in range(steps):
            op = self.draw(st.sampled_from(self.OPS), "op")
            getattr(self, op)()
        self.settle()

    def settle(self) -> None:
        """Every transaction ends its markers: Prepare* becomes Complete* (no hang)."""
        for key, t in self.models.items():
            if t.state in PREPARE:
                d = wait_state(self.s.wire, t.txn_id, {PREPARE[t.state]})
                done = t.candidates()[1]
                assert done.matches(d), f"{short(t.txn_id)}: {d}, model {done}"
                self.models[key] = done
                self.s.visited[done.state] += 1
            if self.models[key].initialized:
                self.s.final[t.txn_id] = self.models[key]


FUZZ = settings(max_examples=int(os.environ.get("DCMIRROR_FUZZ_TXN_EXAMPLES", "200")), deadline=None, database=None,
                print_blob=True, report_multiple_bugs=False, derandomize=not os.environ.get("DCMIRROR_FUZZ_EXPLORE"),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def test_fuzzed_transaction_calls_get_kafkas_answers(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory("fuzz-txn", **BROKER_CONFIG)
    ck_create_topic(broker.bootstrap, TOPIC, TOPIC_PARTITIONS)
    session = Session(broker)
    wait_for_coordinator(session.wire)
    t0 = time.monotonic()

    @FUZZ
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        Example(session, data).run()
        session.health.check()

    run()
    fuzz_s = time.monotonic() - t0
    print(f"\n{session.examples} examples, {sum(session.wire.calls.values())} requests in {fuzz_s:.1f}s; "
          f"ops {dict(session.ops)}")
    print(f"model states reached: {dict(session.visited)}")
    print("tolerated deviations from Kafka (strict-xfail reproductions below): "
          + (", ".join(f"{k}x{n} ({DEVIATIONS[k]})" for k, n in sorted(session.deviations.items())) or "none"))
    timed_out = broker.log_text().count("timed out after")
    print(f"transactions the broker aborted on their timeout meanwhile: {timed_out}")
    assert timed_out > 0, "no chaos transaction ever timed out: the timer path was not exercised"
    driven = list(session.final.values())
    assert len(driven) >= 20, f"only {len(driven)} transactional ids were initialized"
    assert set(session.visited) >= {"Empty", "Ongoing", *PREPARE, *PREPARE.values()}, (
        f"the fuzzer never reached some states: {session.visited}")
    session.health.check()
    session.wire.close()
    session.wire2.close()

    # The coordinator's state survives a clean restart: every driven id as the model says
    # (Ongoing ones too: their timeouts are at least a minute).
    broker.restart()
    session.health.check()
    wire = Wire(broker)
    wait_for_coordinator(wire)
    ids = list(session.final)
    for i in range(0, len(ids), 40):
        for d in describe(wire, *ids[i:i + 40]):
            t = session.final[d.transactional_id]
            assert t.matches(d), f"after a restart {short(t.txn_id)} is {d}; before it was {t}"
    wire.close()
    session.health.check()

    # librdkafka still commits and aborts, with a fresh and with a fuzzed transactional id
    # (left Ongoing, Empty or Complete*: init_transactions fences and aborts what is open).
    fuzzed = next(t.txn_id for t in reversed(driven) if t.txn_id.endswith("-a") and t.pid not in session.tainted)
    group = f"final-{uuid.uuid4().hex[:6]}"
    expected_committed = []
    for round_, txn_id in enumerate((f"final-{uuid.uuid4().hex[:6]}", fuzzed)):
        p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": txn_id, "linger.ms": 5})
        p.init_transactions(30)
        p.begin_transaction()
        for i in range(6):
            p.produce(TOPIC, value=f"r{round_}-c1-{i}".encode(), partition=i % TOPIC_PARTITIONS)
        p.commit_transaction(30)
        p.begin_transaction()
        for i in range(4):
            p.produce(TOPIC, value=f"r{round_}-a-{i}".encode(), partition=i % TOPIC_PARTITIONS)
        p.flush(30)
        p.abort_transaction(30)
        p.begin_transaction()
        for i in range(3):
            p.produce(TOPIC, value=f"r{round_}-c2-{i}".encode(), partition=i % TOPIC_PARTITIONS)
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
        p.send_offsets_to_transaction([TopicPartition(TOPIC, 0, 40 + round_)], c.consumer_group_metadata(), 30)
        c.close()
        p.commit_transaction(30)
        expected_committed += [f"r{round_}-c1-{i}" for i in range(6)] + [f"r{round_}-c2-{i}" for i in range(3)]
    committed = read_values(broker.bootstrap, "read_committed", expect=18)
    assert sorted(v.decode() for v in committed) == sorted(expected_committed)
    uncommitted = read_values(broker.bootstrap, "read_uncommitted", expect=26)
    assert len(uncommitted) == 26, sorted(uncommitted)
    check = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    (tp,) = check.committed([TopicPartition(TOPIC, 0)], timeout=10)
    check.close()
    assert tp.offset == 41
    session.health.check()


# ---- exact reproductions of what the fuzzer found ----------------------------------------


@pytest.fixture(scope="module")
def repro(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Wire]:
    proc = BrokerProcess(tmp_path_factory.mktemp("txn-repro") / "broker", **BROKER_CONFIG).start()
    ck_create_topic(proc.bootstrap, TOPIC, TOPIC_PARTITIONS)
    wire = Wire(proc)
    wait_for_coordinator(wire)
    yield wire
    wire.close()
    Health(proc).check()
    proc.stop()


def init(wire: Wire, txn_id: str, pid: int = -1, epoch: int = -1, *, version: int = 4,
         timeout: int = 60_000) -> Any:
    return wire.call(INIT_PRODUCER_ID, version, {"transactional_id": txn_id, "transaction_timeout": timeout,
                                                 "producer_id": pid, "producer_epoch": epoch})


def add_partitions(wire: Wire, txn_id: str, pid: int, epoch: int, topic: str = TOPIC, partition: int = 0, *,
                   version: int = 3) -> int:
    r = wire.call(ADD_PARTITIONS, version, {
        "v3_and_below_transactional_id": txn_id, "v3_and_below_producer_id": pid, "v3_and_below_producer_epoch": epoch,
        "v3_and_below_topics": [{"name": topic, "partitions": [partition]}]})
    return int(r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code)


def new_id(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}"


def bug_a_empty_transactional_id(wire: Wire) -> None:
    # Kafka: TransactionCoordinator.handleInitProducerId answers INVALID_REQUEST for "".
    r = init(wire, "")
    assert r.error_code == E.invalid_request, f"InitProducerId('') answered {r}"


def bug_b1_epoch_without_producer_id(wire: Wire) -> None:
    # Kafka: KafkaApis.handleInitProducerIdRequest, (NO_PRODUCER_ID, epoch) -> INVALID_REQUEST.
    r = init(wire, new_id("b1"), -1, 5)
    assert r.error_code == E.invalid_request, r


def bug_b2_producer_id_without_epoch(wire: Wire) -> None:
    r = init(wire, new_id("b2"), 1234, -1)
    assert r.error_code == E.invalid_request, r


def bug_b3_negative_producer_id_is_ignored(wire: Wire) -> None:
    # Kafka: an expected producer id that is not the id's -> PRODUCER_FENCED; the broker
    # ignores any producer id < 0 and bumps the epoch of the real producer.
    txn_id = new_id("b3")
    assert init(wire, txn_id).error_code == E.none
    r = init(wire, txn_id, -7, 0)
    assert r.error_code == E.producer_fenced, r


def bug_c1_zombie_regains_the_epoch(wire: Wire) -> None:
    # Kafka: an InitProducerId without producer id (a new instance) sets lastProducerEpoch to
    # -1 (TransactionMetadata.prepareIncrementProducerEpoch), so the old instance presenting
    # (pid, old epoch) is fenced. The broker keeps last = old epoch and answers it NONE with
    # the new instance's epoch: the zombie is not fenced.
    txn_id = new_id("c1")
    first = init(wire, txn_id)
    second = init(wire, txn_id)
    assert (second.producer_id, second.producer_epoch) == (first.producer_id, 1)
    zombie = init(wire, txn_id, first.producer_id, 0)
    assert zombie.error_code == E.producer_fenced, f"the fenced instance got {zombie}"


def bug_c2_timed_out_producer_regains_the_epoch(wire: Wire) -> None:
    # Kafka: the timeout abort is an epoch fence that also sets lastProducerEpoch to -1
    # (TransactionCoordinator.endTransaction, isEpochFence).
    txn_id = new_id("c2")
    r = init(wire, txn_id, timeout=200)
    assert add_partitions(wire, txn_id, r.producer_id, 0) == E.none
    wait_state(wire, txn_id, {"CompleteAbort"})
    again = init(wire, txn_id, r.producer_id, 0)
    assert again.error_code == E.producer_fenced, f"the timed-out producer got {again}"


def bug_d1_add_partitions_v1_fenced_code(wire: Wire) -> None:
    txn_id = new_id("d1")
    r = init(wire, txn_id)
    assert add_partitions(wire, txn_id, r.producer_id, 5, version=1) == E.invalid_producer_epoch


def bug_d2_add_offsets_v1_fenced_code(wire: Wire) -> None:
    txn_id = new_id("d2")
    r = init(wire, txn_id)
    got = wire.call(ADD_OFFSETS, 1, {"transactional_id": txn_id, "producer_id": r.producer_id, "producer_epoch": 5,
                                     "group_id": "g"})
    assert got.error_code == E.invalid_producer_epoch, got


def bug_d3_init_v3_fenced_code(wire: Wire) -> None:
    txn_id = new_id("d3")
    r = init(wire, txn_id)
    got = init(wire, txn_id, r.producer_id, 5, version=3)
    assert got.error_code == E.invalid_producer_epoch, got


def bug_t_transaction_timeout_truncated(wire: Wire) -> None:
    # txn_handlers._ms: int(timedelta.total_seconds() * 1000) is 1000 for 1001 ms (5907 of the
    # first million values lose a millisecond); with transaction.max.timeout.ms=1000 a 1001 ms
    # timeout would even be accepted.
    txn_id = new_id("t")
    assert init(wire, txn_id, timeout=1001).error_code == E.none
    (d,) = describe(wire, txn_id)
    assert d.timeout_ms == 1001, d


def dev_e1_add_partitions_empty_id(wire: Wire) -> None:
    assert add_partitions(wire, "", 0, 0) == E.invalid_request


def dev_e2_add_offsets_empty_id(wire: Wire) -> None:
    got = wire.call(ADD_OFFSETS, 3, {"transactional_id": "", "producer_id": 0, "producer_epoch": 0, "group_id": "g"})
    assert got.error_code == E.invalid_request, got


def dev_e3_end_txn_empty_id(wire: Wire) -> None:
    got = wire.call(END_TXN, 3, {"transactional_id": "", "producer_id": 0, "producer_epoch": 0, "committed": True})
    assert got.error_code == E.invalid_request, got


def dev_e4_describe_empty_id(wire: Wire) -> None:
    (d,) = describe(wire, "")
    assert d.error_code == E.invalid_request, d


def dev_g_internal_topic_in_transaction(wire: Wire) -> None:
    # Kafka: internal topics are filtered out of the authorized ones: TOPIC_AUTHORIZATION_FAILED.
    txn_id = new_id("g")
    r = init(wire, txn_id)
    assert add_partitions(wire, txn_id, r.producer_id, 0, OFFSETS, 0) == E.topic_authorization_failed


def dev_i_describe_producers_invalid_topic(wire: Wire) -> None:
    r = wire.call(DESCRIBE_PRODUCERS, 0, {"topics": [{"name": "a b", "partition_indexes": [0]}]})
    assert r.topics[0].partitions[0].error_code == E.invalid_topic_exception, r


def dev_j_prepare_epoch_fence_filter(wire: Wire) -> None:
    r = wire.call(LIST_TXNS, 1, {"state_filters": ["PrepareEpochFence"], "producer_id_filters": [],
                                 "duration_filter": -1})
    assert r.unknown_state_filters == (), r


def dev_k_txn_offset_commit_without_producer_id(wire: Wire) -> None:
    # The broker wrote a transactional batch with producer id -1, the log refused it, and the
    # client was told COORDINATOR_NOT_AVAILABLE: retriable, so it retried what can never work.
    # Kafka commits it as a plain offset commit (GroupMetadataManager.storeOffsets:
    # isTxnOffsetCommit = producerId != NO_PRODUCER_ID) or, with KIP-890 verification,
    # refuses it for the producer id, as the broker now does (verified first).
    r = wire.call(TXN_OFFSET_COMMIT, 3, {
        "transactional_id": new_id("k"), "group_id": new_id("k-group"), "producer_id": -1, "producer_epoch": -1,
        "generation_id": -1, "member_id": "", "group_instance_id": None,
        "topics": [{"name": TOPIC, "partitions": [{"partition_index": 0, "committed_offset": 5,
                                                   "committed_leader_epoch": -1, "committed_metadata": None}]}]})
    code = r.topics[0].partitions[0].error_code
    assert code in (E.none, E.invalid_producer_id_mapping, E.invalid_txn_state), r


def dev_m_retried_init_resets_the_transaction(wire: Wire) -> None:
    # Kafka: a retried KIP-360 bump (expected epoch == lastProducerEpoch) still transitions to
    # Empty with the request's timeout; the broker answers without writing anything, so the
    # id stays CompleteCommit and a later EndTxn(commit) is answered NONE.
    txn_id = new_id("m")
    first = init(wire, txn_id)
    pid = first.producer_id
    assert init(wire, txn_id, pid, 0).producer_epoch == 1
    assert add_partitions(wire, txn_id, pid, 1) == E.none
    end = wire.call(END_TXN, 3, {"transactional_id": txn_id, "producer_id": pid, "producer_epoch": 1,
                                 "committed": True})
    assert end.error_code == E.none
    wait_state(wire, txn_id, {"CompleteCommit"})
    retry = init(wire, txn_id, pid, 0, timeout=70_000)
    assert (retry.error_code, retry.producer_epoch) == (E.none, 1)
    (d,) = describe(wire, txn_id)
    assert (d.state, d.timeout_ms) == ("Empty", 70_000), d


def _case(fn: Callable[[Wire], None], reason: str) -> Any:
    # Only a wrong answer counts (raises=AssertionError): a dropped connection or a hang still fails.
    return pytest.param(fn, id=fn.__name__, marks=pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason))


def _fixed(fn: Callable[[Wire], None]) -> Any:
    return pytest.param(fn, id=fn.__name__)


# What the fuzzer found and the broker now answers as Kafka does (each failed before its fix).
# The fuzzing model above still tolerates the old answers where it counts deviations.
@pytest.mark.parametrize("case", [
    _fixed(bug_b1_epoch_without_producer_id),
    _fixed(bug_b2_producer_id_without_epoch),
    _fixed(bug_b3_negative_producer_id_is_ignored),
    _fixed(bug_c1_zombie_regains_the_epoch),
    _fixed(bug_c2_timed_out_producer_regains_the_epoch),
    _fixed(bug_d1_add_partitions_v1_fenced_code),
    _fixed(bug_d2_add_offsets_v1_fenced_code),
    _fixed(bug_d3_init_v3_fenced_code),
    _fixed(bug_t_transaction_timeout_truncated),
    _fixed(dev_e1_add_partitions_empty_id),
    _fixed(dev_e2_add_offsets_empty_id),
    _fixed(dev_e3_end_txn_empty_id),
    _fixed(dev_e4_describe_empty_id),
    _fixed(dev_j_prepare_epoch_fence_filter),
    _fixed(dev_m_retried_init_resets_the_transaction),
    _fixed(dev_k_txn_offset_commit_without_producer_id),
    # Last: it makes "" a transactional id on a broker that accepted it (the E cases need it unknown).
    _fixed(bug_a_empty_transactional_id),
])
def test_fuzzer_finding_answered_as_kafka(repro: Wire, case: Callable[[Wire], None]) -> None:
    case(repro)


@pytest.mark.parametrize("case", [
    _case(dev_g_internal_topic_in_transaction, DEVIATIONS["G"]),
    _case(dev_i_describe_producers_invalid_topic, DEVIATIONS["I"]),
])
def test_known_deviation(repro: Wire, case: Callable[[Wire], None]) -> None:
    case(repro)
