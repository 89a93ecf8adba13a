"""Client configuration with the Kafka client names and defaults (producer, consumer, admin).

Unknown keys are refused with the nearest known name, as a typo in `linger.ms` must not
silently fall back to a default.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from cluster.common.config_def import ConfigDef, InvalidConfig, parse_value
from cluster.common.secrets import Secret, secret
from cluster.protocol.sentinels import READ_COMMITTED, READ_UNCOMMITTED

__all__ = ["ClientConfig", "InvalidConfig", "COMMON", "PRODUCER", "CONSUMER"]


def _d(name: str, type_: type, default: Any, doc: str, minimum: int | None = None,
       choices: tuple[str, ...] | None = None) -> ConfigDef:
    return ConfigDef(name, type_, default, None, doc, minimum, choices)


COMMON: dict[str, ConfigDef] = {d.name: d for d in [
    _d("bootstrap.servers", str, "", "HOST:PORT list of brokers to learn the cluster from"),
    _d("client.id", str, "dcmirror", "Name sent with every request (broker logs, quotas)"),
    _d("request.timeout.ms", int, 30000, "How long to wait for an answer before the request is retried", 1),
    _d("socket.connection.setup.timeout.ms", int, 10000, "How long a connection may take to open", 1),
    _d("metadata.max.age.ms", int, 300000, "Refresh metadata at least this often", 0),
    _d("retry.backoff.ms", int, 100, "First retry backoff (doubles, with jitter)", 0),
    _d("retry.backoff.max.ms", int, 1000, "Largest retry backoff", 0),
    _d("reconnect.backoff.ms", int, 50, "First wait before reconnecting to a broker", 0),
    _d("reconnect.backoff.max.ms", int, 1000, "Largest wait before reconnecting", 0),
    _d("max.in.flight.requests.per.connection", int, 5, "Pipelined requests per broker connection", 1),
    _d("receive.message.max.bytes", int, 256 << 20, "Largest response accepted (checked before allocating)", 1024),
    # security (cluster/security/connector.py): librdkafka's names and the Java client's PEM ones
    _d("security.protocol", str, "PLAINTEXT", "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
       choices=("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL", "plaintext", "ssl", "sasl_plaintext", "sasl_ssl")),
    _d("sasl.mechanism", str, "", "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"),
    _d("sasl.mechanisms", str, "", "librdkafka's name for sasl.mechanism"),
    _d("sasl.username", str, "", "SASL user"),
    _d("sasl.password", str, "", "SASL password: a ${file:...}, ${dir:...} or ${env:...} reference"),
    _d("sasl.jaas.config", str, "", "The Java client's JAAS line (username=... password=...)"),
    _d("ssl.ca.location", str, "", "PEM file of the CAs to trust (empty: the system's)"),
    _d("ssl.truststore.location", str, "", "The Java client's name for ssl.ca.location (PEM)"),
    _d("ssl.truststore.type", str, "PEM", "Truststore format", choices=("PEM",)),
    _d("ssl.certificate.location", str, "", "PEM certificate (chain) for mutual TLS"),
    _d("ssl.key.location", str, "", "PEM private key for mutual TLS"),
    _d("ssl.keystore.location", str, "", "PEM file with key and certificate (the Java client's name)"),
    _d("ssl.keystore.type", str, "PEM", "Keystore format", choices=("PEM",)),
    _d("ssl.key.password", str, "", "Password of an encrypted key (a reference, like sasl.password)"),
    _d("ssl.endpoint.identification.algorithm", str, "https", "https: check the broker's host name; none: do not",
       choices=("https", "none", "")),
    _d("enable.ssl.certificate.verification", bool, True, "Verify the broker's certificate"),
]}

# Values kept as Secret (printing a config never shows them).
SECRET_KEYS = frozenset({"sasl.password", "ssl.key.password", "sasl.jaas.config"})

PRODUCER: dict[str, ConfigDef] = COMMON | {d.name: d for d in [
    _d("acks", str, "all", "0, 1 or all (-1)", choices=("0", "1", "all", "-1")),
    _d("enable.idempotence", bool, True, "Exactly one copy of each record per partition, in order"),
    _d("linger.ms", int, 5, "How long a batch waits for more records", 0),
    _d("batch.size", int, 16384 * 8, "Largest batch in bytes (uncompressed)", 1),
    _d("buffer.memory", int, 32 << 20, "Bytes of records buffered before produce() pushes back", 1024),
    _d("max.request.size", int, 1 << 20, "Largest produce request and record", 1024),
    _d("compression.type", str, "none", "Batch codec", choices=("none", "gzip", "snappy", "lz4", "zstd")),
    _d("delivery.timeout.ms", int, 120000, "Upper bound on reporting a record's delivery or failure", 1),
    _d("max.block.ms", int, 60000, "How long send() waits for buffer space or metadata", 0),
    _d("retries", int, 2**31 - 1, "Attempts per batch beyond the first (bounded by delivery.timeout.ms)", 0),
    _d("partitioner", str, "murmur2_random", "Key partitioner: murmur2_random (Java's and librdkafka's default for "
       "Java compatibility), murmur2, random", choices=("murmur2_random", "murmur2", "random")),
    _d("sticky.partitioning.linger.ms", int, 10, "Keyless records stick to one partition this long", 0),
]}

CONSUMER: dict[str, ConfigDef] = COMMON | {d.name: d for d in [
    _d("group.id", str, "", "Consumer group; empty for assign()-only consumers"),
    _d("group.instance.id", str, "", "Static membership id (empty: dynamic)"),
    _d("auto.offset.reset", str, "latest", "Where to start without a committed offset",
       choices=("earliest", "latest", "none", "smallest", "largest", "error")),
    _d("enable.auto.commit", bool, True, "Commit positions in the background"),
    _d("auto.commit.interval.ms", int, 5000, "How often auto commit runs", 0),
    _d("session.timeout.ms", int, 45000, "Member considered dead without heartbeats this long", 1),
    _d("heartbeat.interval.ms", int, 3000, "Heartbeat period", 1),
    _d("max.poll.interval.ms", int, 300000, "Rebalance timeout: longest gap between polls", 1),
    _d("partition.assignment.strategy", str, "range,roundrobin", "Assignors, preferred first"),
    _d("fetch.min.bytes", int, 1, "Broker waits for this many bytes", 0),
    _d("fetch.max.wait.ms", int, 500, "Longest broker wait for fetch.min.bytes", 0),
    _d("fetch.max.bytes", int, 50 << 20, "Largest fetch response", 1),
    _d("max.partition.fetch.bytes", int, 1 << 20, "Largest data per partition in a fetch", 1),
    _d("fetch.sessions.enable", bool, True, "dcmirror's: incremental fetch sessions (KIP-227) where the broker "
       "speaks Fetch v7+, as the Java consumer always does; false: every fetch lists every partition, as librdkafka"),
    _d("isolation.level", str, "read_uncommitted", "read_uncommitted or read_committed",
       choices=("read_uncommitted", "read_committed")),
    _d("queued.max.messages.kbytes", int, 64 << 10, "Fetched but unconsumed data per consumer (KiB)", 1),
    _d("check.crcs", bool, False, "Verify the CRC of every fetched batch"),
    _d("client.rack", str, "", "This consumer's rack: a broker with a rack-aware replica.selector.class "
       "may send it to a follower in the same rack (KIP-392)"),
]}


class ClientConfig:
    """Parsed, validated configuration; `config["linger.ms"]` gives the typed value."""

    def __init__(self, defs: Mapping[str, ConfigDef], values: Mapping[str, Any], *, kind: str) -> None:
        self._values: dict[str, Any] = {}
        for key, raw in values.items():
            if key not in defs:
                close = difflib.get_close_matches(key, defs, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise InvalidConfig(f"unknown {kind} config {key!r}{hint}")
            if key in SECRET_KEYS and isinstance(raw, Secret):
                # Already the secret (e.g. a password typed into the console's login form):
                # never read as a reference, so "${file:...}" typed there opens no file.
                self._values[key] = raw
                continue
            self._values[key] = parse_value(defs[key], raw.reveal() if isinstance(raw, Secret) else raw)
            if key in SECRET_KEYS and self._values[key]:
                self._values[key] = secret(self._values[key], key)  # ${file:...}/${dir:...}/${env:...} resolved
        for key, d in defs.items():
            self._values.setdefault(key, d.default)
        if not self._values["bootstrap.servers"]:
            raise InvalidConfig(f"{kind} config bootstrap.servers is required (HOST:PORT,...)")

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)


def producer_config(values: Mapping[str, Any]) -> ClientConfig:
    config = ClientConfig(PRODUCER, values, kind="producer")
    if config["enable.idempotence"]:
        if config["acks"] not in ("all", "-1"):
            raise InvalidConfig("enable.idempotence=true needs acks=all (set enable.idempotence=false for acks 0/1)")
        if config["max.in.flight.requests.per.connection"] > 5:
            raise InvalidConfig("enable.idempotence=true allows max.in.flight.requests.per.connection of at most 5")
    if config["batch.size"] > config["max.request.size"]:
        raise InvalidConfig(f"batch.size {config['batch.size']} exceeds max.request.size {config['max.request.size']}")
    return config


def isolation_level(config: ClientConfig | Mapping[str, Any]) -> int:
    """The Fetch/ListOffsets isolation_level of a consumer config's `isolation.level`."""
    value = config["isolation.level"] if isinstance(config, ClientConfig) else config.get("isolation.level")
    return READ_COMMITTED if value == "read_committed" else READ_UNCOMMITTED


def consumer_config(values: Mapping[str, Any]) -> ClientConfig:
    config = ClientConfig(CONSUMER, values, kind="consumer")
    if config["heartbeat.interval.ms"] >= config["session.timeout.ms"]:
        raise InvalidConfig("heartbeat.interval.ms must be lower than session.timeout.ms")
    return config


def admin_config(values: Mapping[str, Any]) -> ClientConfig:
    return ClientConfig(COMMON, values, kind="admin")
