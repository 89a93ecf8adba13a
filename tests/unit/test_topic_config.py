"""Topic configs as Kafka 3.9 defines them (cluster/storage/config.py, parsed by
cluster/common/config_def.py): every name, Kafka's parsing and validators with Kafka's
messages, IncrementalAlterConfigs APPEND/SUBTRACT, and how values are described."""

from __future__ import annotations

import pytest

from cluster.broker.config import BrokerConfig
from cluster.common.config_def import InvalidConfig, java_double, render_value
from cluster.storage.config import TOPIC_CONFIG_DEFS, LogConfig, altered_list_value

# Kafka 3.9: TopicConfig's *_CONFIG names plus QuotaConfigs' two throttled-replica lists,
# exactly the names LogConfig defines.
KAFKA_3_9_TOPIC_CONFIGS = frozenset({
    "segment.bytes", "segment.ms", "segment.jitter.ms", "segment.index.bytes", "flush.messages", "flush.ms",
    "retention.bytes", "retention.ms", "remote.storage.enable", "local.retention.ms", "local.retention.bytes",
    "remote.log.copy.disable", "remote.log.delete.on.disable", "max.message.bytes", "index.interval.bytes",
    "file.delete.delay.ms", "delete.retention.ms", "min.compaction.lag.ms", "max.compaction.lag.ms",
    "min.cleanable.dirty.ratio", "cleanup.policy", "unclean.leader.election.enable", "min.insync.replicas",
    "compression.type", "compression.gzip.level", "compression.lz4.level", "compression.zstd.level", "preallocate",
    "message.format.version", "message.timestamp.type", "message.timestamp.difference.max.ms",
    "message.timestamp.before.max.ms", "message.timestamp.after.max.ms", "message.downconversion.enable",
    "leader.replication.throttled.replicas", "follower.replication.throttled.replicas",
})

# A valid, non-default value for every topic config, as given and as DescribeConfigs shows it.
VALID: dict[str, tuple[str, str]] = {
    "segment.bytes": ("14", "14"),
    "segment.ms": ("3600000", "3600000"),
    "segment.jitter.ms": ("1000", "1000"),
    "segment.index.bytes": ("4096", "4096"),
    "flush.messages": ("10000", "10000"),
    "flush.ms": ("5000", "5000"),
    "retention.bytes": ("-5", "-5"),
    "retention.ms": ("-1", "-1"),
    "remote.storage.enable": ("false", "false"),
    "local.retention.ms": ("-1", "-1"),
    "local.retention.bytes": ("1048576", "1048576"),
    "remote.log.copy.disable": ("true", "true"),
    "remote.log.delete.on.disable": ("TRUE", "true"),
    "max.message.bytes": ("2000000", "2000000"),
    "index.interval.bytes": ("0", "0"),
    "file.delete.delay.ms": ("0", "0"),
    "delete.retention.ms": ("1000", "1000"),
    "min.compaction.lag.ms": ("60000", "60000"),
    "max.compaction.lag.ms": ("86400000", "86400000"),
    "min.cleanable.dirty.ratio": ("0.25", "0.25"),
    "cleanup.policy": (" compact , delete ", "compact,delete"),
    "unclean.leader.election.enable": ("true", "true"),
    "min.insync.replicas": ("2", "2"),
    "compression.type": ("zstd", "zstd"),
    "compression.gzip.level": ("9", "9"),
    "compression.lz4.level": ("1", "1"),
    "compression.zstd.level": ("-131072", "-131072"),
    "preallocate": ("true", "true"),
    "message.format.version": ("0.10.2.1", "0.10.2.1"),
    "message.timestamp.type": ("LogAppendTime", "LogAppendTime"),
    "message.timestamp.difference.max.ms": ("0", "0"),
    "message.timestamp.before.max.ms": ("3600000", "3600000"),
    "message.timestamp.after.max.ms": ("60000", "60000"),
    "message.downconversion.enable": ("false", "false"),
    "leader.replication.throttled.replicas": ("*", "*"),
    "follower.replication.throttled.replicas": ("0:1, 1:2", "0:1,1:2"),
}

