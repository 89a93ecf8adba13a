"""Idempotent and transactional producer state of one partition (sans-IO).

Per producer id it keeps the epoch and the metadata of the last five batches, as Kafka's
ProducerStateManager does, for duplicate and sequence checks; and the transactions open on
the partition (producer id → first offset), which hold the last stable offset back until
their marker is replicated. It is rebuilt from batch headers (recovery, a new leader) and
saved as a snapshot next to the log.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum

import orjson

from cluster.protocol.record_batch import BatchHeader
from cluster.protocol.sentinels import NO_SEQUENCE
from cluster.storage.txn_index import Marker

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
    coordinator_epoch: int = -1  # of the last transaction marker (DescribeProducers), -1 before one

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction whose marker was just recorded: its data spans [first_offset, last_offset]."""

    producer_id: int
    first_offset: int
    last_offset: int  # the marker's offset
    aborted: bool


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
        self.ongoing: dict[int, int] = {}  # producer id → first offset of its open transaction
        # KIP-890: producer id → the guard of a transaction start being verified with the
        # coordinator; a marker (the transaction ended meanwhile) takes it away.
        self.verifying: dict[int, object] = {}
        # Ended transactions whose marker may not be replicated yet: still unstable.
        self.unreplicated: list[CompletedTxn] = []
        # A promoted mirror topic: producer ids of the source cluster kept only for their open
        # transaction; forgotten with the marker that ends it (docs/design.md, "Mirror topics
        # keep offsets"), so no producer of this cluster ever meets their sequences.
        self.carried: set[int] = set()

    def check_marker(self, producer_id: int, producer_epoch: int) -> str | None:
        """Why a transaction marker of this producer epoch must be refused (None: fine)."""
        entry = self.producers.get(producer_id)
        if entry is not None and producer_epoch < entry.epoch:
            return f"marker of producer {producer_id} epoch {producer_epoch} is older than {entry.epoch}"
        return None

    def first_unstable_offset(self, high_watermark: int) -> int | None:
        """The first offset of a transaction still open, or ended with its marker at or
        above `high_watermark`; None when everything below the high watermark is stable."""
        if not self.ongoing and not self.unreplicated:
            return None  # every partition without transactions (the fetch path asks each time)
        firsts = [*self.ongoing.values(), *(t.first_offset for t in self.unreplicated if t.last_offset >= high_watermark)]
        return min(firsts) if firsts else None

    def on_high_watermark(self, high_watermark: int) -> None:
        """Forget ended transactions whose marker is replicated (leaders and followers alike,
        so the list stays as short as the unreplicated tail of the log)."""
        if self.unreplicated and self.unreplicated[0].last_offset < high_watermark:
            self.unreplicated = [t for t in self.unreplicated if t.last_offset >= high_watermark]

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

    def record(self, header: BatchHeader, marker: Marker | None = None) -> CompletedTxn | None:
        """Remember an appended batch (its base offset already assigned). For a control
        batch, `marker` is its marker; the transaction it ends is returned."""
        if not header.has_producer_id:
            return None
        pid = header.producer_id
        completed = None
        self.verifying.pop(pid, None)  # ended (a marker), or ongoing now: either way verified no more
        if header.is_control:
            first = self.ongoing.pop(pid, None)
            if first is not None and marker is not None:
                completed = CompletedTxn(pid, first, header.base_offset, aborted=marker.kind == 0)
                self.unreplicated.append(completed)
        elif header.is_transactional and pid not in self.ongoing:
            self.ongoing[pid] = header.base_offset
        entry = self.producers.get(pid)
        if entry is None or header.producer_epoch > entry.epoch:
            entry = ProducerEntry(pid, header.producer_epoch)
            self.producers[pid] = entry
        elif header.producer_epoch < entry.epoch:
            return completed  # an older epoch's batch replayed from the log: the newer state wins
        if header.is_control and marker is not None:
            entry.coordinator_epoch = marker.coordinator_epoch
        if header.is_control and pid in self.carried and pid not in self.ongoing:
            # A source producer's transaction ended in the promoted mirror: nothing of it is
            # needed any more, and its id may be one this cluster hands out.
            self.carried.discard(pid)
            del self.producers[pid]
            return completed
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
        return completed

    def promote(self) -> tuple[int, list[int]]:
        """A mirror topic became an ordinary one: every producer of the source cluster is
        forgotten (its ids are no ids of this cluster) but those with an open transaction,
        which the last stable offset needs until their marker: they are carried, forgotten
        by the marker that ends the transaction. Returns (how many were forgotten, the
        carried producer ids)."""
        gone = [pid for pid in self.producers if pid not in self.ongoing]
        for pid in gone:
            del self.producers[pid]
        self.carried = set(self.ongoing)
        return len(gone), sorted(self.carried)

    def carried_open(self) -> list[ProducerEntry]:
        """Carried source producers whose transaction is still open (their coordinator is in
        another cluster: nobody here will end them but the leader)."""
        return [self.producers[pid] for pid in sorted(self.carried) if pid in self.ongoing and pid in self.producers]

    def remove_expired(self, now_ms: int) -> int:
        """Forget producers idle longer than producer.id.expiration.ms; returns how many."""
        cutoff = now_ms - self.producer_id_expiration_ms
        expired = [pid for pid, e in self.producers.items()
                   if e.last_timestamp_ms < cutoff and pid not in self.ongoing]
        for pid in expired:
            del self.producers[pid]
        return len(expired)

    # ---- snapshots -------------------------------------------------------------------

    def to_snapshot(self, log_tail: tuple[int, int, int] | None = None) -> bytes:
        """The state as a snapshot file's bytes; `log_tail` is the log's last batch when taken
        (base offset, leader epoch, CRC), for the loader to tell another history's snapshot."""
        return orjson.dumps(
            {
                "version": 3,
                "log_tail": list(log_tail) if log_tail is not None else None,
                "ongoing": [[pid, first] for pid, first in self.ongoing.items()],
                "carried": sorted(self.carried),
                "producers": [
                    {
                        "producer_id": e.producer_id,
                        "epoch": e.epoch,
                        "last_timestamp_ms": e.last_timestamp_ms,
                        "coordinator_epoch": e.coordinator_epoch,
                        "batches": [
                            [b.first_seq, b.last_seq, b.base_offset, b.last_offset_delta, b.max_timestamp]
                            for b in e.batches
                        ],
                    }
                    for e in self.producers.values()
                ],
            }
        )

    def load_snapshot(self, data: bytes) -> tuple[int, int, int] | None:
        """Load a snapshot; returns the log tail it was taken after (None: not recorded, or
        an empty log)."""
        doc = orjson.loads(data)
        if doc.get("version") not in (1, 2, 3):
            raise ValueError(f"unknown producer snapshot version {doc.get('version')!r}")
        self.producers = {}
        self.ongoing = {int(pid): int(first) for pid, first in doc.get("ongoing", [])}
        self.unreplicated = []
        self.carried = {int(pid) for pid in doc.get("carried", [])}  # absent before version 3
        for p in doc["producers"]:
            entry = ProducerEntry(int(p["producer_id"]), int(p["epoch"]))
            entry.last_timestamp_ms = int(p["last_timestamp_ms"])
            entry.coordinator_epoch = int(p.get("coordinator_epoch", -1))  # absent in older snapshots
            for b in p["batches"]:
                entry.batches.append(BatchMetadata(*(int(x) for x in b)))
            self.producers[entry.producer_id] = entry
        tail = doc.get("log_tail")  # absent in snapshots written before it was recorded
        return (int(tail[0]), int(tail[1]), int(tail[2])) if tail else None
