"""Shared pieces of the Spark tests: an aggregate-like cluster (real broker processes),
records with mirror provenance headers, a topology file with a [warehouse], and the
expected view of what a warehouse table must hold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from cluster.client.admin import EARLIEST, LATEST
from cluster.client.sync import SyncAdmin
from mirror.history import topic_id_text
from mirror.provenance import FENCE, mirrored_headers
from tests.harness import REPO

# Clusters of the topologies written here: two sources the "mirror" copied from, and the
# aggregate the warehouse loads.
DATACENTERS = {"east": "dc-east", "west": "dc-west"}


@dataclass(frozen=True)
class Sent:
    """One record produced into the aggregate, with the provenance it carries."""

    topic: str
    partition: int
    offset: int  # in the aggregate (Feed assumes it is the only writer of its topics)
    key: bytes | None
    value: bytes | None
    source_cluster: str | None  # None: no provenance (produced into the aggregate directly)
    source_partition: int
    source_offset: int
    timestamp_ms: int
    source_topic_id: str | None = None  # None: no provenance, or mirrored before topic ids
    source_leader_epoch: int | None = None


def source_topic_id(cluster: str, topic: str) -> str:
    """The topic id (Kafka's text form) Feed gives `topic` in source `cluster`."""
    return topic_id_text(uuid.uuid5(uuid.NAMESPACE_URL, f"dcmirror-test:{cluster}/{topic}"))


def write_topology(path: Path, aggregate_bootstrap: str, warehouse: Path, *, topics: str = ".*",
                   config: dict[str, Any] | None = None, schemas: dict[str, str] | None = None) -> Path:
    lines = []
    for i, (name, dc) in enumerate(DATACENTERS.items()):
        lines += [f"[clusters.{name}]", f'datacenter = "{dc}"', f'brokers = ["127.0.0.1:{9 + i}"]', ""]
    lines += ["[clusters.aggregate]", 'datacenter = "central"', f'brokers = ["{aggregate_bootstrap}"]', "",
              "[warehouse]", 'source = "aggregate"', f'path = "{warehouse}"', f"topics = {json.dumps(topics)}"]
    if config:
        lines.append("config = { " + ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in config.items()) + " }")
    if schemas:
        lines += ["", "[warehouse.schemas]"] + [f"{json.dumps(k)} = {json.dumps(v)}" for k, v in schemas.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def create_topics(bootstrap: str, topics: dict[str, int], configs: dict[str, str] | None = None, *,
                  replication_factor: int = 1) -> None:
    """Create the topics and wait until the metadata shows a leader for every partition."""
    with SyncAdmin(bootstrap) as admin:
        for name, partitions in topics.items():
            admin.create_topic(name, partitions, replication_factor, configs=configs)
        deadline = time.monotonic() + 30
        while True:
            meta = admin.metadata(list(topics))
            ready = {t.name for t in meta.topics if t.error_code == 0 and len(t.partitions) == topics[t.name]
                     and all(p.leader_id >= 0 for p in t.partitions)}
            if ready == set(topics):
                return
            assert time.monotonic() < deadline, f"topics {sorted(set(topics) - ready)} have no leaders after 30 s"
            time.sleep(0.05)


class Feed:
    """Produces mirrored-looking records into the aggregate (with librdkafka) and remembers them.

    Source offsets continue per (source cluster, topic, partition), as a mirror's would. Each
    (source cluster, topic) has one topic id (source_topic_id) and the records the leader
    epoch asked for; `incarnation=False` writes provenance as workers did before topic ids
    and leader epochs.
    """

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.sent: list[Sent] = []
        self._next_source: dict[tuple[str, str, int], int] = {}
        self._next_offset: dict[tuple[str, int], int] = {}

    def produce(self, topic: str, partitions: int, count: int, *, source: str | None = "east",
                value: Callable[[int], bytes] | None = None, timestamp_ms: int | None = None,
                key: Callable[[int], bytes | None] | None = None,
                fence_every: int = 0, leader_epoch: int = 0, incarnation: bool = True) -> list[Sent]:
        """`count` records spread round-robin over the partitions; a fence record after every
        `fence_every` (not data: the load must skip it)."""
        made: list[Sent] = []
        errors: list[object] = []

        def delivered(error: object, _message: object) -> None:
            if error is not None:
                errors.append(error)

        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5, "enable.idempotence": True})
        for i in range(count):
            partition = i % partitions
            key_id = (topic, source or "", partition)
            source_offset = self._next_source.get(key_id, 0)
            if source:
                self._next_source[key_id] = source_offset + 1
            n = len(self.sent) + len(made)
            payload = value(n) if value is not None else f"v-{topic}-{n}".encode()
            record_key = f"k{n % 17}".encode() if key is None else key(n)
            ts = timestamp_ms if timestamp_ms is not None else int(time.time() * 1000)
            topic_id = source_topic_id(source, topic) if source and incarnation else None
            epoch = leader_epoch if source and incarnation else None
            headers = mirrored_headers((), source, partition, source_offset, topic_id,
                                       -1 if epoch is None else epoch) if source else ()
            offset = self._next_offset.get((topic, partition), 0)
            producer.produce(topic, payload, record_key, partition=partition, timestamp=ts, headers=list(headers),
                             on_delivery=delivered)
            made.append(Sent(topic, partition, offset, record_key, payload, source,
                             source_partition=partition if source else partition,
                             source_offset=source_offset if source else offset, timestamp_ms=ts,
                             source_topic_id=topic_id, source_leader_epoch=epoch))
            offset += 1
            if fence_every and (i + 1) % fence_every == 0:
                producer.produce(topic, None, None, partition=partition, headers=[(FENCE, b"")],
                                 on_delivery=delivered)
                offset += 1
            self._next_offset[(topic, partition)] = offset
            producer.poll(0)
        assert producer.flush(60) == 0, f"producing into {topic}: records still undelivered after 60 s"
        assert not errors, f"producing into {topic} failed: {errors[:3]}"
        self.sent += made
        return made


def offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
    """partition -> (log start offset, high watermark)."""
    tps = [(topic, p) for p in range(partitions)]
    with SyncAdmin(bootstrap) as admin:
        starts = admin.list_offsets(tps, EARLIEST)
        ends = admin.list_offsets(tps, LATEST)
    return {p: (starts[(topic, p)], ends[(topic, p)]) for _, p in tps}


EXPECTED_COLUMNS = ("source_dc", "source_cluster", "source_partition", "source_offset", "source_topic_id",
                    "source_leader_epoch", "kafka_partition", "kafka_offset", "key", "value")


def expected_rows(sent: Iterable[Sent], loaded_cluster: str = "aggregate") -> list[tuple[Any, ...]]:
    """The rows (EXPECTED_COLUMNS) a table must hold for `sent`, sorted: records without
    provenance have the loaded cluster as their source, at their own partition and offset,
    with no topic id or leader epoch."""
    rows = []
    for s in sent:
        cluster = s.source_cluster or loaded_cluster
        dc = DATACENTERS.get(cluster, "central" if cluster == loaded_cluster else "unknown")
        rows.append((dc, cluster, s.source_partition, s.source_offset, s.source_topic_id, s.source_leader_epoch,
                     s.partition, s.offset, s.key, s.value))
    return sorted_rows(rows)


def sorted_rows(rows: Iterable[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Rows in one order whatever their NULLs (None sorts first in each column)."""
    return sorted(rows, key=lambda row: tuple((v is not None, v) for v in row))


def run_cli(args: Sequence[str], *, timeout_s: float = 300, env: dict[str, str] | None = None,
            start_new_session: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deploy.cli", "--log-level", "WARNING", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, **(env or {})}, start_new_session=start_new_session)


def sql_json(topology: Path, query: str) -> list[dict[str, Any]]:
    """`dcmirror warehouse sql --json`: the last line of its output, parsed."""
    done = run_cli(["warehouse", "sql", "--config", str(topology), "--json", "--max-rows", "10000000", query])
    assert done.returncode == 0, f"warehouse sql failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    rows: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return rows
