"""The sans-IO transaction coordinator (cluster/transactions/coordinator.py): its timers.
Every call takes the time as an argument; nothing sleeps."""

from __future__ import annotations

from cluster.transactions.coordinator import TransactionCoordinator
from cluster.transactions.state import TxnMetadata, TxnState

TIMEOUT_MS = 10_000
CLEANUP_MS = 10_000  # transaction.abort.timed.out.transaction.cleanup.interval.ms


def ongoing(c: TransactionCoordinator, txn_id: str, start_ms: int) -> None:
    c.load({txn_id: TxnMetadata(txn_id, 7, 1, TIMEOUT_MS, TxnState.ONGOING, frozenset({("t", 0)}),
                                start_ms=start_ms, update_ms=start_ms)})


def test_a_timed_out_transaction_whose_abort_fails_waits_for_the_next_cleanup() -> None:
    """The abort of a timed-out transaction cannot be written (its __transaction_state
    partition below min.insync.replicas, say): it is tried again a cleanup interval later,
    not at once. The trio shell asked again at once (next_deadline_ms in the past), and a
    broker of the Kafka Streams fault test spun on it, logging the abort hundreds of times
    a second and missing its heartbeats."""
    c = TransactionCoordinator()
    ongoing(c, "app", start_ms=0)
    assert c.next_deadline_ms() == TIMEOUT_MS + 1
    (decision,) = c.expired(TIMEOUT_MS + 1)
    assert decision.write is not None and decision.write.state is TxnState.PREPARE_ABORT
    assert decision.write.producer_epoch == 2  # the timed-out producer is fenced
    c.expiry_failed("app", TIMEOUT_MS + 1 + CLEANUP_MS)
    assert c.expired(TIMEOUT_MS + 2) == [] and c.expired(TIMEOUT_MS + CLEANUP_MS) == []
    assert c.next_deadline_ms() == TIMEOUT_MS + 1 + CLEANUP_MS
    (again,) = c.expired(TIMEOUT_MS + 1 + CLEANUP_MS)
    c.applied(again.write, "app")  # written this time
    assert c.txns["app"].state is TxnState.PREPARE_ABORT and c.expiry_retry_ms == {}


def test_other_transactions_time_out_on_time_beside_a_failing_one() -> None:
    c = TransactionCoordinator()
    ongoing(c, "stuck", start_ms=0)
    ongoing(c, "next", start_ms=5_000)
    (stuck,) = c.expired(TIMEOUT_MS + 1)
    assert stuck.write is not None and stuck.write.transactional_id == "stuck"
    c.expiry_failed("stuck", TIMEOUT_MS + 1 + CLEANUP_MS)
    assert c.next_deadline_ms() == 5_000 + TIMEOUT_MS + 1
    assert [d.write.transactional_id for d in c.expired(5_000 + TIMEOUT_MS + 1) if d.write] == ["next"]
    c.unload(["stuck"])  # the partition moved: its new coordinator decides
    assert c.expiry_retry_ms == {}
