"""Dynamic broker configs (KIP-226) through real clients against real broker processes:
AlterConfigs / IncrementalAlterConfigs on BROKER resources ("" the cluster-wide default,
"<id>" one broker), DescribeConfigs sources and synonyms, Kafka's refusals, and the
configs taking effect without a restart (retention, message.max.bytes).

librdkafka (confluent-kafka) refuses an empty resource name before sending anything, and
kafka-python's admin methods refuse a non-integer broker name, so the cluster-wide default
is set here by `dcmirror configs --entity-default` and by kafka-python's own request
encoder sent through its client; a broker's own configs go through both admin APIs.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.harness import BrokerProcess, ClusterProcesses
from tests.interop.clients import ck_admin, ck_create_topic, ck_produce, ck_watermarks
from tests.interop.common import Rec, wait_until

pytestmark = pytest.mark.timeout(180)

# Kafka's ConfigSource values and error codes, spelled out.
TOPIC_CONFIG = 1
DYNAMIC_BROKER_CONFIG = 2
DYNAMIC_DEFAULT_BROKER_CONFIG = 3
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5
MESSAGE_TOO_LARGE = 10
INVALID_CONFIG = 40
INVALID_REQUEST = 42
WEEK_MS = "604800000"


# ---- clients ---------------------------------------------------------------------------------


def configs_cli(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deploy.cli", "configs", "--bootstrap", bootstrap, *args],
                          capture_output=True, text=True, timeout=60)


def set_cluster_default(bootstrap: str, **configs: str) -> None:
    r = configs_cli(bootstrap, "--entity-type", "brokers", "--entity-default", "--alter", "--add-config",
                    ",".join(f"{k.replace('_', '.')}={v}" for k, v in configs.items()))
    assert (r.returncode, r.stdout, r.stderr) == (0, "Completed updating default config for brokers in the cluster.\n",
                                                  ""), r


def kp_admin(bootstrap: str) -> Any:
    from kafka.admin import KafkaAdminClient

    return KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000)


def kp_alter_default(bootstrap: str, configs: dict[str, Any], *, incremental: bool = True) -> str:
    """kafka-python's IncrementalAlterConfigs / AlterConfigs request for resource BROKER ""
    (its alter_configs refuses a non-integer broker name), sent by its own client."""
    from kafka.admin import ConfigResource, ConfigResourceType

    admin = kp_admin(bootstrap)
    try:
        request = admin._alter_configs_request([ConfigResource(ConfigResourceType.BROKER, "", configs)],
                                               False, incremental)
        response = admin._manager.run(admin._manager.send, request)
        return str(admin._alter_configs_process_responses(response.responses)["broker"][""])
    finally:
        admin.close()


def kp_describe_broker(bootstrap: str, broker: str) -> dict[str, dict[str, Any]]:
    from kafka.admin import ConfigResource, ConfigResourceType

    admin = kp_admin(bootstrap)
    try:
        result = admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, broker)], include_synonyms=True,
                                        config_filter="all")
        return dict(result["broker"][broker])
    finally:
        admin.close()


def ck_describe(bootstrap: str, kind: str, name: str) -> dict[str, Any]:
    from confluent_kafka.admin import ConfigResource, ResourceType

    resource = ConfigResource(ResourceType[kind], name)
    admin = ck_admin(bootstrap)  # alive until the answer is in
    (future,) = admin.describe_configs([resource], request_timeout=15).values()
    return dict(future.result())


def ck_view(bootstrap: str, kind: str, name: str, key: str) -> tuple[str | None, int]:
    """(value, source) of one config as librdkafka reports it."""
    entry = ck_describe(bootstrap, kind, name)[key]
    return entry.value, int(entry.source)


def ck_incremental(bootstrap: str, broker: str, ops: list[tuple[str, str, str | None]], *,
                   validate_only: bool = False) -> tuple[int, str] | None:
    """IncrementalAlterConfigs on BROKER `broker`; None on success, else (code, message)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType[op]) for k, op, v in ops]
    resource = ConfigResource(ResourceType.BROKER, broker, incremental_configs=entries)
    admin = ck_admin(bootstrap)
    (future,) = admin.incremental_alter_configs([resource], validate_only=validate_only, request_timeout=15).values()
    try:
        future.result()
        return None
    except KafkaException as exc:
        return exc.args[0].code(), exc.args[0].str()


