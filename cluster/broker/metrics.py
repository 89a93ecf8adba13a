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
from typing import Any

import orjson
import trio

from cluster.broker.metadata_cache import MetadataCache
from cluster.broker.quotas import ClientQuotas
from cluster.broker.security import BrokerSecurity
from cluster.common.admin_http import Route, Sample, prometheus_text
from cluster.common.clock import Clock
from cluster.protocol.api_keys import api_name
from cluster.protocol.sentinels import NO_LEADER
from cluster.replication.replica_manager import ReplicaManager

# Upper bounds (seconds) of the request latency buckets, as Prometheus' `le` labels; one
# more bucket (+Inf) catches the rest. Fetch long polls land in the upper ones, as Kafka's
# Fetch TotalTimeMs includes the wait.
LATENCY_BUCKETS_S: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                        1.0, 2.5, 5.0, 10.0, 30.0)
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


class RequestMetrics:
    """Request latencies per API since the process started (Kafka's TotalTimeMs)."""

    def __init__(self, api_keys: list[int], started_ms: int) -> None:
        self.started_ms = started_ms
        # Only the APIs the broker answers get a histogram: label values stay bounded.
        self.requests: dict[int, Histogram] = {k: Histogram() for k in api_keys}

    def observe_request(self, api_key: int, seconds: float) -> None:
        histogram = self.requests.get(api_key)
        if histogram is not None:
            histogram.observe(seconds)


# ---- views read by the admin HTTP server -------------------------------------------------


