"""A transactional id's state as the transaction coordinator keeps it (Kafka's
TransactionMetadata) and its record in `__transaction_state` (versioned JSON, keyed by the
transactional id so compaction keeps the latest; a None value is a tombstone)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum

import orjson

TRANSACTION_STATE_TOPIC = "__transaction_state"
RECORD_VERSION = 1
MAX_EPOCH = 32767


class TxnState(Enum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    DEAD = "Dead"

    @property
    def preparing(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)

    @property
    def idle(self) -> bool:
        """No transaction open: a new one may begin, the producer id may be re-initialized."""
        return self in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)


@dataclass(frozen=True, slots=True)
class TxnMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    partitions: frozenset[tuple[str, int]] = field(default_factory=frozenset)
    start_ms: int = -1  # when the open transaction began (-1: none)
    update_ms: int = -1
    last_producer_epoch: int = -1  # the epoch before the last bump (KIP-360 retries)

    def but(self, **changes: object) -> TxnMetadata:
        return replace(self, **changes)  # type: ignore[arg-type]


def key(transactional_id: str) -> bytes:
    return orjson.dumps({"v": RECORD_VERSION, "type": "txn", "id": transactional_id})


def value(meta: TxnMetadata) -> bytes:
    return orjson.dumps({
        "producer_id": meta.producer_id, "producer_epoch": meta.producer_epoch,
        "last_producer_epoch": meta.last_producer_epoch, "timeout_ms": meta.timeout_ms, "state": meta.state.value,
        "partitions": sorted([t, p] for t, p in meta.partitions), "start_ms": meta.start_ms,
        "update_ms": meta.update_ms,
    })


def replay(records: list[tuple[bytes | None, bytes | None]]) -> dict[str, TxnMetadata]:
    """Transactional ids rebuilt from (key, value) pairs in log order; the last value wins."""
    latest: dict[str, bytes | None] = {}
    for k, v in records:
        if k is None:
            continue
        try:
            doc = orjson.loads(k)
        except orjson.JSONDecodeError:
            continue
        if isinstance(doc, dict) and doc.get("v") == RECORD_VERSION and doc.get("type") == "txn":
            latest[str(doc["id"])] = v
    out: dict[str, TxnMetadata] = {}
    for txn_id, v in latest.items():
        if v is None:
            continue
        d = orjson.loads(v)
        out[txn_id] = TxnMetadata(
            txn_id, int(d["producer_id"]), int(d["producer_epoch"]), int(d["timeout_ms"]), TxnState(d["state"]),
            frozenset((str(t), int(p)) for t, p in d["partitions"]), int(d["start_ms"]), int(d["update_ms"]),
            int(d.get("last_producer_epoch", -1)))
    return out
