"""Idempotent-producer state of one partition (sans-IO): duplicate and sequence checks.

Per producer id it keeps the epoch and the metadata of the last five batches, as Kafka's
ProducerStateManager does. It is rebuilt from batch headers (recovery, a new leader) and
saved as a snapshot next to the log.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum

import orjson

from cluster.protocol.record_batch import BatchHeader
from cluster.protocol.sentinels import NO_SEQUENCE

NUM_BATCHES_TO_RETAIN = 5
_SEQUENCE_MODULUS = 0x80000000


class SequenceVerdict(Enum):
    APPEND = "append"
    DUPLICATE = "duplicate"
    INVALID_PRODUCER_EPOCH = "invalid_producer_epoch"
    OUT_OF_ORDER_SEQUENCE = "out_of_order_sequence"


@dataclass(slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    base_offset: int
    last_offset_delta: int
    max_timestamp: int


@dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    epoch: int
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN))
    last_timestamp_ms: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE


@dataclass(frozen=True, slots=True)
class Check:
    verdict: SequenceVerdict
    duplicate_of: BatchMetadata | None = None
    message: str = ""


class ProducerStateManager:
    """Sequence bookkeeping for one partition; time comes in as arguments."""

    def __init__(self, producer_id_expiration_ms: int = 86_400_000) -> None:
        self.producers: dict[int, ProducerEntry] = {}
        self.producer_id_expiration_ms = producer_id_expiration_ms

    def check(self, header: BatchHeader) -> Check:
        """Verdict for a batch about to be appended (not yet recorded)."""
        if not header.has_producer_id or header.base_sequence == NO_SEQUENCE:
            return Check(SequenceVerdict.APPEND)
        entry = self.producers.get(header.producer_id)
        if entry is None:
            return Check(SequenceVerdict.APPEND)
        if header.producer_epoch < entry.epoch:
            return Check(
                SequenceVerdict.INVALID_PRODUCER_EPOCH,
                message=f"producer {header.producer_id} epoch {header.producer_epoch} is older than {entry.epoch}",
            )
        if header.producer_epoch > entry.epoch:
            if header.base_sequence != 0:
                return Check(
                    SequenceVerdict.OUT_OF_ORDER_SEQUENCE,
                    message=f"new epoch {header.producer_epoch} must start at sequence 0, got {header.base_sequence}",
                )
            return Check(SequenceVerdict.APPEND)
        for batch in entry.batches:
            if batch.first_seq == header.base_sequence and batch.last_seq == header.last_sequence:
                return Check(SequenceVerdict.DUPLICATE, duplicate_of=batch)
        expected = (entry.last_seq + 1) % _SEQUENCE_MODULUS
        if entry.batches and header.base_sequence != expected:
            return Check(
                SequenceVerdict.OUT_OF_ORDER_SEQUENCE,
                message=f"producer {header.producer_id} sequence {header.base_sequence}, expected {expected}",
            )
        return Check(SequenceVerdict.APPEND)

    def record(self, header: BatchHeader) -> None:
        """Remember an appended batch (its base offset already assigned)."""
        if not header.has_producer_id:
            return
        entry = self.producers.get(header.producer_id)
        if entry is None or header.producer_epoch > entry.epoch:
            entry = ProducerEntry(header.producer_id, header.producer_epoch)
            self.producers[header.producer_id] = entry
        elif header.producer_epoch < entry.epoch:
            return  # an older epoch's batch replayed from the log: the newer state wins
        if header.base_sequence != NO_SEQUENCE:
            entry.batches.append(
                BatchMetadata(
                    header.base_sequence,
                    header.last_sequence,
                    header.base_offset,
                    header.last_offset_delta,
                    header.max_timestamp,
                )
            )
        entry.last_timestamp_ms = max(entry.last_timestamp_ms, header.max_timestamp)

    def remove_expired(self, now_ms: int) -> int:
        """Forget producers idle longer than producer.id.expiration.ms; returns how many."""
        cutoff = now_ms - self.producer_id_expiration_ms
        expired = [pid for pid, e in self.producers.items() if e.last_timestamp_ms < cutoff]
        for pid in expired:
            del self.producers[pid]
        return len(expired)

    # ---- snapshots -------------------------------------------------------------------

    def to_snapshot(self) -> bytes:
        return orjson.dumps(
            {
                "version": 1,
                "producers": [
                    {
                        "producer_id": e.producer_id,
                        "epoch": e.epoch,
                        "last_timestamp_ms": e.last_timestamp_ms,
                        "batches": [
                            [b.first_seq, b.last_seq, b.base_offset, b.last_offset_delta, b.max_timestamp]
                            for b in e.batches
                        ],
                    }
                    for e in self.producers.values()
                ],
            }
        )

    def load_snapshot(self, data: bytes) -> None:
        doc = orjson.loads(data)
        if doc.get("version") != 1:
            raise ValueError(f"unknown producer snapshot version {doc.get('version')!r}")
        self.producers = {}
        for p in doc["producers"]:
            entry = ProducerEntry(int(p["producer_id"]), int(p["epoch"]))
            entry.last_timestamp_ms = int(p["last_timestamp_ms"])
            for b in p["batches"]:
                entry.batches.append(BatchMetadata(*(int(x) for x in b)))
            self.producers[entry.producer_id] = entry