class BrokerMetrics:
    """What the admin HTTP server shows of one broker: its counters and its state."""

    def __init__(self, replicas: ReplicaManager, cache: MetadataCache, requests: RequestMetrics,
                 ready: trio.Event, clock: Clock, security: BrokerSecurity | None = None,
                 quotas: ClientQuotas | None = None) -> None:
        self.clock = clock
        self.quotas = quotas
        self.security = security
        self.replicas = replicas
        self.cache = cache
        self.requests = requests
        self.ready = ready

    def partition_health(self) -> dict[str, Any]:
        """What this broker leads and follows, and which of its led partitions lack replicas."""
        led = replicated = 0
        under_replicated: list[dict[str, Any]] = []
        under_min_isr = 0
        for (topic, index), part in self.replicas.partitions.items():
            replicated += 1
            if not part.is_leader:
                continue
            led += 1
            if len(part.isr) < len(part.replicas):
                under_replicated.append({"topic": topic, "partition": index, "replicas": list(part.replicas),
                                         "isr": list(part.isr)})
            if len(part.isr) < part.min_insync_replicas:
                under_min_isr += 1
        offline = [{"topic": t.name, "partition": p.partition, "replicas": list(p.replicas)}
                   for t, p in self.cache.image.all_partitions() if p.leader == NO_LEADER]
        return {"partitions_led": led, "partitions_replicated": replicated,
                "under_replicated": sorted(under_replicated, key=lambda p: (p["topic"], p["partition"])),
                "under_min_isr": under_min_isr,
                "offline": sorted(offline, key=lambda p: (p["topic"], p["partition"]))}

    def cluster_view(self) -> dict[str, Any]:
        """/v1/cluster: this broker's view of its cluster, from its metadata image."""
        image = self.cache.image
        metadata = self.cache.metadata
        health = self.partition_health()
        return {
            "node_id": self.cache.node_id,
            "cluster_id": self.cache.cluster_id,
            "ready": self.ready.is_set(),
            "controller_id": metadata.leader_id,
            "active_controller": metadata.is_active_controller,
            "metadata_offset": image.offset,
            "brokers": [{"node_id": b.broker_id, "host": b.host, "port": b.port, "rack": b.rack, "fenced": b.fenced,
                         "in_controlled_shutdown": b.in_controlled_shutdown}
                        for b in (image.brokers[i] for i in sorted(image.brokers))],
            "topics": len(image.topics_by_name),
            "partitions": sum(len(t.partitions) for t in image.topics_by_name.values()),
            **health,
        }

    def prometheus(self) -> bytes:
        """/metrics in Prometheus text format."""
        m = self.replicas.metrics
        image = self.cache.image
        metadata = self.cache.metadata
        m.forget_topics(set(image.topics_by_name))
        node = {"node_id": str(self.cache.node_id), "cluster_id": self.cache.cluster_id}
        topics = sorted(m.topics.items())

        def per_topic(field: str) -> list[Sample]:
            return [(node | {"topic": name}, float(getattr(c, field))) for name, c in topics]

        latency: list[Sample] = []
        for api_key, histogram in sorted(self.requests.requests.items()):
            if histogram.count:
                latency += histogram.samples(node | {"api": api_name(api_key)})
        health = self.partition_health()
        brokers = list(image.brokers.values())
        sessions = self.replicas.fetch_sessions
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
            "dcmirror_broker_fetch_sessions": ("gauge", "Incremental fetch sessions cached, of followers and consumers "
                                               "(NumIncrementalFetchSessions)", [(node, float(len(sessions)))]),
            "dcmirror_broker_fetch_session_partitions": ("gauge", "Partitions held in fetch sessions "
                                                         "(NumIncrementalFetchPartitionsCached)",
                                                         [(node, float(sessions.partitions_cached))]),
            "dcmirror_broker_fetch_session_evictions_total": ("counter", "Fetch sessions evicted to make room for "
                                                              "new ones (IncrementalFetchSessionEvictionsPerSec)",
                                                              [(node, float(sessions.evictions))]),
            "dcmirror_broker_fetch_requests_total": ("counter", "Fetch requests by fetcher (consumer, follower) and "
                                                     "session (none, full, incremental)",
                                                     [(node | {"fetcher": f, "session": k}, float(n))
                                                      for (f, k), n in sorted(m.fetch_requests.items())]),
            "dcmirror_broker_fetch_partitions_listed_total": ("counter", "Partitions named in fetch requests, by "
                                                              "fetcher and session",
                                                              [(node | {"fetcher": f, "session": k}, float(n))
                                                               for (f, k), n in
                                                               sorted(m.fetch_partitions_listed.items())]),
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
                                      [(node, 1.0 if self.ready.is_set() else 0.0)]),
            "dcmirror_broker_uptime_seconds": ("gauge", "Seconds since the broker process started",
                                               [(node, round((self.clock.now_ms() - self.requests.started_ms) / 1000, 3))]),
            "dcmirror_controller_active": ("gauge", "1 on the active controller (ActiveControllerCount)",
                                           [(node, 1.0 if metadata.is_active_controller else 0.0)]),
            "dcmirror_controller_id": ("gauge", "Node id of the quorum leader as this broker sees it (-1: none)",
                                       [(node, float(metadata.leader_id))]),
            "dcmirror_metadata_offset": ("gauge", "Metadata log offset applied through",
                                         [(node, float(image.offset))]),
            "dcmirror_cluster_brokers": ("gauge", "Registered brokers by state (this broker's metadata image)",
                                         [(node | {"state": "active"}, float(sum(not b.fenced for b in brokers))),
                                          (node | {"state": "fenced"}, float(sum(b.fenced for b in brokers)))]),
            "dcmirror_cluster_offline_partitions": ("gauge", "Partitions without a leader (OfflinePartitionsCount)",
                                                    [(node, float(len(health["offline"])))]),
        }
        if self.security is not None:
            sec = self.security
            families["dcmirror_broker_failed_authentication_total"] = (
                "counter", "Failed SASL logins (failed-authentication-total)", [(node, float(sec.failed_authentications))])
            families["dcmirror_broker_successful_authentication_total"] = (
                "counter", "Successful SASL logins (successful-authentication-total)",
                [(node, float(sec.successful_authentications))])
            families["dcmirror_broker_failed_tls_handshakes_total"] = (
                "counter", "TLS handshakes that failed (bad, expired or missing certificates, not TLS at all)",
                [(node, float(sec.failed_tls_handshakes))])
        if self.quotas is not None:
            managers = self.quotas.managers()
            families["dcmirror_broker_throttle_time_seconds_total"] = (
                "counter", "Time clients were throttled for by client quotas, by quota type (throttle-time)",
                [(node | {"quota_type": m.quota_type}, m.stats.throttle_time_ms / 1000) for m in managers])
            families["dcmirror_broker_throttled_responses_total"] = (
                "counter", "Answers that carried a throttle time, by quota type",
                [(node | {"quota_type": m.quota_type}, float(m.stats.throttled)) for m in managers])
        families["dcmirror_broker_request_latency_seconds"] = (
            "histogram", "Time from reading a request to its answer, by API (TotalTimeMs)", latency)
        return prometheus_text(families)

    def routes(self) -> dict[str, Route]:
        def healthz() -> tuple[int, str, bytes]:
            if self.ready.is_set():
                return 200, "text/plain", b"ok\n"
            return 503, "text/plain", b"starting: not registered with the controller or logs still loading\n"

        return {
            "/healthz": healthz,
            "/metrics": lambda: ("text/plain; version=0.0.4", self.prometheus()),
            "/v1/cluster": lambda: ("application/json", orjson.dumps(self.cluster_view())),
        }
