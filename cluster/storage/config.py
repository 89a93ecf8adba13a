"""Topic (log) configuration with Kafka's names, defaults and broker-level fallbacks."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cluster.common.config_def import (
    ConfigDef,
    InvalidConfig,
    invalid_value,
    list_items,
    parse_value,
)

LONG_MAX = 2**63 - 1

# Kafka's MetadataVersion values (IBP versions) up to 3.9: `release` or `release-IVn`; a
# bare release names its latest production version (4.0 is not production in 3.9).
_IBP_VERSIONS = (
    "0.8.0 0.8.1 0.8.2 0.9.0 0.10.0-IV0 0.10.0-IV1 0.10.1-IV0 0.10.1-IV1 0.10.1-IV2 0.10.2-IV0 0.11.0-IV0 "
    "0.11.0-IV1 0.11.0-IV2 1.0-IV0 1.1-IV0 2.0-IV0 2.0-IV1 2.1-IV0 2.1-IV1 2.1-IV2 2.2-IV0 2.2-IV1 2.3-IV0 "
    "2.3-IV1 2.4-IV0 2.4-IV1 2.5-IV0 2.6-IV0 2.7-IV0 2.7-IV1 2.7-IV2 2.8-IV0 2.8-IV1 3.0-IV0 3.0-IV1 3.1-IV0 "
    "3.2-IV0 3.3-IV0 3.3-IV1 3.3-IV2 3.3-IV3 3.4-IV0 3.5-IV0 3.5-IV1 3.5-IV2 3.6-IV0 3.6-IV1 3.6-IV2 3.7-IV0 "
    "3.7-IV1 3.7-IV2 3.7-IV3 3.7-IV4 3.8-IV0 3.9-IV0 4.0-IV0 4.0-IV1"
).split()
METADATA_VERSIONS = frozenset(_IBP_VERSIONS) | {v.partition("-")[0] for v in _IBP_VERSIONS if not v.startswith("4.")}


def _metadata_version(name: str, value: str) -> None:
    """Kafka's MetadataVersionValidator (MetadataVersion.fromVersionString): 0.x.y.z is read
    as 0.x.y and x.y.z as x.y."""
    parts = value.split(".")
    kept = 3 if value.startswith("0.") else 2
    if (value if len(parts) <= kept else ".".join(parts[:kept])) not in METADATA_VERSIONS:
        raise invalid_value(name, value, f"Version {value} is not a valid version")


def _throttled_replicas(name: str, value: str) -> None:
    """Kafka's ThrottledReplicaListValidator: `*` or partition:broker pairs."""
    items = list_items(value)
    if not (all(re.fullmatch(r"([0-9]+:[0-9]+)?", i) for i in items) or "".join(items) == "*"):
        raise invalid_value(name, f"[{', '.join(items)}]", f"{name} must be the literal '*' or a list of replicas "
                            "in the following format: [partitionId]:[brokerId],[partitionId]:[brokerId],...")


def _gzip_level(name: str, value: int) -> None:
    if value > 9 or (value < 1 and value != -1):
        raise invalid_value(name, value, "Value must be between 1 and 9 or equal to -1")


def _topic(name: str, type_: type, default: object, broker_key: str | None, doc: str, minimum: int | None = None,
           maximum: int | None = None, *, choices: tuple[str, ...] | None = None, int32: bool = False,
           validator: Callable[[str, Any], None] | None = None) -> ConfigDef:
    return ConfigDef(name, type_, default, broker_key, doc, minimum, choices, maximum, 32 if int32 else 64, validator)


