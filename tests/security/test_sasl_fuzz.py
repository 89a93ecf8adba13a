"""The SASL exchange under fuzzing, against a real broker: handshakes and tokens in any
order, malformed, oversized or out of place, requests before authentication. The broker
answers or closes the one connection, never authenticates without the password, never
logs a traceback, and its memory stays bounded."""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster.protocol.messages import encode_request
from tests.security.secured import PASSWORDS, SecuredBroker, add_users, start_secured_broker

MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "", "x" * 300]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    broker = start_secured_broker(tmp_path_factory.mktemp("sasl-fuzz"), **{
        "connection.failed.authentication.delay.ms": 0, "socket.request.max.bytes": 1 << 20})
    try:
        add_users(broker.internal, ("alice",))
        yield broker
    finally:
        broker.proc.stop()


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _frame_handshake(mechanism: str, version: int, corr: int) -> bytes:
    return encode_request(17, version, corr, b"fuzz", {"mechanism": mechanism})


def _frame_authenticate(token: bytes, version: int, corr: int) -> bytes:
    return encode_request(36, version, corr, b"fuzz", {"auth_bytes": token})


ops = st.one_of(
    st.tuples(st.just("handshake"), st.sampled_from(MECHANISMS), st.integers(0, 1)),
    st.tuples(st.just("authenticate"), st.one_of(
        st.binary(max_size=64),
        st.builds(lambda u, p: b"\x00" + u + b"\x00" + p, st.sampled_from([b"alice", b"mallory", b""]),
                  st.binary(max_size=24)),
        st.builds(lambda n: b"n,,n=alice,r=" + n, st.binary(min_size=0, max_size=40)),
        st.builds(lambda n: b"c=biws,r=" + n + b",p=" + n, st.binary(max_size=40)),
        st.just(b"A" * 5000)), st.integers(0, 2)),
    st.tuples(st.just("raw"), st.binary(max_size=200), st.just(0)),  # bare bytes (a v0 token, or garbage)
    st.tuples(st.just("metadata"), st.just(b""), st.just(1)),  # a Kafka request before authentication
    st.tuples(st.just("huge"), st.just(b""), st.just(0)),  # a frame far over socket.request.max.bytes
)


def _send(sock: socket.socket, data: bytes) -> bool:
    try:
        sock.sendall(data)
        return True
    except OSError:
        return False


def _read_frame(sock: socket.socket) -> bytes | None:
    """One answer, or None when the broker closed the connection."""
    try:
        head = sock.recv(4, socket.MSG_WAITALL)
        if len(head) < 4:
            return None
        (size,) = struct.unpack(">i", head)
        assert 0 <= size <= 1 << 20, f"answer declares {size} bytes"
        body = sock.recv(size, socket.MSG_WAITALL) if size else b""
        return body if len(body) == size else None
    except (ConnectionResetError, TimeoutError):
        return None


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(sequence=st.lists(ops, min_size=1, max_size=6))
def test_fuzzed_sasl_exchanges_never_authenticate_nor_harm_the_broker(secured: SecuredBroker,
                                                                      sequence: list[tuple[str, object, int]]) -> None:
    with socket.create_connection(("127.0.0.1", secured.sasl_plaintext_port), timeout=3) as sock:
        corr = 0
        open_ = True
        for kind, arg, version in sequence:
            corr += 1
            if kind == "handshake":
                data = _frame_handshake(str(arg), version, corr)
            elif kind == "authenticate":
                assert isinstance(arg, bytes)
                data = _frame_authenticate(arg, version, corr)
            elif kind == "raw":
                assert isinstance(arg, bytes)
                data = struct.pack(">i", len(arg)) + arg
            elif kind == "metadata":
                data = encode_request(3, 1, corr, b"fuzz", {"topics": None})
            else:
                data = struct.pack(">i", 200 << 20) + b"\x00" * 16
            if not _send(sock, data) or _read_frame(sock) is None:
                open_ = False
                break
            if kind in ("metadata", "huge"):
                raise AssertionError(f"{kind} was answered before authentication")
        if open_:
            # Whatever the sequence did, no valid login happened: a Kafka request closes the connection.
            _send(sock, encode_request(3, 1, 99, b"fuzz", {"topics": None}))
            assert _read_frame(sock) is None, "a request was answered without a login"


def _closed_at_once(port: int, declared: int) -> bool:
    """Declare a frame of `declared` bytes and send none of it: True when the broker closes
    the connection, False when it waits for the bytes."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(struct.pack(">i", declared))
        try:
            return sock.recv(1) == b""
        except TimeoutError:
            return False


def test_frames_before_login_are_small(secured: SecuredBroker) -> None:
    """sasl.server.max.receive.size (512 KiB): an anonymous peer on a SASL listener cannot
    make the broker reserve socket.request.max.bytes (1 MiB here); a listener without SASL
    takes the full size."""
    assert _closed_at_once(secured.sasl_plaintext_port, 600_000)
    assert not _closed_at_once(secured.proc.port, 600_000)
    assert "exceeds sasl.server.max.receive.size=524288" in secured.proc.log_text()


def test_broker_is_whole_after_the_fuzzing(secured: SecuredBroker) -> None:
    """Runs after the fuzzer (same module, in order): alive, no traceback, bounded memory,
    and a real login still works on the fuzzed listener."""
    assert secured.proc.alive()
    log = secured.proc.log_text()
    assert "Traceback" not in log and "internal error" not in log, log[-3000:]
    assert secured.proc.proc is not None
    assert _rss_kib(secured.proc.proc.pid) < 400 * 1024
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{secured.sasl_plaintext_port}",
                         "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "SCRAM-SHA-512",
                         "sasl.username": "alice", "sasl.password": PASSWORDS["alice"]})
    with contextlib.suppress(Exception):
        admin.list_topics(timeout=10)
    assert "authenticated as User:alice (SASL SCRAM-SHA-512) on SASL_PLAINTEXT" in secured.proc.log_text()
