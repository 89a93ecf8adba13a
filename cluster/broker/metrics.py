"""Broker metrics: plain counters bumped on the request path, read by the admin HTTP server.

The hot path only increments integers (per topic: records and bytes in and out) and drops
request latencies into fixed histogram buckets; gauges (under-replicated partitions,
controller state, ...) are computed from the broker's state when a scraper asks. Names
follow Kafka's broker metrics (BytesInPerSec, MessagesInPerSec, UnderReplicatedPartitions,
IsrShrinksPerSec, ActiveControllerCount, TotalTimeMs per request) with Prometheus
conventions: `dcmirror_broker_bytes_in_total{topic=...}`, seconds, `_total` counters.

Served as /metrics (Prometheus text), /v1/cluster (JSON: this broker's view of its
cluster) and /healthz (200 once the broker is ready, 503 before) when the broker config
`admin.http.listener` (HOST:PORT) or `admin.http.port.offset` (Kafka port + N) is set.
"""

from __future__ import annotations

import bisect
import struct
import time
from typing import TYPE_CHECKING, Any

from cluster.admin_http import Route, Sample, prometheus_text
from cluster.controller.image import NO_LEADER
from cluster.protocol.messages import API_NAMES

if TYPE_CHECKING:
    from cluster.broker.broker import Broker

# Upper bounds (seconds) of the request latency buckets, as Prometheus' `le` labels; one
# more bucket (+Inf) catches the rest. Fetch long polls land in the upper ones, as Kafka's
# Fetch TotalTimeMs includes the wait.
LATENCY_BUCKETS_S: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                        1.0, 2.5, 5.0, 10.0, 30.0)
# A v2 batch: batch length (int32) at byte 8 counts from byte 12; record count (int32) at 57.
_LENGTH_AND_COUNT = struct.Struct(">8xi45xi")
_LOG_OVERHEAD = 12
_BATCH_HEADER_BYTES = 61


