"""ACLs with librdkafka's admin API and clients: what an authenticated principal may do is
exactly what its bindings allow (Kafka's errors for the rest), and users and ACLs live in
the metadata log (they survive kill -9 and a restart)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from tests.security.secured import ClientSecurity, SecuredBroker, secured_broker_with_users

LIT, PRE = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    with secured_broker_with_users(tmp_path_factory.mktemp("acls")) as broker:
        admin = AdminClient({"bootstrap.servers": broker.internal})
        topics = ["pageviews", "orders", "east.clicks", "east.secret"]
        for f in admin.create_topics([NewTopic(t, 1, 1) for t in topics]).values():
            f.result(15)
        p = Producer({"bootstrap.servers": broker.internal})
        for t in topics:
            for i in range(5):
                p.produce(t, f"{t}-{i}".encode())
        assert p.flush(15) == 0
        acls = [
            AclBinding(ResourceType.TOPIC, "pageviews", LIT, "User:alice", "*", AclOperation.READ, ALLOW),
            AclBinding(ResourceType.GROUP, "readers", LIT, "User:alice", "*", AclOperation.READ, ALLOW),
            AclBinding(ResourceType.TOPIC, "east.", PRE, "User:bob", "*", AclOperation.READ, ALLOW),
            AclBinding(ResourceType.TOPIC, "east.secret", LIT, "User:bob", "*", AclOperation.READ, DENY),
            AclBinding(ResourceType.GROUP, "bob", PRE, "User:bob", "*", AclOperation.READ, ALLOW),
        ]
        for f in admin.create_acls(acls).values():
            f.result(15)
        yield broker


def _admin(sec: ClientSecurity) -> AdminClient:
    return AdminClient({**sec.librdkafka(), "socket.timeout.ms": 10000})


def _consume(conf: dict[str, Any], topic: str, group: str, n: int = 5, timeout_s: float = 20) -> list[bytes] | KafkaError:
    c = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                return m.error()
            got.append(m.value())
        return got
    finally:
        c.close()


def _produce_error(conf: dict[str, Any], topic: str) -> int | None:
    errors: list[Any] = []
    p = Producer({**conf, "enable.idempotence": False, "message.timeout.ms": 5000})
    p.produce(topic, b"x", on_delivery=lambda e, m: errors.append(e))
    p.flush(15)
    return errors[0].code() if errors[0] is not None else None


def test_a_reader_reads_its_topic_with_its_group_and_nothing_else(secured: SecuredBroker) -> None:
    alice = ClientSecurity(secured, "SCRAM-SHA-512", "alice").librdkafka()
    assert _consume(alice, "pageviews", "readers") == [f"pageviews-{i}".encode() for i in range(5)]
    # another topic: TOPIC_AUTHORIZATION_FAILED
    err = _consume(alice, "orders", "readers")
    assert isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err
    # another group: GROUP_AUTHORIZATION_FAILED
    err = _consume(alice, "pageviews", "not-hers")
    assert isinstance(err, KafkaError) and err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED, err
    # produce: READ does not allow WRITE
    assert _produce_error(alice, "pageviews") == KafkaError.TOPIC_AUTHORIZATION_FAILED
    admin = _admin(ClientSecurity(secured, "SCRAM-SHA-512", "alice"))
    # create and delete topics
    with pytest.raises(KafkaException) as e:
        admin.create_topics([NewTopic("alices-own", 1, 1)])["alices-own"].result(15)
    assert e.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    with pytest.raises(KafkaException) as e:
        admin.delete_topics(["pageviews"])["pageviews"].result(15)
    assert e.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # describe: Metadata lists only what she may describe; asking for another topic is refused
    assert sorted(admin.list_topics(timeout=10).topics) == ["pageviews"]
    md = admin.list_topics(topic="orders", timeout=10)
    assert md.topics["orders"].error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # ACLs and users are the cluster's business (librdkafka drops DescribeAcls' error: kafka-python shows it)
    from kafka.admin import (
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        KafkaAdminClient,
        ResourcePatternFilter,
    )
    from kafka.admin import ResourceType as KpResourceType
    from kafka.errors import ClusterAuthorizationFailedError

    kp = KafkaAdminClient(**ClientSecurity(secured, "SCRAM-SHA-512", "alice").kafka_python())
    with pytest.raises(ClusterAuthorizationFailedError):
        kp.describe_acls(ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                                   ResourcePatternFilter(KpResourceType.ANY, None, ACLResourcePatternType.ANY)))
    kp.close()
    grant = AclBinding(ResourceType.TOPIC, "orders", LIT, "User:alice", "*", AclOperation.ALL, ALLOW)
    with pytest.raises(KafkaException) as e:
        next(iter(admin.create_acls([grant]).values())).result(15)
    assert e.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED


def test_prefixed_allow_with_a_literal_deny(secured: SecuredBroker) -> None:
    bob = ClientSecurity(secured, "SCRAM-SHA-256", "bob").librdkafka()
    assert _consume(bob, "east.clicks", "bob-1") == [f"east.clicks-{i}".encode() for i in range(5)]
    err = _consume(bob, "east.secret", "bob-2")
    assert isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err
    # DENY READ does not deny DESCRIBE: the topic is listed, as Kafka's authorizer does
    listed = AdminClient({**bob}).list_topics(timeout=10).topics
    assert sorted(listed) == ["east.clicks", "east.secret"]


def test_super_user_may_do_everything_over_sasl(secured: SecuredBroker) -> None:
    admin_conf = ClientSecurity(secured, "SCRAM-SHA-512", "admin").librdkafka()
    admin = AdminClient(admin_conf)
    admin.create_topics([NewTopic("admins", 1, 1)])["admins"].result(15)
    assert _produce_error(admin_conf, "admins") is None
    assert _consume(admin_conf, "orders", "any-group") == [f"orders-{i}".encode() for i in range(5)]
    found = admin.describe_acls(AclBindingFilter(ResourceType.TOPIC, None, ResourcePatternType.ANY, "User:bob", None,
                                                 AclOperation.ANY, AclPermissionType.ANY)).result(15)
    assert sorted((b.name, b.permission_type.name) for b in found) == [("east.", "ALLOW"), ("east.secret", "DENY")]
    admin.delete_topics(["admins"])["admins"].result(15)


def test_users_and_acls_survive_kill_9_and_restart(secured: SecuredBroker) -> None:
    admin = AdminClient({"bootstrap.servers": secured.internal})
    filt = AclBindingFilter(ResourceType.TOPIC, "temp", ResourcePatternType.LITERAL, None, None, AclOperation.ANY,
                            AclPermissionType.ANY)
    binding = AclBinding(ResourceType.TOPIC, "temp", LIT, "User:alice", "*", AclOperation.WRITE, ALLOW)
    next(iter(admin.create_acls([binding]).values())).result(15)
    before = sorted(str(b) for b in admin.describe_acls(AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
        AclPermissionType.ANY)).result(15))
    def users() -> dict[str, list[tuple[str, int]]]:
        described = admin.describe_user_scram_credentials().result(15)
        return {u: sorted((i.mechanism.name, i.iterations) for i in d.scram_credential_infos)
                for u, d in described.items()}

    users_before = users()
    assert users_before["alice"] == [("SCRAM_SHA_256", 4096), ("SCRAM_SHA_512", 4096)]
    secured.proc.kill9()
    secured.proc.start()
    admin = AdminClient({"bootstrap.servers": secured.internal})
    after = sorted(str(b) for b in admin.describe_acls(AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
        AclPermissionType.ANY)).result(15))
    assert after == before and len(after) == 6
    # the users still log in, and the ACLs still decide
    alice = ClientSecurity(secured, "SCRAM-SHA-512", "alice").librdkafka()
    assert sorted(AdminClient(alice).list_topics(timeout=15).topics) == ["pageviews"]
    assert _produce_error(alice, "orders") == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert users() == users_before
    # deleting by filter removes exactly the matching binding
    deleted = next(iter(admin.delete_acls([filt]).values())).result(15)
    assert [str(b) for b in deleted] == [str(binding)]


def test_authorized_operations_are_what_the_acls_allow(secured: SecuredBroker) -> None:
    """describe_topics / describe_cluster / describe_consumer_groups with
    include_authorized_operations: the authorizer's answer per operation (Kafka: READ implies
    DESCRIBE); a super user gets every operation of the resource type."""
    from confluent_kafka import TopicCollection

    def operations(conf: dict[str, Any]) -> tuple[set[AclOperation], set[AclOperation], set[AclOperation]]:
        admin = AdminClient(conf)
        topic = admin.describe_topics(TopicCollection(["pageviews"]), include_authorized_operations=True)
        cluster = admin.describe_cluster(include_authorized_operations=True).result(15)
        group = admin.describe_consumer_groups(["readers"], include_authorized_operations=True)["readers"].result(15)
        return (set(topic["pageviews"].result(15).authorized_operations), set(cluster.authorized_operations or ()),
                set(group.authorized_operations))

    op = AclOperation
    alice = operations(ClientSecurity(secured, "SCRAM-SHA-512", "alice").librdkafka())
    assert alice == ({op.READ, op.DESCRIBE}, set(), {op.READ, op.DESCRIBE}), alice
    admin = operations(ClientSecurity(secured, "SCRAM-SHA-512", "admin").librdkafka())
    assert admin == ({op.READ, op.WRITE, op.CREATE, op.DESCRIBE, op.DELETE, op.ALTER, op.DESCRIBE_CONFIGS, op.ALTER_CONFIGS},
                     {op.CREATE, op.CLUSTER_ACTION, op.DESCRIBE_CONFIGS, op.ALTER_CONFIGS, op.IDEMPOTENT_WRITE, op.ALTER,
                      op.DESCRIBE},
                     {op.READ, op.DESCRIBE, op.DELETE}), admin


def test_dynamic_broker_configs_need_the_cluster_config_operations(secured: SecuredBroker) -> None:
    """AlterConfigs / DescribeConfigs on a BROKER resource need ALTER_CONFIGS /
    DESCRIBE_CONFIGS on the CLUSTER resource (Kafka's KafkaApis)."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    def alter(conf: dict[str, Any], value: str | None) -> int:
        op = AlterConfigOpType.SET if value is not None else AlterConfigOpType.DELETE
        resource = ConfigResource(ResourceType.BROKER, "1",
                                  incremental_configs=[ConfigEntry("log.retention.bytes", value, incremental_operation=op)])
        admin = AdminClient(conf)
        try:
            admin.incremental_alter_configs([resource], request_timeout=15)[resource].result()
            return 0
        except KafkaException as exc:
            return int(exc.args[0].code())

    def describe(conf: dict[str, Any]) -> dict[str, Any] | int:
        resource = ConfigResource(ResourceType.BROKER, "1")
        admin = AdminClient(conf)
        try:
            return dict(admin.describe_configs([resource], request_timeout=15)[resource].result())
        except KafkaException as exc:
            return int(exc.args[0].code())

    bob = ClientSecurity(secured, "SCRAM-SHA-256", "bob").librdkafka()
    assert alter(bob, "123") == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    assert describe(bob) == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    admin = ClientSecurity(secured, "SCRAM-SHA-512", "admin").librdkafka()  # a super user
    assert alter(admin, "123") == 0
    described = describe(admin)
    assert isinstance(described, dict) and described["log.retention.bytes"].value == "123"
    # The SASL login the broker itself uses is never shown.
    assert described["sasl.jaas.config"].value is None and described["sasl.jaas.config"].is_sensitive
    assert alter(admin, None) == 0
