"""The warehouse as the topology file describes it: where it lives, what it loads, how
Spark runs (sans-IO; the `[warehouse]` section is validated by topology/load.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from cluster.client.registry import RegistryAccess
from mirror.checkpoints import CHECKPOINTS_TOPIC
from mirror.worker import HEARTBEATS_TOPIC
from spark_aggregate.load_metrics import textfile_path
from topology import Topology, TopologyError
from topology.model import MirrorSpec, RegistryTableSpec

DATABASE = "dcmirror"
LEDGER_TABLE = "loads"
UNKNOWN_DATACENTER = "unknown"
DEFAULT_MASTER = "local[2]"
DEFAULT_POLL_TIMEOUT_MS = 120_000
MIRROR_TOPICS = frozenset({HEARTBEATS_TOPIC, CHECKPOINTS_TOPIC})
REGISTRY_TOPIC = "_schemas"  # the schema registry's state (cluster/registry/store.py SCHEMAS_TOPIC)


def table_name(topic: str) -> str:
    """Warehouse table of a topic: non-alphanumerics become "_" (east.pageviews ->
    east_pageviews); the metastore keeps names in lower case."""
    return re.sub(r"[^A-Za-z0-9]", "_", topic).lower()


def is_loadable(topic: str) -> bool:
    """Kafka's internal topics, the mirror's own and the schema registry's are never warehouse data."""
    return not topic.startswith("__") and topic not in MIRROR_TOPICS and topic != REGISTRY_TOPIC


@dataclass(frozen=True)
class WarehouseSettings:
    source: str
    """The cluster loaded from."""
    bootstrap: str
    path: Path
    """Local directory: lock, embedded metastore, logs, last-load summary."""
    warehouse_uri: str
    """Where the tables' data goes (a Hadoop filesystem URI)."""
    metastore_uri: str | None
    topics: str
    schemas: tuple[tuple[str, str], ...]
    datacenters: dict[str, str] = field(hash=False)
    """cluster name -> datacenter, for the tables' source_dc partition column."""
    spark_conf: dict[str, str] = field(hash=False)
    kafka: dict[str, str] = field(hash=False)
    fail_on_data_loss: bool = True
    min_partitions: int | None = None
    max_offsets_per_load: int | None = None
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS
    load_interval_ms: int = 0
    writer: str = "auto"
    """Who writes the tables' Parquet files: "arrow" (the tasks), "spark", or "auto"."""
    metrics_textfile: Path | None = None
    """Where each load's Prometheus metrics go (load_metrics.py); None: not written."""
    registry_schemas: tuple[RegistryTableSpec, ...] = ()
    """Topics whose tables take their columns from the schema registry (typed.py)."""
    registry_url: str | None = None
    """The source cluster's schema registry."""
    registry_access: RegistryAccess = RegistryAccess()
    """How the loader authenticates to it and trusts its certificate (references only)."""
    schema_flows: tuple[MirrorSpec, ...] = field(default=(), hash=False)
    """The flows into the loaded cluster that copy schemas: the registry context of each
    source's schema ids (`schema_context`) and its topics' names (`rename`) for typed tables."""

    def schema_sources(self, topic: str) -> tuple[tuple[str, str, str | None], ...]:
        """(source cluster, its registry context, the source topic named `topic` here or None)
        of every flow into the loaded cluster that copies schemas."""
        return tuple((f.source, f.schema_context or f".{f.source}",
                      f.source_topic(topic, self.datacenters.get(f.source, f.source))) for f in self.schema_flows)

    @property
    def embedded_metastore(self) -> bool:
        return self.metastore_uri is None

    @property
    def staging_uri(self) -> str:
        return f"{self.warehouse_uri.rstrip('/')}/_staging"

    def schema_of(self, topic: str) -> str | None:
        for pattern, ddl in self.schemas:
            if re.fullmatch(pattern, topic):
                return ddl
        return None

    def registry_schema_of(self, topic: str) -> RegistryTableSpec | None:
        """The typed-table entry of a topic (the first whose regex matches)."""
        for spec in self.registry_schemas:
            if re.fullmatch(spec.topics, topic):
                return spec
        return None

    def wanted(self, topic: str) -> bool:
        return is_loadable(topic) and re.fullmatch(self.topics, topic) is not None

    @classmethod
    def from_topology(cls, topology: Topology) -> WarehouseSettings:
        spec = topology.warehouse
        if spec is None:
            file = str(topology.path) if topology.path is not None else None
            raise TopologyError("the topology has no [warehouse] section: add one naming the cluster to load "
                                "from, e.g. [warehouse] source = \"aggregate\"", file=file)
        config = dict(spec.config)
        spark_conf = {k: v for k, v in config.items() if k.startswith("spark.")}
        spark_conf.setdefault("spark.master", DEFAULT_MASTER)
        # the source cluster's `client` table (security settings), the load's rack (the
        # source's datacenter: a stretched cluster serves it from replicas there, KIP-392),
        # then the load's own kafka.*
        kafka = {**topology.cluster(spec.source).client, "client.rack": topology.cluster(spec.source).datacenter,
                 **{k[len("kafka."):]: v for k, v in config.items() if k.startswith("kafka.")}}
        path = Path(spec.path)
        registry = topology.cluster(spec.source).registry
        return cls(
            source=spec.source,
            bootstrap=topology.cluster(spec.source).bootstrap(),
            path=path,
            warehouse_uri=config.get("warehouse.uri", path.absolute().as_uri()),
            metastore_uri=config.get("metastore.uri"),
            topics=spec.topics,
            schemas=spec.schemas,
            datacenters={name: c.datacenter for name, c in topology.clusters.items()},
            spark_conf=spark_conf,
            kafka=kafka,
            fail_on_data_loss=config.get("failOnDataLoss", "true") == "true",
            min_partitions=int(config["minPartitions"]) if "minPartitions" in config else None,
            max_offsets_per_load=int(config["maxOffsetsPerLoad"]) if "maxOffsetsPerLoad" in config else None,
            poll_timeout_ms=int(config.get("pollTimeoutMs", DEFAULT_POLL_TIMEOUT_MS)),
            load_interval_ms=int(config.get("load.interval.ms", 0)),
            writer=config.get("load.writer", "auto"),
            metrics_textfile=textfile_path(path, config),
            registry_schemas=spec.registry_schemas,
            registry_url=None if registry is None else registry.url,
            registry_access=RegistryAccess() if registry is None else RegistryAccess(
                registry.auth_token, config.get("registry.basic.auth.user.info", ""), registry.keystore),
            schema_flows=tuple(m for m in topology.mirrors_into(spec.source) if m.schemas),
        )
