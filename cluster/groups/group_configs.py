"""Dynamic group configs (KIP-848, KIP-932): per-group overrides of the broker's group
settings, set with IncrementalAlterConfigs on resource type GROUP and kept in the metadata log
(GroupConfig records, cluster/controller/image.py), as Kafka 4.3.1's GroupConfig has them.

Every key has a broker synonym that supplies its default (share.session.timeout.ms ←
group.share.session.timeout.ms) except share.auto.offset.reset, share.isolation.level and
share.renew.acknowledge.enable, whose defaults are their own. A value is checked in Kafka's
order: the name, the type and the key's own range (ConfigDef), then the broker's bounds
(group.share.min/max.*), then a session timeout above its heartbeat interval. Every refusal is
INVALID_CONFIG with Kafka's message; the broker's bounds and defaults come in as a mapping,
so this module stays below the broker layer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cluster.common.config_def import (
    ConfigDef,
    InvalidConfig,
    invalid_value,
    parse_value,
    render_value,
)
from cluster.controller.image import MetadataImage

AUTO_OFFSET_RESET = "share.auto.offset.reset"
ISOLATION_LEVEL = "share.isolation.level"
RECORD_LOCK_DURATION_MS = "share.record.lock.duration.ms"
DELIVERY_COUNT_LIMIT = "share.delivery.count.limit"
PARTITION_MAX_RECORD_LOCKS = "share.partition.max.record.locks"
RENEW_ACKNOWLEDGE_ENABLE = "share.renew.acknowledge.enable"
SHARE_SESSION_TIMEOUT_MS = "share.session.timeout.ms"
SHARE_HEARTBEAT_INTERVAL_MS = "share.heartbeat.interval.ms"
CONSUMER_SESSION_TIMEOUT_MS = "consumer.session.timeout.ms"
CONSUMER_HEARTBEAT_INTERVAL_MS = "consumer.heartbeat.interval.ms"
STREAMS_SESSION_TIMEOUT_MS = "streams.session.timeout.ms"
STREAMS_HEARTBEAT_INTERVAL_MS = "streams.heartbeat.interval.ms"

BY_DURATION = "by_duration:"
# java.time.Duration.parse's grammar (days, hours, minutes, seconds with up to 9 decimals),
# ASCII digits only; the sign in front is refused afterwards (Kafka refuses negative durations).
_DURATION = re.compile(
    r"([-+]?)P(?:([-+]?[0-9]+)D)?(T(?:([-+]?[0-9]+)H)?(?:([-+]?[0-9]+)M)?(?:([-+]?[0-9]+)(?:[.,]([0-9]{0,9}))?S)?)?",
    re.IGNORECASE | re.ASCII)
_JAVA_LONG_MAX = 2**63 - 1


def duration_ms(text: str) -> int | None:
    """An ISO-8601 duration (PnDTnHnMn.nS) in milliseconds, or None when it is not one or is
    negative."""
    m = _DURATION.fullmatch(text)
    if m is None or (m.group(3) is not None and m.group(3).upper() == "T"):
        return None  # no match, or a "T" with nothing after it
    days, hours, minutes, seconds, fraction = (m.group(i) for i in (2, 4, 5, 6, 7))
    if days is None and m.group(3) is None:
        return None
    total_ns = 0
    for part, unit_s in ((days, 86_400), (hours, 3_600), (minutes, 60), (seconds, 1)):
        if part is not None:
            total_ns += int(part) * unit_s * 1_000_000_000
    if fraction:
        nanos = int(fraction.ljust(9, "0"))
        total_ns += -nanos if (seconds or "").startswith("-") else nanos
    if m.group(1) == "-":
        total_ns = -total_ns
    if total_ns < 0 or total_ns // 1_000_000_000 > _JAVA_LONG_MAX:
        return None
    return total_ns // 1_000_000


def _auto_offset_reset(name: str, value: Any) -> None:
    text = str(value).lower()
    if text in ("earliest", "latest"):
        return
    if text.startswith(BY_DURATION) and duration_ms(str(value)[len(BY_DURATION):]) is not None:
        return
    raise invalid_value(name, value, f"Invalid value `{value}` for configuration {name}. The value must be either "
                                     "'earliest', 'latest' or of the format 'by_duration:<PnDTnHnMn.nS>'.")


def _int(name: str, default: int, broker_key: str | None, minimum: int, doc: str) -> ConfigDef:
    return ConfigDef(name, int, default, broker_key, doc, minimum=minimum, width_bits=32)


# Kafka 4.3.1's group configs, in the order DescribeConfigs lists them (by name).
GROUP_CONFIG_DEFS: dict[str, ConfigDef] = {d.name: d for d in sorted([
    _int("consumer.assignment.interval.ms", 1_000, "group.consumer.assignment.interval.ms", 0,
         "The interval between assignment updates for a consumer group."),
    _int(CONSUMER_HEARTBEAT_INTERVAL_MS, 5_000, "group.consumer.heartbeat.interval.ms", 1,
         "The heartbeat interval given to the members of a consumer group."),
    _int(CONSUMER_SESSION_TIMEOUT_MS, 45_000, "group.consumer.session.timeout.ms", 1,
         "The timeout to detect client failures when using the consumer group protocol."),
    _int("share.assignment.interval.ms", 1_000, "group.share.assignment.interval.ms", 0,
         "The interval between assignment updates for a share group."),
    ConfigDef(AUTO_OFFSET_RESET, str, "latest", None, "Where a share partition starts: earliest, latest or "
              "by_duration:<ISO-8601 duration>.", validator=_auto_offset_reset),
    _int(DELIVERY_COUNT_LIMIT, 5, "group.share.delivery.count.limit", 2,
         "The maximum number of delivery attempts for a record delivered to a share group."),
    _int(SHARE_HEARTBEAT_INTERVAL_MS, 5_000, "group.share.heartbeat.interval.ms", 1,
         "The heartbeat interval given to the members of a share group."),
    ConfigDef(ISOLATION_LEVEL, str, "read_uncommitted", None, "Whether a share group delivers the records of "
              "transactions not committed.", choices=("read_committed", "read_uncommitted")),
    _int(PARTITION_MAX_RECORD_LOCKS, 2_000, "group.share.partition.max.record.locks", 100,
         "Share-group record lock limit per share-partition."),
    _int(RECORD_LOCK_DURATION_MS, 30_000, "group.share.record.lock.duration.ms", 1_000,
         "The record acquisition lock duration in milliseconds for share groups."),
    ConfigDef(RENEW_ACKNOWLEDGE_ENABLE, bool, True, None,
              "Whether the renew acknowledge type is enabled for the share group."),
    _int(SHARE_SESSION_TIMEOUT_MS, 45_000, "group.share.session.timeout.ms", 1,
         "The timeout to detect client failures when using the share group protocol."),
    _int("streams.assignment.interval.ms", 1_000, "group.streams.assignment.interval.ms", 0,
         "The interval between assignment updates for a streams group."),
    _int(STREAMS_HEARTBEAT_INTERVAL_MS, 5_000, "group.streams.heartbeat.interval.ms", 1,
         "The heartbeat interval given to the members."),
    _int("streams.initial.rebalance.delay.ms", 3_000, "group.streams.initial.rebalance.delay.ms", 0,
         "The delay of a streams group's first rebalance."),
    _int("streams.num.standby.replicas", 0, "group.streams.num.standby.replicas", 0,
         "The number of standby replicas for each task."),
    _int(STREAMS_SESSION_TIMEOUT_MS, 45_000, "group.streams.session.timeout.ms", 1,
         "The timeout to detect client failures when using the streams group protocol."),
], key=lambda d: d.name)}

# Kafka 4.3.1's broker defaults of the bounds below (the broker passes its own values).
BROKER_BOUND_DEFAULTS: dict[str, int] = {
    "group.consumer.min.heartbeat.interval.ms": 5_000, "group.consumer.max.heartbeat.interval.ms": 15_000,
    "group.consumer.min.session.timeout.ms": 45_000, "group.consumer.max.session.timeout.ms": 60_000,
    "group.consumer.min.assignment.interval.ms": 0, "group.consumer.max.assignment.interval.ms": 15_000,
    "group.share.min.heartbeat.interval.ms": 5_000, "group.share.max.heartbeat.interval.ms": 15_000,
    "group.share.min.session.timeout.ms": 45_000, "group.share.max.session.timeout.ms": 60_000,
    "group.share.min.record.lock.duration.ms": 15_000, "group.share.max.record.lock.duration.ms": 60_000,
    "group.share.min.delivery.count.limit": 2, "group.share.max.delivery.count.limit": 10,
    "group.share.min.partition.max.record.locks": 100, "group.share.max.partition.max.record.locks": 4_000,
    "group.share.min.assignment.interval.ms": 0, "group.share.max.assignment.interval.ms": 15_000,
    "group.streams.min.heartbeat.interval.ms": 5_000, "group.streams.max.heartbeat.interval.ms": 15_000,
    "group.streams.min.session.timeout.ms": 45_000, "group.streams.max.session.timeout.ms": 60_000,
    "group.streams.max.standby.replicas": 2,
    "group.streams.min.assignment.interval.ms": 0, "group.streams.max.assignment.interval.ms": 15_000,
}
# The broker configs a group config is checked against, in Kafka's order:
# (group config, broker minimum or None, broker maximum).
_BOUNDS: tuple[tuple[str, str | None, str], ...] = (
    (CONSUMER_HEARTBEAT_INTERVAL_MS, "group.consumer.min.heartbeat.interval.ms",
     "group.consumer.max.heartbeat.interval.ms"),
    (CONSUMER_SESSION_TIMEOUT_MS, "group.consumer.min.session.timeout.ms", "group.consumer.max.session.timeout.ms"),
    ("consumer.assignment.interval.ms", "group.consumer.min.assignment.interval.ms",
     "group.consumer.max.assignment.interval.ms"),
    (SHARE_HEARTBEAT_INTERVAL_MS, "group.share.min.heartbeat.interval.ms", "group.share.max.heartbeat.interval.ms"),
    (SHARE_SESSION_TIMEOUT_MS, "group.share.min.session.timeout.ms", "group.share.max.session.timeout.ms"),
    (RECORD_LOCK_DURATION_MS, "group.share.min.record.lock.duration.ms", "group.share.max.record.lock.duration.ms"),
    (DELIVERY_COUNT_LIMIT, "group.share.min.delivery.count.limit", "group.share.max.delivery.count.limit"),
    (PARTITION_MAX_RECORD_LOCKS, "group.share.min.partition.max.record.locks",
     "group.share.max.partition.max.record.locks"),
    ("share.assignment.interval.ms", "group.share.min.assignment.interval.ms",
     "group.share.max.assignment.interval.ms"),
    (STREAMS_HEARTBEAT_INTERVAL_MS, "group.streams.min.heartbeat.interval.ms",
     "group.streams.max.heartbeat.interval.ms"),
    (STREAMS_SESSION_TIMEOUT_MS, "group.streams.min.session.timeout.ms", "group.streams.max.session.timeout.ms"),
    ("streams.num.standby.replicas", None, "group.streams.max.standby.replicas"),
    ("streams.assignment.interval.ms", "group.streams.min.assignment.interval.ms",
     "group.streams.max.assignment.interval.ms"),
)
_SESSION_OVER_HEARTBEAT = ((CONSUMER_SESSION_TIMEOUT_MS, CONSUMER_HEARTBEAT_INTERVAL_MS),
                           (SHARE_SESSION_TIMEOUT_MS, SHARE_HEARTBEAT_INTERVAL_MS),
                           (STREAMS_SESSION_TIMEOUT_MS, STREAMS_HEARTBEAT_INTERVAL_MS))

BrokerValues = Mapping[str, Any]
"""The broker's configs by Kafka name (its group.* defaults and bounds); a name missing takes
Kafka's default."""


