"""The share partition's state (cluster/groups/share_partition.py, KIP-932): acquisition,
acknowledgement types, lock timeouts, delivery limits, members leaving, gaps, the in-flight
window, and the durable snapshot; then a seeded model check of the delivery guarantees over
thousands of random schedules (members, acknowledgements, lock timeouts, crashes restored from
the snapshot), each printing its seed on failure."""

from __future__ import annotations

import os
import random

import pytest

from cluster.groups.share_partition import (
    AcknowledgeType,
    AcquiredRecords,
    RecordState,
    SharePartition,
    ShareState,
    StateBatch,
)
from cluster.protocol.errors import ErrorCode
from tests.unit.share_partition_model import ModelSharePartition

A, R, X, G, N = (AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE, AcknowledgeType.REJECT, AcknowledgeType.GAP,
                 AcknowledgeType.RENEW)


def test_records_are_acquired_once_acknowledged_and_the_start_moves_over_settled_ones() -> None:
    sp = SharePartition(10, lock_duration_ms=1_000)
    assert sp.fetch_offset() == 10
    assert sp.acquire("m1", range(10, 15), now_ms=0, max_records=3) == [AcquiredRecords(10, 12, 1)]
    assert sp.acquire("m2", range(10, 15), now_ms=0, max_records=10) == [AcquiredRecords(13, 14, 1)]
    assert sp.acquire("m3", range(10, 15), now_ms=0, max_records=10) == []  # all taken
    assert sp.end_offset == 15 and sp.fetch_offset() == 15
    # Only the holder acknowledges, and all of a call or nothing.
    assert sp.acknowledge("m2", [(10, 10, [A])], now_ms=1) == ErrorCode.invalid_record_state
    assert sp.acknowledge("m1", [(10, 11, [A]), (13, 13, [A])], now_ms=1) == ErrorCode.invalid_record_state
    assert sp.state_of(10) == (RecordState.ACQUIRED, 1)
    assert sp.acknowledge("m1", [(10, 12, [A, X, R])], now_ms=1) == ErrorCode.none
    assert sp.start_offset == 12  # 10 accepted, 11 archived (rejected), 12 released
    assert sp.state_of(12) == (RecordState.AVAILABLE, 1) and sp.fetch_offset() == 12
    assert sp.acquire("m3", range(12, 15), now_ms=2, max_records=10) == [AcquiredRecords(12, 12, 2)]
    assert sp.acknowledge("m1", [(12, 12, [A])], now_ms=3) == ErrorCode.invalid_record_state  # released: gone
    assert sp.acknowledge("m3", [(12, 12, [A])], now_ms=3) == ErrorCode.none
    assert sp.acknowledge("m2", [(13, 14, [A])], now_ms=3) == ErrorCode.none
    assert (sp.start_offset, sp.end_offset, sp.in_flight()) == (15, 15, 0)
    assert sp.acknowledge("m2", [(13, 14, [A])], now_ms=3) == ErrorCode.none  # below the start: settled
    sp.acquire("m1", range(15, 17), now_ms=4, max_records=10)
    assert sp.acknowledge("m1", [(15, 15, [A])], now_ms=5) == ErrorCode.none
    assert sp.acknowledge("m1", [(15, 15, [A])], now_ms=5) == ErrorCode.none  # settled: skipped
    assert sp.acknowledge("m2", [(16, 16, [A])], now_ms=5) == ErrorCode.invalid_record_state


@pytest.mark.parametrize(("batches", "code"), [
    ([(5, 4, [A])], ErrorCode.invalid_request),       # last before first
    ([(0, 2, [A, A])], ErrorCode.invalid_request),    # neither one type nor one per offset
    ([(0, 0, [])], ErrorCode.invalid_request),
    ([(0, 0, [9])], ErrorCode.invalid_request),       # no such type
    ([(0, 10**9, [A])], ErrorCode.invalid_request),   # past the end offset
    ([(3, 3, [A])], ErrorCode.invalid_request),       # past the end offset: never read
    ([(1, 2, [A]), (0, 0, [A])], ErrorCode.invalid_request),  # out of order
    ([(0, 1, [A]), (1, 2, [A])], ErrorCode.invalid_request),  # overlapping
    ([(0, 0, [N])], "renew"),                                 # RENEW without IsRenewAck (or in v1)
])
def test_malformed_acknowledgements_change_nothing(batches: list[tuple[int, int, list[int]]],
                                                  code: ErrorCode | str) -> None:
    sp = SharePartition(0)
    sp.acquire("m", range(3), now_ms=0, max_records=10)
    if code == "renew":
        assert sp.acknowledge("m", batches, now_ms=0, renew_allowed=False) == ErrorCode.invalid_request
    else:
        assert sp.acknowledge("m", batches, now_ms=0) == code
    assert sp.acquired_by("m") == [0, 1, 2]
    assert sp.acknowledge("m", [(0, 2, [A])], now_ms=0) == ErrorCode.none


