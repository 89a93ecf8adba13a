"""Real clients against a secured broker (tests/security/secured.py): librdkafka
(confluent-kafka), kafka-python, aiokafka, kcat and the project's own client each produce
and consume over mutual TLS and over SASL_SSL with PLAIN and SCRAM; bad credentials and
certificates are refused with Kafka's errors while other clients go on; ACLs decide what
an authenticated principal may do."""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.security.secured import (
    PASSWORDS,
    ClientSecurity,
    SecuredBroker,
    add_users,
    create_acls,
    start_secured_broker,
)

N = 25


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    broker = start_secured_broker(tmp_path_factory.mktemp("secured"))
    try:
        add_users(broker.internal)
        _acls(broker.internal, [
            ("TOPIC", "sec.", "PREFIXED", "User:alice", "ALL", "ALLOW"),
            ("GROUP", "sec.", "PREFIXED", "User:alice", "READ", "ALLOW"),
            ("BROKER", "kafka-cluster", "LITERAL", "User:alice", "IDEMPOTENT_WRITE", "ALLOW"),  # the cluster
        ])
        yield broker
    finally:
        broker.proc.stop()


def _acls(bootstrap: str, rows: list[tuple[str, str, str, str, str, str]]) -> None:
    create_acls({"bootstrap.servers": bootstrap}, rows)


def _create_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the answer is in
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(15)


def _records(tag: str) -> list[tuple[bytes, bytes]]:
    return [(f"k{i}".encode(), f"{tag}-{i}".encode()) for i in range(N)]


# ---- each client, each way in ---------------------------------------------------------------


