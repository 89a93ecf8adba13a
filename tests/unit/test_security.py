"""The sans-IO security core: SCRAM against RFC 7677's test vector, the SASL session's
state machine, the authorizer's rules (Kafka's StandardAuthorizer), principal mapping
rules, and the listener settings."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.security.acl import (
    AclBinding,
    AclFilter,
    AclOperation,
    AclPermissionType,
    Authorizer,
    InvalidAcl,
    PatternType,
    ResourceType,
)
from cluster.security.errors import AuthenticationFailed, SecurityConfigError
from cluster.security.listeners import parse_listeners, parse_protocol_map
from cluster.security.principal import KafkaPrincipal, SslPrincipalMapper, user
from cluster.security.sasl import SaslServerSession
from cluster.security.scram import (
    ScramClient,
    ScramServer,
    credential_from_salted,
    make_credential,
    password_matches,
    salted_password,
)

# ---- SCRAM ----------------------------------------------------------------------------------


def test_scram_sha_256_matches_rfc_7677():
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    credential = credential_from_salted("SCRAM-SHA-256", salted_password("SCRAM-SHA-256", b"pencil", salt, 4096),
                                        salt, 4096)
    client = ScramClient("SCRAM-SHA-256", "user", b"pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    server = ScramServer("SCRAM-SHA-256", lambda name: credential if name == "user" else None,
                         nonce=lambda: "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    assert client.first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    server_first = server.receive(client.first())
    assert server_first == b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    final = client.final(server_first)
    assert final == (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                     b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    server_final = server.receive(final)
    assert server_final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    client.verify(server_final)
    assert server.complete and server.username == "user"


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_wrong_password_unknown_user_and_fake_broker_fail(mechanism: str):
    credential = make_credential(mechanism, b"right", iterations=4096)
    store = {"alice": credential}

    # right password: both sides agree
    client = ScramClient(mechanism, "alice", b"right")
    server = ScramServer(mechanism, store.get)
    client.verify(server.receive(client.final(server.receive(client.first()))))
    for name, password in (("alice", b"wrong"), ("mallory", b"right")):
        client = ScramClient(mechanism, name, password)
        server = ScramServer(mechanism, store.get)
        with pytest.raises(AuthenticationFailed, match="invalid credentials"):
            server.receive(client.final(server.receive(client.first())))
    # a broker that does not hold the credential cannot fake the final signature
    client = ScramClient(mechanism, "alice", b"right")
    impostor = ScramServer(mechanism, {"alice": make_credential(mechanism, b"other", iterations=4096)}.get)
    server_first = impostor.receive(client.first())
    client.final(server_first)
    with pytest.raises(AuthenticationFailed):
        client.verify(b"v=" + base64.b64encode(b"x" * (32 if mechanism.endswith("256") else 64)))


def test_credential_never_holds_the_password_and_plain_checks_against_it():
    credential = make_credential("SCRAM-SHA-512", b"hunter2-secret", iterations=4096)
    assert b"hunter2-secret" not in repr(credential).encode()
    assert password_matches(credential, b"hunter2-secret")
    assert not password_matches(credential, b"hunter2")


@settings(max_examples=300, deadline=None)
@given(first=st.binary(max_size=200), final=st.binary(max_size=200))
def test_scram_server_takes_any_bytes_and_fails_cleanly(first: bytes, final: bytes):
    server = ScramServer("SCRAM-SHA-512", {"u": make_credential("SCRAM-SHA-512", b"p", iterations=4096)}.get)
    try:
        server.receive(first)
        server.receive(final)
    except AuthenticationFailed:
        return
    assert server.complete  # only a real proof gets here (random bytes never do)


def test_oversized_scram_message_is_refused_before_parsing():
    server = ScramServer("SCRAM-SHA-256", lambda name: None)
    with pytest.raises(AuthenticationFailed, match="over"):
        server.receive(b"n,,n=a,r=" + b"x" * 10_000)


# ---- the SASL session -----------------------------------------------------------------------


def _session(reauth_ms: int = 0) -> SaslServerSession:
    cred = make_credential("SCRAM-SHA-512", b"pw", iterations=4096)
    return SaslServerSession(("PLAIN", "SCRAM-SHA-512"),
                             lambda name, mech: cred if (name, mech) == ("alice", "SCRAM-SHA-512") else None,
                             reauth_ms=reauth_ms)


def test_plain_login_and_reauthentication_as_the_same_user_only():
    s = _session(reauth_ms=1000)
    assert not s.handshake("SCRAM-SHA-256", 1)  # not enabled
    with pytest.raises(AuthenticationFailed):
        s.authenticate(b"\x00alice\x00pw", 0)  # SaslHandshake first
    assert s.handshake("PLAIN", 1)
    s.authenticate(b"\x00alice\x00pw", now_ms=100)
    assert s.principal == user("alice") and s.session_lifetime_ms(600) == 500
    assert not s.expired(1099) and s.expired(1100)
    assert s.handshake("PLAIN", 1)  # KIP-368 re-authentication
    s.authenticate(b"\x00alice\x00pw", now_ms=1050)
    assert not s.expired(1100)
    s2 = _session()
    assert s2.handshake("PLAIN", 1)
    with pytest.raises(AuthenticationFailed):
        s2.authenticate(b"\x00alice\x00nope", 0)
    assert s2.principal is None and s2.state == "failed"
    for bad in (b"", b"alice", b"\x00\x00pw", b"bob\x00alice\x00pw", b"\x00alice\x00pw\x00x"):
        s3 = _session()
        s3.handshake("PLAIN", 1)
        with pytest.raises(AuthenticationFailed):
            s3.authenticate(bad, 0)


# ---- the authorizer -------------------------------------------------------------------------

ALICE = KafkaPrincipal.parse("User:alice")


def _acl(rt: ResourceType, name: str, op: AclOperation, perm: AclPermissionType = AclPermissionType.ALLOW,
         pattern: PatternType = PatternType.LITERAL, principal: str = "User:alice", host: str = "*") -> AclBinding:
    return AclBinding(rt, name, pattern, principal, host, op, perm).validate()


def test_authorizer_follows_kafkas_rules():
    a = Authorizer(super_users=["User:admin"])
    a.set_acls([
        _acl(ResourceType.TOPIC, "pageviews", AclOperation.READ),
        _acl(ResourceType.TOPIC, "east.", AclOperation.ALL, pattern=PatternType.PREFIXED),
        _acl(ResourceType.TOPIC, "east.secret", AclOperation.READ, AclPermissionType.DENY),
        _acl(ResourceType.GROUP, "*", AclOperation.READ, principal="User:*"),
        _acl(ResourceType.TOPIC, "lab", AclOperation.WRITE, host="10.0.0.1"),
    ])
    T = ResourceType.TOPIC
    assert a.authorize(ALICE, "1.2.3.4", AclOperation.READ, T, "pageviews")
    assert a.authorize(ALICE, "1.2.3.4", AclOperation.DESCRIBE, T, "pageviews")  # implied by READ
    assert not a.authorize(ALICE, "1.2.3.4", AclOperation.WRITE, T, "pageviews")
    assert not a.authorize(ALICE, "1.2.3.4", AclOperation.DESCRIBE_CONFIGS, T, "pageviews")
    assert a.authorize(ALICE, "1.2.3.4", AclOperation.WRITE, T, "east.pageviews")  # PREFIXED ALL
    assert not a.authorize(ALICE, "1.2.3.4", AclOperation.READ, T, "east.secret")  # LITERAL DENY wins
    assert a.authorize(ALICE, "1.2.3.4", AclOperation.WRITE, T, "east.secret")  # the DENY is READ only
    assert a.authorize(ALICE, "1.2.3.4", AclOperation.DESCRIBE, T, "east.secret")  # DENY READ does not deny DESCRIBE
    assert a.authorize(user("bob"), "1.2.3.4", AclOperation.READ, ResourceType.GROUP, "anything")
    assert not a.authorize(user("bob"), "1.2.3.4", AclOperation.READ, T, "pageviews")
    assert not a.authorize(ALICE, "1.2.3.4", AclOperation.WRITE, T, "lab")
    assert a.authorize(ALICE, "10.0.0.1", AclOperation.WRITE, T, "lab")
    assert not a.authorize(ALICE, "1.2.3.4", AclOperation.READ, T, "no-acl-at-all")
    assert a.authorize(user("admin"), "1.2.3.4", AclOperation.DELETE, T, "east.secret")
    assert a.any_allowed(ALICE, "1.2.3.4", AclOperation.WRITE, T)
    assert not a.any_allowed(user("bob"), "1.2.3.4", AclOperation.WRITE, T)
    open_by_default = Authorizer(allow_everyone_if_no_acl_found=True)
    open_by_default.set_acls([_acl(T, "pageviews", AclOperation.READ)])
    assert open_by_default.authorize(user("bob"), "h", AclOperation.WRITE, T, "other")
    assert not open_by_default.authorize(user("bob"), "h", AclOperation.READ, T, "pageviews")


def test_planted_bug_allow_before_deny_is_caught():
    """The rule checker above fails on an authorizer that lets ALLOW win over DENY."""

    class AllowWins(Authorizer):
        def authorize(self, principal, host, operation, resource_type, name):  # type: ignore[no-untyped-def]
            return any(b.permission is AclPermissionType.ALLOW and b.applies_to(resource_type, name)
                       and b.operation in (operation, AclOperation.ALL)
                       for b in self._by_type.get(resource_type, ()))

    a = AllowWins()
    a.set_acls([_acl(ResourceType.TOPIC, "east.", AclOperation.ALL, pattern=PatternType.PREFIXED),
                _acl(ResourceType.TOPIC, "east.secret", AclOperation.READ, AclPermissionType.DENY)])
    assert a.authorize(ALICE, "h", AclOperation.READ, ResourceType.TOPIC, "east.secret")  # the bug shows


def test_acl_validation_and_filters():
    with pytest.raises(InvalidAcl, match="cluster resource"):
        _acl(ResourceType.CLUSTER, "mine", AclOperation.ALTER)
    with pytest.raises(InvalidAcl, match="does not apply"):
        _acl(ResourceType.GROUP, "g", AclOperation.WRITE)
    with pytest.raises(InvalidAcl, match="TYPE:NAME"):
        _acl(ResourceType.TOPIC, "t", AclOperation.READ, principal="alice")
    bindings = [_acl(ResourceType.TOPIC, "east.", AclOperation.READ, pattern=PatternType.PREFIXED),
                _acl(ResourceType.TOPIC, "east.clicks", AclOperation.READ),
                _acl(ResourceType.TOPIC, "*", AclOperation.DESCRIBE),
                _acl(ResourceType.GROUP, "east.clicks", AclOperation.READ)]
    match = AclFilter(ResourceType.TOPIC, "east.clicks", PatternType.MATCH)
    assert [b for b in bindings if match.matches(b)] == bindings[:3]
    literal = AclFilter(ResourceType.ANY, "east.clicks", PatternType.LITERAL)
    assert [b for b in bindings if literal.matches(b)] == [bindings[1], bindings[3]]
    assert all(AclFilter().matches(b) for b in bindings)


# ---- principals and listeners ---------------------------------------------------------------


def test_ssl_principal_mapping_rules():
    mapper = SslPrincipalMapper(r"RULE:^CN=([^,]*),OU=brokers.*$/broker-$1/L,RULE:^CN=(.*?),.*$/$1/,DEFAULT")
    assert mapper.principal_for("CN=Node-1,OU=brokers,O=dcmirror") == user("broker-node-1")
    assert mapper.principal_for("CN=alice,O=dcmirror") == user("alice")
    assert mapper.principal_for("O=dcmirror") == user("O=dcmirror")
    assert SslPrincipalMapper().principal_for("CN=x,O=y") == user("CN=x,O=y")
    with pytest.raises(SecurityConfigError):
        SslPrincipalMapper("RULE:missing-slashes")


def test_listener_settings_parse_with_kafkas_errors():
    assert [str(a) for a in parse_listeners("INTERNAL://127.0.0.1:9092, external://0.0.0.0:9093")] == [
        "INTERNAL://127.0.0.1:9092", "EXTERNAL://0.0.0.0:9093"]
    assert parse_protocol_map("INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL") == {"INTERNAL": "PLAINTEXT",
                                                                          "EXTERNAL": "SASL_SSL"}
    for bad in ("INTERNAL:127.0.0.1:9092", "A://h:99999", "A://h:1,A://h:2"):
        with pytest.raises(SecurityConfigError):
            parse_listeners(bad)
    with pytest.raises(SecurityConfigError, match="PROTOCOL"):
        parse_protocol_map("EXTERNAL:TLS")
