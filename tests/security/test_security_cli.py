"""`dcmirror users` and `dcmirror acls` against a secured broker, run as an operator would:
over SASL_SSL as the admin user, with the password in a file referenced from a client
properties file (--command-config), never on the command line."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import REPO
from tests.security.secured import (
    PASSWORDS,
    ClientSecurity,
    SecuredBroker,
    add_users,
    start_secured_broker,
)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    broker = start_secured_broker(tmp_path_factory.mktemp("cli"))
    try:
        add_users(broker.internal, ("admin",))
        yield broker
    finally:
        broker.proc.stop()


def dcmirror(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deploy.cli", *args], cwd=REPO, capture_output=True, text=True,
                          input=stdin, timeout=60)


def test_users_and_acls_commands_over_sasl_ssl(secured: SecuredBroker, tmp_path: Path) -> None:
    from confluent_kafka import Consumer, Producer

    (tmp_path / "admin-password").write_text(PASSWORDS["admin"] + "\n")
    props = tmp_path / "admin.properties"
    props.write_text("security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=admin\n"
                     f"sasl.password=${{dir:{tmp_path}:admin-password}}\n"
                     f"ssl.ca.location={secured.pki.ca.cert_path}\n")
    conn = ["--bootstrap", secured.sasl_ssl, "--command-config", str(props)]
    (tmp_path / "carol-password").write_text("carol-password-9\n")
    added = dcmirror("users", "add", "carol", "--password-file", str(tmp_path / "carol-password"), *conn)
    assert added.returncode == 0, added.stderr
    listed = dcmirror("users", "list", *conn)
    assert listed.returncode == 0 and "carol  SCRAM-SHA-256(iterations=8192)  SCRAM-SHA-512(iterations=8192)" \
        in listed.stdout, listed
    grant = dcmirror("acls", "add", "--allow-principal", "User:carol", "--operation", "Read", "--topic", "carol.",
                     "--group", "carol.", "--resource-pattern-type", "prefixed", *conn)
    assert grant.returncode == 0, grant.stderr
    assert dcmirror("acls", "list", "--principal", "User:carol", *conn).stdout.splitlines() == [
        "topic:carol. (prefixed)  User:carol  ALLOW  READ  from *",
        "group:carol. (prefixed)  User:carol  ALLOW  READ  from *"]
    # carol reads her topic
    p = Producer({"bootstrap.servers": secured.internal})
    for i in range(3):
        p.produce("carol.events", f"e{i}".encode())
    assert p.flush(15) == 0
    carol = {**ClientSecurity(secured, "SCRAM-SHA-512", "carol", "carol-password-9").librdkafka(),
             "group.id": "carol.readers", "auto.offset.reset": "earliest"}
    c = Consumer(carol)
    c.subscribe(["carol.events"])
    got = []
    for _ in range(60):
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m.value())
        if len(got) == 3:
            break
    c.close()
    assert got == [b"e0", b"e1", b"e2"]
    # revoke and remove
    removed = dcmirror("acls", "remove", "--principal", "User:carol", "--topic", "carol.", "--resource-pattern-type",
                       "prefixed", "--force", *conn)
    assert removed.returncode == 0 and removed.stdout.splitlines() == [
        "removed  topic:carol. (prefixed)  User:carol  ALLOW  READ  from *"], removed
    gone = dcmirror("users", "remove", "carol", *conn)
    assert gone.returncode == 0, gone.stderr
    assert "carol" not in dcmirror("users", "list", *conn).stdout
    # no password anywhere in what the commands printed or the broker logged
    log = secured.proc.log_text()
    for secret in (PASSWORDS["admin"], "carol-password-9"):
        assert secret not in log
        for out in (added, listed, grant, removed, gone):
            assert secret not in out.stdout + out.stderr
    # a wrong admin password is a clear error, without the password
    (tmp_path / "admin-password").write_text("not-the-admin-password\n")
    refused = dcmirror("users", "list", *conn)
    assert refused.returncode == 1 and "Authentication failed" in refused.stderr, refused
    assert "not-the-admin-password" not in refused.stderr


def test_perf_takes_the_client_security_settings_of_kafkas_perf_tools(secured: SecuredBroker, tmp_path: Path) -> None:
    """`dcmirror perf produce|consume` over SASL_SSL with --producer.config / --consumer.config
    (secrets by reference), exact counts; a wrong password is one clear line, exit 1."""
    import json

    (tmp_path / "pw.properties").write_text(f"admin={PASSWORDS['admin']}\n")
    props = tmp_path / "client.properties"
    props.write_text("security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=admin\n"
                     f"sasl.password=${{file:{tmp_path}/pw.properties:admin}}\n"
                     f"ssl.ca.location={secured.pki.ca.cert_path}\n")
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": secured.internal})
    admin.create_topics([NewTopic("perf.sec", 2, 1)])["perf.sec"].result(30)
    produced = dcmirror("perf", "produce", "--bootstrap-server", secured.sasl_ssl, "--topic", "perf.sec",
                        "--num-records", "5000", "--record-size", "100", "--producer.config", str(props), "--json")
    assert produced.returncode == 0, produced.stderr
    assert json.loads(produced.stdout.strip().splitlines()[-1])["records"] == 5000
    consumed = dcmirror("perf", "consume", "--bootstrap-server", secured.sasl_ssl, "--topic", "perf.sec",
                        "--messages", "5000", "--command-config", str(props), "--json")
    assert consumed.returncode == 0, consumed.stderr
    assert json.loads(consumed.stdout.strip().splitlines()[-1])["records"] == 5000
    (tmp_path / "pw.properties").write_text("admin=not-the-password\n")
    refused = dcmirror("perf", "produce", "--bootstrap-server", secured.sasl_ssl, "--topic", "perf.sec",
                       "--num-records", "10", "--producer.config", str(props))
    assert refused.returncode == 1 and "authentication" in refused.stderr.lower(), \
        (refused.returncode, refused.stderr[-2000:])
    assert "not-the-password" not in refused.stderr + refused.stdout


def test_acls_take_kafka_acls_deny_host_force_and_bootstrap_server(secured: SecuredBroker) -> None:
    """--deny-host goes with --deny-principal and --allow-host with --allow-principal (each *
    when not given); `remove` asks first, removes nothing unless answered y, and --force
    skips the question; --bootstrap-server is --bootstrap, as in kafka-acls."""
    conn = ["--bootstrap-server", secured.internal]
    added = dcmirror("acls", "add", "--allow-principal", "User:erin", "--allow-host", "10.0.0.1",
                     "--deny-principal", "User:frank", "--deny-host", "10.0.0.2", "--deny-host", "10.0.0.3",
                     "--operation", "Read", "--topic", "hosts.t", *conn)
    assert added.returncode == 0, added.stderr
    assert sorted(added.stdout.splitlines()) == [
        "added  topic:hosts.t (literal)  User:erin  ALLOW  READ  from 10.0.0.1",
        "added  topic:hosts.t (literal)  User:frank  DENY  READ  from 10.0.0.2",
        "added  topic:hosts.t (literal)  User:frank  DENY  READ  from 10.0.0.3"]
    assert dcmirror("acls", "add", "--deny-principal", "User:frank", "--operation", "Write", "--topic", "hosts.t",
                    *conn).stdout.splitlines() == ["added  topic:hosts.t (literal)  User:frank  DENY  WRITE  from *"]
    listed = sorted(dcmirror("acls", "list", "--topic", "hosts.t", *conn).stdout.splitlines())
    assert len(listed) == 4, listed
    # kafka-acls --remove: exactly the ACLs the principal, permission and host options name
    kept = dcmirror("acls", "remove", "--deny-principal", "User:frank", "--deny-host", "10.0.0.2", "--operation",
                    "Read", "--topic", "hosts.t", *conn, stdin="n\n")
    assert kept.returncode == 0 and "not confirmed, nothing removed" in kept.stderr, kept
    assert "topic:hosts.t (literal)  User:frank  DENY  READ  from 10.0.0.2" in kept.stdout  # what it asked about
    assert sorted(dcmirror("acls", "list", "--topic", "hosts.t", *conn).stdout.splitlines()) == listed
    removed = dcmirror("acls", "remove", "--deny-principal", "User:frank", "--deny-host", "10.0.0.2", "--operation",
                       "Read", "--topic", "hosts.t", *conn, stdin="y\n")
    assert removed.returncode == 0 and removed.stdout.splitlines()[-1] == \
        "removed  topic:hosts.t (literal)  User:frank  DENY  READ  from 10.0.0.2", removed
    forced = dcmirror("acls", "remove", "--force", "--topic", "hosts.t", *conn)
    assert forced.returncode == 0 and sorted(forced.stdout.splitlines()) == [
        "removed  topic:hosts.t (literal)  User:erin  ALLOW  READ  from 10.0.0.1",
        "removed  topic:hosts.t (literal)  User:frank  DENY  READ  from 10.0.0.3",
        "removed  topic:hosts.t (literal)  User:frank  DENY  WRITE  from *"], forced
    assert dcmirror("acls", "list", "--topic", "hosts.t", *conn).stdout == ""