# (config, value, INVALID_CONFIG message) exactly as Kafka 3.9 words them.
INVALID: list[tuple[str, str, str]] = [
    ("cleanup.policy", "bogus", "Invalid value bogus for configuration cleanup.policy: String must be one of: "
                                "compact, delete"),
    ("cleanup.policy", "compact,", "Invalid value  for configuration cleanup.policy: String must be one of: "
                                   "compact, delete"),
    ("min.insync.replicas", "0", "Invalid value 0 for configuration min.insync.replicas: Value must be at least 1"),
    ("max.compaction.lag.ms", "0",
     "Invalid value 0 for configuration max.compaction.lag.ms: Value must be at least 1"),
    ("segment.bytes", "13", "Invalid value 13 for configuration segment.bytes: Value must be at least 14"),
    ("segment.bytes", "2147483648",
     "Invalid value 2147483648 for configuration segment.bytes: Not a number of type INT"),
    ("retention.ms", "1_000", "Invalid value 1_000 for configuration retention.ms: Not a number of type LONG"),
    ("retention.ms", "-2", "Invalid value -2 for configuration retention.ms: Value must be at least -1"),
    ("min.cleanable.dirty.ratio", "1.5",
     "Invalid value 1.5 for configuration min.cleanable.dirty.ratio: Value must be no more than 1"),
    ("min.cleanable.dirty.ratio", "half",
     "Invalid value half for configuration min.cleanable.dirty.ratio: Not a number of type DOUBLE"),
    ("compression.type", "gzip,lz4", "Invalid value gzip,lz4 for configuration compression.type: String must be "
                                     "one of: uncompressed, zstd, lz4, snappy, gzip, producer"),
    ("compression.gzip.level", "0", "Invalid value 0 for configuration compression.gzip.level: Value must be "
                                    "between 1 and 9 or equal to -1"),
    ("compression.zstd.level", "23",
     "Invalid value 23 for configuration compression.zstd.level: Value must be no more than 22"),
    ("preallocate", "yes", "Invalid value yes for configuration preallocate: Expected value to be either true or "
                           "false"),
    ("message.format.version", "4.0", "Invalid value 4.0 for configuration message.format.version: Version 4.0 is "
                                      "not a valid version"),
    ("message.timestamp.type", "createtime", "Invalid value createtime for configuration message.timestamp.type: "
                                             "String must be one of: CreateTime, LogAppendTime"),
    ("local.retention.bytes", "-3",
     "Invalid value -3 for configuration local.retention.bytes: Value must be at least -2"),
    ("follower.replication.throttled.replicas", "0:1,x",
     "Invalid value [0:1, x] for configuration follower.replication.throttled.replicas: "
     "follower.replication.throttled.replicas must be the literal '*' or a list of replicas in the following "
     "format: [partitionId]:[brokerId],[partitionId]:[brokerId],..."),
    ("remote.storage.enable", "true",
     "Tiered Storage functionality is disabled in the broker. Topic cannot be configured with remote log storage."),
    ("no.such.config", "1", "Unknown topic config name: no.such.config"),
]


def test_the_topic_configs_are_kafka_3_9s() -> None:
    assert set(TOPIC_CONFIG_DEFS) == KAFKA_3_9_TOPIC_CONFIGS
    assert set(VALID) == KAFKA_3_9_TOPIC_CONFIGS


def test_every_config_takes_a_valid_value_and_describes_it_as_kafka() -> None:
    config = LogConfig.build({name: given for name, (given, _) in VALID.items()})
    assert config.overrides == KAFKA_3_9_TOPIC_CONFIGS
    assert {name: render_value(config[name]) for name in VALID} == {name: shown for name, (_, shown) in VALID.items()}


def test_defaults_are_described_as_kafka() -> None:
    config = LogConfig.build({})
    described = {name: render_value(config[name]) for name in TOPIC_CONFIG_DEFS}
    assert {k: described[k] for k in ("min.cleanable.dirty.ratio", "cleanup.policy", "message.format.version",
                                      "max.compaction.lag.ms", "local.retention.ms", "compression.gzip.level",
                                      "follower.replication.throttled.replicas", "message.downconversion.enable")} == {
        "min.cleanable.dirty.ratio": "0.5", "cleanup.policy": "delete", "message.format.version": "3.0-IV1",
        "max.compaction.lag.ms": str(2**63 - 1), "local.retention.ms": "-2", "compression.gzip.level": "-1",
        "follower.replication.throttled.replicas": "", "message.downconversion.enable": "true"}


@pytest.mark.parametrize(("name", "value", "message"), INVALID, ids=[f"{n}={v}" for n, v, _ in INVALID])
def test_a_bad_value_is_refused_with_kafkas_message(name: str, value: str, message: str) -> None:
    with pytest.raises(InvalidConfig) as info:
        LogConfig.build({name: value})
    assert str(info.value) == message