def test_acknowledgements_below_the_start_offset_are_skipped() -> None:
    """A batch that reaches below the start offset (settled, gone) is taken for the rest."""
    sp = SharePartition(0)
    sp.acquire("m", range(4), now_ms=0, max_records=10)
    assert sp.acknowledge("m", [(0, 1, [A])], now_ms=0) == ErrorCode.none and sp.start_offset == 2
    assert sp.acknowledge("m", [(0, 3, [A, A, X, A])], now_ms=0) == ErrorCode.none
    assert sp.start_offset == 4


def test_locks_time_out_renew_extends_them_and_the_delivery_limit_archives() -> None:
    sp = SharePartition(0, lock_duration_ms=100, delivery_count_limit=2)
    sp.acquire("m1", [0, 1], now_ms=0, max_records=10)
    assert sp.next_lock_deadline_ms() == 100
    assert sp.acknowledge("m1", [(1, 1, [N])], now_ms=60) == ErrorCode.none  # renewed until 160
    assert sp.expire_locks(99) == 0 and sp.expire_locks(100) == 1
    assert sp.state_of(0) == (RecordState.AVAILABLE, 1) and sp.state_of(1) == (RecordState.ACQUIRED, 1)
    assert sp.acknowledge("m1", [(0, 0, [A])], now_ms=101) == ErrorCode.invalid_record_state  # its lock is gone
    assert sp.acquire("m2", [0, 1], now_ms=110, max_records=10) == [AcquiredRecords(0, 0, 2)]
    # The second delivery fails too (timeout): the limit is reached, the record is archived.
    assert sp.expire_locks(210) == 2
    assert sp.state_of(0) is None and sp.start_offset == 1  # archived, the start moved over it
    assert sp.state_of(1) == (RecordState.AVAILABLE, 1)
    assert sp.acquire("m2", [1], now_ms=300, max_records=10) == [AcquiredRecords(1, 1, 2)]
    assert sp.acknowledge("m2", [(1, 1, [R])], now_ms=301) == ErrorCode.none  # released at the limit: archived
    assert (sp.start_offset, sp.next_lock_deadline_ms()) == (2, None)


def test_a_member_that_leaves_releases_what_it_holds() -> None:
    sp = SharePartition(0)
    sp.acquire("m1", range(4), now_ms=0, max_records=2)
    sp.acquire("m2", range(4), now_ms=0, max_records=2)
    assert sp.release_member("m1") == 2 and sp.acquired_by("m2") == [2, 3]
    assert sp.acquire("m3", range(4), now_ms=1, max_records=10) == [AcquiredRecords(0, 1, 2)]


def test_gaps_and_skipped_records_are_archived_without_delivery() -> None:
    """Offsets the log does not hold (compaction) and records not to deliver (transaction
    markers, aborted records under read_committed) are archived as the window passes them."""
    sp = SharePartition(0)
    assert sp.acquire("m", [0, 3, 4, 6], now_ms=0, max_records=10, skipped=[5]) == [
        AcquiredRecords(0, 0, 1), AcquiredRecords(3, 4, 1), AcquiredRecords(6, 6, 1)]
    assert [sp.state_of(o) for o in (1, 2, 5)] == [(RecordState.ARCHIVED, 0)] * 3
    assert sp.acknowledge("m", [(0, 0, [A]), (3, 4, [A, G])], now_ms=1) == ErrorCode.none
    assert sp.start_offset == 6


def test_the_in_flight_window_bounds_acquisition() -> None:
    sp = SharePartition(0, max_in_flight=3)
    assert sp.acquire("m", range(10), now_ms=0, max_records=10) == [AcquiredRecords(0, 2, 1)]
    assert sp.fetch_offset() is None  # full: nothing to read until something settles
    sp.acknowledge("m", [(0, 0, [A])], now_ms=1)
    assert sp.fetch_offset() == 3
    assert sp.acquire("m", range(3, 10), now_ms=1, max_records=10) == [AcquiredRecords(3, 3, 1)]


