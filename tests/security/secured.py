"""A secured broker for tests: a CA and certificates made on the fly, and a broker with

    INTERNAL  PLAINTEXT on loopback (the harness's port; User:ANONYMOUS is a super user there,
              as an operator's internal loopback listener would be)
    SSL       TLS with client certificates required (mutual TLS; CN=<name> → User:<name>)
    SASL_SSL  TLS, then SASL PLAIN / SCRAM-SHA-256 / SCRAM-SHA-512
    SASL_PLAINTEXT  SASL without TLS (the SASL fuzzer's way in)

and the StandardAuthorizer (allow.everyone.if.no.acl.found=false). Client settings for every
client library come from `ClientSecurity`.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy.certs import Authority, issue, make_ca, split_keystore
from tests.harness import BrokerProcess, free_port

PASSWORDS = {"alice": "alice-pw-1", "bob": "bob-pw-2", "admin": "admin-pw-3"}


@dataclass(frozen=True)
class Pki:
    ca: Authority
    broker: Path
    client_key: dict[str, Path]
    client_cert: dict[str, Path]
    other_ca: Path  # a CA nobody trusts
    expired_key: Path
    expired_cert: Path
    untrusted_key: Path
    untrusted_cert: Path


def make_pki(root: Path) -> Pki:
    ca = make_ca(root / "ca")
    broker = issue(ca, root / "certs", "broker-1")
    keys, certs = {}, {}
    for name in ("alice", "bob"):
        keys[name], certs[name] = split_keystore(issue(ca, root / "certs", name))
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=30)
    expired_key, expired_cert = split_keystore(issue(ca, root / "certs", "expired", not_before=past,
                                                     not_after=past + datetime.timedelta(days=1)))
    other = make_ca(root / "other-ca", "someone else's CA")
    untrusted_key, untrusted_cert = split_keystore(issue(other, root / "other-certs", "alice"))
    return Pki(ca, broker, keys, certs, other.cert_path, expired_key, expired_cert, untrusted_key, untrusted_cert)


@dataclass
class SecuredBroker:
    proc: BrokerProcess
    pki: Pki
    ssl_port: int
    sasl_ssl_port: int
    sasl_plaintext_port: int
    admin_http_port: int

    def metric(self, name: str) -> float:
        """One counter of the broker's /metrics (admin HTTP, loopback)."""
        import httpx

        text = httpx.get(f"http://127.0.0.1:{self.admin_http_port}/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"{name} is not in /metrics")

    @property
    def internal(self) -> str:
        return self.proc.bootstrap

    @property
    def ssl(self) -> str:
        return f"127.0.0.1:{self.ssl_port}"

    @property
    def sasl_ssl(self) -> str:
        return f"127.0.0.1:{self.sasl_ssl_port}"


def start_secured_broker(root: Path, **extra: object) -> SecuredBroker:
    pki = make_pki(root / "pki")
    port, ssl_port, sasl_port, sasl_plain_port, admin_port = (free_port() for _ in range(5))
    config = {
        "listeners": f"INTERNAL://127.0.0.1:{port},SSL://127.0.0.1:{ssl_port},SASL_SSL://127.0.0.1:{sasl_port},"
                     f"SASL_PLAINTEXT://127.0.0.1:{sasl_plain_port}",
        "listener.security.protocol.map": "INTERNAL:PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL,SASL_PLAINTEXT:SASL_PLAINTEXT",
        "inter.broker.listener.name": "INTERNAL",
        "ssl.keystore.location": str(pki.broker),
        "ssl.truststore.location": str(pki.ca.cert_path),
        "listener.name.ssl.ssl.client.auth": "required",
        "ssl.principal.mapping.rules": "RULE:^CN=([^,]*)(,.*)?$/$1/,DEFAULT",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS;User:admin",
        "offsets.topic.replication.factor": 1,
        "offsets.topic.num.partitions": 3,
        "group.initial.rebalance.delay.ms": 0,
        "connection.failed.authentication.delay.ms": 50,
        "admin.http.listener": f"127.0.0.1:{admin_port}",
        **extra,
    }
    proc = BrokerProcess(root / "broker", port, **config).start()
    return SecuredBroker(proc, pki, ssl_port, sasl_port, sasl_plain_port, admin_port)


@contextmanager
def secured_broker_with_users(root: Path, **extra: object) -> Iterator[SecuredBroker]:
    """start_secured_broker with the SCRAM users of PASSWORDS added, stopped at the end (what
    a module's fixture yields after creating its topics and ACLs)."""
    broker = start_secured_broker(root, **extra)
    try:
        add_users(broker.internal)
        yield broker
    finally:
        broker.proc.stop()


def add_users(bootstrap: str, names: tuple[str, ...] = ("alice", "bob", "admin")) -> None:
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap})
    ups = []
    for name in names:
        for mechanism in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512):
            ups.append(UserScramCredentialUpsertion(name, ScramCredentialInfo(mechanism, 4096),
                                                    PASSWORDS[name].encode()))
    for future in admin.alter_user_scram_credentials(ups).values():
        future.result(15)