def _confluent(sec: ClientSecurity, topic: str, records: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    from confluent_kafka import Consumer, Producer

    p = Producer({**sec.librdkafka(), "enable.idempotence": True})
    errors: list[Any] = []
    for k, v in records:
        p.produce(topic, v, k, on_delivery=lambda e, m: errors.append(e) if e else None)
    assert p.flush(30) == 0 and errors == []
    c = Consumer({**sec.librdkafka(), "group.id": f"sec.{topic}", "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got: list[tuple[bytes, bytes]] = []
    deadline = time.monotonic() + 30
    while len(got) < len(records) and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None:
            assert m.error() is None, m.error()
            got.append((m.key(), m.value()))
    c.commit(asynchronous=False)
    c.close()
    return got


def _kafka_python(sec: ClientSecurity, topic: str, records: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    p = KafkaProducer(**sec.kafka_python(), acks="all")
    for k, v in records:
        p.send(topic, v, key=k).get(30)
    p.close()
    c = KafkaConsumer(**sec.kafka_python(), group_id=None, enable_auto_commit=False)
    tp = TopicPartition(topic, 0)
    c.assign([tp])
    c.seek_to_beginning(tp)
    got: list[tuple[bytes, bytes]] = []
    deadline = time.monotonic() + 30
    while len(got) < len(records) and time.monotonic() < deadline:
        for batch in c.poll(500).values():
            got.extend((r.key, r.value) for r in batch)
    c.close()
    return got


def _aiokafka(sec: ClientSecurity, topic: str, records: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    async def main() -> list[tuple[bytes, bytes]]:
        p = AIOKafkaProducer(**sec.aiokafka(), acks="all")
        await p.start()
        try:
            for k, v in records:
                await p.send_and_wait(topic, v, key=k)
        finally:
            await p.stop()
        c = AIOKafkaConsumer(**sec.aiokafka(), group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest")
        await c.start()
        got: list[tuple[bytes, bytes]] = []
        try:
            c.assign([TopicPartition(topic, 0)])
            await c.seek_to_beginning()
            deadline = time.monotonic() + 30
            while len(got) < len(records) and time.monotonic() < deadline:
                for batch in (await c.getmany(timeout_ms=500)).values():
                    got.extend((r.key, r.value) for r in batch)
        finally:
            await c.stop()
        return got

    return asyncio.run(asyncio.wait_for(main(), 90))


def _kcat(sec: ClientSecurity, topic: str, records: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    opts = [arg for k, v in sec.librdkafka().items() if k != "bootstrap.servers" for arg in ("-X", f"{k}={v}")]
    base = ["kcat", "-b", sec.bootstrap, *opts]
    lines = "".join(f"{k.decode()}:{v.decode()}\n" for k, v in records)
    subprocess.run([*base, "-P", "-t", topic, "-K", ":"], input=lines.encode(), check=True, timeout=60)
    out = subprocess.run([*base, "-C", "-t", topic, "-o", "beginning", "-e", "-c", str(len(records)), "-f", "%k:%s\n"],
                         capture_output=True, check=True, timeout=60).stdout
    return [tuple(line.split(b":", 1)) for line in out.splitlines()]  # type: ignore[misc]


def _dcmirror(sec: ClientSecurity, topic: str, records: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    from cluster.client.sync import SyncConsumer, SyncProducer

    with SyncProducer(sec.dcmirror()) as p:
        p.produce_many(topic, records)
        p.flush(30)
    got: list[tuple[bytes, bytes]] = []
    with SyncConsumer({**sec.dcmirror(), "auto.offset.reset": "earliest", "enable.auto.commit": False}) as c:
        c.assign([(topic, 0)])
        deadline = time.monotonic() + 30
        while len(got) < len(records) and time.monotonic() < deadline:
            for batch in c.poll(0.5).values():
                got.extend((r.key, r.value) for r in batch)
    return got


CLIENTS = {"confluent": _confluent, "kafka-python": _kafka_python, "aiokafka": _aiokafka, "kcat": _kcat,
           "dcmirror": _dcmirror}
CASES = [(client, mode) for client in CLIENTS for mode in ("mtls", "SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
         if not (client == "kafka-python" and mode == "SCRAM-SHA-256")]


@pytest.mark.parametrize(("client", "mode"), CASES)
def test_client_produces_and_consumes_over_tls_and_sasl(secured: SecuredBroker, client: str, mode: str) -> None:
    topic = f"sec.{client}.{mode.lower()}"
    _create_topic(secured.internal, topic)
    records = _records(f"{client}-{mode}")
    got = CLIENTS[client](ClientSecurity(secured, mode), topic, records)
    assert got == records  # every record once, in order, over an authenticated TLS connection


# ---- refused: wrong secrets, bad certificates, plaintext on a TLS port ----------------------


def _librdkafka_error(conf: dict[str, Any], timeout_s: float = 10.0) -> str:
    """What librdkafka reports (error_cb) while it tries to connect with `conf`."""
    from confluent_kafka import Producer

    errors: list[str] = []
    p = Producer({**conf, "error_cb": lambda e: errors.append(str(e)), "socket.timeout.ms": 5000})
    deadline = time.monotonic() + timeout_s
    while not errors and time.monotonic() < deadline:
        p.poll(0.2)
    assert errors, f"librdkafka connected with {conf}"
    return " ".join(errors)


@pytest.mark.parametrize("mode", ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"])
def test_wrong_password_and_unknown_user_are_refused_with_kafkas_error(secured: SecuredBroker, mode: str) -> None:
    failed_before = secured.metric("dcmirror_broker_failed_authentication_total")
    wrong = _librdkafka_error(ClientSecurity(secured, mode, password="not-the-password").librdkafka())
    assert "Authentication failed" in wrong and "invalid credentials" in wrong, wrong
    unknown = _librdkafka_error(ClientSecurity(secured, mode, user="mallory", password="x").librdkafka())
    assert "Authentication failed" in unknown, unknown
    # the broker names no secret in its log, and a good client still works right after
    log = secured.proc.log_text()
    assert "not-the-password" not in log and PASSWORDS["alice"] not in log
    assert "failed SASL" in log
    assert secured.metric("dcmirror_broker_failed_authentication_total") >= failed_before + 2
    topic = f"sec.after-bad-login.{mode.lower()}"
    _create_topic(secured.internal, topic)
    assert _confluent(ClientSecurity(secured, mode), topic, _records("ok")) == _records("ok")


def test_bad_certificates_and_plaintext_on_tls_ports_are_refused(secured: SecuredBroker) -> None:
    pki = secured.pki
    base = {"bootstrap.servers": secured.ssl, "security.protocol": "SSL", "ssl.ca.location": str(pki.ca.cert_path)}
    cases = {
        "expired": ({"ssl.certificate.location": str(pki.expired_cert), "ssl.key.location": str(pki.expired_key)},
                    "certificate has expired"),
        "untrusted": ({"ssl.certificate.location": str(pki.untrusted_cert),
                       "ssl.key.location": str(pki.untrusted_key)}, "certificate verify failed"),
        "none": ({}, "peer did not return a certificate"),  # ssl.client.auth=required on this listener
    }
    for what, (extra, reason) in cases.items():
        mark = len(secured.proc.log_text())
        _librdkafka_error({**base, **extra})
        deadline = time.monotonic() + 10  # the client may hear the alert before the broker logs it
        while True:
            said = secured.proc.log_text()[mark:]
            if ("TLS handshake" in said and reason in said) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert "TLS handshake" in said and reason in said, (what, said[-2000:])
    # a client that does not trust the broker's CA stops itself
    distrust = _librdkafka_error({**base, "ssl.ca.location": str(pki.other_ca),
                                  "ssl.certificate.location": str(pki.client_cert["alice"]),
                                  "ssl.key.location": str(pki.client_key["alice"])})
    assert "certificate verify failed" in distrust, distrust
    # plaintext Kafka on the TLS port: the broker reads a non-TLS hello and closes
    for port in (secured.ssl_port, secured.sasl_ssl_port):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"\x00\x00\x00\x0e\x00\x12\x00\x00\x00\x00\x00\x01\x00\x04test")
            s.settimeout(5)
            data = b""
            while chunk := s.recv(100):  # the broker closes: at most a TLS alert, never a Kafka answer
                data += chunk
            assert data == b"" or data[0] == 0x15, data
    # the project's client says what went wrong, without the password
    from cluster.client.sync import SyncAdmin

    with pytest.raises(Exception) as err:  # noqa: B017
        with SyncAdmin({**ClientSecurity(secured, "SCRAM-SHA-512", password="wrong-pw-x").dcmirror(),
                        "request.timeout.ms": 3000}) as admin:
            admin.list_topics()
    assert "wrong-pw-x" not in str(err.value)
    # TLS 1.1 is refused
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    with socket.create_connection(("127.0.0.1", secured.sasl_ssl_port), timeout=5) as raw:
        with pytest.raises((ssl.SSLError, OSError)):
            ctx.wrap_socket(raw).do_handshake()
    # the broker is unharmed
    topic = "sec.after-bad-certs"
    _create_topic(secured.internal, topic)
    assert _confluent(ClientSecurity(secured, "mtls"), topic, _records("ok")) == _records("ok")


def test_certificate_subject_is_the_principal(secured: SecuredBroker, tmp_path: Path) -> None:
    """bob's certificate is valid, but bob has no ACL: mutual TLS authenticates, ACLs refuse."""
    from confluent_kafka import KafkaError, Producer

    topic = "sec.bob-may-not"
    _create_topic(secured.internal, topic)
    errors: list[Any] = []
    p = Producer({**ClientSecurity(secured, "mtls", user="bob").librdkafka(), "enable.idempotence": False,
                  "message.timeout.ms": 5000})
    p.produce(topic, b"x", on_delivery=lambda e, m: errors.append(e))
    p.flush(15)
    assert [e.code() for e in errors] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]


def test_failed_logins_are_answered_ever_more_slowly(secured: SecuredBroker) -> None:
    """connection.failed.authentication.delay.ms (50 ms here) doubles with each failure from
    one address in a row: guessing passwords costs more and more time per try."""
    import trio

    from cluster.security.connector import LinkSecurity, open_stream
    from cluster.security.errors import AuthenticationFailed

    bad = LinkSecurity.from_config(ClientSecurity(secured, "SCRAM-SHA-512", password="guess").librdkafka())
    good = LinkSecurity.from_config(ClientSecurity(secured, "SCRAM-SHA-512").librdkafka())

    async def attempt(link: LinkSecurity) -> float:
        start = trio.current_time()
        try:
            stream = await open_stream("127.0.0.1", secured.sasl_ssl_port, link)
            await stream.aclose()
        except AuthenticationFailed:
            pass
        return trio.current_time() - start

    async def main() -> tuple[list[float], float]:
        await attempt(good)  # a success resets the count
        return [await attempt(bad) for _ in range(5)], await attempt(good)

    failures, success = trio.run(main)
    # the broker waits 50, 100, 200, 400, 800 ms; connection set-up adds the same to each try
    assert failures[0] >= 0.05 and failures == sorted(failures), failures
    assert failures[4] - failures[0] >= 0.6 and failures[4] - failures[2] >= 0.45, failures
    assert success < failures[4], (success, failures)  # a good login is not slowed down


def test_sessions_expire_and_clients_log_in_again_without_losing_records(tmp_path: Path) -> None:
    """connections.max.reauth.ms on the SASL listener: a producer running across several
    session lifetimes re-authenticates (KIP-368) or reconnects; every record arrives once."""
    from confluent_kafka import Producer

    broker = start_secured_broker(tmp_path, **{"connections.max.reauth.ms": 1000})
    try:
        add_users(broker.internal, ("alice",))
        _acls(broker.internal, [("TOPIC", "sec.", "PREFIXED", "User:alice", "ALL", "ALLOW"),
                                ("GROUP", "sec.", "PREFIXED", "User:alice", "READ", "ALLOW")])
        _create_topic(broker.internal, "sec.reauth")
        logins_before = broker.metric("dcmirror_broker_successful_authentication_total")
        conf = ClientSecurity(broker, "SCRAM-SHA-512").librdkafka()
        p = Producer({**conf, "enable.idempotence": True})
        sent = []
        deadline = time.monotonic() + 5
        i = 0
        while time.monotonic() < deadline:
            p.produce("sec.reauth", f"r{i}".encode(), key=b"k")
            sent.append((b"k", f"r{i}".encode()))
            i += 1
            p.poll(0)
            time.sleep(0.01)
        assert p.flush(30) == 0
        assert broker.metric("dcmirror_broker_successful_authentication_total") >= logins_before + 4
        from kafka import KafkaConsumer, TopicPartition

        c = KafkaConsumer(**ClientSecurity(broker, "SCRAM-SHA-512").kafka_python(), group_id=None,
                          enable_auto_commit=False)
        c.assign([TopicPartition("sec.reauth", 0)])
        c.seek_to_beginning()
        got: list[tuple[bytes, bytes]] = []
        deadline = time.monotonic() + 30
        while len(got) < len(sent) and time.monotonic() < deadline:
            for batch in c.poll(500).values():
                got.extend((r.key, r.value) for r in batch)
        c.close()
        assert got == sent
    finally:
        broker.proc.stop()