def ck_alter_legacy(bootstrap: str, broker: str, configs: dict[str, str]) -> None:
    """AlterConfigs (the whole dynamic config of the broker is replaced)."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    resource = ConfigResource(ResourceType.BROKER, broker, set_config=configs)
    admin = ck_admin(bootstrap)
    with pytest.warns(DeprecationWarning):  # confluent-kafka deprecates the API, not Kafka
        futures = admin.alter_configs([resource], request_timeout=15)
    for future in futures.values():
        assert future.result() is None


def ck_produce_one(bootstrap: str, topic: str, size: int) -> int:
    """Produce one record of `size` value bytes; the delivery report's error code (0: ok)."""
    from confluent_kafka import Producer

    codes: list[int] = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "compression.type": "none",
                         "message.send.max.retries": 0, "enable.idempotence": False})
    producer.produce(topic, b"x" * size, partition=0,
                     on_delivery=lambda err, _msg: codes.append(0 if err is None else err.code()))
    assert producer.flush(30) == 0
    (code,) = codes
    return code


# ---- one broker -------------------------------------------------------------------------------


def test_cluster_default_retention_applies_live_and_survives_a_restart(broker_factory) -> None:
    broker: BrokerProcess = broker_factory(**{"log.retention.check.interval.ms": 500})
    bs = broker.bootstrap
    ck_create_topic(bs, "bc-follows", 1, {"segment.bytes": "10000"})
    ck_create_topic(bs, "bc-own", 1, {"segment.bytes": "10000", "retention.ms": "86400000"})
    two_hours_ago_ms = int(time.time() * 1000) - 2 * 3_600_000
    recs = [Rec(0, b"k", f"{i:05d}".encode() + b"v" * 200, (), two_hours_ago_ms) for i in range(300)]
    for topic in ("bc-follows", "bc-own"):
        ck_produce(bs, topic, recs, {"linger.ms": 0}, flush_every=20)
    time.sleep(1.5)  # retention ran at least twice: a week's retention keeps everything
    assert ck_watermarks(bs, "bc-follows", 1) == {0: (0, 300)}
    assert ck_view(bs, "TOPIC", "bc-follows", "retention.ms") == (WEEK_MS, DEFAULT_CONFIG)

    set_cluster_default(bs, **{"log.retention.ms": "3600000"})

    # The topic without its own retention.ms follows the new default at once: every segment
    # (records two hours old; the active one rolls, as in Kafka) goes; the topic with its own
    # retention.ms keeps everything.
    wait_until(lambda: ck_watermarks(bs, "bc-follows", 1) == {0: (300, 300)} or None, 20,
               what="retention under the new cluster default")
    assert ck_watermarks(bs, "bc-own", 1) == {0: (0, 300)}
    assert ck_view(bs, "TOPIC", "bc-follows", "retention.ms") == ("3600000", DYNAMIC_DEFAULT_BROKER_CONFIG)
    assert ck_view(bs, "TOPIC", "bc-own", "retention.ms") == ("86400000", TOPIC_CONFIG)
    assert ck_view(bs, "BROKER", "1", "log.retention.ms") == ("3600000", DYNAMIC_DEFAULT_BROKER_CONFIG)
    kp = kp_describe_broker(bs, "1")["log.retention.ms"]
    assert (kp["value"], kp["config_source"], kp["read_only"], kp["is_sensitive"]) == (
        "3600000", "DYNAMIC_DEFAULT_BROKER_CONFIG", False, False)
    # Kafka's log.retention.ms has no default: its chain ends at log.retention.hours' (Kafka 4.3.1's answer)
    assert [(s["name"], s["value"], s["source"]) for s in kp["synonyms"]] == [
        ("log.retention.ms", "3600000", "DYNAMIC_DEFAULT_BROKER_CONFIG"),
        ("log.retention.hours", "168", "DEFAULT_CONFIG")]
    r = configs_cli(bs, "--entity-type", "brokers", "--entity-default", "--describe")
    # (min.insync.replicas: written when the cluster was formatted, for KIP-966, as Kafka 4's)
    assert (r.returncode, r.stdout) == (0, "Default configs for brokers in the cluster are:\n"
                                           "  log.retention.ms=3600000 sensitive=false "
                                           "synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:log.retention.ms=3600000}\n"
                                           "  min.insync.replicas=1 sensitive=false "
                                           "synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:min.insync.replicas=1}\n"), r

    broker.restart()  # the metadata log holds it: nothing to set again
    assert ck_view(bs, "BROKER", "1", "log.retention.ms") == ("3600000", DYNAMIC_DEFAULT_BROKER_CONFIG)
    assert ck_view(bs, "TOPIC", "bc-follows", "retention.ms") == ("3600000", DYNAMIC_DEFAULT_BROKER_CONFIG)
    assert ck_watermarks(bs, "bc-follows", 1) == {0: (300, 300)}

    # Deleting the default falls back to Kafka's.
    assert kp_alter_default(bs, {"log.retention.ms": ("DELETE", None)}) == "OK"
    assert ck_view(bs, "TOPIC", "bc-follows", "retention.ms") == (WEEK_MS, DEFAULT_CONFIG)
    assert ck_view(bs, "BROKER", "1", "log.retention.ms") == (None, DEFAULT_CONFIG)  # as Kafka describes it