# Every topic config of Kafka 3.9 (LogConfig): type, default, Range/ValidString/ValidList and
# the broker config that supplies the default (ServerTopicConfigSynonyms), in LogConfig's order.
TOPIC_CONFIG_DEFS: dict[str, ConfigDef] = {
    d.name: d
    for d in (
        _topic("segment.bytes", int, 1_073_741_824, "log.segment.bytes", "Segment file size before a roll", 14,
               int32=True),
        _topic("segment.ms", int, 604_800_000, "log.roll.ms", "Time before a non-empty segment rolls", 1),
        _topic("segment.jitter.ms", int, 0, "log.roll.jitter.ms", "Random reduction of segment.ms (stored, not used)",
               0),
        _topic("segment.index.bytes", int, 10_485_760, "log.index.size.max.bytes", "Offset index size before a roll",
               4, int32=True),
        _topic("flush.messages", int, LONG_MAX, "log.flush.interval.messages", "Messages between fsyncs", 1),
        _topic("flush.ms", int, LONG_MAX, "log.flush.interval.ms", "Time between fsyncs", 0),
        _topic("retention.bytes", int, -1, "log.retention.bytes",
               "Partition size above which old segments are deleted (-1: no limit)"),
        _topic("retention.ms", int, 604_800_000, "log.retention.ms", "Age after which segments are deleted (-1: never)",
               -1),
        _topic("max.message.bytes", int, 1_048_588, "message.max.bytes", "Largest record batch accepted", 0,
               int32=True),
        _topic("index.interval.bytes", int, 4096, "log.index.interval.bytes", "Bytes between offset index entries", 0,
               int32=True),
        _topic("delete.retention.ms", int, 86_400_000, "log.cleaner.delete.retention.ms",
               "How long tombstones are kept after compaction", 0),
        _topic("min.compaction.lag.ms", int, 0, "log.cleaner.min.compaction.lag.ms",
               "Minimum age of a record before compaction", 0),
        _topic("max.compaction.lag.ms", int, LONG_MAX, "log.cleaner.max.compaction.lag.ms",
               "A dirty record older than this is compacted whatever the dirty ratio", 1),
        _topic("file.delete.delay.ms", int, 60_000, "log.segment.delete.delay.ms",
               "Delay before deleted segment files are removed (stored, not used: they go at once)", 0),
        _topic("min.cleanable.dirty.ratio", float, 0.5, "log.cleaner.min.cleanable.ratio",
               "Dirty ratio that triggers compaction", 0, 1),
        _topic("cleanup.policy", list, "delete", "log.cleanup.policy", "delete, compact or both",
               choices=("compact", "delete")),
        _topic("unclean.leader.election.enable", bool, False, "unclean.leader.election.enable",
               "Allow out-of-sync replicas to lead"),
        _topic("min.insync.replicas", int, 1, "min.insync.replicas", "Replicas that must acknowledge acks=all", 1,
               int32=True),
        _topic("compression.type", str, "producer", "compression.type", "Codec batches are stored in",
               choices=("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")),
        _topic("compression.gzip.level", int, -1, "compression.gzip.level", "gzip level (stored, not used)",
               int32=True, validator=_gzip_level),
        _topic("compression.lz4.level", int, 9, "compression.lz4.level", "lz4 level (stored, not used)", 1, 17,
               int32=True),
        _topic("compression.zstd.level", int, 3, "compression.zstd.level", "zstd level (stored, not used)", -131072,
               22, int32=True),
        _topic("preallocate", bool, False, "log.preallocate", "Preallocate segment files (stored, not used)"),
        _topic("message.format.version", str, "3.0-IV1", "log.message.format.version",
               "Deprecated; ignored since 3.0, as Kafka ignores it", validator=_metadata_version),
        _topic("message.timestamp.type", str, "CreateTime", "log.message.timestamp.type", "CreateTime or LogAppendTime",
               choices=("CreateTime", "LogAppendTime")),
        _topic("message.timestamp.difference.max.ms", int, LONG_MAX, "log.message.timestamp.difference.max.ms",
               "Deprecated record timestamp bound (stored, not used)", 0),
        _topic("message.timestamp.before.max.ms", int, LONG_MAX, "log.message.timestamp.before.max.ms",
               "How far behind the broker's clock a record timestamp may be (stored, not used)", 0),
        _topic("message.timestamp.after.max.ms", int, LONG_MAX, "log.message.timestamp.after.max.ms",
               "How far ahead of the broker's clock a record timestamp may be (stored, not used)", 0),
        _topic("leader.replication.throttled.replicas", list, "", None,
               "partition:broker replicas throttled on the leader side, or * (stored, not used)",
               validator=_throttled_replicas),
        _topic("follower.replication.throttled.replicas", list, "", None,
               "partition:broker replicas throttled on the follower side, or * (stored, not used)",
               validator=_throttled_replicas),
        _topic("message.downconversion.enable", bool, True, "log.message.downconversion.enable",
               "Down-convert for old consumers (stored, not used)"),
        _topic("remote.storage.enable", bool, False, None, "Tiered storage (this broker has none: only false)"),
        _topic("local.retention.ms", int, -2, "log.local.retention.ms",
               "Local retention of a tiered topic (-2: retention.ms; stored, not used)", -2),
        _topic("local.retention.bytes", int, -2, "log.local.retention.bytes",
               "Local retention of a tiered topic (-2: retention.bytes; stored, not used)", -2),
        _topic("remote.log.copy.disable", bool, False, None, "Stop copying to tiered storage (stored, not used)"),
        _topic("remote.log.delete.on.disable", bool, False, None,
               "Delete tiered data when tiering is turned off (stored, not used)"),
    )
}