def test_batch_optimized_acquires_whole_log_batches_and_record_limit_stops_at_max_records() -> None:
    """ShareAcquireMode (ShareFetch v2): batch_optimized (given the log batches' last offsets)
    goes past MaxRecords to the end of the log batch where it was reached; record_limit stops
    at MaxRecords; both stay within the in-flight window."""
    ends = [4, 9, 14]  # log batches [0, 4], [5, 9], [10, 14]
    sp = SharePartition(0)
    assert sp.acquire("m", range(15), now_ms=0, max_records=6, batch_ends=ends) == [AcquiredRecords(0, 9, 1)]
    assert sp.acquire("m", range(10, 15), now_ms=0, max_records=1, batch_ends=ends) == [AcquiredRecords(10, 14, 1)]
    sp = SharePartition(0)
    assert sp.acquire("m", range(15), now_ms=0, max_records=6) == [AcquiredRecords(0, 5, 1)]  # record_limit
    assert sp.acquire("m", range(6, 15), now_ms=0, max_records=0, batch_ends=ends) == []
    sp = SharePartition(0, max_in_flight=7)
    assert sp.acquire("m", range(15), now_ms=0, max_records=6, batch_ends=ends) == [AcquiredRecords(0, 6, 1)]
    # a released record inside a batch: the batch's other records are not AVAILABLE, passed over
    sp = SharePartition(0)
    sp.acquire("m", range(10), now_ms=0, max_records=10)
    assert sp.acknowledge("m", [(2, 2, [R])], now_ms=1) == ErrorCode.none
    assert sp.acquire("n", range(10), now_ms=2, max_records=1, batch_ends=ends) == [AcquiredRecords(2, 2, 2)]


def test_a_config_change_applies_to_what_comes_next() -> None:
    """configure (the group's configs changed while the share partition is loaded): a running
    lock keeps its deadline, the next lock and renew take the new duration; a lowered
    delivery limit archives at the next release, expiry or acquisition; a lowered in-flight
    limit stops acquisition until the window is below it, a raised one lets it go on."""
    sp = SharePartition(0, lock_duration_ms=30_000, delivery_count_limit=5, max_in_flight=100)
    sp.acquire("m", [0], now_ms=0, max_records=1)
    sp.configure(lock_duration_ms=1_000, delivery_count_limit=5, max_in_flight=100)
    assert sp.next_lock_deadline_ms() == 30_000  # the running lock
    sp.acquire("m", [1], now_ms=10, max_records=1)
    assert sp.expire_locks(1_010) == 1 and sp.state_of(1) == (RecordState.AVAILABLE, 1)
    assert sp.acknowledge("m", [(0, 0, [N])], now_ms=2_000) == ErrorCode.none  # renewed: 1 s from now
    assert sp.next_lock_deadline_ms() == 3_000
    # delivered twice under a limit of 5, then the limit becomes 2: released, it is archived
    sp = SharePartition(0, delivery_count_limit=5)
    for now in (0, 1):
        sp.acquire("m", [0, 1], now_ms=now, max_records=2)
        assert sp.acknowledge("m", [(0, 1, [R])], now_ms=now) == ErrorCode.none
    assert sp.state_of(0) == (RecordState.AVAILABLE, 2)
    sp.acquire("m", [0], now_ms=2, max_records=1)  # its third delivery, under the old limit
    sp.configure(lock_duration_ms=100, delivery_count_limit=2, max_in_flight=2_000)
    assert sp.acknowledge("m", [(0, 0, [R])], now_ms=3) == ErrorCode.none
    assert sp.state_of(0) is None  # archived, the start moved over it
    # record 1 waited AVAILABLE with 2 deliveries: the lowered limit archives it when reached
    assert sp.acquire("m", [1, 2], now_ms=4, max_records=2) == [AcquiredRecords(2, 2, 1)]
    assert sp.start_offset == 2
    # the in-flight limit lowered below what is in flight, then raised
    sp = SharePartition(0, max_in_flight=10)
    sp.acquire("m", range(8), now_ms=0, max_records=8)
    sp.configure(lock_duration_ms=100, delivery_count_limit=5, max_in_flight=4)
    assert sp.fetch_offset() is None and sp.acquired_by("m") == list(range(8))  # kept, nothing new
    sp.configure(lock_duration_ms=100, delivery_count_limit=5, max_in_flight=9)
    assert sp.acquire("m", range(8, 20), now_ms=1, max_records=10) == [AcquiredRecords(8, 8, 1)]
    with pytest.raises(ValueError, match="must be positive"):
        sp.configure(lock_duration_ms=0, delivery_count_limit=5, max_in_flight=9)