def test_a_broker_override_wins_over_the_default_and_deleting_it_falls_back(broker_factory) -> None:
    broker: BrokerProcess = broker_factory(**{"log.retention.ms": "50000"})  # static
    bs = broker.bootstrap
    ck_create_topic(bs, "bc-layers", 1)
    assert ck_view(bs, "TOPIC", "bc-layers", "retention.ms") == ("50000", STATIC_BROKER_CONFIG)
    assert kp_alter_default(bs, {"log.retention.ms": "40000"}) == "OK"
    assert ck_incremental(bs, "1", [("log.retention.ms", "SET", "30000")]) is None
    assert ck_view(bs, "BROKER", "1", "log.retention.ms") == ("30000", DYNAMIC_BROKER_CONFIG)
    assert ck_view(bs, "TOPIC", "bc-layers", "retention.ms") == ("30000", DYNAMIC_BROKER_CONFIG)
    kp = kp_describe_broker(bs, "1")["log.retention.ms"]
    assert [(s["value"], s["source"]) for s in kp["synonyms"]] == [
        ("30000", "DYNAMIC_BROKER_CONFIG"), ("40000", "DYNAMIC_DEFAULT_BROKER_CONFIG"),
        ("50000", "STATIC_BROKER_CONFIG"), ("168", "DEFAULT_CONFIG")]
    r = configs_cli(bs, "--entity-type", "brokers", "--entity-name", "1", "--describe")
    assert r.returncode == 0 and r.stdout.splitlines() == [
        "Dynamic configs for broker 1 are:",
        "  log.retention.ms=30000 sensitive=false synonyms={DYNAMIC_BROKER_CONFIG:log.retention.ms=30000, "
        "DYNAMIC_DEFAULT_BROKER_CONFIG:log.retention.ms=40000, STATIC_BROKER_CONFIG:log.retention.ms=50000, "
        "DEFAULT_CONFIG:log.retention.hours=168}"], r

    # validate_only changes nothing.
    assert ck_incremental(bs, "1", [("log.retention.ms", "SET", "20000")], validate_only=True) is None
    assert ck_view(bs, "BROKER", "1", "log.retention.ms") == ("30000", DYNAMIC_BROKER_CONFIG)
    # APPEND on a list config starts from Kafka's default ("delete").
    assert ck_incremental(bs, "1", [("log.cleanup.policy", "APPEND", "compact")]) is None
    assert ck_view(bs, "BROKER", "1", "log.cleanup.policy") == ("delete,compact", DYNAMIC_BROKER_CONFIG)

    assert ck_incremental(bs, "1", [("log.retention.ms", "DELETE", None)]) is None
    assert ck_view(bs, "TOPIC", "bc-layers", "retention.ms") == ("40000", DYNAMIC_DEFAULT_BROKER_CONFIG)
    r = configs_cli(bs, "--entity-type", "brokers", "--entity-default", "--alter", "--delete-config", "log.retention.ms")
    assert (r.returncode, r.stdout) == (0, "Completed updating default config for brokers in the cluster.\n"), r
    assert ck_view(bs, "TOPIC", "bc-layers", "retention.ms") == ("50000", STATIC_BROKER_CONFIG)


