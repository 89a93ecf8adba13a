"""Fuzzing a real broker process over raw sockets (docs/protocol.md, "Frames and headers").

What must hold whatever arrives on a connection:
- the broker process stays up, and a fresh connection still completes an ApiVersions v0
  roundtrip; a healthy connection opened before the fuzzing keeps working in between;
- a frame whose declared size exceeds socket.request.max.bytes, a negative size, an unknown
  API key or version, or a body that does not parse closes that connection (no response
  bytes) and nothing else; the cap is reported in the broker log;
- ApiVersions with an unsupported version is answered in v0 format with error 35 and the
  supported list; corrupt record batches in a Produce get Kafka's exact error (CORRUPT_MESSAGE
  or INVALID_RECORD, as ProduceRequest.validateRecords and the batch checks answer);
- memory stays bounded after a stream of frames declaring 2 GiB.

Handler semantics are fuzzed in-process (tests/unit/test_protocol_fuzz.py); here a request
whose body parses must simply be answered in order (or not at all for acks=0), so the
expected outcome of each generated frame comes from the request parser. Requests that may
legitimately block (Fetch long polls, JoinGroup/SyncGroup barriers) are not sent here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import socket
import struct
import threading
import time
import typing
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer
from crc32c import crc32c
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st
from kio.serial import entity_reader, entity_writer

from cluster.broker.broker import SUPPORTED_APIS
from cluster.protocol import messages
from cluster.protocol.errors import ProtocolError
from cluster.protocol.legacy import decode_legacy_produce
from tests.cluster_helpers import create_topic
from tests.fuzzing import mutate
from tests.harness import BrokerProcess

CAP = 1_048_576
INT32_MAX = 2**31 - 1
API_VERSIONS = 18
PRODUCE = 0
UNSUPPORTED_VERSION = 35
CORRUPT_MESSAGE = 2
RSS_LIMIT_KB = 300 * 1024
IO_TIMEOUT_S = 5.0
# Requests that may wait (long poll, group barriers) are not fuzzed over the network.
BLOCKING_APIS = {1, 11, 14}
EXPECTED_API_LIST = [(k, lo, hi) for k, (lo, hi) in sorted(SUPPORTED_APIS.items())]

# Derandomized so CI sees the same cases every run (the coverage check below cannot flake);
# DCMIRROR_FUZZ_EXPLORE=1 draws fresh cases, and a failure prints the blob to replay it.
FUZZ = settings(max_examples=200, deadline=None, print_blob=True, report_multiple_bugs=False,
                derandomize=not os.environ.get("DCMIRROR_FUZZ_EXPLORE"),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

I32 = struct.Struct(">i")


# ---- broker and socket helpers -----------------------------------------------------------


def start_broker(broker_factory: Callable[..., BrokerProcess], **extra: object) -> BrokerProcess:
    overrides: dict[str, object] = {
        "socket.request.max.bytes": CAP,
        "offsets.topic.num.partitions": 1,
        "group.initial.rebalance.delay.ms": 0,
        "max.topic.partitions": 8,
        **extra,
    }
    return broker_factory("fuzz", **overrides)


def create_topics(broker: BrokerProcess, *names: str) -> None:
    """Produce does not create topics (Kafka creates them on Metadata only): the
    topics a test produces to are created first, and their leader is known."""
    for name in names:
        create_topic(broker.bootstrap, name, 1, 1)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "fuzz-probe"})
    try:
        for name in names:
            for _ in range(100):
                md = consumer.list_topics(name, timeout=IO_TIMEOUT_S).topics.get(name)
                if md is not None and md.error is None and md.partitions and md.partitions[0].leader >= 0:
                    break
                time.sleep(0.05)
            else:
                raise AssertionError(f"topic {name} has no leader")
    finally:
        consumer.close()


def connect(broker: BrokerProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", broker.port), timeout=IO_TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def send_quietly(sock: socket.socket, data: bytes) -> None:
    """Send; the broker may already have closed (that is asserted separately)."""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        sock.sendall(data)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def read_response(sock: socket.socket) -> bytes:
    """One size-prefixed response, without its size prefix."""
    (size,) = I32.unpack(recv_exact(sock, 4))
    assert 4 <= size <= 64 << 20, f"response declares {size} bytes"
    return recv_exact(sock, size)


def assert_closed_without_response(sock: socket.socket, broker: BrokerProcess) -> None:
    """The broker closes the connection and sends nothing at all first."""
    got = b""
    closed = False
    deadline = time.monotonic() + IO_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                closed = True
                break
            got += chunk
            break  # a response where none is due: fail at once
    except ConnectionResetError:
        closed = True
    except TimeoutError:
        pass
    assert got == b"" and closed, (
        f"expected the connection closed without a response; got {got[:64].hex() or 'nothing'}, "
        f"{'closed' if closed else f'still open after {IO_TIMEOUT_S}s'}\n{log_tail(broker)}")


def log_tail(broker: BrokerProcess, n: int = 4000) -> str:
    return "---- broker log ----\n" + broker.log_text()[-n:]


def header(api: int, version: int, corr: int, client_id: bytes | None = b"fuzz", flexible: bool = False) -> bytes:
    out = struct.pack(">hhi", api, version, corr)
    out += struct.pack(">h", -1) if client_id is None else struct.pack(">h", len(client_id)) + client_id
    return out + (b"\x00" if flexible else b"")


def frame(body: bytes) -> bytes:
    return I32.pack(len(body)) + body


def api_versions_v0(corr: int) -> bytes:
    return frame(header(API_VERSIONS, 0, corr))


def parse_api_versions_v0(body: bytes) -> tuple[int, int, list[tuple[int, int, int]]]:
    """(correlation id, error code, api list) of a v0 ApiVersions response body."""
    corr, error, n = struct.unpack_from(">ihi", body)
    assert len(body) == 10 + 6 * n, f"not a v0 ApiVersions response: {body.hex()}"
    return corr, error, [struct.unpack_from(">hhh", body, 10 + 6 * i) for i in range(n)]


def api_versions_roundtrip(sock: socket.socket, corr: int) -> None:
    sock.sendall(api_versions_v0(corr))
    assert parse_api_versions_v0(read_response(sock)) == (corr, 0, EXPECTED_API_LIST)


class Health:
    """The broker is alive, a fresh connection works, and so does the long-lived one.

    Also: the broker logged no internal error (a traceback) since the previous check.
    """

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker
        self.healthy = connect(broker)
        self.corr = 1_000_000
        self.log_seen = 0

    def check(self) -> None:
        assert self.broker.proc is not None and self.broker.proc.poll() is None, (
            f"broker exited with {self.broker.proc and self.broker.proc.returncode}\n{log_tail(self.broker)}")
        self.corr += 1
        try:
            with connect(self.broker) as fresh:
                api_versions_roundtrip(fresh, self.corr)
            api_versions_roundtrip(self.healthy, self.corr)
        except (OSError, EOFError) as exc:
            pytest.fail(f"broker stopped answering: {exc!r}\n{log_tail(self.broker)}")
        text = self.broker.log_text()
        new, self.log_seen = text[self.log_seen :], len(text)
        if "Traceback" in new or "internal error" in new:
            pytest.fail("the broker logged an internal error:\n" + new[-6000:])

    def close(self) -> None:
        self.check()
        self.healthy.close()


def rss_kb(broker: BrokerProcess) -> int:
    assert broker.proc is not None
    with open(f"/proc/{broker.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


# ---- requests ----------------------------------------------------------------------------


def zigzag_varint(n: int) -> bytes:
    z = ((n << 1) ^ (n >> 63)) & ((1 << 64) - 1)
    out = bytearray()
    while True:
        b = z & 0x7F
        z >>= 7
        if not z:
            out.append(b)
            return bytes(out)
        out.append(b | 0x80)


def seal_batch(records_section: bytes, count: int, *, last_offset_delta: int | None = None,
               attributes: int = 0, base_offset: int = 0, leader_epoch: int = -1, magic: int = 2) -> bytes:
    """A magic-2 RecordBatch with a correct CRC32C over byte 21 to the end."""
    lod = count - 1 if last_offset_delta is None else last_offset_delta
    ts = 1_700_000_000_000
    after_crc = struct.pack(">hiqqqhii", attributes, lod, ts, ts, -1, -1, -1, count) + records_section
    rest = struct.pack(">ib", leader_epoch, magic) + struct.pack(">I", crc32c(after_crc)) + after_crc
    return struct.pack(">qi", base_offset, len(rest)) + rest


def record(offset_delta: int, key: bytes | None, value: bytes) -> bytes:
    key_part = zigzag_varint(-1) if key is None else zigzag_varint(len(key)) + key
    body = (b"\x00" + zigzag_varint(0) + zigzag_varint(offset_delta) + key_part
            + zigzag_varint(len(value)) + value + zigzag_varint(0))
    return zigzag_varint(len(body)) + body


def batch_of(values: list[bytes]) -> bytes:
    return seal_batch(b"".join(record(i, b"k", v) for i, v in enumerate(values)), len(values))


def produce_v8(corr: int, topic: bytes, records: bytes | None, acks: int = -1) -> bytes:
    body = header(PRODUCE, 8, corr) + struct.pack(">hhi", -1, acks, 10_000)
    body += I32.pack(1) + struct.pack(">h", len(topic)) + topic + I32.pack(1) + I32.pack(0)
    body += I32.pack(-1) if records is None else I32.pack(len(records)) + records
    return frame(body)


def parse_produce_v8(body: bytes, corr: int) -> tuple[int, int]:
    """(error code, base offset) of the single partition of a Produce v8 response."""
    assert I32.unpack_from(body)[0] == corr
    cls = messages.response_schema(PRODUCE, 8)
    value, size = entity_reader(cls)(body, 4)
    assert 4 + size == len(body)
    (topic,) = value.responses
    (part,) = topic.partition_responses
    return int(part.error_code), int(part.base_offset)


def base_requests() -> list[bytes]:
    """One default-valued request frame (without size prefix) per advertised non-blocking API/version."""
    out = []
    for api, (lo, hi) in sorted(SUPPORTED_APIS.items()):
        for version in range(lo, hi + 1):
            if api in BLOCKING_APIS or (api == PRODUCE and version < 3):
                continue
            cls = messages.request_schema(api, version)
            buf = io.BytesIO()
            entity_writer(cls)(buf, messages.build(cls, {}))
            out.append(header(api, version, 7, b"fuzz", cls.__flexible__) + buf.getvalue())
    out.append(produce_v8(7, b"t", batch_of([b"v"]))[4:])
    out.append(header(3, 1, 7) + I32.pack(1) + struct.pack(">h", 1) + b"t")
    return out


BASE_REQUESTS = base_requests()


def expected_outcome(body: bytes) -> str:
    """What the broker must do with a complete frame: "response", "none" or "close".

    "blocking" marks a parseable request that may legitimately wait (not sent).
    """
    if len(body) < 8:
        return "close"
    api, version, _ = struct.unpack_from(">hhi", body)
    try:
        if api == API_VERSIONS:
            if not 0 <= version <= 3:
                return "response"
            h = messages.parse_request_header(body, flexible=version >= 3)
            messages.decode_request(api, version, body, h.body_offset)
            return "response"
        lo, hi = SUPPORTED_APIS.get(api, (1, 0))
        if not lo <= version <= hi:
            return "close"
        if api == PRODUCE and version < 3:
            h = messages.parse_request_header(body, flexible=False)
            read = decode_legacy_produce(version, body, h.body_offset)
            return "none" if read.acks == 0 else "response"
        h = messages.parse_request_header(body, flexible=messages.is_flexible_request(api, version))
        request = messages.decode_request(api, version, body, h.body_offset)
    except ProtocolError:
        return "close"
    if null_in_non_nullable(request):
        return "close"  # Kafka: "non-nullable field ... was serialized as null"
    if api in BLOCKING_APIS:
        return "blocking"
    if api == PRODUCE and request.acks == 0:
        return "none"
    return "response"


def null_in_non_nullable(value: Any) -> bool:
    """Whether a decoded request holds None where its schema does not allow null."""
    hints = typing.get_type_hints(type(value))
    for f in dataclasses.fields(value):
        v = getattr(value, f.name)
        if v is None:
            if type(None) not in typing.get_args(hints[f.name]):
                return True
        elif dataclasses.is_dataclass(v):
            if null_in_non_nullable(v):
                return True
        elif isinstance(v, tuple) and any(dataclasses.is_dataclass(x) and null_in_non_nullable(x) for x in v):
            return True
    return False




@st.composite
def fuzz_cases(draw: Any) -> tuple[str, bytes]:
    """(kind, bytes to send) — kinds decide how the outcome is checked."""
    kind = draw(st.sampled_from(["truncated", "huge", "negative", "unknown", "garbage", "mutated", "null-array"]))
    if kind == "truncated":
        full = frame(draw(st.sampled_from(BASE_REQUESTS)))
        return kind, full[: draw(st.integers(1, len(full) - 1))]
    if kind == "huge":
        size = draw(st.one_of(st.just(INT32_MAX), st.just(CAP + 1), st.integers(CAP + 1, INT32_MAX)))
        return kind, I32.pack(size) + draw(st.binary(max_size=64))
    if kind == "negative":
        return kind, I32.pack(draw(st.integers(-(2**31), -1))) + draw(st.binary(max_size=16))
    if kind == "unknown":
        api = draw(st.integers(-32768, 32767))
        lo, hi = SUPPORTED_APIS.get(api, (1, 0))
        version = draw(st.integers(-32768, 32767))
        assume(api != API_VERSIONS and not lo <= version <= hi)
        return kind, frame(struct.pack(">hhi", api, version, 3) + draw(st.binary(max_size=32)))
    if kind == "garbage":
        api, (lo, hi) = draw(st.sampled_from(sorted(SUPPORTED_APIS.items())))
        version = draw(st.integers(lo, hi))
        return kind, frame(header(api, version, 5, b"g", messages.is_flexible_request(api, version)) + draw(st.binary(max_size=64)))
    if kind == "null-array":
        base = draw(st.sampled_from(BASE_REQUESTS))
        zeros = [i for i in range(14, len(base) - 3) if base[i : i + 4] == b"\x00\x00\x00\x00"]
        assume(zeros)
        i = draw(st.sampled_from(zeros))
        return kind, frame(base[:i] + b"\xff\xff\xff\xff" + base[i + 4 :])
    return kind, frame(mutate(draw(st.sampled_from(BASE_REQUESTS)), draw))


# ---- tests -------------------------------------------------------------------------------


def test_fuzzed_frames_close_only_their_connection(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = start_broker(broker_factory)
    health = Health(broker)
    seen: set[str] = set()

    @FUZZ
    @given(case=fuzz_cases())
    def run(case: tuple[str, bytes]) -> None:
        kind, data = case
        if kind in ("truncated", "huge", "negative", "unknown"):
            expected = {"truncated": "close", "huge": "close", "negative": "close", "unknown": "close"}[kind]
        else:
            expected = expected_outcome(data[4:]) if I32.unpack_from(data)[0] == len(data) - 4 else "close"
            assume(expected != "blocking")
        note(f"{kind}: {data.hex()} -> expect {expected}")
        seen.add(f"{kind}:{expected}")
        with connect(broker) as sock:
            send_quietly(sock, data)
            if kind == "truncated":
                sock.shutdown(socket.SHUT_WR)
            if expected == "close":
                assert_closed_without_response(sock, broker)
            else:
                corr = I32.unpack_from(data, 8)[0]
                # A pipelined ApiVersions must come back after the fuzzed request's answer.
                send_quietly(sock, api_versions_v0(424242))
                try:
                    first = read_response(sock)
                except (EOFError, ConnectionResetError) as exc:
                    pytest.fail(f"connection dropped ({exc!r}) where a {expected} was due\n{log_tail(broker)}")
                if expected == "response":
                    assert I32.unpack_from(first)[0] == corr, first.hex()
                    first = read_response(sock)
                assert parse_api_versions_v0(first) == (424242, 0, EXPECTED_API_LIST)
        health.check()

    run()
    health.close()
    for needed in ("truncated:close", "huge:close", "negative:close", "unknown:close",
                   "garbage:close", "mutated:close", "mutated:response"):
        assert needed in seen, f"the fuzzer never produced {needed}: {sorted(seen)}"


def test_unsupported_api_versions_version_gets_v0_error_35(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = start_broker(broker_factory)
    health = Health(broker)
    with connect(broker) as sock:
        # A client newer than the broker opens with its own latest version (flexible header).
        sock.sendall(frame(header(API_VERSIONS, 99, 31, b"fuzz", flexible=True) + b"\x00\x00\x00"))
        assert parse_api_versions_v0(read_response(sock)) == (31, UNSUPPORTED_VERSION, EXPECTED_API_LIST)
        api_versions_roundtrip(sock, 32)  # the connection stays usable; the client retries lower

    @settings(FUZZ, max_examples=100)
    @given(version=st.one_of(st.integers(4, 32767), st.integers(-32768, -1)),
           corr=st.integers(-(2**31), INT32_MAX), body=st.binary(max_size=48))
    def run(version: int, corr: int, body: bytes) -> None:
        health.healthy.sendall(frame(struct.pack(">hhi", API_VERSIONS, version, corr) + body))
        assert parse_api_versions_v0(read_response(health.healthy)) == (corr, UNSUPPORTED_VERSION, EXPECTED_API_LIST)
        health.check()

    run()
    health.close()


INVALID_RECORD = 87


def kafka_precheck(data: bytes) -> int | None:
    """The partition error Kafka's ProduceRequest.validateRecords gives before the log, or
    None when the payload is exactly one whole batch of magic 2 (then the batch itself is
    validated: CRC, counts, attributes). Walks batches as ByteBufferLogInputStream does: a
    length below 14 or a magic outside 0..2 is CORRUPT_MESSAGE; no whole batch, a first batch
    of magic 0/1, or two batches is INVALID_RECORD."""
    pos = whole = 0
    first_magic = None
    while len(data) - pos >= 12:
        (length,) = I32.unpack_from(data, pos + 8)
        if length < 14:
            return CORRUPT_MESSAGE
        if len(data) - pos < 17:
            break
        magic = struct.unpack_from(">b", data, pos + 16)[0]
        if not 0 <= magic <= 2:
            return CORRUPT_MESSAGE
        if 12 + length > len(data) - pos:
            break
        first_magic = magic if first_magic is None else first_magic
        whole += 1
        pos += 12 + length
    if whole == 0 or first_magic != 2 or whole > 1:
        return INVALID_RECORD
    return None


@st.composite
def corrupt_batches(draw: Any) -> tuple[str, bytes | None, int]:
    """(kind, records payload, exact error code the partition must get): Kafka's precheck
    first (kafka_precheck), then CORRUPT_MESSAGE for a whole batch that does not verify."""
    kind, records, batch_code = draw(_corrupt_batches())
    return kind, records, (kafka_precheck(records or b"") or batch_code)


@st.composite
def _corrupt_batches(draw: Any) -> tuple[str, bytes | None, int]:
    values = draw(st.lists(st.binary(max_size=20), min_size=1, max_size=4))
    good = batch_of(values)
    kind = draw(st.sampled_from([
        "flip-crc-covered", "flip-crc", "truncate", "garbage", "bad-count", "bad-delta", "control-or-txn",
        "length-longer", "length-shorter", "bad-second-batch", "empty", "null", "magic", "outside-crc",
    ]))
    if kind == "flip-crc-covered":
        pos = draw(st.integers(21, len(good) - 1))
    elif kind == "flip-crc":
        pos = draw(st.integers(17, 20))
    elif kind == "outside-crc":
        pos = draw(st.sampled_from([*range(0, 8), *range(12, 16)]))
    if kind in ("flip-crc-covered", "flip-crc", "outside-crc"):
        bad = bytearray(good)
        bad[pos] ^= draw(st.integers(1, 255))
        return f"{kind}@{pos}", bytes(bad), (0 if kind == "outside-crc" else CORRUPT_MESSAGE)
    if kind == "truncate":
        return kind, good[: draw(st.integers(1, len(good) - 1))], CORRUPT_MESSAGE
    if kind == "garbage":
        data = bytearray(draw(st.binary(min_size=1, max_size=200)))
        if len(data) > 16 and draw(st.booleans()):
            data[16] = 2  # get past the magic check to the length and CRC checks
        return kind, bytes(data), CORRUPT_MESSAGE
    section = b"".join(record(i, None, v) for i, v in enumerate(values))
    if kind == "bad-count":
        return kind, seal_batch(section, 0, last_offset_delta=len(values) - 1), CORRUPT_MESSAGE
    if kind == "bad-delta":
        delta = draw(st.integers(-(2**31), INT32_MAX).filter(lambda d: d != len(values) - 1))
        return kind, seal_batch(section, len(values), last_offset_delta=delta), CORRUPT_MESSAGE
    if kind == "control-or-txn":
        attrs = draw(st.sampled_from([0x10, 0x20, 0x30]))
        return kind, seal_batch(section, len(values), attributes=attrs), CORRUPT_MESSAGE
    if kind in ("length-longer", "length-shorter"):
        delta = draw(st.integers(1, 40))
        declared = len(good) - 12 + (delta if kind == "length-longer" else -delta)
        return kind, good[:8] + I32.pack(declared) + good[12:], CORRUPT_MESSAGE
    if kind == "bad-second-batch":
        second = bytearray(batch_of([b"second"]))
        second[draw(st.integers(21, len(second) - 1))] ^= 0xFF
        return kind, good + bytes(second), CORRUPT_MESSAGE
    if kind == "magic":
        magic = draw(st.integers(-128, 127).filter(lambda m: m != 2))
        return kind, seal_batch(section, len(values), magic=magic), CORRUPT_MESSAGE
    return kind, (b"" if kind == "empty" else None), CORRUPT_MESSAGE


def test_produce_v8_corrupt_batches_get_corrupt_message(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = start_broker(broker_factory)
    create_topics(broker, "fuzzed")
    health = Health(broker)
    producer = connect(broker)
    state = {"corr": 0, "next_offset": 0}

    def produce(records: bytes | None) -> tuple[int, int]:
        state["corr"] += 1
        producer.sendall(produce_v8(state["corr"], b"fuzzed", records))
        try:
            return parse_produce_v8(read_response(producer), state["corr"])
        except (EOFError, ConnectionResetError) as exc:
            pytest.fail(f"produce connection dropped: {exc!r}\n{log_tail(broker)}")

    assert produce(batch_of([b"first"])) == (0, 0)
    state["next_offset"] = 1

    @FUZZ
    @given(case=corrupt_batches())
    def run(case: tuple[str, bytes | None, int]) -> None:
        kind, records, code = case
        note(f"{kind}: {records.hex() if records is not None else None}")
        error, base_offset = produce(records)
        assert error == code, f"{kind}: error {error}, expected {code}"
        if code == 0:
            # Accepted batches get the next offset: nothing corrupt was appended before.
            assert base_offset == state["next_offset"]
            assert records is not None
            state["next_offset"] += I32.unpack_from(records, 57)[0]
        else:
            assert base_offset == -1
        health.check()

    run()
    assert produce(batch_of([b"last"])) == (0, state["next_offset"])
    producer.close()
    health.close()


def _produce_of_exact_size(size: int) -> bytes:
    """A Produce v8 frame whose size field (bytes after it) is exactly `size`."""
    value_len = size - 200
    for _ in range(10):
        data = produce_v8(1, b"cap", batch_of([b"x" * value_len]))
        diff = size - (len(data) - 4)
        if diff == 0:
            return data
        value_len += diff
    raise AssertionError("could not hit the exact frame size")


def test_frame_at_cap_is_served_and_above_cap_is_refused_and_logged(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = start_broker(broker_factory)
    create_topics(broker, "cap")
    health = Health(broker)
    with connect(broker) as sock:
        sock.sendall(_produce_of_exact_size(CAP))
        assert parse_produce_v8(read_response(sock), 1) == (0, 0)
    with connect(broker) as sock:
        send_quietly(sock, _produce_of_exact_size(CAP + 1))
        assert_closed_without_response(sock, broker)
    health.check()
    deadline = time.monotonic() + 5
    while f"exceeds socket.request.max.bytes={CAP}" not in broker.log_text():
        assert time.monotonic() < deadline, log_tail(broker)
        time.sleep(0.05)
    assert f"frame of {CAP + 1} bytes exceeds socket.request.max.bytes={CAP}" in broker.log_text()
    with connect(broker) as sock:
        send_quietly(sock, I32.pack(-1))
        assert_closed_without_response(sock, broker)
    health.close()


def test_huge_declared_lengths_keep_memory_bounded(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = start_broker(broker_factory)
    health = Health(broker)
    before = rss_kb(broker)
    for i in range(300):
        with connect(broker) as sock:
            size = INT32_MAX if i % 2 == 0 else CAP + 1 + (i * 7_919_993) % (INT32_MAX - CAP)
            send_quietly(sock, I32.pack(size) + b"\xab" * 512)
            assert_closed_without_response(sock, broker)
        if i % 50 == 0:
            health.check()
    after_huge = rss_kb(broker)
    assert after_huge < RSS_LIMIT_KB, f"RSS {after_huge} kB after refusing 2 GiB frames (was {before} kB)"

    # Frames up to the cap are legitimately buffered, but only while they are being received:
    # 32 slow senders (1 MiB declared, half sent) must not stop the healthy connection.
    slow = []
    for _ in range(32):
        sock = connect(broker)
        sock.sendall(I32.pack(CAP) + header(3, 1, 9) + b"\x00" * (CAP // 2))
        slow.append(sock)
    t0 = time.monotonic()
    health.check()
    assert time.monotonic() - t0 < 2.0, "slow senders delayed the healthy connection"
    during = rss_kb(broker)
    assert during < RSS_LIMIT_KB, f"RSS {during} kB with 32 half-received 1 MiB frames"
    for sock in slow:
        sock.close()
    health.check()
    final = rss_kb(broker)
    note_text = f"RSS kB: start {before}, after 300 huge frames {after_huge}, with slow senders {during}, end {final}"
    assert final < RSS_LIMIT_KB, note_text
    health.close()


def test_garbage_senders_do_not_disturb_a_concurrent_healthy_connection(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = start_broker(broker_factory)
    health = Health(broker)
    stop = threading.Event()
    errors: list[BaseException] = []
    sent = [0]

    def hammer() -> None:
        payloads = [I32.pack(INT32_MAX), I32.pack(-7), frame(struct.pack(">hhi", 9999, 0, 1)),
                    frame(header(3, 5, 1) + b"\xff" * 40), frame(header(0, 8, 1) + b"\x00\x01"),
                    I32.pack(100) + b"short"]
        try:
            while not stop.is_set():
                for p in payloads:
                    with connect(broker) as sock:
                        send_quietly(sock, p)
                        sock.shutdown(socket.SHUT_WR)
                        with contextlib.suppress(ConnectionResetError):
                            assert sock.recv(65536) == b""
                    sent[0] += 1
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=hammer, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        worst = 0.0
        for i in range(300):
            t0 = time.monotonic()
            api_versions_roundtrip(health.healthy, 5000 + i)
            worst = max(worst, time.monotonic() - t0)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
    assert not errors, f"{errors[0]!r}\n{log_tail(broker)}"
    assert sent[0] > 100, f"the garbage senders only got {sent[0]} connections through"
    assert worst < 1.0, f"a healthy roundtrip took {worst:.3f}s while garbage arrived"
    health.close()


def test_pipelined_valid_requests_are_answered_before_a_bad_frame_closes(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    """Requests received before a bad frame are answered in order; then the connection closes.

    Each bad frame is tried twice: sent after the good requests were answered, and in the
    same send() as the good requests (so the broker receives them in one read).
    """
    broker = start_broker(broker_factory)
    health = Health(broker)
    bad_frames = {
        "unknown api": frame(struct.pack(">hhi", 4242, 0, 3)),
        "malformed body": frame(header(3, 1, 3) + b"\x7f\xff\xff\xff"),
        "negative size": I32.pack(-1),
        "size above cap": I32.pack(CAP + 1),
    }
    wrong = []
    for name, bad in bad_frames.items():
        for together in (False, True):
            answered = []
            with connect(broker) as sock:
                sock.sendall(api_versions_v0(1) + api_versions_v0(2) + (bad if together else b""))
                with contextlib.suppress(EOFError, ConnectionResetError):
                    for _ in range(2):
                        answered.append(parse_api_versions_v0(read_response(sock))[0])
                if not together:
                    send_quietly(sock, bad)
                assert_closed_without_response(sock, broker)
            if answered != [1, 2]:
                wrong.append(f"{name} ({'same send' if together else 'separate send'}): answered {answered}")
            health.check()
    health.close()
    assert not wrong, "pipelined requests before a bad frame were dropped:\n" + "\n".join(wrong)


def list_offsets_v1(corr: int, topic: bytes, timestamp: int) -> bytes:
    body = header(2, 1, corr) + I32.pack(-1) + I32.pack(1) + struct.pack(">h", len(topic)) + topic
    return frame(body + I32.pack(1) + I32.pack(0) + struct.pack(">q", timestamp))


def test_acks0_produce_is_never_answered(broker_factory: Callable[..., BrokerProcess]) -> None:
    """docs/protocol.md: acks=0 produce gets no response at all, whatever the outcome."""
    broker = start_broker(broker_factory)
    health = Health(broker)
    cases = {
        "plain": produce_v8(1, b"acks0", batch_of([b"v"]), acks=0),
        "corrupt batch": produce_v8(1, b"acks0", b"\x00" * 70, acks=0),
        "transactional id": frame(header(PRODUCE, 8, 1) + struct.pack(">h", 2) + b"tx" + struct.pack(">hi", 0, 1000)
                                  + I32.pack(1) + struct.pack(">h", 5) + b"acks0" + I32.pack(1) + I32.pack(0)
                                  + I32.pack(len(batch_of([b"v"]))) + batch_of([b"v"])),
    }
    wrong = []
    for name, request in cases.items():
        with connect(broker) as sock:
            sock.sendall(request + api_versions_v0(77))
            first = read_response(sock)
            if I32.unpack_from(first)[0] != 77:
                wrong.append(f"{name}: got a response {first[:40].hex()}... to an acks=0 produce")
                first = read_response(sock)
            assert parse_api_versions_v0(first) == (77, 0, EXPECTED_API_LIST)
        health.check()
    health.close()
    assert not wrong, "\n".join(wrong)


def test_timestamp_lookup_over_a_batch_whose_records_do_not_parse(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    """A batch with a correct CRC but records that do not parse, then ListOffsets by timestamp.

    Whatever the Produce answer, the ListOffsets must be answered on the same connection.
    """
    broker = start_broker(broker_factory)
    create_topics(broker, "unparsed")
    health = Health(broker)
    with connect(broker) as sock:
        sock.sendall(produce_v8(1, b"unparsed", seal_batch(b"", 1)))
        produce_error, _ = parse_produce_v8(read_response(sock), 1)
        sock.sendall(list_offsets_v1(2, b"unparsed", 0))
        try:
            body = read_response(sock)
        except (EOFError, ConnectionResetError) as exc:
            pytest.fail(f"ListOffsets dropped the connection ({exc!r}); produce answered error "
                        f"{produce_error}\n{log_tail(broker)}")
        assert I32.unpack_from(body)[0] == 2
        value, size = entity_reader(messages.response_schema(2, 1))(body, 4)
        assert 4 + size == len(body)
        (part,) = value.topics[0].partitions
        assert int(part.error_code) == 0
    health.check()
    health.close()
