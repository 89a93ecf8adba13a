"""Counters of the data path, bumped by the replica manager and read by the admin HTTP
server (cluster/broker/metrics.py). The hot path only increments integers."""

from __future__ import annotations


class TopicCounters:
    __slots__ = ("records_in", "bytes_in", "records_out", "bytes_out", "produce_errors")

    def __init__(self) -> None:
        self.records_in = 0
        self.bytes_in = 0
        self.records_out = 0
        self.bytes_out = 0
        self.produce_errors = 0


class ReplicationMetrics:
    """Per-topic traffic and ISR changes of one broker since it started (Kafka's
    BrokerTopicMetrics, IsrShrinksPerSec, IsrExpandsPerSec)."""

    def __init__(self) -> None:
        self.topics: dict[str, TopicCounters] = {}
        self.isr_shrinks = 0
        self.isr_expands = 0
        self.replication_bytes_out = 0
        # Fetch requests and the partitions they listed, by (fetcher, session): fetcher
        # "consumer" or "follower", session "none", "full" or "incremental" (KIP-227).
        self.fetch_requests: dict[tuple[str, str], int] = {}
        self.fetch_partitions_listed: dict[tuple[str, str], int] = {}

    def fetch_request(self, fetcher: str, session: str, partitions_listed: int) -> None:
        key = (fetcher, session)
        self.fetch_requests[key] = self.fetch_requests.get(key, 0) + 1
        self.fetch_partitions_listed[key] = self.fetch_partitions_listed.get(key, 0) + partitions_listed

    def topic(self, name: str) -> TopicCounters:
        counters = self.topics.get(name)
        if counters is None:
            counters = self.topics[name] = TopicCounters()
        return counters

    def forget_topics(self, live: set[str]) -> None:
        """Drop counters of deleted topics (keeps the map bounded by the topics that exist)."""
        for name in [t for t in self.topics if t not in live]:
            del self.topics[name]