def test_message_max_bytes_lowered_without_a_restart(broker) -> None:
    bs = broker.bootstrap
    ck_create_topic(bs, "bc-size", 1)
    assert ck_produce_one(bs, "bc-size", 5000) == 0
    # AlterConfigs (not incremental): the broker's dynamic config becomes exactly this.
    ck_alter_legacy(bs, "1", {"message.max.bytes": "2048"})
    assert ck_view(bs, "TOPIC", "bc-size", "max.message.bytes") == ("2048", DYNAMIC_BROKER_CONFIG)
    assert ck_produce_one(bs, "bc-size", 5000) == MESSAGE_TOO_LARGE
    assert ck_produce_one(bs, "bc-size", 500) == 0
    ck_alter_legacy(bs, "1", {})
    assert ck_view(bs, "TOPIC", "bc-size", "max.message.bytes") == ("1048588", DEFAULT_CONFIG)
    assert ck_produce_one(bs, "bc-size", 5000) == 0
    assert ck_watermarks(bs, "bc-size", 1) == {0: (0, 3)}


@pytest.mark.parametrize("ops, code, message", [
    ([("node.id", "SET", "7")], INVALID_REQUEST, "Cannot update these configs dynamically: [node.id]"),
    ([("broker.id", "SET", "7"), ("log.dirs", "SET", "/tmp/x")], INVALID_REQUEST,
     "Cannot update these configs dynamically: [broker.id, log.dirs]"),
    ([("log.retention.ms", "SET", "soon")], INVALID_REQUEST,
     "Invalid value soon for configuration log.retention.ms: Not a number of type LONG"),
    ([("min.insync.replicas", "SET", "0")], INVALID_REQUEST,
     "Invalid value 0 for configuration min.insync.replicas: Value must be at least 1"),
    ([("no.such.config", "SET", "1")], INVALID_CONFIG,
     "Unknown broker config name(s): no.such.config (use Kafka's broker config names, e.g. log.retention.ms)"),
    ([("log.retention.ms", "APPEND", "5")], INVALID_CONFIG,
     "Can't APPEND to key log.retention.ms because its type is not LIST."),
])
def test_refusals_with_kafkas_codes_and_messages(broker, ops, code, message) -> None:
    bs = broker.bootstrap
    assert ck_incremental(bs, "1", ops) == (code, message)
    assert ck_incremental(bs, "1", ops, validate_only=True) == (code, message)
    # Nothing was stored.
    assert all(e.source != DYNAMIC_BROKER_CONFIG for e in ck_describe(bs, "BROKER", "1").values())


def test_kafka_python_alter_configs_and_refusals(broker) -> None:
    from kafka.admin import ConfigResource, ConfigResourceType

    bs = broker.bootstrap
    admin = kp_admin(bs)
    try:
        ok = admin.alter_configs([ConfigResource(ConfigResourceType.BROKER, "1", {"log.retention.bytes": "123456"})])
        assert ok == {"broker": {"1": "OK"}}
        refused = admin.alter_configs([ConfigResource(ConfigResourceType.BROKER, "1", {"sasl.jaas.config": "x y z"})],
                                      raise_on_unknown=False)
        assert refused == {"broker": {"1": "[Error 42] InvalidRequestError: "
                                           "Cannot update these configs dynamically: [sasl.jaas.config]"}}
    finally:
        admin.close()
    described = kp_describe_broker(bs, "1")
    assert (described["log.retention.bytes"]["value"], described["log.retention.bytes"]["config_source"]) == (
        "123456", "DYNAMIC_BROKER_CONFIG")
    jaas = described["sasl.jaas.config"]
    assert (jaas["value"], jaas["is_sensitive"], jaas["read_only"]) == (None, True, True)
    assert described["node.id"]["read_only"] is True