def _broker_int(broker: BrokerValues, name: str) -> int:
    value = broker.get(name)
    if value is None:
        definition = next((d for d in GROUP_CONFIG_DEFS.values() if d.broker_key == name), None)
        value = BROKER_BOUND_DEFAULTS[name] if definition is None else definition.default
    return int(value)


def default_value(name: str, broker: BrokerValues) -> Any:
    """A group config's value when the group does not set it: its broker synonym's, else its own."""
    definition = GROUP_CONFIG_DEFS[name]
    return definition.default if definition.broker_key is None else _broker_int(broker, definition.broker_key)


def validate_group_configs(configs: Mapping[str, str], broker: BrokerValues) -> dict[str, str]:
    """A group's whole set of configs after an alter, checked as Kafka's GroupConfig.validate
    checks it; the values as stored (trimmed). Raises InvalidConfig (INVALID_CONFIG)."""
    for name in configs:
        if name not in GROUP_CONFIG_DEFS:
            raise InvalidConfig(f"Unknown group config name: {name}")
    parsed = {name: parse_value(GROUP_CONFIG_DEFS[name], raw) for name, raw in configs.items()}
    effective = {name: parsed.get(name, default_value(name, broker)) for name in GROUP_CONFIG_DEFS}
    for name, low, high in _BOUNDS:
        if low is not None and effective[name] < _broker_int(broker, low):
            raise InvalidConfig(f"{name} must be greater than or equal to {low}")
        if effective[name] > _broker_int(broker, high):
            raise InvalidConfig(f"{name} must be less than or equal to {high}")
    for session, heartbeat in _SESSION_OVER_HEARTBEAT:
        if effective[session] <= effective[heartbeat]:
            raise InvalidConfig(f"{session} must be greater than {heartbeat}")
    return {name: str(raw).strip() for name, raw in configs.items()}