MIRROR_SOURCE = "mirror.source"


def _mirror_source(name: str, value: str) -> None:
    if value and not re.fullmatch(r"[^:\s]+:[^:\s]+", value):
        raise invalid_value(name, value, f"{name} is <cluster>:<topic> (the source this topic mirrors), "
                                         "or empty for an ordinary topic")


# dcmirror's own topic configs, beyond Kafka's: described only where a topic sets them, so a
# topic's described defaults stay Kafka's. `mirror.source` makes a mirror topic (KIP-1279's
# read-only topics): its partitions take only batches copied at their source offsets
# (MirrorAppend, cluster/protocol/internal.py); removing it promotes the topic.
EXTRA_TOPIC_CONFIG_DEFS: dict[str, ConfigDef] = {
    d.name: d
    for d in (
        _topic(MIRROR_SOURCE, str, "", None,
               "<cluster>:<topic> this topic mirrors at the same offsets (read-only while set); empty: none",
               validator=_mirror_source),
    )
}


def topic_config_def(name: str) -> ConfigDef | None:
    """The definition of a topic config: Kafka's, or one of dcmirror's own."""
    return TOPIC_CONFIG_DEFS.get(name) or EXTRA_TOPIC_CONFIG_DEFS.get(name)


def validate_topic_values(values: Mapping[str, Any]) -> None:
    """Kafka's checks across configs (LogConfig.validateValues and, for a broker without
    tiered storage, validateRemoteStorageOnlyIfSystemEnabled)."""
    min_lag_ms, max_lag_ms = values["min.compaction.lag.ms"], values["max.compaction.lag.ms"]
    if min_lag_ms > max_lag_ms:
        raise InvalidConfig(f"conflict topic config setting min.compaction.lag.ms ({min_lag_ms}) > "
                            f"max.compaction.lag.ms ({max_lag_ms})")
    if values["remote.storage.enable"]:
        raise InvalidConfig("Tiered Storage functionality is disabled in the broker. "
                            "Topic cannot be configured with remote log storage.")


def altered_list_value(name: str, current: str | None, operation: str, value: str,
                       definitions: Mapping[str, ConfigDef] = TOPIC_CONFIG_DEFS) -> str:
    """IncrementalAlterConfigs APPEND or SUBTRACT on a topic (or, given the broker's
    `definitions`, a dynamic broker) config, as Kafka's controller does it
    (ConfigurationControlManager): only a LIST config; the current value (else the config's
    own default) gains the values it lacks, or loses those given, in order."""
    definition = definitions.get(name)
    if definition is None or definition.type is not list:
        raise InvalidConfig(f"Can't {operation.upper()} to key {name} because its type is not LIST.")
    base = definition.default if current is None else current
    items = [v for v in base.split(",") if v]
    for v in _java_split(value):
        if operation == "append" and v not in items:
            items.append(v)
        elif operation == "subtract" and v in items:
            items.remove(v)
    return ",".join(items)