def test_renew_refused_where_the_group_disables_it() -> None:
    """share.renew.acknowledge.enable=false: a RENEW is INVALID_RECORD_STATE (as Kafka), and
    nothing of the call is applied."""
    sp = SharePartition(0, lock_duration_ms=100)
    sp.acquire("m", [0, 1], now_ms=0, max_records=2)
    assert sp.acknowledge("m", [(0, 0, [A]), (1, 1, [N])], now_ms=50,
                          renew_enabled=False) == ErrorCode.invalid_record_state
    assert sp.acquired_by("m") == [0, 1] and sp.next_lock_deadline_ms() == 100


def test_log_start_moves_and_reset() -> None:
    sp = SharePartition(0)
    sp.acquire("m", range(5), now_ms=0, max_records=10)
    sp.move_log_start(3)
    assert sp.start_offset == 3 and sp.acquired_by("m") == [3, 4]
    sp.move_log_start(8)
    assert (sp.start_offset, sp.end_offset, sp.acquired_by("m")) == (8, 8, [])
    sp.reset(2)
    assert (sp.start_offset, sp.end_offset, sp.state_epoch) == (2, 2, 1)


def test_the_snapshot_keeps_outcomes_and_counts_and_voids_locks() -> None:
    sp = SharePartition(0, delivery_count_limit=3)
    sp.acquire("m", range(6), now_ms=0, max_records=10)
    sp.acknowledge("m", [(1, 1, [A]), (2, 2, [X]), (3, 3, [R])], now_ms=1)
    state = sp.snapshot()
    assert state == ShareState(0, 0, (StateBatch(0, 0, RecordState.AVAILABLE, 1),
                                      StateBatch(1, 1, RecordState.ACKNOWLEDGED, 1),
                                      StateBatch(2, 2, RecordState.ARCHIVED, 1),
                                      StateBatch(3, 5, RecordState.AVAILABLE, 1)))
    back = SharePartition.restore(state, delivery_count_limit=3)
    assert back.acquire("n", range(6), now_ms=5, max_records=10) == [AcquiredRecords(0, 0, 2),
                                                                     AcquiredRecords(3, 5, 2)]
    with pytest.raises(ValueError, match="outside the share partition"):
        SharePartition.restore(ShareState(5, 0, (StateBatch(2, 3, RecordState.ARCHIVED, 1),)))


# ---- the model check ---------------------------------------------------------------------------

SEEDS = int(os.environ.get("DCMIRROR_SHARE_SEEDS", "1000"))
SEED_BASE = int(os.environ.get("DCMIRROR_SHARE_SEED_BASE", "0"))