def test_min_compaction_lag_may_not_exceed_max() -> None:
    LogConfig.build({"min.compaction.lag.ms": "1000", "max.compaction.lag.ms": "1000"})
    with pytest.raises(InvalidConfig) as info:
        LogConfig.build({"min.compaction.lag.ms": "1001", "max.compaction.lag.ms": "1000"})
    assert str(info.value) == ("conflict topic config setting min.compaction.lag.ms (1001) > "
                               "max.compaction.lag.ms (1000)")


def test_message_format_version_accepts_what_kafka_parses() -> None:
    for version in ("0.8.0", "0.10.0-IV1", "0.11.0.3", "2.8", "2.8.2", "3.0-IV1", "3.9", "4.0-IV1"):
        assert LogConfig.build({"message.format.version": version})["message.format.version"] == version
    for version in ("4.0", "3.10", "0.12.0", "", "latest"):
        with pytest.raises(InvalidConfig, match="message.format.version"):
            LogConfig.build({"message.format.version": version})


def test_an_empty_cleanup_policy_is_accepted_as_in_kafka_3_9() -> None:
    config = LogConfig.build({"cleanup.policy": ""})
    assert (config["cleanup.policy"], config.delete_enabled, config.compact_enabled) == ("", False, False)


def test_broker_defaults_of_new_configs_come_from_kafkas_broker_names() -> None:
    broker = BrokerConfig.from_overrides({"log.cleaner.max.compaction.lag.ms": "5000",
                                          "log.cleaner.min.cleanable.ratio": "0.75", "log.cleanup.policy": "compact"})
    config = broker.log_config({})
    assert (config.max_compaction_lag_ms, config.min_cleanable_dirty_ratio, config.compact_enabled) == (5000, 0.75, True)
    assert config.broker_defaults == {"max.compaction.lag.ms", "min.cleanable.dirty.ratio", "cleanup.policy"}
    with pytest.raises(InvalidConfig, match="^Invalid value 0 for configuration log.cleaner.max.compaction.lag.ms: "):
        BrokerConfig.from_overrides({"log.cleaner.max.compaction.lag.ms": "0"})


def test_a_compacted_topic_rolls_its_segment_at_max_compaction_lag() -> None:
    assert LogConfig.build({"segment.ms": "10000", "max.compaction.lag.ms": "3000"}).max_segment_ms == 10000
    compacted = {"cleanup.policy": "compact", "segment.ms": "10000"}
    assert LogConfig.build({**compacted, "max.compaction.lag.ms": "3000"}).max_segment_ms == 3000
    assert LogConfig.build({**compacted, "max.compaction.lag.ms": "30000"}).max_segment_ms == 10000


# ---------------------------------------------------------------- APPEND / SUBTRACT


@pytest.mark.parametrize(("current", "operation", "value", "expected"), [
    (None, "append", "compact", "delete,compact"),  # from the topic config's own default
    ("delete,compact", "append", "compact", "delete,compact"),  # already there
    ("compact", "append", "delete,compact", "compact,delete"),
    (None, "subtract", "delete", ""),
    ("delete,compact", "subtract", "delete", "compact"),
    ("compact", "subtract", "delete", "compact"),  # not there
    ("", "append", "compact", "compact"),
])
def test_append_and_subtract_on_cleanup_policy(current: str | None, operation: str, value: str, expected: str) -> None:
    assert altered_list_value("cleanup.policy", current, operation, value) == expected


def test_append_and_subtract_on_throttled_replicas() -> None:
    name = "follower.replication.throttled.replicas"
    assert altered_list_value(name, None, "append", "0:1,1:1") == "0:1,1:1"
    assert altered_list_value(name, "0:1,1:1", "append", "1:1,2:1") == "0:1,1:1,2:1"
    assert altered_list_value(name, "0:1,1:1,2:1", "subtract", "1:1") == "0:1,2:1"


@pytest.mark.parametrize("operation", ["append", "subtract"])
@pytest.mark.parametrize("name", ["retention.ms", "compression.type", "no.such.config"])
def test_append_and_subtract_need_a_list_config(name: str, operation: str) -> None:
    with pytest.raises(InvalidConfig) as info:
        altered_list_value(name, None, operation, "1")
    assert str(info.value) == f"Can't {operation.upper()} to key {name} because its type is not LIST."


def test_doubles_are_described_as_java_writes_them() -> None:
    assert [java_double(v) for v in (0.0, 0.5, 1.0, 1e-4, 1.5e-5, 12345678.0, 0.001)] == [
        "0.0", "0.5", "1.0", "1.0E-4", "1.5E-5", "1.2345678E7", "0.001"]
    assert render_value(LogConfig.build({"min.cleanable.dirty.ratio": "1"})["min.cleanable.dirty.ratio"]) == "1.0"