def _java_split(value: str) -> list[str]:
    """Java's String.split(","): trailing empty strings are dropped."""
    parts = value.split(",")
    while parts and not parts[-1]:
        parts.pop()
    return parts


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Effective topic configuration: topic overrides over broker defaults over Kafka defaults."""

    values: Mapping[str, Any]
    overrides: frozenset[str]
    broker_defaults: frozenset[str]

    @classmethod
    def build(cls, overrides: Mapping[str, object], broker: Mapping[str, Any] | None = None, *,
              check_across: bool = True) -> LogConfig:
        """`check_across=False` skips the checks across configs (validate_topic_values): a
        topic's configs were checked when they were set, and a later broker default that
        conflicts with them must not make the topic unusable (Kafka checks them only then)."""
        broker = broker or {}
        values: dict[str, Any] = {}
        from_broker = set()
        for name, d in TOPIC_CONFIG_DEFS.items():
            if d.broker_key and d.broker_key in broker:
                values[name] = parse_value(d, broker[d.broker_key])
                from_broker.add(name)
            else:
                values[name] = d.default
        for name, d in EXTRA_TOPIC_CONFIG_DEFS.items():
            values[name] = d.default
        for name, raw in overrides.items():
            found = topic_config_def(name)
            if found is None:
                raise InvalidConfig(f"Unknown topic config name: {name}")
            values[name] = parse_value(found, raw)
        if check_across:
            validate_topic_values(values)
        return cls(values, frozenset(overrides), frozenset(from_broker))

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    @property
    def mirror_source(self) -> str:
        """`<cluster>:<topic>` of a mirror topic (read-only, takes mirrored batches); "" else."""
        return str(self.values[MIRROR_SOURCE])

    @property
    def segment_bytes(self) -> int:
        return int(self.values["segment.bytes"])

    @property
    def segment_ms(self) -> int:
        return int(self.values["segment.ms"])

    @property
    def index_interval_bytes(self) -> int:
        return int(self.values["index.interval.bytes"])

    @property
    def index_max_entries(self) -> int:
        return max(1, int(self.values["segment.index.bytes"]) // 8)

    @property
    def retention_ms(self) -> int:
        return int(self.values["retention.ms"])

    @property
    def retention_bytes(self) -> int:
        return int(self.values["retention.bytes"])

    @property
    def flush_messages(self) -> int:
        return int(self.values["flush.messages"])

    @property
    def flush_ms(self) -> int:
        return int(self.values["flush.ms"])

    @property
    def max_message_bytes(self) -> int:
        return int(self.values["max.message.bytes"])

    @property
    def log_append_time(self) -> bool:
        return self.values["message.timestamp.type"] == "LogAppendTime"

    @property
    def target_compression(self) -> int | None:
        """The codec batches must be stored in, or None to keep the producer's."""
        from cluster.protocol.records import CODEC_IDS

        codec = str(self.values["compression.type"])
        return None if codec == "producer" else CODEC_IDS[codec]

    @property
    def timestamp_bounds_ms(self) -> tuple[int, int] | None:
        """How far a CreateTime record's timestamp may lie before and after the broker's
        clock (message.timestamp.before/after.max.ms, else the deprecated
        message.timestamp.difference.max.ms, as Kafka 3.6+); None when unbounded."""
        if self.log_append_time:
            return None
        difference = int(self.values["message.timestamp.difference.max.ms"])
        before = int(self.values["message.timestamp.before.max.ms"])
        after = int(self.values["message.timestamp.after.max.ms"])
        before = difference if before == LONG_MAX else before
        after = difference if after == LONG_MAX else after
        return None if before == after == LONG_MAX else (before, after)

    @property
    def delete_enabled(self) -> bool:
        return "delete" in list_items(self.values["cleanup.policy"])

    @property
    def compact_enabled(self) -> bool:
        return "compact" in list_items(self.values["cleanup.policy"])

    @property
    def min_cleanable_dirty_ratio(self) -> float:
        return float(self.values["min.cleanable.dirty.ratio"])

    @property
    def min_compaction_lag_ms(self) -> int:
        return int(self.values["min.compaction.lag.ms"])

    @property
    def max_compaction_lag_ms(self) -> int:
        return int(self.values["max.compaction.lag.ms"])

    @property
    def max_segment_ms(self) -> int:
        """Kafka's maxSegmentMs: a compacted topic's active segment also rolls at
        max.compaction.lag.ms, so no record waits longer than that to become cleanable."""
        return min(self.segment_ms, self.max_compaction_lag_ms) if self.compact_enabled else self.segment_ms
