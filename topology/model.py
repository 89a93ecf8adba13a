"""What a topology file describes, as frozen dataclasses (built by ``topology.load``)."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path

from topology.errors import TopologyError

DEFAULT_RENAME = "{source}.{topic}"
# A mirror flow's `config` keys (mirror/worker.py reads them); client settings go through
# the producer. and consumer. prefixes with the Kafka client names.
MIRROR_CONFIG_KEYS = ("topic.refresh.ms", "offset.commit.interval.ms", "heartbeat.interval.ms",
                      "checkpoint.interval.ms", "http.port.base", "group.offset.sync.ms", "acl.sync.ms",
                      "schema.sync.ms", "flow.control.poll.ms", "num.replica.fetchers")
# Keys that take one of a few words: what a flow does when its source topic was deleted and
# created again (mirror the new incarnation after the old one, or stop that partition).
MIRROR_CHOICE_KEYS = {"on.topic.recreated": ("mirror", "stop"),
                      # Which source subjects a flow's topics use (Confluent's subject name strategies).
                      "schema.subject.name.strategy": ("TopicNameStrategy", "RecordNameStrategy",
                                                       "TopicRecordNameStrategy")}
MIRROR_CONFIG_PREFIXES = ("producer.", "consumer.", "source.", "target.")
# Basic-auth credentials (`user:password`, a secret reference) a flow's schema sync logs in to
# the source's / the target's registry with (without them: the registry's auth_token, if any).
MIRROR_REGISTRY_SECRET_KEYS = ("schema.source.basic.auth.user.info", "schema.target.basic.auth.user.info")
# The workers' admin HTTP (workers_http, or http.port.base): bind address, bearer token (a
# reference), HTTPS keystore, and the CA `dcmirror status` verifies it with.
MIRROR_HTTP_KEYS = ("http.host", "http.auth.token", "http.ssl.keystore.location", "http.ssl.ca.location")
RENAME_PLACEHOLDERS = ("source", "target", "topic", "source_dc")
# The warehouse's `config` keys (spark_aggregate/settings.py reads them, with their types and
# defaults); spark.* and kafka.* pass through to Spark and to the cluster client.
WAREHOUSE_CONFIG_KEYS = ("metastore.uri", "warehouse.uri", "failOnDataLoss", "minPartitions",
                         "maxOffsetsPerLoad", "pollTimeoutMs", "load.interval.ms", "load.writer",
                         "load.metrics.textfile.dir", "load.service", "registry.basic.auth.user.info")
WAREHOUSE_CONFIG_PREFIXES = ("spark.", "kafka.")
# Columns every warehouse table has; a topic's schema cannot declare them again.
WAREHOUSE_COLUMNS = ("key", "value", "headers", "timestamp", "timestamp_type", "kafka_partition",
                     "kafka_offset", "source_cluster", "source_partition", "source_offset", "source_topic_id",
                     "source_leader_epoch", "load_id",
                     "source_dc", "event_date")


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address) is this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class NodeAddress:
    node_id: int
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host  # IPv6 literal
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class RegistrySpec:
    """A cluster's schema registry (`[clusters.NAME.registry]`): Confluent's REST API on
    `listen`, state in the cluster's `_schemas` topic."""

    listen: NodeAddress
    auth_token: str = ""
    """Bearer token reference (${file:...}/${dir:...}/${env:...}), empty = none."""
    basic_auth_users: str = ""
    """A file of `user: password` lines for HTTP basic auth, empty = none."""
    keystore: str = ""
    """PEM keystore for HTTPS, empty = plain HTTP."""

    @property
    def url(self) -> str:
        return f"{'https' if self.keystore else 'http'}://{self.listen}"


