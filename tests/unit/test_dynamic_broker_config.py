"""Dynamic broker configs (KIP-226) on one broker: the configs in force, topic config
resolution (topic > dynamic broker > dynamic default > static > default) and what
DescribeConfigs reports for each (cluster/broker/dynamic_config.py), over a metadata image
built from BrokerConfig records as the metadata log holds them."""

from __future__ import annotations

from typing import Any

import pytest

from cluster.broker.config import ALTERABLE_BROKER_CONFIGS, BROKER_QUOTA_CONFIG_DEFS, BrokerConfig
from cluster.broker.dynamic_config import DynamicBrokerConfig
from cluster.broker.kafka_configs import KAFKA_BROKER_CONFIGS
from cluster.controller.image import MetadataImage, record
from deploy.configs_cmd import parse_add_config

# Kafka's ConfigSource values, spelled out.
TOPIC_CONFIG = 1
DYNAMIC_BROKER_CONFIG = 2
DYNAMIC_DEFAULT_BROKER_CONFIG = 3
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5

NODE = 2


def _setup(static: dict[str, object] | None = None,
           dynamic: dict[str, dict[str, str]] | None = None) -> tuple[DynamicBrokerConfig, MetadataImage]:
    image = MetadataImage()
    for name, configs in (dynamic or {}).items():
        for key, value in configs.items():
            image.apply(record("BrokerConfig", resource_name=name, key=key, value=value))
    return DynamicBrokerConfig(BrokerConfig.from_overrides(static or {}), NODE, lambda: image), image


def _set(image: MetadataImage, name: str, key: str, value: str | None) -> None:
    image.apply(record("BrokerConfig", resource_name=name, key=key, value=value))