def run_schedule(seed: int, steps: int = 300) -> None:
    """Random members fetch, acknowledge (every type, good and bad), let locks run out, leave,
    and the partition crashes and is restored from its last durable snapshot; checked after
    every step: no record held by two members, none acknowledged twice, none settled without
    an outcome, delivery counts within the limit; at the end a drain settles every record."""
    rng = random.Random(seed)
    limit = rng.randint(1, 4)
    log_end = rng.randint(5, 60)
    sp = SharePartition(0, lock_duration_ms=rng.choice([5, 50]), delivery_count_limit=limit,
                        max_in_flight=rng.randint(1, 30))
    durable = sp.snapshot()
    holder: dict[int, str] = {}        # what members were told they hold (acquired, lock not run out)
    accepted: set[int] = set()         # acknowledged as accepted (and made durable or not)
    durable_accepted: set[int] = set()
    deliveries: dict[int, int] = {}
    now = 0
    members = ["a", "b", "c"]
    for _ in range(steps):
        now += rng.randint(0, 20)
        sp.expire_locks(now)  # a lock that ran out: the record is no longer held
        for offset in list(holder):
            state = sp.state_of(offset)
            if state is None or state[0] != RecordState.ACQUIRED:
                del holder[offset]
        op = rng.random()
        member = rng.choice(members)
        if op < 0.4:
            start = sp.fetch_offset()
            if start is not None:
                got = sp.acquire(member, range(start, min(log_end, start + rng.randint(1, 10))), now,
                                 rng.randint(1, 8))
                for run in got:
                    for offset in range(run.first_offset, run.last_offset + 1):
                        assert offset not in holder, f"seed {seed}: {offset} given to {member} held by {holder[offset]}"
                        assert offset not in accepted, f"seed {seed}: {offset} delivered again after it was accepted"
                        deliveries[offset] = deliveries.get(offset, 0) + 1
                        assert run.delivery_count == deliveries[offset], f"seed {seed}: delivery count of {offset}"
                        assert run.delivery_count <= limit, f"seed {seed}: {offset} delivered past the limit"
                        holder[offset] = member
        elif op < 0.8:
            mine = [o for o, m in holder.items() if m == member] or list(range(sp.start_offset, sp.end_offset))
            if mine:
                offset = rng.choice(mine)
                kind = rng.choice([A, A, R, X, N])
                code = sp.acknowledge(member, [(offset, offset, [kind])], now)
                if holder.get(offset) == member:
                    assert code == ErrorCode.none, f"seed {seed}: the holder's acknowledgement of {offset}: {code}"
                    if kind != N:
                        del holder[offset]
                    if kind == A:
                        assert offset not in accepted, f"seed {seed}: {offset} accepted twice"
                        accepted.add(offset)
                else:
                    assert code == ErrorCode.invalid_record_state, f"seed {seed}: {member} acknowledged {offset}"
        elif op < 0.88:
            sp.release_member(member)
            holder = {o: m for o, m in holder.items() if m != member}
        elif op < 0.95:
            durable = sp.snapshot()
            durable_accepted = set(accepted)
        else:
            # Crash: what was not made durable is lost, locks are void. Records accepted since
            # the snapshot may be delivered again (at least once), the durable ones never.
            sp = SharePartition.restore(durable, lock_duration_ms=sp.lock_duration_ms,
                                        delivery_count_limit=limit, max_in_flight=sp.max_in_flight)
            holder.clear()
            accepted = set(durable_accepted)
            deliveries = {}
            for batch in durable.batches:
                for offset in range(batch.first_offset, batch.last_offset + 1):
                    deliveries[offset] = batch.delivery_count
        for offset in range(0, sp.start_offset):
            assert offset not in holder, f"seed {seed}: {offset} below the start while held"
    # Drain: every record ends accepted or archived, the start at the log end.
    for _ in range(10 * log_end * (limit + 1)):
        now += 1_000
        sp.expire_locks(now)
        start = sp.fetch_offset()
        if start is None or start >= log_end:
            if sp.start_offset >= log_end:
                break
            continue
        for run in sp.acquire("drain", range(start, log_end), now, 100):
            assert sp.acknowledge("drain", [(run.first_offset, run.last_offset, [A])], now) == ErrorCode.none
            for offset in range(run.first_offset, run.last_offset + 1):
                assert offset not in durable_accepted, f"seed {seed}: {offset} delivered again after it was durable"
    assert sp.start_offset == log_end, f"seed {seed}: drained to {sp.start_offset} of {log_end}"


