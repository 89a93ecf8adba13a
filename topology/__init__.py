"""Topology file: the TOML description of clusters, topics, mirror flows and the warehouse.

``load(path)`` / ``loads(text)`` parse and validate it into a frozen :class:`Topology`;
problems raise :class:`TopologyError` naming file, line and key path.
"""

from topology.errors import TopologyError
from topology.load import (
    default_topology_text,
    format_key_path,
    load,
    load_default,
    loads,
    topic_name_problem,
)
from topology.model import (
    DEFAULT_RENAME,
    ClusterSpec,
    Defaults,
    MirrorSpec,
    NodeAddress,
    TopicSpec,
    Topology,
    WarehouseSpec,
)

__all__ = [
    "DEFAULT_RENAME",
    "ClusterSpec",
    "Defaults",
    "MirrorSpec",
    "NodeAddress",
    "TopicSpec",
    "Topology",
    "TopologyError",
    "WarehouseSpec",
    "default_topology_text",
    "format_key_path",
    "load",
    "load_default",
    "loads",
    "topic_name_problem",
]
