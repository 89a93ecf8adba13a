"""Broker configuration: Kafka's broker config names and defaults."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cluster.broker.kafka_configs import KAFKA_BROKER_CONFIGS
from cluster.common.config_def import (
    ConfigDef,
    ConfigUpdateRefused,
    InvalidConfig,
    parse_value,
)
from cluster.replication.replica_selector import SELECTORS
from cluster.security.listeners import DEFAULT_PROTOCOL_MAP
from cluster.security.sasl import SUPPORTED_MECHANISMS
from cluster.storage.config import TOPIC_CONFIG_DEFS, LogConfig

BROKER_CONFIG_DEFS: dict[str, ConfigDef] = {
    d.name: d
    for d in (
        ConfigDef("node.id", int, 1, None, "This broker's id", 0),
        ConfigDef("socket.request.max.bytes", int, 104_857_600, None, "Largest request frame accepted", 1024),
        ConfigDef("auto.create.topics.enable", bool, True, None, "Create unknown topics on metadata/produce"),
        ConfigDef("num.partitions", int, 1, None, "Partitions of auto-created topics", 1),
        ConfigDef("default.replication.factor", int, 1, None, "Replication factor of auto-created topics", 1),
        ConfigDef("delete.topic.enable", bool, True, None, "Allow DeleteTopics"),
        ConfigDef("log.retention.check.interval.ms", int, 300_000, None, "How often retention runs", 1),
        ConfigDef("log.flush.offset.checkpoint.interval.ms", int, 60_000, None, "How often recovery points are written", 1),
        ConfigDef("log.flush.scheduler.interval.ms", int, 1000, None, "How often flush.ms is checked", 1),
        ConfigDef("connections.max.idle.ms", int, 600_000, None, "Idle connections are closed after this", 1),
        ConfigDef("max.connections", int, 10_000, None, "Connections accepted at once", 1),
        ConfigDef("quota.window.num", int, 11, None, "Samples client quota rates are measured over", 2),
        ConfigDef("quota.window.size.seconds", int, 1, None, "Length of one client quota sample", 1),
        ConfigDef("producer.id.expiration.ms", int, 86_400_000, None, "Idle producer state is forgotten after this", 1),
        ConfigDef("fetch.max.bytes", int, 57_671_680, None, "Largest fetch response", 1024),
        ConfigDef("max.topic.partitions", int, 10_000, None, "Partitions one topic may have", 1),
        ConfigDef("max.topics", int, 10_000, None, "Topics one broker may hold", 1),
        ConfigDef("max.request.partition.size.limit", int, 2000, None,
                  "Most partitions one DescribeTopicPartitions answer holds", 1),
        ConfigDef("broker.rack", str, "", None, "Rack of this broker"),
        ConfigDef("replica.selector.class", str, "", None,
                  "Replica consumers are sent to read from (KIP-392); empty: the leader", choices=SELECTORS),
        ConfigDef("group.min.session.timeout.ms", int, 6_000, None, "Smallest session timeout a member may ask for", 1),
        ConfigDef("group.max.session.timeout.ms", int, 1_800_000, None, "Largest session timeout a member may ask for", 1),
        ConfigDef("group.initial.rebalance.delay.ms", int, 3_000, None, "Wait for more members before the first rebalance", 0),
        ConfigDef("group.max.size", int, 2_147_483_647, None, "Members one group may have", 1),
        ConfigDef("group.consumer.session.timeout.ms", int, 45_000, None,
                  "Session timeout of KIP-848 consumer group members", 1),
        ConfigDef("group.consumer.heartbeat.interval.ms", int, 5_000, None,
                  "Heartbeat interval KIP-848 consumer group members are told", 1),
        ConfigDef("group.consumer.assignors", list, "uniform,range", None,
                  "Server-side assignors of KIP-848 groups; the first is the default", choices=("uniform", "range")),
        ConfigDef("group.consumer.max.size", int, 2_147_483_647, None, "Members one KIP-848 group may have", 1),
        ConfigDef("offsets.retention.minutes", int, 10_080, None, "Offsets of empty groups expire after this", 1),
        ConfigDef("offset.metadata.max.bytes", int, 4096, None, "Largest commit metadata string", 0),
        ConfigDef("offsets.topic.num.partitions", int, 50, None, "Partitions of __consumer_offsets", 1),
        ConfigDef("offsets.topic.segment.bytes", int, 104_857_600, None, "Segment size of __consumer_offsets", 1024),
        ConfigDef("offsets.commit.timeout.ms", int, 5000, None,
                  "A group's records (commits, KIP-848 state) wait this long for the offsets topic's in-sync replicas", 1),
        ConfigDef("transaction.state.log.num.partitions", int, 50, None, "Partitions of __transaction_state", 1),
        ConfigDef("transaction.state.log.replication.factor", int, 3, None,
                  "Replication factor of __transaction_state (capped by brokers)", 1),
        ConfigDef("transaction.state.log.min.isr", int, 2, None, "min.insync.replicas of __transaction_state", 1),
        ConfigDef("transaction.state.log.segment.bytes", int, 104_857_600, None,
                  "Segment size of __transaction_state", 1024),
        ConfigDef("share.coordinator.state.topic.num.partitions", int, 50, None, "Partitions of __share_group_state", 1),
        ConfigDef("share.coordinator.state.topic.replication.factor", int, 3, None,
                  "Replication factor of __share_group_state (capped by brokers)", 1),
        ConfigDef("share.coordinator.state.topic.min.isr", int, 2, None, "min.insync.replicas of __share_group_state",
                  1),
        ConfigDef("share.coordinator.state.topic.segment.bytes", int, 104_857_600, None,
                  "Segment size of __share_group_state", 1024),
        ConfigDef("share.coordinator.write.timeout.ms", int, 5000, None,
                  "A share partition's state record waits this long for __share_group_state's in-sync replicas", 1),
        ConfigDef("transaction.max.timeout.ms", int, 900_000, None, "Largest transaction.timeout.ms a producer may ask for", 1),
        ConfigDef("transactional.id.expiration.ms", int, 604_800_000, None,
                  "A transactional id idle this long is forgotten", 1),
        ConfigDef("transaction.abort.timed.out.transaction.cleanup.interval.ms", int, 10_000, None,
                  "How often transactions past their timeout are looked for", 1),
        ConfigDef("log.cleaner.enable", bool, True, None, "Run log compaction for compacted topics"),
        ConfigDef("log.cleaner.backoff.ms", int, 15_000, None, "Sleep between compaction passes", 1),
        ConfigDef("log.cleaner.dedupe.buffer.size", int, 134_217_728, None, "Memory for the compaction key map", 1024),
        ConfigDef("broker.session.timeout.ms", int, 2_000, None, "A broker without heartbeats this long is fenced", 100),
        ConfigDef("broker.heartbeat.interval.ms", int, 500, None, "Time between a broker's heartbeats to the controller", 10),
        ConfigDef("controller.quorum.election.timeout.ms", int, 1_000, None, "Quorum election timeout (randomized up to 2x)", 10),
        ConfigDef("controller.quorum.fetch.timeout.ms", int, 2_000, None, "A quorum leader without majority fetches this long resigns", 10),
        ConfigDef("controller.quorum.fetch.interval.ms", int, 25, None, "A caught-up quorum follower fetches again after this", 1),
        ConfigDef("controller.quorum.request.timeout.ms", int, 500, None, "An unanswered quorum fetch is sent again after this", 10),
        ConfigDef("metadata.log.max.record.bytes.between.snapshots", int, 20_971_520, None,
                  "Metadata log bytes applied before the image is snapshotted", 1024),
        ConfigDef("controlled.shutdown.enable", bool, True, None, "Move leadership away before stopping"),
        ConfigDef("controlled.shutdown.timeout.ms", int, 10_000, None, "Longest wait for a controlled shutdown", 0),
        ConfigDef("auto.leader.rebalance.enable", bool, True, None, "Move leadership back to preferred replicas"),
        ConfigDef("leader.imbalance.check.interval.seconds", int, 300, None, "How often leader balance is checked", 1),
        ConfigDef("leader.imbalance.per.broker.percentage", int, 10, None, "Imbalance a broker may have before a rebalance", 0),
        ConfigDef("offsets.topic.replication.factor", int, 3, None, "Replication factor of __consumer_offsets (capped by brokers)", 1),
        ConfigDef("replica.lag.time.max.ms", int, 30_000, None, "A follower not caught up this long leaves the ISR", 1),
        ConfigDef("replica.fetch.max.bytes", int, 1_048_576, None, "Bytes a follower fetches per partition", 1024),
        ConfigDef("replica.fetch.response.max.bytes", int, 10_485_760, None, "Bytes a follower fetches per request", 1024),
        ConfigDef("replica.fetch.wait.max.ms", int, 500, None, "Longest a follower's fetch waits for data", 0),
        ConfigDef("max.incremental.fetch.session.cache.slots", int, 1000, None,
                  "Incremental fetch sessions a broker keeps for followers and consumers", 0),
        ConfigDef("replica.high.watermark.checkpoint.interval.ms", int, 5000, None,
                  "How often high watermarks are written to replication-offset-checkpoint", 1),
        ConfigDef("admin.http.listener", str, "", None,
                  "HOST:PORT of the admin HTTP server (/healthz, /metrics, /v1/cluster); empty: off"),
        ConfigDef("admin.http.auth.token", str, "", None,
                  "Bearer token every admin HTTP page but /healthz needs (a ${file:...}/${dir:...}/${env:...} "
                  "reference; empty: none)"),
        ConfigDef("admin.http.ssl.keystore.location", str, "", None,
                  "PEM key + certificate chain: the admin HTTP server speaks HTTPS only (empty: HTTP)"),
        ConfigDef("admin.http.port.offset", int, 0, None,
                  "Serve admin HTTP on the Kafka listener's host at its port + this (0: off); "
                  "one setting for every broker of a topology cluster", 0),
        ConfigDef("log.cleaner.io.max.bytes.per.second", float, 1.7976931348623157e308, None,
                  "Compaction read rate limit (bytes per second)", 1),
        # ---- listeners and security (cluster/security) ----
        ConfigDef("listeners", str, "", None,
                  "NAME://HOST:PORT,... to accept connections on (empty: one PLAINTEXT listener at --listen)"),
        ConfigDef("advertised.listeners", str, "", None, "NAME://HOST:PORT,... given to clients (empty: listeners)"),
        ConfigDef("listener.security.protocol.map", str, DEFAULT_PROTOCOL_MAP, None,
                  "NAME:PROTOCOL,... (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)"),
        ConfigDef("inter.broker.listener.name", str, "", None,
                  "Listener other nodes reach this one on (replication, controller, quorum)"),
        ConfigDef("security.inter.broker.protocol", str, "PLAINTEXT", None,
                  "Protocol of the inter-broker listener when inter.broker.listener.name is not set",
                  choices=("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")),
        ConfigDef("controller.listener.names", str, "", None, "Listener(s) the quorum uses (this broker: the inter-broker one)"),
        ConfigDef("ssl.keystore.type", str, "PEM", None, "Keystore format", choices=("PEM",)),
        ConfigDef("ssl.keystore.location", str, "", None, "PEM file with this broker's private key and certificate chain"),
        ConfigDef("ssl.key.password", str, "", None, "Password of an encrypted key (a ${file:...}/${env:...} reference)"),
        ConfigDef("ssl.truststore.type", str, "PEM", None, "Truststore format", choices=("PEM",)),
        ConfigDef("ssl.truststore.location", str, "", None, "PEM file with the CA certificates this broker trusts"),
        ConfigDef("ssl.client.auth", str, "none", None, "Client certificates: none, requested, required",
                  choices=("none", "requested", "required")),
        ConfigDef("ssl.enabled.protocols", list, "TLSv1.2,TLSv1.3", None, "TLS versions accepted",
                  choices=("TLSv1.2", "TLSv1.3")),
        ConfigDef("ssl.cipher.suites", str, "", None, "OpenSSL cipher list (empty: the library's defaults)"),
        ConfigDef("ssl.endpoint.identification.algorithm", str, "https", None,
                  "Check peer host names on inter-broker TLS links (https) or not (empty)"),
        ConfigDef("ssl.principal.mapping.rules", str, "DEFAULT", None,
                  "Certificate subject → user name: RULE:pattern/replacement/[LU],...,DEFAULT"),
        ConfigDef("sasl.enabled.mechanisms", list, "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512", None,
                  "SASL mechanisms SASL listeners accept", choices=SUPPORTED_MECHANISMS),
        ConfigDef("sasl.mechanism.inter.broker.protocol", str, "SCRAM-SHA-512", None,
                  "SASL mechanism of inter-broker links", choices=SUPPORTED_MECHANISMS),
        ConfigDef("sasl.jaas.config", str, "", None,
                  "Credentials this broker logs in with on SASL inter-broker links (Kafka's JAAS line; "
                  "password as a ${file:...}/${env:...} reference)"),
        ConfigDef("sasl.server.max.receive.size", int, 524_288, None,
                  "Largest frame a connection may send before its SASL login completes", 1024),
        ConfigDef("connections.max.reauth.ms", int, 0, None, "SASL sessions end after this unless re-authenticated (0: never)", 0),
        ConfigDef("connection.failed.authentication.delay.ms", int, 100, None,
                  "A connection whose login failed is answered and closed after this delay", 0),
        ConfigDef("authorizer.class.name", str, "", None,
                  "Empty: no authorization; StandardAuthorizer (org.apache.kafka.metadata.authorizer.StandardAuthorizer): ACLs"),
        ConfigDef("super.users", str, "", None, "Principals allowed everything: User:admin;User:broker"),
        ConfigDef("allow.everyone.if.no.acl.found", bool, False, None, "Allow a resource that has no ACL at all"),
    )
}

# Values DescribeConfigs never shows (Kafka's PASSWORD type).
SENSITIVE_CONFIGS = frozenset({"ssl.key.password", "sasl.jaas.config", "admin.http.auth.token"})
KAFKA_PASSWORD_CONFIGS = frozenset(n for n, (kind, _, _) in KAFKA_BROKER_CONFIGS.items() if kind == "PASSWORD")
# Settings a listener may override as listener.name.<listener>.<setting>.
PER_LISTENER_CONFIGS = frozenset({
    "ssl.keystore.type", "ssl.keystore.location", "ssl.key.password", "ssl.truststore.type", "ssl.truststore.location",
    "ssl.client.auth", "ssl.enabled.protocols", "ssl.cipher.suites", "ssl.principal.mapping.rules",
    "sasl.enabled.mechanisms", "connections.max.reauth.ms", "sasl.jaas.config",
    "plain.sasl.jaas.config", "scram-sha-256.sasl.jaas.config", "scram-sha-512.sasl.jaas.config",
})

# Broker-level defaults for topic configs (log.segment.bytes, log.retention.ms, ...).
LOG_DEFAULT_DEFS: dict[str, ConfigDef] = {
    d.broker_key: dataclasses.replace(d, name=d.broker_key, broker_key=None)
    for d in TOPIC_CONFIG_DEFS.values()
    if d.broker_key
}
# Kafka also accepts log.retention.hours/minutes and log.roll.hours.
_ALIASES = {
    "log.retention.hours": ("log.retention.ms", 3_600_000),
    "log.retention.minutes": ("log.retention.ms", 60_000),
    "log.roll.hours": ("log.roll.ms", 3_600_000),
}


# ---- dynamic broker configs (KIP-226) ------------------------------------------------------
# The configs AlterConfigs / IncrementalAlterConfigs may change on a BROKER resource, per
# broker or as the cluster-wide default: Kafka's dynamically updatable broker configs
# (DynamicBrokerConfig.AllDynamicConfigs) that this broker applies without a restart, each
# allowed per broker and cluster-wide as in Kafka:
#   - the log defaults of topics (Kafka's DynamicLogConfig: the broker synonym of every topic
#     config; message.max.bytes, min.insync.replicas, unclean.leader.election.enable and
#     log.retention.ms among them), applied to every log at the next metadata update;
#   - max.connections (SocketServer), checked at each new connection;
#   - the log cleaner's log.cleaner.backoff.ms, log.cleaner.io.max.bytes.per.second and
#     log.cleaner.dedupe.buffer.size (LogCleaner), read at each compaction pass.
# Kafka's other dynamic configs (thread pools, listeners and their keystores, per-IP limits)
# are read-only here: this broker would not act on them before a restart, and it reads its
# start-up configuration from its static config only.
DYNAMIC_BROKER_CONFIG_DEFS: dict[str, ConfigDef] = {
    **LOG_DEFAULT_DEFS,
    **{name: BROKER_CONFIG_DEFS[name] for name in ("max.connections", "log.cleaner.backoff.ms",
                                                   "log.cleaner.io.max.bytes.per.second",
                                                   "log.cleaner.dedupe.buffer.size")},
}
DYNAMIC_BROKER_CONFIGS: frozenset[str] = frozenset(DYNAMIC_BROKER_CONFIG_DEFS)
# Kafka broker configs this broker takes from its command line or topology instead: known,
# and read-only as in Kafka (and refused in its own config, which has its own way to say them).
KAFKA_STATIC_ONLY_CONFIGS = frozenset({
    "broker.id", "log.dir", "log.dirs", "metadata.log.dir", "process.roles", "controller.quorum.voters",
    "controller.quorum.bootstrap.servers", "zookeeper.connect",
})

# ---- every other broker config Kafka has (cluster/broker/kafka_configs.py) -----------------
_KAFKA_TYPES: dict[str, tuple[type, int]] = {
    "BOOLEAN": (bool, 64), "STRING": (str, 64), "INT": (int, 32), "SHORT": (int, 16), "LONG": (int, 64),
    "DOUBLE": (float, 64), "LIST": (list, 64), "CLASS": (str, 64), "PASSWORD": (str, 64)}


def _kafka_def(name: str, kind: str, default: str | None) -> ConfigDef:
    python_type, width = _KAFKA_TYPES[kind]
    definition = ConfigDef(name, python_type, None, None, "Apache Kafka's broker config; no effect on this broker",
                           width_bits=width)
    return definition if default is None else dataclasses.replace(definition,
                                                                  default=parse_value(definition, default))


# Kafka's broker configs this broker has no use for: known (described with Kafka's default,
# accepted in a broker's own config), so a Kafka server.properties or tool works unchanged.
KAFKA_CONFIG_DEFS: dict[str, ConfigDef] = {
    name: _kafka_def(name, kind, default) for name, (kind, default, _) in KAFKA_BROKER_CONFIGS.items()
    if name not in BROKER_CONFIG_DEFS and name not in LOG_DEFAULT_DEFS}
# Kafka's defaults that are null (log.retention.ms: log.retention.hours decides): described as
# null when nothing sets them, as Kafka describes them, whatever this broker uses.
KAFKA_NULL_DEFAULTS = frozenset(name for name, (_, default, _) in KAFKA_BROKER_CONFIGS.items()
                                if default is None and name != "node.id")  # (this broker's id is known)
_KAFKA_LEVELS = {name: level for name, (_, _, level) in KAFKA_BROKER_CONFIGS.items() if level}
# Kafka's dynamic configs this broker does not take: it would claim a change it does not make
# (listeners, TLS and SASL settings, connection limits, cordoned log dirs, transaction
# verification, producer state expiry), so they stay read-only here.
NOT_DYNAMIC_HERE = frozenset({
    "listeners", "advertised.listeners", "listener.security.protocol.map", "principal.builder.class",
    "sasl.enabled.mechanisms", "sasl.mechanism.inter.broker.protocol", "sasl.jaas.config",
    "max.connection.creation.rate", "max.connections.per.ip", "max.connections.per.ip.overrides",
    "cordoned.log.dirs", "transaction.partition.verification.enable", "producer.id.expiration.ms",
    *(n for n in _KAFKA_LEVELS if n.startswith("ssl.")),
})
# Kafka's dynamic configs that change nothing here (thread pools, Kerberos and login refresh,
# tiered storage, buffer sizes, metric reporters): AlterConfigs stores them, DescribeConfigs
# shows them, as Kafka (librdkafka's tests set sasl.kerberos.min.time.before.relogin).
RECORDED_BROKER_CONFIGS = frozenset(
    name for name, level in _KAFKA_LEVELS.items()
    if level in ("cluster", "broker") and name not in DYNAMIC_BROKER_CONFIGS and name not in NOT_DYNAMIC_HERE)
# Kafka's broker-level quotas (QuotaConfig.brokerQuotaConfigs): kafka-reassign-partitions
# --throttle sets the replication rates on each broker and --verify removes them. Recorded
# and described when set (only then, as Kafka), per broker or cluster-wide; this broker does
# not throttle replication.
BROKER_QUOTA_CONFIG_DEFS: dict[str, ConfigDef] = {
    name: ConfigDef(name, int, 2**63 - 1, None, "Apache Kafka's replication quota (bytes/s); not enforced here",
                    minimum=0)
    for name in ("leader.replication.throttled.rate", "follower.replication.throttled.rate",
                 "replica.alter.log.dirs.io.max.bytes.per.second")}
# What AlterConfigs may change on a BROKER resource: applied, or recorded.
ALTERABLE_BROKER_CONFIG_DEFS: dict[str, ConfigDef] = {
    **DYNAMIC_BROKER_CONFIG_DEFS,
    **{name: BROKER_CONFIG_DEFS.get(name) or KAFKA_CONFIG_DEFS[name] for name in sorted(RECORDED_BROKER_CONFIGS)},
    **BROKER_QUOTA_CONFIG_DEFS,
}
ALTERABLE_BROKER_CONFIGS: frozenset[str] = frozenset(ALTERABLE_BROKER_CONFIG_DEFS)
# Dynamic in Kafka for one broker only, or (TLS key and trust stores) only per listener.
PER_BROKER_ONLY_CONFIGS = frozenset(name for name, level in _KAFKA_LEVELS.items() if level == "broker")
PER_LISTENER_ONLY_CONFIGS = frozenset(name for name, level in _KAFKA_LEVELS.items() if level == "listener")


def _names(names: list[str]) -> str:
    return f"[{', '.join(names)}]"  # how Kafka 4 prints a set of names


def validate_dynamic_configs(resource_name: str, configs: Mapping[str, str]) -> None:
    """The dynamic configs a BROKER resource ("" the cluster default, "<id>" one broker)
    would hold after an alter, checked in the order of Kafka's
    DynamicBrokerConfig.validateConfigs: a read-only config, a TLS store without its listener
    prefix, a bad value, or a per-broker config at the cluster default raises
    ConfigUpdateRefused (INVALID_REQUEST, with Kafka's message); a name no broker config has
    raises InvalidConfig. Messages name configs, never a value of a sensitive one."""
    fixed = sorted(n for n in configs if n not in ALTERABLE_BROKER_CONFIGS and n not in PER_LISTENER_ONLY_CONFIGS
                   and is_known_broker_config(n))
    if fixed:
        raise ConfigUpdateRefused(f"Cannot update these configs dynamically: {_names(fixed)}")
    per_listener = sorted(n for n in configs if n in PER_LISTENER_ONLY_CONFIGS)
    if per_listener:
        raise ConfigUpdateRefused("These security configs can be dynamically updated only per-listener using the "
                                  f"listener prefix: {_names(per_listener)}")
    unknown = sorted(n for n in configs if not is_known_broker_config(n))
    if unknown:
        raise InvalidConfig(f"Unknown broker config name(s): {', '.join(unknown)} (use Kafka's broker config names, "
                            f"e.g. log.retention.ms)")
    try:
        parsed = {n: parse_value(ALTERABLE_BROKER_CONFIG_DEFS[n], v) for n, v in configs.items()}
        # the checks across log configs (min vs max compaction lag)
        LogConfig.build({}, {n: v for n, v in parsed.items() if n in LOG_DEFAULT_DEFS})
    except InvalidConfig as exc:
        raise ConfigUpdateRefused(str(exc)) from None
    per_broker = sorted(n for n in configs if n in PER_BROKER_ONLY_CONFIGS)
    if resource_name == "" and per_broker:
        raise ConfigUpdateRefused("Cannot update these configs at default cluster level, broker id must be "
                                  f"specified: {_names(per_broker)}")


def is_known_broker_config(name: str) -> bool:
    return (name in BROKER_CONFIG_DEFS or name in LOG_DEFAULT_DEFS or name in _ALIASES
            or name in KAFKA_STATIC_ONLY_CONFIGS or name in KAFKA_CONFIG_DEFS or name in BROKER_QUOTA_CONFIG_DEFS
            or per_listener_setting(name) is not None)


def broker_config_def(name: str) -> ConfigDef | None:
    """The definition of a broker config name: this broker's own, else Kafka's."""
    return (BROKER_CONFIG_DEFS.get(name) or LOG_DEFAULT_DEFS.get(name) or KAFKA_CONFIG_DEFS.get(name)
            or BROKER_QUOTA_CONFIG_DEFS.get(name))


@dataclass
class BrokerConfig:
    values: dict[str, Any] = field(default_factory=dict)
    static_keys: frozenset[str] = frozenset()  # the configs given (server properties, topology)

    @classmethod
    def from_overrides(cls, overrides: Mapping[str, object]) -> BrokerConfig:
        values = {name: d.default for name, d in BROKER_CONFIG_DEFS.items()}
        log_defaults: dict[str, Any] = {}
        for key, raw in overrides.items():
            if key in _ALIASES:
                target, factor = _ALIASES[key]
                try:
                    log_defaults[target] = int(str(raw)) * factor
                except ValueError:
                    raise InvalidConfig(f"broker config {key}={raw!r} is not an integer") from None
            elif key in BROKER_CONFIG_DEFS:
                values[key] = parse_value(BROKER_CONFIG_DEFS[key], raw)
            elif key in LOG_DEFAULT_DEFS:
                log_defaults[key] = parse_value(LOG_DEFAULT_DEFS[key], raw)
            elif (listener_key := per_listener_setting(key)) is not None:
                base = BROKER_CONFIG_DEFS.get(listener_key)
                values[key] = parse_value(base, raw) if base is not None else str(raw)
            elif key in KAFKA_CONFIG_DEFS and key not in KAFKA_STATIC_ONLY_CONFIGS:
                values[key] = parse_value(KAFKA_CONFIG_DEFS[key], raw)  # known, and not used here
            else:
                raise InvalidConfig(
                    f"unknown broker config {key!r} (use Kafka's broker config names, e.g. log.retention.ms)"
                )
        values.update(log_defaults)
        given = {_ALIASES[k][0] if k in _ALIASES else k for k in overrides}
        return cls(values, frozenset(given))

    def with_dynamic(self, *layers: Mapping[str, str]) -> tuple[BrokerConfig, dict[str, str]]:
        """This static config under dynamic layers (lowest precedence first), and the
        dynamic values that could not be used, with why (the metadata log may hold what a
        newer broker accepted): Kafka's DynamicBrokerConfig.updateCurrentConfig."""
        values = dict(self.values)
        skipped: dict[str, str] = {}
        for layer in layers:
            for key, raw in layer.items():
                if key not in DYNAMIC_BROKER_CONFIGS:
                    if key not in RECORDED_BROKER_CONFIGS and key not in BROKER_QUOTA_CONFIG_DEFS:
                        # (those are described, not used)
                        skipped[key] = "not a dynamic broker config of this broker"
                    continue
                try:
                    values[key] = parse_value(DYNAMIC_BROKER_CONFIG_DEFS[key], raw)
                except InvalidConfig as exc:
                    skipped[key] = str(exc)
        return BrokerConfig(values, self.static_keys), skipped

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def __contains__(self, key: str) -> bool:
        return key in self.values

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    @property
    def log_defaults(self) -> dict[str, Any]:
        return {k: v for k, v in self.values.items() if k in LOG_DEFAULT_DEFS}

    def log_config(self, topic_overrides: Mapping[str, object]) -> LogConfig:
        return LogConfig.build(topic_overrides, self.log_defaults)


def per_listener_setting(key: str) -> str | None:
    """`listener.name.<listener>.<setting>` → setting, when it may be set per listener."""
    if not key.startswith("listener.name."):
        return None
    listener, sep, setting = key[len("listener.name."):].partition(".")
    return setting if sep and listener and setting in PER_LISTENER_CONFIGS else None


def is_sensitive(name: str) -> bool:
    return (name in SENSITIVE_CONFIGS or name in KAFKA_PASSWORD_CONFIGS or name.endswith(".sasl.jaas.config")
            or name.endswith(".ssl.key.password"))


def parse_listen(listen: str, what: str = "--listen") -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{what} {listen!r} must be HOST:PORT, e.g. 127.0.0.1:9092")
    return host.strip("[]") or "0.0.0.0", int(port)


def admin_http_address(config: BrokerConfig, host: str, port: int) -> tuple[str, int] | None:
    """Where the admin HTTP server listens: admin.http.listener, or the Kafka listener's host
    at its port + admin.http.port.offset (one setting for every broker of a cluster); None: off."""
    listener = str(config["admin.http.listener"])
    offset = int(config["admin.http.port.offset"])
    if listener and offset:
        raise ValueError("set admin.http.listener or admin.http.port.offset, not both")
    if listener:
        return parse_listen(listener, "admin.http.listener")
    if offset:
        if port + offset > 65535:
            raise ValueError(f"admin.http.port.offset={offset}: Kafka port {port} + {offset} is above 65535")
        return host, port + offset
    return None
