"""The transaction coordinator's decisions (sans-IO; Kafka's TransactionCoordinator and
TransactionStateManager, KIP-98/KIP-360/KIP-447).

Each call returns a `Decision`: the error to answer with and, usually, a new metadata for
the transactional id that the shell (service.py) must write to `__transaction_state`
(replicated) before it takes effect and before the answer goes out. While such a write is
in flight the id is busy and other calls get CONCURRENT_TRANSACTIONS, as in Kafka. A write
into PrepareCommit/PrepareAbort is followed by transaction markers to every partition of
the transaction; once they are all written, `complete` gives the CompleteCommit /
CompleteAbort write.

State machine (Kafka's):  Empty/Complete* --AddPartitions--> Ongoing --EndTxn--> Prepare*
--markers--> Complete*.  InitProducerId bumps the epoch (fencing zombies); on an Ongoing
transaction it first aborts it under the bumped epoch and answers CONCURRENT_TRANSACTIONS
(the client retries). A transaction older than its timeout is aborted the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from cluster.protocol.errors import ErrorCode
from cluster.transactions.state import MAX_EPOCH, TxnMetadata, TxnState

OFFSETS_TOPIC = "__consumer_offsets"


@dataclass(frozen=True, slots=True)
class TransactionConfig:
    max_timeout_ms: int = 900_000  # transaction.max.timeout.ms
    id_expiration_ms: int = 604_800_000  # transactional.id.expiration.ms


@dataclass(frozen=True, slots=True)
class Decision:
    error: int = ErrorCode.none
    write: TxnMetadata | None = None  # to persist before answering (None: nothing to write)
    remove: bool = False  # write a tombstone instead (expired id)

    @property
    def markers(self) -> bool:
        return self.write is not None and self.write.state.preparing


def _fail(code: int) -> Decision:
    return Decision(code)


class TransactionCoordinator:
    def __init__(self, config: TransactionConfig | None = None) -> None:
        self.config = config or TransactionConfig()
        self.txns: dict[str, TxnMetadata] = {}
        self.busy: set[str] = set()  # ids with a write (or markers) in flight
        # ids whose timeout abort (or expiry) could not be written: not tried again before
        # then (Kafka tries at its next cleanup run, transaction.abort.timed.out.
        # transaction.cleanup.interval.ms later), not in a loop as fast as the write fails
        self.expiry_retry_ms: dict[str, int] = {}

    # ---- ownership --------------------------------------------------------------------

    def load(self, txns: dict[str, TxnMetadata]) -> None:
        self.txns.update(txns)

    def unload(self, ids: list[str]) -> None:
        for txn_id in ids:
            self.txns.pop(txn_id, None)
            self.busy.discard(txn_id)
            self.expiry_retry_ms.pop(txn_id, None)

    def applied(self, meta: TxnMetadata | None, txn_id: str) -> None:
        """A decided write reached the log: it is the state now (None: the id is gone)."""
        self.expiry_retry_ms.pop(txn_id, None)
        if meta is None:
            self.txns.pop(txn_id, None)
        else:
            self.txns[txn_id] = meta

    # ---- InitProducerId ---------------------------------------------------------------

    def needs_producer_id(self, txn_id: str) -> bool:
        meta = self.txns.get(txn_id)
        return meta is None or meta.producer_epoch >= MAX_EPOCH - 1

    def init_producer_id(self, txn_id: str, timeout_ms: int, producer_id: int, producer_epoch: int,
                         fresh_producer_id: int | None, now_ms: int) -> Decision:
        if timeout_ms <= 0 or timeout_ms > self.config.max_timeout_ms:
            return _fail(ErrorCode.invalid_transaction_timeout)
        if txn_id in self.busy:
            return _fail(ErrorCode.concurrent_transactions)
        meta = self.txns.get(txn_id)
        if meta is None:
            assert fresh_producer_id is not None
            return Decision(write=TxnMetadata(txn_id, fresh_producer_id, 0, timeout_ms, TxnState.EMPTY,
                                              update_ms=now_ms))
        expected = producer_id != -1  # KIP-360: the client says which producer it was
        retried = False
        if expected:
            if producer_id != meta.producer_id:
                return _fail(ErrorCode.producer_fenced)
            if producer_epoch != meta.producer_epoch:
                if producer_epoch != meta.last_producer_epoch or not meta.state.idle:
                    return _fail(ErrorCode.producer_fenced)
                retried = True  # a retry of the bump that already happened: answer as it did
        if meta.state.preparing:
            return _fail(ErrorCode.concurrent_transactions)
        if meta.state is TxnState.ONGOING:
            # Abort the open transaction under a bumped epoch (fencing its producer); the
            # client is told to retry and finds the id idle then.
            return Decision(ErrorCode.concurrent_transactions, self._abort_fenced(meta, now_ms))
        if retried:
            bumped = meta
        elif meta.producer_epoch >= MAX_EPOCH - 1:
            assert fresh_producer_id is not None
            bumped = meta.but(producer_id=fresh_producer_id, producer_epoch=0, last_producer_epoch=-1)
        else:
            # As Kafka: only a bump the client asked for with its epoch may be retried with
            # that epoch; a fresh instance's bump fences every earlier epoch for good.
            bumped = meta.but(producer_epoch=meta.producer_epoch + 1,
                              last_producer_epoch=meta.producer_epoch if expected else -1)
        return Decision(write=bumped.but(timeout_ms=timeout_ms, state=TxnState.EMPTY, partitions=frozenset(),
                                         start_ms=-1, update_ms=now_ms))

    def _abort_fenced(self, meta: TxnMetadata, now_ms: int) -> TxnMetadata:
        epoch = min(meta.producer_epoch + 1, MAX_EPOCH)
        return meta.but(producer_epoch=epoch, last_producer_epoch=-1,  # the fenced epoch never comes back
                        state=TxnState.PREPARE_ABORT, update_ms=now_ms)

    # ---- the transaction's partitions ----------------------------------------------------

    def _check_producer(self, txn_id: str, producer_id: int, producer_epoch: int) -> tuple[TxnMetadata | None, int]:
        meta = self.txns.get(txn_id)
        if meta is None or meta.producer_id != producer_id:
            return None, ErrorCode.invalid_producer_id_mapping
        if producer_epoch != meta.producer_epoch:
            return None, ErrorCode.producer_fenced
        if txn_id in self.busy or meta.state.preparing:
            return None, ErrorCode.concurrent_transactions
        return meta, ErrorCode.none

    def add_partitions(self, txn_id: str, producer_id: int, producer_epoch: int,
                       partitions: list[tuple[str, int]], now_ms: int) -> Decision:
        meta, code = self._check_producer(txn_id, producer_id, producer_epoch)
        if meta is None:
            return _fail(code)
        if meta.state is TxnState.ONGOING and meta.partitions.issuperset(partitions):
            return Decision()
        if meta.state not in (TxnState.ONGOING, TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT):
            return _fail(ErrorCode.invalid_txn_state)
        opening = meta.state is not TxnState.ONGOING
        return Decision(write=meta.but(
            state=TxnState.ONGOING,
            partitions=(frozenset() if opening else meta.partitions) | frozenset(partitions),
            start_ms=now_ms if opening else meta.start_ms, update_ms=now_ms))

    def verify(self, txn_id: str, producer_id: int, producer_epoch: int,
               partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """KIP-890 verification for a partition leader about to take a transaction's first
        batch: NONE for each partition of the producer's ongoing transaction, else why not."""
        meta = self.txns.get(txn_id)
        if meta is None or meta.producer_id != producer_id:
            return dict.fromkeys(partitions, ErrorCode.invalid_producer_id_mapping)
        if producer_epoch != meta.producer_epoch:
            return dict.fromkeys(partitions, ErrorCode.producer_fenced)
        ongoing = meta.state is TxnState.ONGOING
        return {tp: ErrorCode.none if ongoing and tp in meta.partitions else ErrorCode.invalid_txn_state
                for tp in partitions}

    def add_offsets(self, txn_id: str, producer_id: int, producer_epoch: int, offsets_partition: int,
                    now_ms: int) -> Decision:
        """The group's `__consumer_offsets` partition joins the transaction (its pending
        offsets become visible with the commit marker)."""
        index = offsets_partition
        return self.add_partitions(txn_id, producer_id, producer_epoch, [(OFFSETS_TOPIC, index)], now_ms)

    def check_txn_offset_commit(self, txn_id: str, producer_id: int, producer_epoch: int) -> int:
        meta = self.txns.get(txn_id)
        if meta is None or meta.producer_id != producer_id:
            return ErrorCode.invalid_producer_id_mapping
        if producer_epoch != meta.producer_epoch:
            return ErrorCode.producer_fenced
        return ErrorCode.none

    # ---- EndTxn -----------------------------------------------------------------------

    def end_txn(self, txn_id: str, producer_id: int, producer_epoch: int, commit: bool, now_ms: int) -> Decision:
        meta = self.txns.get(txn_id)
        if meta is None or meta.producer_id != producer_id:
            return _fail(ErrorCode.invalid_producer_id_mapping)
        if producer_epoch != meta.producer_epoch:
            # A transaction aborted on timeout bumped the epoch: this producer is fenced.
            return _fail(ErrorCode.producer_fenced)
        if txn_id in self.busy:
            return _fail(ErrorCode.concurrent_transactions)
        if meta.state is TxnState.ONGOING:
            target = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
            return Decision(write=meta.but(state=target, update_ms=now_ms))
        if (meta.state is TxnState.COMPLETE_COMMIT and commit) or (meta.state is TxnState.COMPLETE_ABORT and not commit):
            return Decision()  # a retry of an EndTxn that is done
        if meta.state.preparing and (meta.state is TxnState.PREPARE_COMMIT) == commit:
            return _fail(ErrorCode.concurrent_transactions)
        return _fail(ErrorCode.invalid_txn_state)

    def complete(self, txn_id: str, now_ms: int) -> Decision:
        """Every marker of a preparing transaction is written: the Complete* write."""
        meta = self.txns.get(txn_id)
        if meta is None or not meta.state.preparing:
            return Decision()
        done = TxnState.COMPLETE_COMMIT if meta.state is TxnState.PREPARE_COMMIT else TxnState.COMPLETE_ABORT
        # The start time stays until the next InitProducerId (Kafka's prepareComplete keeps
        # txnStartTimestamp): DescribeTransactions of a completed transaction shows it.
        return Decision(write=meta.but(state=done, partitions=frozenset(), update_ms=now_ms))

    def abort(self, txn_id: str, now_ms: int) -> Decision:
        """An operator's abort (or a timeout): fence the producer and abort what is open."""
        meta = self.txns.get(txn_id)
        if meta is None:
            return _fail(ErrorCode.transactional_id_not_found)
        if txn_id in self.busy or meta.state.preparing:
            return _fail(ErrorCode.concurrent_transactions)
        if meta.state is not TxnState.ONGOING:
            return _fail(ErrorCode.invalid_txn_state)
        return Decision(write=self._abort_fenced(meta, now_ms))

    # ---- time -------------------------------------------------------------------------

    def expired(self, now_ms: int) -> list[Decision]:
        """Open transactions past their timeout (aborted, producer fenced) and ids idle
        longer than transactional.id.expiration.ms (removed)."""
        out = []
        for txn_id, meta in self.txns.items():
            if txn_id in self.busy or self.expiry_retry_ms.get(txn_id, now_ms) > now_ms:
                continue
            if meta.state is TxnState.ONGOING and now_ms - meta.start_ms > meta.timeout_ms:
                out.append(Decision(write=self._abort_fenced(meta, now_ms)))
            elif meta.state.idle and now_ms - meta.update_ms > self.config.id_expiration_ms:
                out.append(Decision(write=meta.but(state=TxnState.DEAD, update_ms=now_ms), remove=True))
        return out

    def expiry_failed(self, txn_id: str, retry_at_ms: int) -> None:
        """The write of an `expired` decision for `txn_id` failed: try again at `retry_at_ms`."""
        self.expiry_retry_ms[txn_id] = retry_at_ms

    def next_deadline_ms(self) -> int | None:
        deadlines = [(i, m.start_ms + m.timeout_ms + 1) for i, m in self.txns.items() if m.state is TxnState.ONGOING]
        deadlines += [(i, m.update_ms + self.config.id_expiration_ms + 1) for i, m in self.txns.items() if m.state.idle]
        return min((max(d, self.expiry_retry_ms.get(i, d)) for i, d in deadlines), default=None)

    def preparing(self) -> list[TxnMetadata]:
        """Transactions whose markers are still to be written (after a load)."""
        return [m for m in self.txns.values() if m.state.preparing]
