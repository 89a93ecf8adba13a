"""Topic metadata of a standalone broker, kept in `topics.json` in the data directory.

Multi-broker clusters will keep this in the Raft metadata log instead; the interface
(create, delete, lookup) stays the same.
"""

from __future__ import annotations

import base64
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from cluster.storage.checkpoint import write_atomic

TOPICS_FILE = "topics.json"
META_FILE = "meta.properties"
_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME_LENGTH = 249


class InvalidTopic(ValueError):
    pass


def validate_topic_name(name: str) -> None:
    if not name or name in (".", ".."):
        raise InvalidTopic(f"topic name {name!r} is not allowed")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopic(f"topic name is {len(name)} characters, longer than {MAX_TOPIC_NAME_LENGTH}")
    if not _LEGAL_TOPIC.match(name):
        raise InvalidTopic(f"topic name {name!r} may only contain ASCII letters, digits, '.', '_' and '-'")


@dataclass
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)
    internal: bool = False


class TopicStore:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.topics: dict[str, TopicInfo] = {}
        self.cluster_id = ""

    def load(self, node_id: int) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        meta = self.data_dir / META_FILE
        props: dict[str, str] = {}
        if meta.exists():
            for line in meta.read_text().splitlines():
                if "=" in line and not line.startswith("#"):
                    k, v = line.split("=", 1)
                    props[k.strip()] = v.strip()
            if props.get("node.id") and int(props["node.id"]) != node_id:
                raise ValueError(
                    f"{meta} belongs to node {props['node.id']}, not {node_id}: use that node id or another data dir"
                )
        self.cluster_id = props.get("cluster.id") or base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not meta.exists():
            write_atomic(meta, f"version=1\ncluster.id={self.cluster_id}\nnode.id={node_id}\n".encode())
        path = self.data_dir / TOPICS_FILE
        if path.exists():
            doc = orjson.loads(path.read_bytes())
            for t in doc["topics"]:
                info = TopicInfo(t["name"], uuid.UUID(t["topic_id"]), int(t["partitions"]), dict(t["configs"]),
                                 bool(t.get("internal", False)))
                self.topics[info.name] = info

    def save(self) -> None:
        doc = {
            "version": 1,
            "topics": [
                {"name": t.name, "topic_id": str(t.topic_id), "partitions": t.partitions, "configs": t.configs,
                 "internal": t.internal}
                for t in self.topics.values()
            ],
        }
        write_atomic(self.data_dir / TOPICS_FILE, orjson.dumps(doc, option=orjson.OPT_INDENT_2))

    def create(self, name: str, partitions: int, configs: dict[str, str], *, internal: bool = False) -> TopicInfo:
        info = TopicInfo(name, uuid.uuid4(), partitions, configs, internal)
        self.topics[name] = info
        self.save()
        return info

    def delete(self, name: str) -> TopicInfo | None:
        info = self.topics.pop(name, None)
        if info is not None:
            self.save()
        return info

    def by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        for t in self.topics.values():
            if t.topic_id == topic_id:
                return t
        return None