@dataclass(frozen=True)
class ConsoleSpec:
    """The web console (`[console]`, `dcmirror console --config FILE`): one application for
    the whole topology on `listen`."""

    listen: NodeAddress
    auth_token: str = ""
    """Bearer token reference: who presents it logs in as the console's admin (acting with
    the topology's client credentials); empty = no token login."""
    keystore: str = ""
    """PEM keystore for HTTPS, empty = plain HTTP."""
    refresh_ms: int = 2000
    """How often the console asks the clusters and workers (one poll however many
    browsers are open) and how often pages refresh."""

    @property
    def url(self) -> str:
        return f"{'https' if self.keystore else 'http'}://{self.listen}"


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    datacenter: str
    brokers: tuple[NodeAddress, ...]
    """Node ids 1..n in file order."""
    controllers: tuple[NodeAddress, ...]
    """Dedicated controllers (quorum voters only), node ids n+1..n+m; empty = combined mode."""
    data_dir: Path
    config: dict[str, str] = field(default_factory=dict, hash=False)
    """Broker configs with Kafka's names, every value a string."""
    client: dict[str, str] = field(default_factory=dict, hash=False)
    """How every dcmirror client reaches this cluster: security.protocol, sasl.*, ssl.*
    (secrets as ${file:...}/${dir:...}/${env:...} references, never inline)."""
    listeners: dict[str, tuple[NodeAddress, ...]] = field(default_factory=dict, hash=False)
    """More listeners of every broker, by listener name: one address per broker, in broker
    order (the `brokers` addresses are the inter-broker listener's)."""
    client_listener: str = ""
    """The listener dcmirror's clients bootstrap from (empty: the inter-broker one)."""
    users: dict[str, str] = field(default_factory=dict, hash=False)
    """SCRAM users the cluster starts with (written into its metadata log when it is first
    formed, as kafka-storage format --add-scram) and `topology apply` keeps present:
    user name -> password reference."""

    racks: tuple[str, ...] = ()
    """Each broker's broker.rack, in broker order (empty: no racks)."""
    registry: RegistrySpec | None = None
    """The cluster's schema registry, if it has one (`dcmirror registry`, run by `up`)."""

    @property
    def nodes(self) -> tuple[NodeAddress, ...]:
        return self.brokers + self.controllers

    def broker_configs(self, node_id: int) -> dict[str, str]:
        """The broker configs of node `node_id`: the cluster's, its rack, and rack-aware
        reads (KIP-392) when racks are declared, unless the config chose a selector."""
        out = dict(self.config)
        brokers = [b.node_id for b in self.brokers]
        if self.racks and node_id in brokers:
            out["broker.rack"] = self.racks[brokers.index(node_id)]
            out.setdefault("replica.selector.class", "org.apache.kafka.common.replica.RackAwareReplicaSelector")
        return out

    @property
    def voters(self) -> tuple[NodeAddress, ...]:
        """The metadata quorum: the dedicated controllers if any, else every broker."""
        return self.controllers or self.brokers

    @property
    def combined(self) -> bool:
        return not self.controllers

    def node(self, node_id: int) -> NodeAddress:
        for address in self.nodes:
            if address.node_id == node_id:
                return address
        ids = ", ".join(str(a.node_id) for a in self.nodes)
        raise TopologyError(f"cluster {self.name!r} has no node {node_id}; its node ids are {ids}")

    def is_controller(self, node_id: int) -> bool:
        """True for a dedicated controller node (not a broker)."""
        return self.node(node_id) in self.controllers

    def node_data_dir(self, node_id: int) -> Path:
        self.node(node_id)  # unknown ids raise
        return self.data_dir / f"node-{node_id}"

    @property
    def inter_broker_listener(self) -> str:
        """The name of the listener the `brokers` addresses serve (Kafka's
        inter.broker.listener.name, else security.inter.broker.protocol, else PLAINTEXT)."""
        return (self.config.get("inter.broker.listener.name") or self.config.get("security.inter.broker.protocol")
                or "PLAINTEXT").upper()

    def listener_addresses(self, name: str = "") -> tuple[NodeAddress, ...]:
        """Every broker's address on listener `name` (empty: the client listener)."""
        name = (name or self.client_listener or self.inter_broker_listener).upper()
        if name == self.inter_broker_listener:
            return self.brokers
        if name not in self.listeners:
            known = ", ".join([self.inter_broker_listener, *self.listeners])
            raise TopologyError(f"cluster {self.name!r} has no listener {name!r}; its listeners: {known}")
        return self.listeners[name]

    def listener_protocol(self, listener: str) -> str:
        """PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL (listener.security.protocol.map, or
        the name itself)."""
        listener = listener.upper()
        for pair in self.config.get("listener.security.protocol.map", "").split(","):
            name, _, protocol = pair.partition(":")
            if name.strip().upper() == listener:
                return protocol.strip().upper()
        return listener

    def is_host_local(self, listener: str) -> bool:
        """A secured cluster's plaintext listener on loopback: for clients on the broker's own
        host only, so it stays on loopback wherever the file is deployed (pods, lab hosts)."""
        return (self.listener_protocol(listener) == "PLAINTEXT"
                and self.listener_protocol(self.inter_broker_listener) != "PLAINTEXT"
                and all(is_loopback(a.host) for a in self.listener_addresses(listener)))

    def node_listeners(self, node_id: int) -> str:
        """The node's Kafka `listeners` config: NAME://host:port,... (dedicated controllers
        serve the inter-broker listener only)."""
        node = self.node(node_id)
        out = [f"{self.inter_broker_listener}://{node}"]
        if node in self.brokers:
            index = self.brokers.index(node)
            out += [f"{name}://{addresses[index]}" for name, addresses in self.listeners.items()]
        return ",".join(out)

    def bootstrap(self, listener: str = "") -> str:
        """``host:port,host:port,...`` of the brokers on `listener` (default: the client
        listener), for Kafka clients."""
        return ",".join(str(a) for a in self.listener_addresses(listener))

    def client_config(self, *overrides: dict[str, str]) -> dict[str, str]:
        """Client settings for this cluster: bootstrap.servers (the client listener), the
        cluster's `client` table, then `overrides` (a flow's principal for one side)."""
        out = {"bootstrap.servers": self.bootstrap(), **self.client}
        for o in overrides:
            out.update(o)
        return out