def create_acls(conf: dict[str, Any], rows: list[tuple[str, str, str, str, str, str]]) -> None:
    """ACLs with librdkafka's admin API: rows of (resource type, name, pattern type,
    principal, operation, permission) by confluent-kafka's enum names (BROKER: the cluster)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    admin = AdminClient(conf)
    bindings = [AclBinding(ResourceType[rt], name, ResourcePatternType[pt], principal, "*", AclOperation[op],
                           AclPermissionType[perm]) for rt, name, pt, principal, op, perm in rows]
    for future in admin.create_acls(bindings).values():
        future.result(15)


@dataclass(frozen=True)
class ClientSecurity:
    """One way in: `mode` is mtls, or a SASL mechanism over SASL_SSL."""

    broker: SecuredBroker
    mode: str
    user: str = "alice"
    password: str | None = None

    @property
    def bootstrap(self) -> str:
        return self.broker.ssl if self.mode == "mtls" else self.broker.sasl_ssl

    def _pw(self) -> str:
        return self.password if self.password is not None else PASSWORDS[self.user]

    def librdkafka(self) -> dict[str, Any]:
        pki = self.broker.pki
        out: dict[str, Any] = {"bootstrap.servers": self.bootstrap, "ssl.ca.location": str(pki.ca.cert_path)}
        if self.mode == "mtls":
            return {**out, "security.protocol": "SSL", "ssl.certificate.location": str(pki.client_cert[self.user]),
                    "ssl.key.location": str(pki.client_key[self.user])}
        return {**out, "security.protocol": "SASL_SSL", "sasl.mechanisms": self.mode, "sasl.username": self.user,
                "sasl.password": self._pw()}

    def kafka_python(self) -> dict[str, Any]:
        pki = self.broker.pki
        out: dict[str, Any] = {"bootstrap_servers": self.bootstrap, "ssl_cafile": str(pki.ca.cert_path)}
        if self.mode == "mtls":
            return {**out, "security_protocol": "SSL", "ssl_certfile": str(pki.client_cert[self.user]),
                    "ssl_keyfile": str(pki.client_key[self.user])}
        return {**out, "security_protocol": "SASL_SSL", "sasl_mechanism": self.mode,
                "sasl_plain_username": self.user, "sasl_plain_password": self._pw()}

    def aiokafka(self) -> dict[str, Any]:
        from aiokafka.helpers import create_ssl_context

        pki = self.broker.pki
        if self.mode == "mtls":
            ctx = create_ssl_context(cafile=str(pki.ca.cert_path), certfile=str(pki.client_cert[self.user]),
                                     keyfile=str(pki.client_key[self.user]))
            return {"bootstrap_servers": self.bootstrap, "security_protocol": "SSL", "ssl_context": ctx}
        ctx = create_ssl_context(cafile=str(pki.ca.cert_path))
        return {"bootstrap_servers": self.bootstrap, "security_protocol": "SASL_SSL", "ssl_context": ctx,
                "sasl_mechanism": self.mode, "sasl_plain_username": self.user, "sasl_plain_password": self._pw()}

    def dcmirror(self) -> dict[str, Any]:
        """The project's own client: the same names as librdkafka."""
        return self.librdkafka()