def describe_group_configs(configs: Mapping[str, str], broker: BrokerValues, keys: set[str] | None,
                           with_synonyms: bool, *, source_group: int, source_default: int) -> list[dict[str, Any]]:
    """DescribeConfigs entries of a GROUP resource, as Kafka 4.3.1 answers: every group config,
    its own value (GROUP_CONFIG) over its broker synonym's (reported as DEFAULT_CONFIG, as
    Kafka reports it). A key without a broker synonym lists only its default as synonym."""
    entries = []
    for name, definition in GROUP_CONFIG_DEFS.items():
        if keys is not None and name not in keys:
            continue
        default = render_value(default_value(name, broker))
        synonyms: list[dict[str, Any]] = []
        if name in configs and definition.broker_key is not None:
            synonyms.append({"name": name, "value": configs[name], "source": source_group})
        synonyms.append({"name": definition.broker_key or name, "value": default, "source": source_default})
        own = name in configs
        entries.append({"name": name, "value": configs[name] if own else default, "read_only": False,
                        "config_source": source_group if own else source_default, "is_sensitive": False,
                        "synonyms": synonyms if with_synonyms else []})
    return entries


@dataclass(frozen=True, slots=True)
class ShareGroupConfig:
    """What a share group sets for itself; None: the broker's own setting applies."""
    auto_offset_reset: str = "latest"
    isolation_level: str = "read_uncommitted"
    record_lock_duration_ms: int | None = None
    session_timeout_ms: int | None = None
    heartbeat_interval_ms: int | None = None
    delivery_count_limit: int | None = None
    partition_max_record_locks: int | None = None
    renew_acknowledge_enable: bool = True

    @property
    def reset_duration_ms(self) -> int | None:
        """by_duration:<d>'s duration in milliseconds (None for earliest and latest)."""
        if not self.auto_offset_reset.lower().startswith(BY_DURATION):
            return None
        return duration_ms(self.auto_offset_reset[len(BY_DURATION):])