class Histogram:
    """Fixed-bucket latency histogram: one bisect and three increments per observation."""

    __slots__ = ("counts", "sum_s", "count")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self.sum_s = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        # bisect_left: a value equal to a bound belongs to that bucket (Prometheus' `le`).
        self.counts[bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
        self.sum_s += seconds
        self.count += 1

    def samples(self, labels: dict[str, str]) -> list[Sample]:
        """(suffix, labels, value) for _bucket (cumulative), _sum and _count."""
        out: list[Sample] = []
        running = 0
        for bound, n in zip((*LATENCY_BUCKETS_S, float("inf")), self.counts, strict=True):
            running += n
            le = "+Inf" if bound == float("inf") else repr(bound)
            out.append(("_bucket", labels | {"le": le}, running))
        out.append(("_sum", labels, self.sum_s))
        out.append(("_count", labels, self.count))
        return out


class TopicCounters:
    __slots__ = ("records_in", "bytes_in", "records_out", "bytes_out", "produce_errors")

    def __init__(self) -> None:
        self.records_in = 0
        self.bytes_in = 0
        self.records_out = 0
        self.bytes_out = 0
        self.produce_errors = 0


def batch_record_count(data: bytes | bytearray | memoryview) -> int:
    """Records in the whole v2 batches of a fetch answer (header fields only, no decoding)."""
    total = 0
    pos = 0
    n = len(data)
    unpack = _LENGTH_AND_COUNT.unpack_from
    while n - pos >= _BATCH_HEADER_BYTES:
        length, count = unpack(data, pos)
        size = length + _LOG_OVERHEAD
        if size < _BATCH_HEADER_BYTES or pos + size > n:
            break
        total += count
        pos += size
    return total


class BrokerMetrics:
    """Counters of one broker process since it started."""

    def __init__(self, api_keys: list[int]) -> None:
        self.started_s = time.time()
        self.topics: dict[str, TopicCounters] = {}
        # Only the APIs the broker answers get a histogram: label values stay bounded.
        self.requests: dict[int, Histogram] = {k: Histogram() for k in api_keys}
        self.isr_shrinks = 0
        self.isr_expands = 0
        self.replication_bytes_out = 0

    def topic(self, name: str) -> TopicCounters:
        counters = self.topics.get(name)
        if counters is None:
            counters = self.topics[name] = TopicCounters()
        return counters

    def observe_request(self, api_key: int, seconds: float) -> None:
        histogram = self.requests.get(api_key)
        if histogram is not None:
            histogram.observe(seconds)

    def forget_topics(self, live: set[str]) -> None:
        """Drop counters of deleted topics (keeps the map bounded by the topics that exist)."""
        for name in [t for t in self.topics if t not in live]:
            del self.topics[name]


# ---- views read by the admin HTTP server -------------------------------------------------


def partition_health(broker: Broker) -> dict[str, Any]:
    """What this broker leads and follows, and which of its led partitions lack replicas."""
    led = replicated = 0
    under_replicated: list[dict[str, Any]] = []
    under_min_isr = 0
    for (topic, index), part in broker.partitions.items():
        replicated += 1
        if not part.is_leader:
            continue
        led += 1
        if len(part.isr) < len(part.replicas):
            under_replicated.append({"topic": topic, "partition": index, "replicas": list(part.replicas),
                                     "isr": list(part.isr)})
        if len(part.isr) < int(part.log.config["min.insync.replicas"]):
            under_min_isr += 1
    offline = [{"topic": t.name, "partition": p.partition, "replicas": list(p.replicas)}
               for t, p in broker.image.all_partitions() if p.leader == NO_LEADER]
    return {"partitions_led": led, "partitions_replicated": replicated,
            "under_replicated": sorted(under_replicated, key=lambda p: (p["topic"], p["partition"])),
            "under_min_isr": under_min_isr,
            "offline": sorted(offline, key=lambda p: (p["topic"], p["partition"]))}


def cluster_view(broker: Broker) -> dict[str, Any]:
    """/v1/cluster: this broker's view of its cluster, from its metadata image."""
    image = broker.image
    health = partition_health(broker)
    return {
        "node_id": broker.node_id,
        "cluster_id": broker.cluster_id,
        "ready": broker.ready.is_set(),
        "controller_id": broker.metadata.leader_id,
        "active_controller": broker.metadata.is_active_controller,
        "metadata_offset": image.offset,
        "brokers": [{"node_id": b.broker_id, "host": b.host, "port": b.port, "rack": b.rack, "fenced": b.fenced,
                     "in_controlled_shutdown": b.in_controlled_shutdown}
                    for b in (image.brokers[i] for i in sorted(image.brokers))],
        "topics": len(image.topics_by_name),
        "partitions": sum(len(t.partitions) for t in image.topics_by_name.values()),
        **health,
    }


def prometheus(broker: Broker) -> bytes:
    """/metrics in Prometheus text format."""
    m = broker.metrics
    m.forget_topics(set(broker.image.topics_by_name))
    node = {"node_id": str(broker.node_id), "cluster_id": broker.cluster_id}
    topics = sorted(m.topics.items())

    def per_topic(field: str) -> list[Sample]:
        return [(node | {"topic": name}, float(getattr(c, field))) for name, c in topics]

    latency: list[Sample] = []
    for api_key, histogram in sorted(m.requests.items()):
        if histogram.count:
            latency += histogram.samples(node | {"api": API_NAMES.get(api_key, str(api_key))})
    health = partition_health(broker)
    image = broker.image
    brokers = list(image.brokers.values())
    families: dict[str, tuple[str, str, list[Sample]]] = {
        "dcmirror_broker_records_in_total": ("counter", "Records appended by producers (MessagesInPerSec)",
                                             per_topic("records_in")),
        "dcmirror_broker_bytes_in_total": ("counter", "Record batch bytes appended by producers (BytesInPerSec)",
                                           per_topic("bytes_in")),
        "dcmirror_broker_records_out_total": ("counter", "Records sent to consumers", per_topic("records_out")),
        "dcmirror_broker_bytes_out_total": ("counter", "Record batch bytes sent to consumers (BytesOutPerSec)",
                                            per_topic("bytes_out")),
        "dcmirror_broker_produce_errors_total": ("counter", "Partition appends refused (FailedProduceRequestsPerSec)",
                                                 per_topic("produce_errors")),
        "dcmirror_broker_replication_bytes_out_total": ("counter", "Record batch bytes sent to follower replicas",
                                                        [(node, float(m.replication_bytes_out))]),
        "dcmirror_broker_isr_shrinks_total": ("counter", "Replicas leaving the ISR of a partition this broker leads (by the leader or the controller)",
                                              [(node, float(m.isr_shrinks))]),
        "dcmirror_broker_isr_expands_total": ("counter", "Replicas joining the ISR of a partition this broker leads",
                                              [(node, float(m.isr_expands))]),
        "dcmirror_broker_under_replicated_partitions": ("gauge", "Led partitions whose ISR lacks replicas",
                                                        [(node, float(len(health["under_replicated"])))]),
        "dcmirror_broker_under_min_isr_partitions": ("gauge", "Led partitions whose ISR is below min.insync.replicas",
                                                     [(node, float(health["under_min_isr"]))]),
        "dcmirror_broker_leader_partitions": ("gauge", "Partitions this broker leads (LeaderCount)",
                                              [(node, float(health["partitions_led"]))]),
        "dcmirror_broker_partitions": ("gauge", "Partition replicas on this broker (PartitionCount)",
                                       [(node, float(health["partitions_replicated"]))]),
        "dcmirror_broker_ready": ("gauge", "1 once registered, logs loaded and unfenced",
                                  [(node, 1.0 if broker.ready.is_set() else 0.0)]),
        "dcmirror_broker_uptime_seconds": ("gauge", "Seconds since the broker process started",
                                           [(node, round(time.time() - m.started_s, 3))]),
        "dcmirror_controller_active": ("gauge", "1 on the active controller (ActiveControllerCount)",
                                       [(node, 1.0 if broker.metadata.is_active_controller else 0.0)]),
        "dcmirror_controller_id": ("gauge", "Node id of the quorum leader as this broker sees it (-1: none)",
                                   [(node, float(broker.metadata.leader_id))]),
        "dcmirror_metadata_offset": ("gauge", "Metadata log offset applied through",
                                     [(node, float(image.offset))]),
        "dcmirror_cluster_brokers": ("gauge", "Registered brokers by state (this broker's metadata image)",
                                     [(node | {"state": "active"}, float(sum(not b.fenced for b in brokers))),
                                      (node | {"state": "fenced"}, float(sum(b.fenced for b in brokers)))]),
        "dcmirror_cluster_offline_partitions": ("gauge", "Partitions without a leader (OfflinePartitionsCount)",
                                                [(node, float(len(health["offline"])))]),
    }
    families["dcmirror_broker_request_latency_seconds"] = (
        "histogram", "Time from reading a request to its answer, by API (TotalTimeMs)", latency)
    return prometheus_text(families)


def routes(broker: Broker) -> dict[str, Route]:
    import orjson

    def healthz() -> tuple[int, str, bytes]:
        if broker.ready.is_set():
            return 200, "text/plain", b"ok\n"
        return 503, "text/plain", b"starting: not registered with the controller or logs still loading\n"

    return {
        "/healthz": healthz,
        "/metrics": lambda: ("text/plain; version=0.0.4", prometheus(broker)),
        "/v1/cluster": lambda: ("application/json", orjson.dumps(cluster_view(broker))),
    }