@dataclass(frozen=True)
class TopicSpec:
    cluster: str
    name: str
    partitions: int
    replication_factor: int
    config: dict[str, str] = field(default_factory=dict, hash=False)
    """Topic configs with Kafka's names: ``[defaults] config`` overlaid by the topic's own."""


@dataclass(frozen=True)
class MirrorSpec:
    name: str
    source: str
    target: str
    topics: str
    """Regex, matched against the whole source topic name."""
    exclude: str | None = None
    """Regex; source topics matching it are not copied even if ``topics`` matches."""
    rename: str = DEFAULT_RENAME
    workers: int = 1
    groups: str | None = None
    """Regex of source consumer groups whose offsets are translated to the target."""
    config: dict[str, str] = field(default_factory=dict, hash=False)
    workers_http: tuple[NodeAddress, ...] = ()
    """Where worker i serves its admin HTTP (/healthz, /metrics, /v1/status), one per worker
    (node_id = i): where it binds (unless config http.host says otherwise) and where `dcmirror
    status` reaches it. Empty: config http.port.base (http.host:base+i), or no admin HTTP."""
    mirror_topics: bool = False
    """Targets are mirror topics: each source partition's batches at the same offsets, byte for
    byte (partitionLeaderEpoch aside), read-only until promoted (docs/design.md, "Mirror topics
    keep offsets"). False: records are copied with provenance headers (the aggregate's flows)."""
    mirror_groups: str | None = None
    """Mirror topics only: regex of source consumer groups whose committed offsets of the mirrored
    topics are copied 1:1 into the target while the group has no members there (None: none)."""
    acl_principal_map: dict[str, str] = field(default_factory=dict, hash=False)
    """Mirror topics only: source principal -> the principal the target's copy of its topic ACLs
    names (principals not listed are kept as they are)."""
    schemas: bool = False
    """Copy the schemas the flow's topics use from the source's registry into the target's, in
    context `schema_context` with their ids (default: on when both clusters have a registry)."""
    schema_context: str = ""
    """The target registry's context of this source's schemas (default `.<source>`)."""

    def http_address(self, index: int) -> tuple[str, int] | None:
        """Where worker `index` serves its admin HTTP, as other hosts reach it; None: it has none."""
        if self.workers_http:
            address = self.workers_http[index]
            return address.host, address.port
        base = int(self.config.get("http.port.base", "0") or 0)
        if base:
            return self.config.get("http.host", "127.0.0.1"), base + index
        return None

    def matches(self, topic: str) -> bool:
        """Whether this flow copies source topic ``topic``."""
        if re.fullmatch(self.topics, topic) is None:
            return False
        return self.exclude is None or re.fullmatch(self.exclude, topic) is None

    def target_topic(self, topic: str, source_dc: str) -> str:
        """The name ``topic`` gets in the target cluster."""
        return self.rename.format(source=self.source, target=self.target, topic=topic, source_dc=source_dc)

    def source_topic(self, target_topic: str, source_dc: str) -> str | None:
        """The source topic this flow names ``target_topic`` in the target (the rename template
        read backwards), or None: no topic this flow copies gets that name."""
        import string

        pattern, fixed = "", {"source": self.source, "target": self.target, "source_dc": source_dc}
        seen_topic = False
        for literal, name, _, _ in string.Formatter().parse(self.rename):
            pattern += re.escape(literal)
            if name == "topic":
                pattern += "(?P=topic)" if seen_topic else "(?P<topic>.+?)"
                seen_topic = True
            elif name is not None:
                pattern += re.escape(fixed.get(name, "{" + name + "}"))
        found = re.fullmatch(pattern, target_topic) if seen_topic else None
        if found is None or not self.matches(found["topic"]):
            return None
        topic: str = found["topic"]
        return topic if self.target_topic(topic, source_dc) == target_topic else None


