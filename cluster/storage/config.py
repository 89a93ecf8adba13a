"""Topic (log) configuration with Kafka's names, defaults and broker-level fallbacks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cluster.common.config_def import ConfigDef, InvalidConfig, parse_value

LONG_MAX = 2**63 - 1

TOPIC_CONFIG_DEFS: dict[str, ConfigDef] = {
    d.name: d
    for d in (
        ConfigDef("segment.bytes", int, 1_073_741_824, "log.segment.bytes", "Segment file size before a roll", 14),
        ConfigDef("segment.ms", int, 604_800_000, "log.roll.ms", "Time before a non-empty segment rolls", 1),
        ConfigDef("segment.index.bytes", int, 10_485_760, "log.index.size.max.bytes", "Offset index size before a roll", 8),
        ConfigDef("index.interval.bytes", int, 4096, "log.index.interval.bytes", "Bytes between offset index entries", 0),
        ConfigDef("retention.ms", int, 604_800_000, "log.retention.ms", "Age after which segments are deleted (-1: never)", -1),
        ConfigDef("retention.bytes", int, -1, "log.retention.bytes", "Partition size above which old segments are deleted (-1: no limit)", -1),
        ConfigDef("flush.messages", int, LONG_MAX, "log.flush.interval.messages", "Messages between fsyncs", 1),
        ConfigDef("flush.ms", int, LONG_MAX, "log.flush.interval.ms", "Time between fsyncs", 0),
        ConfigDef("max.message.bytes", int, 1_048_588, "message.max.bytes", "Largest record batch accepted", 0),
        ConfigDef("cleanup.policy", str, "delete", "log.cleanup.policy", "delete, compact or both", choices=("delete", "compact")),
        ConfigDef("delete.retention.ms", int, 86_400_000, "log.cleaner.delete.retention.ms", "How long tombstones are kept after compaction", 0),
        ConfigDef("min.compaction.lag.ms", int, 0, "log.cleaner.min.compaction.lag.ms", "Minimum age of a record before compaction", 0),
        ConfigDef("min.cleanable.dirty.ratio", str, "0.5", "log.cleaner.min.cleanable.ratio", "Dirty ratio that triggers compaction"),
        ConfigDef("min.insync.replicas", int, 1, "min.insync.replicas", "Replicas that must acknowledge acks=all", 1),
        ConfigDef("unclean.leader.election.enable", bool, False, "unclean.leader.election.enable", "Allow out-of-sync replicas to lead"),
        ConfigDef("message.timestamp.type", str, "CreateTime", "log.message.timestamp.type", "CreateTime or LogAppendTime", choices=("CreateTime", "LogAppendTime")),
        ConfigDef("compression.type", str, "producer", "compression.type", "Codec batches are stored in", choices=("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")),
        ConfigDef("file.delete.delay.ms", int, 60_000, "log.segment.delete.delay.ms", "Delay before deleted segment files are removed", 0),
        ConfigDef("preallocate", bool, False, "log.preallocate", "Preallocate segment files"),
        ConfigDef("message.downconversion.enable", bool, True, "log.message.downconversion.enable", "Down-convert for old consumers"),
    )
}


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Effective topic configuration: topic overrides over broker defaults over Kafka defaults."""

    values: Mapping[str, Any]
    overrides: frozenset[str]
    broker_defaults: frozenset[str]

    @classmethod
    def build(cls, overrides: Mapping[str, object], broker: Mapping[str, Any] | None = None) -> LogConfig:
        broker = broker or {}
        values: dict[str, Any] = {}
        from_broker = set()
        for name, d in TOPIC_CONFIG_DEFS.items():
            if d.broker_key and d.broker_key in broker:
                values[name] = parse_value(d, broker[d.broker_key])
                from_broker.add(name)
            else:
                values[name] = d.default
        for name, raw in overrides.items():
            found = TOPIC_CONFIG_DEFS.get(name)
            if found is None:
                raise InvalidConfig(f"unknown topic config {name!r}")
            values[name] = parse_value(found, raw)
        return cls(values, frozenset(overrides), frozenset(from_broker))

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

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
    def delete_enabled(self) -> bool:
        return "delete" in str(self.values["cleanup.policy"])
