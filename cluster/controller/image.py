"""The metadata image: what every broker knows about the cluster, built from the metadata log.

The log holds versioned JSON records (orjson); one Raft entry is a list of records that
apply atomically. Every node applies committed entries in order to its own image and
answers Metadata from it; the active controller keeps a working copy that runs ahead of
the commit point while its proposals are in flight.

Record types (field "type", format version "v"):
  RegisterBroker  broker_id broker_epoch incarnation_id host port rack   (registers fenced)
  FenceBroker / UnfenceBroker / BrokerShutdown   broker_id broker_epoch
  Topic           topic_id name configs internal
  Partition       topic_id partition replicas isr leader leader_epoch partition_epoch adding removing
                  [elr] [last_known_elr]
  PartitionChange topic_id partition [leader] [isr] [replicas] [adding] [removing] [elr] [last_known_elr]
                  (a new leader bumps leader_epoch; every change bumps partition_epoch)
  FeatureLevel    name level   (KIP-584 finalized feature levels; level 0 removes the feature)
  TopicConfig     topic_id key value|null
  BrokerConfig    resource_name key value|null   (KIP-226 dynamic broker config: resource name ""
                  is the cluster-wide default, "<id>" that broker; Kafka's ConfigRecord of type BROKER)
  GroupConfig     group key value|null   (KIP-848/KIP-932 dynamic group config; Kafka's ConfigRecord
                  of type GROUP)
  RemoveTopic     topic_id
  ProducerIds     broker_id next_producer_id   (a block [previous next, next) went to the broker)
  ScramCredential name mechanism salt iterations stored_key server_key   (base64; never a password)
  RemoveScramCredential  name mechanism
  Acl             id resource_type resource_name pattern_type principal host operation permission
  RemoveAcl       id
  ClientQuota     entity key value|null   (entity: [[entity type, name|null], ...] sorted by type;
                  null name: the default entity; null value removes the key)
RegisterBroker may carry `listeners`: {listener name: [host, port]} (advertised.listeners).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from cluster.protocol.sentinels import NO_LEADER

RECORD_VERSION = 1
ELR_FEATURE = "eligible.leader.replicas.version"  # KIP-966


class MetadataError(ValueError):
    """A record that cannot apply: the log and this code disagree (a bug, or a newer writer)."""


@dataclass
class BrokerRegistration:
    broker_id: int
    broker_epoch: int
    incarnation_id: str
    host: str
    port: int
    rack: str | None = None
    fenced: bool = True
    listeners: dict[str, list[Any]] = field(default_factory=dict)  # advertised: name → [host, port]
    in_controlled_shutdown: bool = False

    def endpoint(self, listener: str) -> tuple[str, int] | None:
        """Where clients of `listener` reach this broker (None: it has no such listener)."""
        if not self.listeners:
            return self.host, self.port
        address = self.listeners.get(listener)
        return None if address is None else (str(address[0]), int(address[1]))

    @property
    def active(self) -> bool:
        """May lead partitions and join ISRs."""
        return not self.fenced and not self.in_controlled_shutdown


@dataclass
class PartitionState:
    topic_id: str
    partition: int
    replicas: list[int]
    isr: list[int]
    leader: int
    leader_epoch: int = 0
    partition_epoch: int = 0
    adding: list[int] = field(default_factory=list)
    removing: list[int] = field(default_factory=list)
    # KIP-966: replicas out of the ISR that still hold every record below the high watermark
    # (they left while the ISR was below min.insync.replicas, when it cannot advance), and the
    # last leader while the ISR is empty (elected when it is back and nothing better is).
    elr: list[int] = field(default_factory=list)
    last_known_elr: list[int] = field(default_factory=list)

    @property
    def preferred_leader(self) -> int:
        return self.replicas[0] if self.replicas else NO_LEADER

    @property
    def target_replicas(self) -> list[int]:
        return [r for r in self.replicas if r not in self.removing]


@dataclass
class TopicImage:
    topic_id: str
    name: str
    configs: dict[str, str] = field(default_factory=dict)
    internal: bool = False
    partitions: dict[int, PartitionState] = field(default_factory=dict)
    # Bumped by every record that changes the topic or a partition of it: what a broker
    # derived from the topic (its encoded Metadata entry) holds while this does. Not saved.
    changes: int = field(default=0, compare=False)


class MetadataImage:
    def __init__(self) -> None:
        self.brokers: dict[int, BrokerRegistration] = {}
        self.topics: dict[str, TopicImage] = {}  # by topic id
        self.topics_by_name: dict[str, TopicImage] = {}
        self.next_producer_id = 0
        self.next_broker_epoch = 1
        self.offset = 0  # metadata log offset applied through (exclusive)
        # SCRAM credentials by (user, mechanism): the record's fields (base64 salt and keys)
        self.scram: dict[tuple[str, str], dict[str, Any]] = {}
        self.acls: dict[str, dict[str, Any]] = {}  # by ACL id: the binding's fields
        self.security_version = 0  # bumped by every credential or ACL change
        # Dynamic broker configs by resource name ("" the cluster default, "<id>" one broker),
        # raw strings as the admin APIs gave them.
        self.broker_configs: dict[str, dict[str, str]] = {}
        # Dynamic group configs by group id (cluster/groups/group_configs.py), raw strings.
        self.group_configs: dict[str, dict[str, str]] = {}
        # Client quotas (KIP-546) by entity ((type, name|None) pairs sorted by type): key → value
        self.client_quotas: dict[tuple[tuple[str, str | None], ...], dict[str, float]] = {}
        self.quota_version = 0  # bumped by every quota change
        self.features: dict[str, int] = {}  # finalized feature levels above 0 (FeatureLevel records)

    # ---- queries -----------------------------------------------------------------------

    @property
    def is_empty(self) -> bool:
        """Nothing was ever recorded: a new cluster's log (bootstrap records go in first)."""
        return (not self.brokers and not self.topics and not self.scram and not self.acls and not self.broker_configs
                and not self.group_configs and not self.client_quotas and not self.features
                and self.next_producer_id == 0 and self.next_broker_epoch == 1)

    @property
    def elr_enabled(self) -> bool:
        """KIP-966 eligible leader replicas (and strict min ISR) are on for this cluster."""
        return self.features.get(ELR_FEATURE, 0) >= 1

    def topic(self, name: str) -> TopicImage | None:
        return self.topics_by_name.get(name)

    def partition(self, name: str, index: int) -> PartitionState | None:
        t = self.topics_by_name.get(name)
        return t.partitions.get(index) if t else None

    def is_active(self, broker_id: int) -> bool:
        b = self.brokers.get(broker_id)
        return b is not None and b.active

    def active_brokers(self) -> list[int]:
        return sorted(b for b, reg in self.brokers.items() if reg.active)

    def unfenced_brokers(self) -> list[BrokerRegistration]:
        return [self.brokers[b] for b in sorted(self.brokers) if not self.brokers[b].fenced]

    def all_partitions(self) -> list[tuple[TopicImage, PartitionState]]:
        return [(t, p) for t in self.topics_by_name.values() for p in t.partitions.values()]

    # ---- apply -------------------------------------------------------------------------

    def apply_entry(self, offset: int, data: bytes) -> list[dict[str, Any]]:
        """Apply one committed log entry (a JSON list of records); empty entries are markers."""
        records: list[dict[str, Any]] = orjson.loads(data) if data else []
        for record in records:
            self.apply(record)
        self.offset = offset + 1
        return records

    def apply(self, r: dict[str, Any]) -> None:
        kind = r.get("type")
        if int(r.get("v", 0)) > RECORD_VERSION:
            raise MetadataError(f"metadata record {kind} has version {r.get('v')}, newer than this broker reads")
        handler = _APPLY.get(str(kind))
        if handler is None:
            raise MetadataError(f"unknown metadata record type {kind!r}")
        handler(self, r)

    def _register(self, r: dict[str, Any]) -> None:
        self.brokers[r["broker_id"]] = BrokerRegistration(
            r["broker_id"], r["broker_epoch"], r["incarnation_id"], r["host"], r["port"], r.get("rack"),
            listeners=dict(r.get("listeners") or {}))
        self.next_broker_epoch = max(self.next_broker_epoch, r["broker_epoch"] + 1)

    def _broker(self, r: dict[str, Any]) -> BrokerRegistration | None:
        b = self.brokers.get(r["broker_id"])
        return b if b is not None and b.broker_epoch == r["broker_epoch"] else None

    def _fence(self, r: dict[str, Any]) -> None:
        if (b := self._broker(r)) is not None:
            b.fenced = True
            b.in_controlled_shutdown = False

    def _unfence(self, r: dict[str, Any]) -> None:
        if (b := self._broker(r)) is not None:
            b.fenced = False
            b.in_controlled_shutdown = False

    def _shutdown(self, r: dict[str, Any]) -> None:
        if (b := self._broker(r)) is not None:
            b.in_controlled_shutdown = True

    def _topic(self, r: dict[str, Any]) -> None:
        if r["name"] in self.topics_by_name:
            raise MetadataError(f"topic {r['name']} is created twice")
        t = TopicImage(r["topic_id"], r["name"], dict(r.get("configs") or {}), bool(r.get("internal", False)))
        self.topics[t.topic_id] = t
        self.topics_by_name[t.name] = t

    def _topic_of(self, r: dict[str, Any]) -> TopicImage:
        t = self.topics.get(r["topic_id"])
        if t is None:
            raise MetadataError(f"{r['type']} names unknown topic id {r['topic_id']}")
        return t

    def _partition(self, r: dict[str, Any]) -> None:
        t = self._topic_of(r)
        t.changes += 1
        t.partitions[r["partition"]] = PartitionState(
            t.topic_id, r["partition"], list(r["replicas"]), list(r["isr"]), r["leader"], r.get("leader_epoch", 0),
            r.get("partition_epoch", 0), list(r.get("adding", [])), list(r.get("removing", [])),
            list(r.get("elr", [])), list(r.get("last_known_elr", [])))

    def _partition_change(self, r: dict[str, Any]) -> None:
        t = self._topic_of(r)
        t.changes += 1
        p = t.partitions.get(r["partition"])
        if p is None:
            raise MetadataError(f"PartitionChange for unknown partition {r['topic_id']}-{r['partition']}")
        if "leader" in r and r["leader"] != p.leader:
            p.leader = r["leader"]
            p.leader_epoch += 1
        for key in ("isr", "replicas", "adding", "removing", "elr", "last_known_elr"):
            if key in r:
                setattr(p, key, list(r[key]))
        p.partition_epoch += 1

    def _topic_config(self, r: dict[str, Any]) -> None:
        t = self._topic_of(r)
        t.changes += 1
        if r.get("value") is None:
            t.configs.pop(r["key"], None)
        else:
            t.configs[r["key"]] = str(r["value"])

    def _broker_config(self, r: dict[str, Any]) -> None:
        configs = self.broker_configs.setdefault(str(r["resource_name"]), {})
        if r.get("value") is None:
            configs.pop(r["key"], None)
        else:
            configs[r["key"]] = str(r["value"])
        if not configs:
            del self.broker_configs[str(r["resource_name"])]

    def _group_config(self, r: dict[str, Any]) -> None:
        group = str(r["group"])
        configs = self.group_configs.setdefault(group, {})
        if r.get("value") is None:
            configs.pop(r["key"], None)
        else:
            configs[r["key"]] = str(r["value"])
        if not configs:
            del self.group_configs[group]

    def _remove_topic(self, r: dict[str, Any]) -> None:
        t = self.topics.pop(r["topic_id"], None)
        if t is not None:
            self.topics_by_name.pop(t.name, None)

    def _feature_level(self, r: dict[str, Any]) -> None:
        level = int(r["level"])
        if level > 0:
            self.features[str(r["name"])] = level
        else:
            self.features.pop(str(r["name"]), None)

    def _producer_ids(self, r: dict[str, Any]) -> None:
        self.next_producer_id = max(self.next_producer_id, r["next_producer_id"])

    def _scram(self, r: dict[str, Any]) -> None:
        self.scram[(r["name"], r["mechanism"])] = {k: r[k] for k in ("salt", "iterations", "stored_key", "server_key")}
        self.security_version += 1

    def _remove_scram(self, r: dict[str, Any]) -> None:
        self.scram.pop((r["name"], r["mechanism"]), None)
        self.security_version += 1

    def _acl(self, r: dict[str, Any]) -> None:
        self.acls[r["id"]] = {k: v for k, v in r.items() if k not in ("type", "v", "id")}
        self.security_version += 1

    def _remove_acl(self, r: dict[str, Any]) -> None:
        self.acls.pop(r["id"], None)
        self.security_version += 1

    def _client_quota(self, r: dict[str, Any]) -> None:
        entity = tuple(sorted((str(t), None if n is None else str(n)) for t, n in r["entity"]))
        if not entity:
            raise MetadataError("ClientQuota without an entity")
        if r.get("value") is None:
            values = self.client_quotas.get(entity)
            if values is not None:
                values.pop(r["key"], None)
                if not values:
                    del self.client_quotas[entity]
        else:
            self.client_quotas.setdefault(entity, {})[str(r["key"])] = float(r["value"])
        self.quota_version += 1

    # ---- snapshots ---------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        return orjson.dumps({
            "v": RECORD_VERSION,
            "offset": self.offset,
            "next_producer_id": self.next_producer_id,
            "next_broker_epoch": self.next_broker_epoch,
            "brokers": [vars(b) for b in self.brokers.values()],
            "topics": [
                {"topic_id": t.topic_id, "name": t.name, "configs": t.configs, "internal": t.internal,
                 "partitions": [vars(p) for p in t.partitions.values()]}
                for t in self.topics.values()
            ],
            "scram": [{"name": n, "mechanism": m, **c} for (n, m), c in self.scram.items()],
            "acls": [{"id": i, **a} for i, a in self.acls.items()],
            "broker_configs": self.broker_configs,
            "group_configs": self.group_configs,
            "client_quotas": [{"entity": [list(p) for p in e], "values": v} for e, v in self.client_quotas.items()],
            "features": self.features,
        })

    @classmethod
    def from_bytes(cls, data: bytes) -> MetadataImage:
        doc = orjson.loads(data)
        if int(doc.get("v", 0)) > RECORD_VERSION:
            raise MetadataError(f"metadata snapshot version {doc.get('v')} is newer than this broker reads")
        image = cls()
        image.offset = doc["offset"]
        image.next_producer_id = doc["next_producer_id"]
        image.next_broker_epoch = doc["next_broker_epoch"]
        for b in doc["brokers"]:
            image.brokers[b["broker_id"]] = BrokerRegistration(**b)
        for t in doc["topics"]:
            topic = TopicImage(t["topic_id"], t["name"], dict(t["configs"]), bool(t["internal"]))
            for p in t["partitions"]:
                topic.partitions[p["partition"]] = PartitionState(**p)
            image.topics[topic.topic_id] = topic
            image.topics_by_name[topic.name] = topic
        for c in doc.get("scram", []):
            image.scram[(c["name"], c["mechanism"])] = {k: c[k] for k in ("salt", "iterations", "stored_key",
                                                                          "server_key")}
        for a in doc.get("acls", []):
            image.acls[a["id"]] = {k: v for k, v in a.items() if k != "id"}
        image.security_version = len(image.scram) + len(image.acls)
        image.broker_configs = {str(name): {str(k): str(v) for k, v in configs.items()}
                                for name, configs in doc.get("broker_configs", {}).items() if configs}
        image.group_configs = {str(group): {str(k): str(v) for k, v in configs.items()}
                               for group, configs in doc.get("group_configs", {}).items() if configs}
        for q in doc.get("client_quotas", []):
            entity = tuple(sorted((str(t), None if n is None else str(n)) for t, n in q["entity"]))
            image.client_quotas[entity] = {str(k): float(v) for k, v in q["values"].items()}
        image.quota_version = len(image.client_quotas)
        image.features = {str(k): int(v) for k, v in doc.get("features", {}).items() if int(v) > 0}
        return image

    def copy(self) -> MetadataImage:
        return MetadataImage.from_bytes(self.to_bytes())


_APPLY = {
    "RegisterBroker": MetadataImage._register,
    "FenceBroker": MetadataImage._fence,
    "UnfenceBroker": MetadataImage._unfence,
    "BrokerShutdown": MetadataImage._shutdown,
    "Topic": MetadataImage._topic,
    "Partition": MetadataImage._partition,
    "PartitionChange": MetadataImage._partition_change,
    "TopicConfig": MetadataImage._topic_config,
    "BrokerConfig": MetadataImage._broker_config,
    "GroupConfig": MetadataImage._group_config,
    "RemoveTopic": MetadataImage._remove_topic,
    "ProducerIds": MetadataImage._producer_ids,
    "ScramCredential": MetadataImage._scram,
    "RemoveScramCredential": MetadataImage._remove_scram,
    "Acl": MetadataImage._acl,
    "RemoveAcl": MetadataImage._remove_acl,
    "ClientQuota": MetadataImage._client_quota,
    "FeatureLevel": MetadataImage._feature_level,
}


def record(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "v": RECORD_VERSION, **fields}