def share_group_config(image: MetadataImage, group_id: str) -> ShareGroupConfig:
    """A share group's configs from the metadata image (defaults where unset). A value the
    log holds but this broker cannot read (a newer writer) falls back to the default."""
    configs = image.group_configs.get(group_id, {})

    def number(name: str) -> int | None:
        raw = configs.get(name)
        if raw is None:
            return None
        try:
            return int(parse_value(GROUP_CONFIG_DEFS[name], raw))
        except InvalidConfig:
            return None

    reset = configs.get(AUTO_OFFSET_RESET, "latest").strip()
    try:
        _auto_offset_reset(AUTO_OFFSET_RESET, reset)
    except InvalidConfig:
        reset = "latest"
    isolation = configs.get(ISOLATION_LEVEL, "read_uncommitted").strip()
    try:
        renew = bool(parse_value(GROUP_CONFIG_DEFS[RENEW_ACKNOWLEDGE_ENABLE], configs[RENEW_ACKNOWLEDGE_ENABLE]))
    except (KeyError, InvalidConfig):
        renew = True
    return ShareGroupConfig(
        auto_offset_reset=reset.lower() if not reset.lower().startswith(BY_DURATION) else reset,
        isolation_level=isolation if isolation in ("read_committed", "read_uncommitted") else "read_uncommitted",
        record_lock_duration_ms=number(RECORD_LOCK_DURATION_MS),
        session_timeout_ms=number(SHARE_SESSION_TIMEOUT_MS),
        heartbeat_interval_ms=number(SHARE_HEARTBEAT_INTERVAL_MS),
        delivery_count_limit=number(DELIVERY_COUNT_LIMIT),
        partition_max_record_locks=number(PARTITION_MAX_RECORD_LOCKS),
        renew_acknowledge_enable=renew,
    )


@dataclass(frozen=True, slots=True)
class ShareRecordSettings:
    """What a share group's share partitions go by, the group's configs over the broker's
    group.share.* settings (Kafka's ShareGroupConfigProvider: read again at every use, so a
    change reaches share partitions already loaded at their next acquisition, release or
    lock expiry)."""

    lock_duration_ms: int
    delivery_count_limit: int
    max_in_flight: int  # share.partition.max.record.locks
    read_committed: bool
    renew_enabled: bool


def share_record_settings(image: MetadataImage, group_id: str, broker: BrokerValues) -> ShareRecordSettings:
    """The settings in force for `group_id`'s share partitions (see ShareRecordSettings)."""
    config = share_group_config(image, group_id)

    def pick(own: int | None, name: str) -> int:
        return own if own is not None else int(default_value(name, broker))

    return ShareRecordSettings(
        lock_duration_ms=pick(config.record_lock_duration_ms, RECORD_LOCK_DURATION_MS),
        delivery_count_limit=pick(config.delivery_count_limit, DELIVERY_COUNT_LIMIT),
        max_in_flight=pick(config.partition_max_record_locks, PARTITION_MAX_RECORD_LOCKS),
        read_committed=config.isolation_level == "read_committed",
        renew_enabled=config.renew_acknowledge_enable,
    )