# Subject naming strategies of typed warehouse tables (Confluent's names).
SUBJECT_NAME_STRATEGIES = ("TopicNameStrategy", "RecordNameStrategy", "TopicRecordNameStrategy")
POISON_ACTIONS = ("dead-letter", "fail")


@dataclass(frozen=True)
class RegistryTableSpec:
    """A `[warehouse.registry_schemas]` entry: topics whose values are decoded by their
    schema id (Confluent wire format) through the warehouse source cluster's registry."""

    topics: str
    """Regex, matched against the whole topic name in the warehouse source cluster."""
    value: bool = True
    subject_name_strategy: str = "TopicNameStrategy"
    subject: str = ""
    """Explicit subject whose latest version is the table's schema (overrides the strategy)."""
    poison: str = "dead-letter"
    """A record that is not in the wire format: "dead-letter" (its own table) or "fail"."""
    key: bool = False
    """Keys are decoded too, into the struct column `record_key` (their schema a record)."""
    key_subject: str = ""
    """Explicit subject of the key schema (default TopicNameStrategy: `<topic>-key`)."""


@dataclass(frozen=True)
class WarehouseSpec:
    source: str
    path: Path
    topics: str
    """Regex, matched against the whole topic name in the source cluster."""
    config: dict[str, str] = field(default_factory=dict, hash=False)
    schemas: tuple[tuple[str, str], ...] = ()
    """(topic regex, Spark DDL column list): values of matching topics are parsed as JSON
    into these columns; the first matching entry applies."""
    registry_schemas: tuple[RegistryTableSpec, ...] = ()
    """Topics whose tables take their columns from the schema registry."""

    @property
    def service(self) -> bool:
        """config load.service = "true": `dcmirror up` (or a systemd unit) keeps `dcmirror
        warehouse serve`, one Spark session that loads and `warehouse sql` use."""
        return self.config.get("load.service", "false") == "true"


@dataclass(frozen=True)
class Defaults:
    """Applied to ``[[topics]]`` entries that leave a key out."""

    partitions: int = 6
    replication_factor: int = 3
    """Capped by the cluster's broker count when applied."""
    config: dict[str, str] = field(default_factory=dict, hash=False)
    """Topic configs every declared topic starts from."""


@dataclass(frozen=True)
class Topology:
    path: Path | None
    clusters: dict[str, ClusterSpec] = field(hash=False)
    topics: tuple[TopicSpec, ...]
    mirrors: tuple[MirrorSpec, ...]
    warehouse: WarehouseSpec | None
    defaults: Defaults
    console: ConsoleSpec | None = None

    def cluster(self, name: str) -> ClusterSpec:
        try:
            return self.clusters[name]
        except KeyError:
            names = ", ".join(self.clusters) or "(none)"
            file = str(self.path) if self.path is not None else None
            raise TopologyError(f"unknown cluster {name!r}; clusters: {names}", file=file) from None

    def topics_of(self, cluster: str) -> list[TopicSpec]:
        self.cluster(cluster)  # unknown names raise
        return [t for t in self.topics if t.cluster == cluster]

    def mirrors_from(self, cluster: str) -> list[MirrorSpec]:
        self.cluster(cluster)
        return [m for m in self.mirrors if m.source == cluster]

    def mirrors_into(self, cluster: str) -> list[MirrorSpec]:
        self.cluster(cluster)
        return [m for m in self.mirrors if m.target == cluster]

    def schema_contexts(self, cluster: str) -> tuple[tuple[str, str], ...]:
        """(source cluster, registry context) of the flows into `cluster` that copy schemas:
        where the schema ids of records mirrored from each source are (`schema_context`)."""
        return tuple((m.source, m.schema_context or f".{m.source}") for m in self.mirrors_into(cluster) if m.schemas)