def _entry(entries: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = [e for e in entries if e["name"] == name]
    return found


def _chain(entry: dict[str, Any]) -> list[tuple[str, str | None, int]]:
    return [(s["name"], s["value"], s["source"]) for s in entry["synonyms"]]


def test_topic_configs_resolve_topic_over_own_over_default_over_static_over_kafka_default() -> None:
    cfg, image = _setup({"log.retention.ms": "50000"})
    assert cfg.log_config({}).retention_ms == 50_000  # static
    _set(image, "", "log.retention.ms", "40000")
    assert cfg.log_config({}).retention_ms == 40_000  # dynamic default, without a restart
    _set(image, str(NODE), "log.retention.ms", "30000")
    assert cfg.log_config({}).retention_ms == 30_000  # this broker's own
    _set(image, "9", "log.retention.ms", "1")  # another broker's own: not this one's
    assert cfg.log_config({}).retention_ms == 30_000
    assert cfg.log_config({"retention.ms": "20000"}).retention_ms == 20_000  # the topic's own wins
    _set(image, str(NODE), "log.retention.ms", None)
    assert cfg.log_config({}).retention_ms == 40_000  # deleting falls back
    _set(image, "", "log.retention.ms", None)
    assert cfg.log_config({}).retention_ms == 50_000
    assert _setup()[0].log_config({}).retention_ms == 604_800_000  # Kafka's default


def test_message_max_bytes_and_min_insync_replicas_reach_the_log_config() -> None:
    cfg, image = _setup()
    _set(image, "", "message.max.bytes", "2048")
    _set(image, "", "min.insync.replicas", "2")
    config = cfg.log_config({})
    assert (config.max_message_bytes, config["min.insync.replicas"]) == (2048, 2)
    assert cfg.current["message.max.bytes"] == 2048


def test_a_stored_value_this_broker_cannot_use_is_skipped() -> None:
    # The log may hold what another (newer) broker accepted: keep the rest working.
    cfg, image = _setup({"log.retention.ms": "50000"}, {"": {"log.retention.ms": "soon", "log.retention.bytes": "7",
                                                             "num.io.threads": "8"}})
    assert (cfg.log_config({}).retention_ms, cfg.log_config({}).retention_bytes) == (50_000, 7)
    entry = _entry(cfg.describe_broker(str(NODE), {"log.retention.ms"}, True), "log.retention.ms")
    assert (entry["value"], entry["config_source"]) == ("50000", STATIC_BROKER_CONFIG)


def test_describe_broker_reports_value_source_read_only_and_synonyms() -> None:
    cfg, image = _setup({"log.retention.ms": "50000", "node.id": "2"},
                        {"": {"log.retention.ms": "40000"}, str(NODE): {"log.retention.ms": "30000"}})
    entries = cfg.describe_broker(str(NODE), None, True)
    retention = _entry(entries, "log.retention.ms")
    assert (retention["value"], retention["config_source"], retention["read_only"], retention["is_sensitive"]) == (
        "30000", DYNAMIC_BROKER_CONFIG, False, False)
    # Kafka's log.retention.ms has no default: the chain ends at log.retention.hours' (Kafka 4.3.1's answer)
    assert _chain(retention) == [("log.retention.ms", "30000", DYNAMIC_BROKER_CONFIG),
                                 ("log.retention.ms", "40000", DYNAMIC_DEFAULT_BROKER_CONFIG),
                                 ("log.retention.ms", "50000", STATIC_BROKER_CONFIG),
                                 ("log.retention.hours", "168", DEFAULT_CONFIG)]
    node = _entry(entries, "node.id")
    assert (node["value"], node["config_source"], node["read_only"]) == ("2", STATIC_BROKER_CONFIG, True)
    segment = _entry(entries, "log.segment.bytes")
    assert (segment["value"], segment["config_source"], segment["read_only"], _chain(segment)) == (
        "1073741824", DEFAULT_CONFIG, False, [("log.segment.bytes", "1073741824", DEFAULT_CONFIG)])
    # Every config is reported once; read_only exactly where an alter is refused (Kafka's
    # replication quotas are alterable but described only once set, as Kafka's).
    assert len({e["name"] for e in entries}) == len(entries)
    assert {e["name"] for e in entries if not e["read_only"]} == set(ALTERABLE_BROKER_CONFIGS) - set(
        BROKER_QUOTA_CONFIG_DEFS)
    # Kafka's every broker config is there, those this broker has no use for with Kafka's default
    assert set(KAFKA_BROKER_CONFIGS) <= {e["name"] for e in entries}
    threads = _entry(entries, "num.io.threads")
    assert (threads["value"], threads["config_source"], threads["read_only"]) == ("8", DEFAULT_CONFIG, False)
    unset = _entry(cfg.describe_broker(str(NODE), None, True), "log.roll.ms")
    assert (unset["value"], unset["config_source"], unset["synonyms"]) == (None, DEFAULT_CONFIG, [])
    # Without include_synonyms there are none.
    assert _entry(cfg.describe_broker(str(NODE), None, False), "log.retention.ms")["synonyms"] == []


def test_describe_of_the_default_resource_lists_only_the_cluster_wide_dynamic_configs() -> None:
    cfg, _ = _setup({"log.retention.ms": "50000"}, {"": {"log.retention.ms": "40000", "message.max.bytes": "2048"},
                                                    str(NODE): {"log.retention.ms": "30000"}})
    entries = cfg.describe_broker("", None, True)
    assert [(e["name"], e["value"], e["config_source"], _chain(e)) for e in entries] == [
        ("log.retention.ms", "40000", DYNAMIC_DEFAULT_BROKER_CONFIG,
         [("log.retention.ms", "40000", DYNAMIC_DEFAULT_BROKER_CONFIG)]),
        ("message.max.bytes", "2048", DYNAMIC_DEFAULT_BROKER_CONFIG,
         [("message.max.bytes", "2048", DYNAMIC_DEFAULT_BROKER_CONFIG)])]
    assert cfg.describe_broker("", {"message.max.bytes"}, False)[0]["name"] == "message.max.bytes"


def test_sensitive_configs_never_show_their_value() -> None:
    jaas = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="b" password="pw-123";'
    cfg, _ = _setup({"sasl.jaas.config": jaas, "listener.name.internal.ssl.key.password": "pw-456"})
    entries = cfg.describe_broker(str(NODE), None, True)
    for name in ("sasl.jaas.config", "listener.name.internal.ssl.key.password", "admin.http.auth.token"):
        e = _entry(entries, name)
        assert (e["value"], e["is_sensitive"], e["read_only"]) == (None, True, True)
        assert all(s["value"] is None for s in e["synonyms"])
    assert _entry(entries, "sasl.jaas.config")["config_source"] == STATIC_BROKER_CONFIG
    assert "pw-123" not in str(entries) and "pw-456" not in str(entries)


def test_describe_topic_reports_the_dynamic_default_its_value_comes_from() -> None:
    cfg, image = _setup({"log.retention.ms": "50000"}, {"": {"log.retention.ms": "40000"}})
    entries = cfg.describe_topic({"segment.bytes": "100000"}, None, True)
    retention = _entry(entries, "retention.ms")
    assert (retention["value"], retention["config_source"], retention["read_only"]) == (
        "40000", DYNAMIC_DEFAULT_BROKER_CONFIG, False)
    assert _chain(retention) == [("log.retention.ms", "40000", DYNAMIC_DEFAULT_BROKER_CONFIG),
                                 ("log.retention.ms", "50000", STATIC_BROKER_CONFIG),
                                 ("log.retention.hours", "168", DEFAULT_CONFIG)]
    segment = _entry(entries, "segment.bytes")
    assert (segment["value"], segment["config_source"], _chain(segment)) == (
        "100000", TOPIC_CONFIG, [("segment.bytes", "100000", TOPIC_CONFIG),
                                 ("log.segment.bytes", "1073741824", DEFAULT_CONFIG)])
    throttled = _entry(entries, "leader.replication.throttled.replicas")  # no broker synonym
    assert (throttled["value"], throttled["config_source"], throttled["synonyms"]) == ("", DEFAULT_CONFIG, [])
    _set(image, str(NODE), "log.retention.ms", "30000")
    retention = _entry(cfg.describe_topic({}, {"retention.ms"}, False), "retention.ms")
    assert (retention["value"], retention["config_source"]) == ("30000", DYNAMIC_BROKER_CONFIG)


def test_broker_config_records_survive_a_snapshot() -> None:
    _, image = _setup(dynamic={"": {"log.retention.ms": "40000"}, "3": {"message.max.bytes": "2048"}})
    again = MetadataImage.from_bytes(image.to_bytes())
    assert again.broker_configs == {"": {"log.retention.ms": "40000"}, "3": {"message.max.bytes": "2048"}}
    assert not again.is_empty


@pytest.mark.parametrize("text, parsed", [
    ("log.retention.ms=1000", {"log.retention.ms": "1000"}),
    ("log.retention.ms=1000,message.max.bytes=2048", {"log.retention.ms": "1000", "message.max.bytes": "2048"}),
    ("log.cleanup.policy=[delete,compact],min.insync.replicas=2",
     {"log.cleanup.policy": "delete,compact", "min.insync.replicas": "2"}),
    (" a = b ,", {"a": "b"}),
])
def test_kafka_configs_add_config_syntax(text: str, parsed: dict[str, str]) -> None:
    assert parse_add_config(text) == parsed


def test_kafka_configs_add_config_refuses_a_pair_without_a_value() -> None:
    with pytest.raises(ValueError, match="must be KEY=VALUE"):
        parse_add_config("log.retention.ms")


def test_connection_and_cleaner_limits_are_dynamic_too() -> None:
    cfg, image = _setup({"max.connections": "100"})
    _set(image, "", "max.connections", "50")
    _set(image, "", "log.cleaner.io.max.bytes.per.second", "1048576")
    _set(image, str(NODE), "log.cleaner.backoff.ms", "500")
    current = cfg.current
    assert (current["max.connections"], current["log.cleaner.io.max.bytes.per.second"],
            current["log.cleaner.backoff.ms"]) == (50, 1048576.0, 500)
    entry = _entry(cfg.describe_broker(str(NODE), {"log.cleaner.io.max.bytes.per.second"}, True),
                   "log.cleaner.io.max.bytes.per.second")
    assert _chain(entry) == [("log.cleaner.io.max.bytes.per.second", "1048576.0", DYNAMIC_DEFAULT_BROKER_CONFIG),
                             ("log.cleaner.io.max.bytes.per.second", "1.7976931348623157E308", DEFAULT_CONFIG)]
    assert cfg.static["max.connections"] == 100  # the static config itself is untouched


def test_a_default_that_conflicts_with_a_topics_own_configs_leaves_the_topic_usable() -> None:
    cfg, image = _setup()
    topic = {"min.compaction.lag.ms": "10000", "cleanup.policy": "compact"}
    assert cfg.log_config(topic).min_compaction_lag_ms == 10_000
    _set(image, "", "log.cleaner.max.compaction.lag.ms", "5000")  # accepted: valid on its own
    config = cfg.log_config(topic)
    assert (config.min_compaction_lag_ms, config.max_compaction_lag_ms) == (10_000, 5000)
    assert _entry(cfg.describe_topic(topic, {"max.compaction.lag.ms"}, False), "max.compaction.lag.ms")["value"] == "5000"


def test_every_broker_config_kafka_has_is_known_and_the_meaningless_dynamic_ones_are_recorded() -> None:
    """Kafka's dynamic configs that change nothing here (librdkafka's admin tests set
    sasl.kerberos.min.time.before.relogin) are stored and described, at the levels Kafka
    allows; those this broker would not act on stay read-only; Kafka's static ones are known
    (read-only), and a Kafka server.properties' names are accepted in the static config."""
    from cluster.broker.config import validate_dynamic_configs
    from cluster.common.config_def import ConfigUpdateRefused

    validate_dynamic_configs(str(NODE), {"sasl.kerberos.min.time.before.relogin": "58000", "num.io.threads": "16"})
    refusals = {
        ("", "sasl.kerberos.min.time.before.relogin", "58000"):
            "Cannot update these configs at default cluster level, broker id must be specified: "
            "[sasl.kerberos.min.time.before.relogin]",
        (str(NODE), "sasl.kerberos.min.time.before.relogin", "soon"):
            "Invalid value soon for configuration sasl.kerberos.min.time.before.relogin: Not a number of type LONG",
        (str(NODE), "ssl.keystore.location", "/k.pem"):
            "These security configs can be dynamically updated only per-listener using the listener prefix: "
            "[ssl.keystore.location]",
        (str(NODE), "listeners", "PLAINTEXT://:9092"): "Cannot update these configs dynamically: [listeners]",
        (str(NODE), "num.partitions", "3"): "Cannot update these configs dynamically: [num.partitions]",
    }
    for (resource, name, value), message in refusals.items():
        with pytest.raises(ConfigUpdateRefused) as exc:
            validate_dynamic_configs(resource, {name: value})
        assert str(exc.value) == message

    cfg, image = _setup({"num.network.threads": "5"}, {str(NODE): {"sasl.kerberos.min.time.before.relogin": "58000"}})
    entries = cfg.describe_broker(str(NODE), None, True)
    relogin = _entry(entries, "sasl.kerberos.min.time.before.relogin")
    assert (relogin["value"], relogin["config_source"], relogin["read_only"], _chain(relogin)) == (
        "58000", DYNAMIC_BROKER_CONFIG, False, [("sasl.kerberos.min.time.before.relogin", "58000", DYNAMIC_BROKER_CONFIG),
                                                ("sasl.kerberos.min.time.before.relogin", "60000", DEFAULT_CONFIG)])
    network = _entry(entries, "num.network.threads")
    assert (network["value"], network["config_source"], network["read_only"]) == ("5", STATIC_BROKER_CONFIG, False)
    assert _entry(entries, "listeners")["read_only"] is True
    assert _entry(entries, "ssl.keystore.password")["is_sensitive"] is True
    assert cfg.current.log_config({}).retention_ms == 604_800_000  # a recorded config changes nothing


def test_synonym_chains_run_layer_by_layer_from_the_configs_own_first_entry() -> None:
    """Kafka's DynamicBrokerConfig synonyms, as Kafka 4.3.1 answers kafka-configs: the names
    that set one thing (log.retention.ms, .minutes, .hours), layer by layer, everything before
    the config's own first entry dropped; with nothing set, log.retention.ms (null default)
    has no synonym at all and retention.ms none either."""
    cfg, _ = _setup()
    topic = {e["name"]: e for e in cfg.describe_topic({}, None, True)}
    assert (topic["retention.ms"]["value"], _chain(topic["retention.ms"])) == ("604800000", [])
    broker = {e["name"]: e for e in cfg.describe_broker(str(NODE), None, True)}
    assert (broker["log.retention.ms"]["value"], _chain(broker["log.retention.ms"])) == (None, [])
    assert _chain(broker["log.retention.hours"]) == [("log.retention.hours", "168", DEFAULT_CONFIG)]
    assert _chain(broker["log.roll.ms"]) == [] and _chain(broker["log.roll.jitter.ms"]) == []
    cfg, _ = _setup({}, {"": {"log.roll.ms": "60000"}, str(NODE): {"log.flush.interval.ms": "1000"}})
    topic = {e["name"]: e for e in cfg.describe_topic({}, None, True)}
    assert _chain(topic["segment.ms"]) == [("log.roll.ms", "60000", DYNAMIC_DEFAULT_BROKER_CONFIG),
                                           ("log.roll.hours", "168", DEFAULT_CONFIG)]
    assert _chain(topic["flush.ms"])[:1] == [("log.flush.interval.ms", "1000", DYNAMIC_BROKER_CONFIG)]
    assert [n for n, _, _ in _chain(topic["flush.ms"])] == ["log.flush.interval.ms", "log.flush.scheduler.interval.ms"]


def test_kafkas_replication_quotas_are_recorded_and_described_only_when_set() -> None:
    """kafka-reassign-partitions --throttle sets leader/follower.replication.throttled.rate on
    each broker (--verify removes them): accepted per broker and cluster-wide, described as
    Kafka describes them (only when set, no default synonym), changing nothing here."""
    from cluster.broker.config import validate_dynamic_configs

    for name in ("leader.replication.throttled.rate", "follower.replication.throttled.rate",
                 "replica.alter.log.dirs.io.max.bytes.per.second"):
        validate_dynamic_configs(str(NODE), {name: "50000000"})
        validate_dynamic_configs("", {name: "50000000"})
    cfg, _ = _setup()
    assert "leader.replication.throttled.rate" not in {e["name"] for e in cfg.describe_broker(str(NODE), None, True)}
    cfg, _ = _setup({}, {str(NODE): {"leader.replication.throttled.rate": "50000000"},
                         "": {"follower.replication.throttled.rate": "7"}})
    described = {e["name"]: e for e in cfg.describe_broker(str(NODE), None, True)}
    assert _chain(described["leader.replication.throttled.rate"]) == [
        ("leader.replication.throttled.rate", "50000000", DYNAMIC_BROKER_CONFIG)]
    assert (described["follower.replication.throttled.rate"]["value"],
            described["follower.replication.throttled.rate"]["read_only"]) == ("7", False)
    assert cfg.current.values == BrokerConfig.from_overrides({}).values  # nothing applied