def _api_versions_answered(sock: socket.socket) -> bool:
    """Send ApiVersions v0 on a raw connection: True if answered, False if the broker closed it."""
    sock.sendall(struct.pack(">ihhih", 10, 18, 0, 7, -1))
    try:
        head = sock.recv(8)
    except ConnectionResetError:
        return False
    return len(head) == 8 and struct.unpack(">ii", head)[1] == 7


def test_max_connections_lowered_without_a_restart(broker) -> None:
    bs = broker.bootstrap
    set_cluster_default(bs, **{"max.connections": "2"})  # the CLI's own connection is gone when it exits
    wait_until(lambda: "max.connections" in broker.log_text() or None, 10, what="the broker applying it")
    host, port = bs.split(":")
    socks = [socket.create_connection((host, int(port)), timeout=10) for _ in range(3)]
    try:
        time.sleep(0.5)
        assert [_api_versions_answered(s) for s in socks] == [True, True, False]
    finally:
        for s in socks:
            s.close()
    time.sleep(0.5)  # the broker saw them close
    # Back to the static value: a new connection (the CLI's) is accepted again.
    r = configs_cli(bs, "--entity-type", "brokers", "--entity-default", "--alter", "--delete-config",
                    "max.connections")
    assert r.returncode == 0, r
    assert ck_view(bs, "BROKER", "1", "max.connections") == ("10000", DEFAULT_CONFIG)


# ---- three brokers ----------------------------------------------------------------------------


def test_every_broker_reports_the_default_and_only_its_own_override(cluster_factory) -> None:
    cluster: ClusterProcesses = cluster_factory(3)
    bs = cluster.bootstrap
    from tests.cluster_helpers import create_topic

    create_topic(bs, "bc-cluster", 3, 3)
    set_cluster_default(bs, **{"log.retention.ms": "3600000", "message.max.bytes": "4096"})
    for node in (1, 2, 3):
        assert ck_view(bs, "BROKER", str(node), "log.retention.ms") == ("3600000", DYNAMIC_DEFAULT_BROKER_CONFIG)
        assert ck_view(cluster.bootstrap_of(node), "TOPIC", "bc-cluster", "max.message.bytes") == (
            "4096", DYNAMIC_DEFAULT_BROKER_CONFIG)
    # A broker's own value goes to that broker and changes only it.
    assert ck_incremental(bs, "2", [("log.retention.ms", "SET", "1800000")]) is None
    assert [ck_view(bs, "BROKER", str(n), "log.retention.ms") for n in (1, 2, 3)] == [
        ("3600000", DYNAMIC_DEFAULT_BROKER_CONFIG), ("1800000", DYNAMIC_BROKER_CONFIG),
        ("3600000", DYNAMIC_DEFAULT_BROKER_CONFIG)]
    # A broker asked for another broker's own configs refuses, as Kafka does.
    from kafka.admin import ConfigResource, ConfigResourceType

    admin = kp_admin(cluster.bootstrap_of(1))
    try:
        request = admin._alter_configs_request(
            [ConfigResource(ConfigResourceType.BROKER, "3", {"log.retention.ms": "1"})], False, True)
        response = admin._manager.run(admin._manager.send, request, 1)  # to broker 1
        (r,) = response.responses
        assert (r.error_code, r.error_message) == (INVALID_REQUEST, "Unexpected broker id, expected 1, but received 3")
    finally:
        admin.close()
    # A restarted broker still has both, and a large record is refused on every leader.
    cluster[3].stop()
    cluster[3].start()
    assert ck_view(bs, "BROKER", "3", "log.retention.ms") == ("3600000", DYNAMIC_DEFAULT_BROKER_CONFIG)
    assert ck_view(bs, "BROKER", "2", "log.retention.ms") == ("1800000", DYNAMIC_BROKER_CONFIG)
    assert ck_produce_one(bs, "bc-cluster", 8000) == MESSAGE_TOO_LARGE