@pytest.mark.parametrize("chunk", range(4))
def test_delivery_guarantees_hold_over_seeded_schedules(chunk: int) -> None:
    """SEEDS seeds (DCMIRROR_SHARE_SEEDS; a failure names its seed: replay with
    DCMIRROR_SHARE_SEED_BASE=<seed> DCMIRROR_SHARE_SEEDS=4)."""
    per = max(1, SEEDS // 4)
    for seed in range(SEED_BASE + chunk * per, SEED_BASE + (chunk + 1) * per):
        run_schedule(seed)


# ---- the runs against the per-record model --------------------------------------------------

def same_state(sp: SharePartition, model: ModelSharePartition, where: str) -> None:
    """Every answer a reader gets: the window, each offset's state, where the next fetch
    starts, the first lock to run out, the durable snapshot."""
    assert (sp.start_offset, sp.end_offset, sp.state_epoch) == (model.start_offset, model.end_offset,
                                                                model.state_epoch), where
    for offset in range(max(0, sp.start_offset - 2), sp.end_offset + 2):
        assert sp.state_of(offset) == model.state_of(offset), f"{where}: offset {offset}"
    assert sp.fetch_offset() == model.fetch_offset(), where
    assert sp.next_lock_deadline_ms() == model.next_lock_deadline_ms(), where
    assert sp.snapshot() == model.snapshot(), where
    for member in ("a", "b", "c"):
        assert sp.acquired_by(member) == model.acquired_by(member), where


def differential_schedule(seed: int, steps: int = 200) -> None:
    """Random operations, every kind and shape (skipped offsets, batch-optimized limits, gaps,
    acknowledgement batches of one type or one per offset, good and bad, renewals, lowered
    limits, the log start moving, resets, crashes restored from snapshots), applied to the
    run-based share partition and to the per-record model: every answer equal, and every
    state a reader can see after every step."""
    rng = random.Random(seed)
    settings = {"lock_duration_ms": rng.choice([5, 50]), "delivery_count_limit": rng.randint(1, 4),
                "max_in_flight": rng.randint(1, 40)}
    first = rng.randint(0, 5)
    sp, model = SharePartition(first, **settings), ModelSharePartition(first, **settings)
    log_end, now = rng.randint(5, 80), 0
    for step in range(steps):
        where = f"seed {seed} step {step}"
        now += rng.randint(0, 20)
        assert sp.expire_locks(now) == model.expire_locks(now), where
        op, member = rng.random(), rng.choice("abc")
        if op < 0.35:
            start = model.fetch_offset()
            if start is not None:
                hi = min(log_end, start + rng.randint(1, 25))
                offsets = [o for o in range(start, hi) if rng.random() > 0.1]  # compaction holes
                skipped = [o for o in offsets if rng.random() < 0.15]
                ends = sorted({o for o in offsets if rng.random() < 0.3} | ({offsets[-1]} if offsets else set()))
                limit = rng.randint(0, 10)
                kw = {"skipped": skipped, "batch_ends": ends if rng.random() < 0.6 else []}
                assert sp.acquire(member, offsets, now, limit, **kw) == model.acquire(member, offsets, now, limit,
                                                                                      **kw), where
        elif op < 0.7:
            lo = rng.randint(max(0, model.start_offset - 3), model.end_offset + 1)
            batches = []
            for _ in range(rng.randint(1, 3)):
                width = rng.randint(0, 6)
                types = [rng.choice([A, A, A, R, X, G, N, 9])] if rng.random() < 0.6 else \
                    [rng.choice([A, R, X, N]) for _ in range(width + 1)]
                batches.append((lo, lo + width, types))
                lo += width + rng.randint(1, 3)
            renew = rng.random() < 0.8, rng.random() < 0.8
            got = sp.acknowledge(member, batches, now, renew_allowed=renew[0], renew_enabled=renew[1])
            assert got == model.acknowledge(member, batches, now, renew_allowed=renew[0], renew_enabled=renew[1]), \
                f"{where}: {batches}"
        elif op < 0.78:
            assert sp.release_member(member) == model.release_member(member), where
        elif op < 0.84:
            settings = {"lock_duration_ms": rng.choice([5, 50]), "delivery_count_limit": rng.randint(1, 4),
                        "max_in_flight": rng.randint(1, 40)}
            sp.configure(**settings)
            model.configure(**settings)
        elif op < 0.88:
            lso = rng.randint(model.start_offset, model.end_offset + 3)
            sp.move_log_start(lso)
            model.move_log_start(lso)
        elif op < 0.9:
            to = rng.randint(0, log_end)
            sp.reset(to)
            model.reset(to)
        elif op < 0.96:
            log_end += rng.randint(0, 10)
        else:
            kept = model.snapshot()
            assert sp.snapshot() == kept, where
            sp, model = SharePartition.restore(kept, **settings), ModelSharePartition.restore(kept, **settings)
        same_state(sp, model, where)


@pytest.mark.parametrize("chunk", range(4))
def test_runs_answer_as_the_per_record_model(chunk: int) -> None:
    """SEEDS seeds, as the model check above (replay: DCMIRROR_SHARE_SEED_BASE=<seed>
    DCMIRROR_SHARE_SEEDS=4)."""
    per = max(1, SEEDS // 4)
    for seed in range(SEED_BASE + chunk * per, SEED_BASE + (chunk + 1) * per):
        differential_schedule(seed)
