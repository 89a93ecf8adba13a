"""The small files that tie a data directory to its node and cluster (`meta.properties`)
and a partition directory to its topic id (`partition.metadata`), as Kafka's are.

Topic metadata itself lives in the metadata log (cluster/controller).
"""

from __future__ import annotations

from pathlib import Path

from cluster.storage.checkpoint import write_atomic

PARTITION_METADATA_FILE = "partition.metadata"
META_FILE = "meta.properties"


def _read_properties(path: Path) -> dict[str, str]:
    props: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            props[k.strip()] = v.strip()
    return props


def write_meta_properties(data_dir: Path, node_id: int, cluster_id: str) -> None:
    """meta.properties ties a data directory to one node of one cluster."""
    data_dir.mkdir(parents=True, exist_ok=True)
    meta = data_dir / META_FILE
    if meta.exists():
        props = _read_properties(meta)
        if props.get("node.id") and int(props["node.id"]) != node_id:
            raise ValueError(f"{meta} belongs to node {props['node.id']}, not {node_id}: use that node id or another data dir")
        if props.get("cluster.id") and cluster_id and props["cluster.id"] != cluster_id:
            raise ValueError(f"{meta} belongs to cluster {props['cluster.id']!r}, not {cluster_id!r}")
        return
    write_atomic(meta, f"version=1\ncluster.id={cluster_id}\nnode.id={node_id}\n".encode())


def read_partition_topic_id(partition_dir: Path) -> str | None:
    path = partition_dir / PARTITION_METADATA_FILE
    if not path.exists():
        return None
    return _read_properties(path).get("topic_id")


def write_partition_topic_id(partition_dir: Path, topic_id: str, *, fsync: bool = True) -> bool:
    """partition.metadata names the topic id a partition directory belongs to (as Kafka's
    does); False when it already did. Without `fsync` the caller syncs (a batch of them)."""
    if read_partition_topic_id(partition_dir) == topic_id:
        return False
    write_atomic(partition_dir / PARTITION_METADATA_FILE, f"version=0\ntopic_id={topic_id}\n".encode(), fsync=fsync)
    return True
