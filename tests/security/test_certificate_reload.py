"""Renewed broker certificates are served without a restart: a keystore replaced on disk is
loaded again (at the periodic check, or at once on SIGHUP), new TLS connections get the new
certificate, existing ones go on; a broken replacement is refused and the old certificate
kept."""

from __future__ import annotations

import shutil
import signal
import socket
import ssl
import time
from pathlib import Path

from cryptography import x509

from deploy.certs import issue
from tests.security.secured import PASSWORDS, add_users, start_secured_broker


def served_serial(address: str, ca: Path) -> int:
    host, port = address.rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection((host, int(port)), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname=host) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return int(x509.load_der_x509_certificate(der).serial_number)


def test_renewed_keystore_is_served_after_sighup_and_a_broken_one_is_refused(tmp_path: Path) -> None:
    from confluent_kafka import Consumer, Producer

    broker = start_secured_broker(tmp_path)
    try:
        ca = broker.pki.ca.cert_path
        first = served_serial(broker.sasl_ssl, ca)
        add_users(broker.internal, ("admin",))
        tls_client = {"bootstrap.servers": broker.sasl_ssl, "security.protocol": "SASL_SSL", "ssl.ca.location": str(ca),
                      "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "admin", "sasl.password": PASSWORDS["admin"]}
        # a connection made before the renewal
        p = Producer({"bootstrap.servers": broker.internal})
        p.produce("renew", b"before")
        assert p.flush(30) == 0
        # renew: a new keystore (new key, new serial) written in place, then SIGHUP
        renewed = issue(broker.pki.ca, tmp_path / "renewed", broker.pki.broker.stem)
        shutil.copyfile(renewed, broker.pki.broker)
        assert broker.proc.proc is not None
        broker.proc.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        second = first
        while second == first and time.monotonic() < deadline:
            time.sleep(0.2)
            second = served_serial(broker.sasl_ssl, ca)
        assert second != first and second == x509.load_pem_x509_certificate(renewed.read_bytes()).serial_number
        assert "reloaded" in broker.proc.log_text()
        # a broken replacement (a key that does not match the certificate) is refused: old one kept
        other = issue(broker.pki.ca, tmp_path / "other", "other").read_text()
        renewed_text = renewed.read_text()
        key_end = renewed_text.index("-----END PRIVATE KEY-----") + len("-----END PRIVATE KEY-----\n")
        broker.pki.broker.write_text(other[:other.index("-----END PRIVATE KEY-----") + 26] + renewed_text[key_end:])
        broker.proc.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "keeps its certificate" not in broker.proc.log_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "keeps its certificate" in broker.proc.log_text(), broker.proc.log_text()[-2000:]
        assert served_serial(broker.sasl_ssl, ca) == second
        # the broker kept serving throughout, TLS clients included
        p.produce("renew", b"after")
        assert p.flush(30) == 0
        c = Consumer({**tls_client, "group.id": "r", "auto.offset.reset": "earliest"})
        c.subscribe(["renew"])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < 2 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m.value())
        c.close()
        assert got == [b"before", b"after"]
    finally:
        broker.proc.stop()
