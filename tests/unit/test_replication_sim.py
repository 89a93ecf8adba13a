"""Seeded simulation of a cluster's replication (tests/replication_sim.py): the real logs,
replica manager, partitions and controller decisions under crashes, machine crashes that
lose unsynced disk tails, network partitions, drops, delays, pauses and leader changes.

`make test` runs a fixed set of seeds (`make_test_seeds()`: every 8th seed below 944, the
first seed of each scenario kind those miss, and the named seeds in REGRESSION_SEEDS, each
of which once found a bug); `DCMIRROR_REPLICATION_SEEDS=<n>` runs every seed below n instead.
Replay one seed: `DCMIRROR_REPLICATION_SEED=<seed> pytest tests/unit/test_replication_sim.py -k replay -s`.
A longer soak: `make soak` (every seed below 944, then DCMIRROR_SOAK_SEEDS new ones, longer runs).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest

from cluster.controller.controller import QuorumController
from cluster.replication import partition as partition_module
from cluster.replication.partition import Partition, Truncation
from cluster.storage.producer_state import Check, ProducerStateManager, SequenceVerdict
from tests.replication_sim import ReplicationSim, SafetyViolation, scenario, window_scenario

SPREAD = 944  # make test ran every seed below this (1,000 before the window tests came)
STRIDE = 8
# Seeds that found bugs (stretch: how much longer they ran): all in the soak, with ELR.
REGRESSION_SEEDS = {
    1000036: 4,  # the "every copy destroyed" excuse: one replica's crash loss hid another's
    1000039: 4,  # a follower's truncation stopped at the first answer (KIP-279; commit 772f52e)
    1000050: 4,  # the excuse keyed destroyed records by offset only (RF 2, min ISR 1)
    1000101: 4,  # records first committed by a deposed leader, committed after the destruction
    1000576: 4,  # a segment a truncation deleted, back after a machine crash: the follower looped
    1000828: 4,  # the checker: a record destroyed, written again by a retry, committed, destroyed again
    1000916: 4,  # the clean shutdown marker's deletion not durable: back after a machine crash, a
    #              follower's truncated tail was trusted beside the leader epoch that replaced it
    1002326: 4,  # a producer snapshot a truncation deleted, back after a crash: a retry acked as a duplicate
}
ALL_BELOW = os.environ.get("DCMIRROR_REPLICATION_SEEDS")  # every seed below it, in place of the fixed set
REPLAY = os.environ.get("DCMIRROR_REPLICATION_SEED")
STRETCH = int(os.environ.get("DCMIRROR_REPLICATION_STRETCH", "1"))  # the soak runs 4x longer
CHUNKS = 8
ROOT = Path(__file__).resolve().parents[2]


def _run(seed: int, stretch: int = 1) -> ReplicationSim:
    config, faults = scenario(seed)
    try:
        return ReplicationSim(seed, config=replace(config, duration_ms=config.duration_ms * stretch),
                              faults=faults).run()
    except SafetyViolation:
        raise
    except Exception as exc:  # anything else is a failure of that seed too: name it
        raise AssertionError(f"seed {seed} (stretch {stretch}): {type(exc).__name__}: {exc}") from exc


@pytest.mark.skipif(REPLAY is None, reason="set DCMIRROR_REPLICATION_SEED to replay one seed")
def test_replay_seed() -> None:
    assert REPLAY is not None
    config, faults = scenario(int(REPLAY))
    print(f"seed {REPLAY}: {config}\n{faults}")
    sim = _run(int(REPLAY), STRETCH)
    print(f"seed {REPLAY}: {sim.stats}, digest {sim.digest}")


def scenario_kind(seed: int) -> tuple[object, ...]:
    """What kind of run scenario(seed) is: the cluster's shape (brokers, replication factor,
    min.insync.replicas, partitions), whether logs flush only on the page cache's writeback,
    whether crashes may be machine crashes, whether the KIP-966 window comes."""
    config, faults = scenario(seed)
    return (config.brokers, config.replication_factor, config.min_insync_replicas, config.partitions,
            config.flush_messages is None, faults.machine_crash > 0, faults.window_at_ms is not None)


@cache
def make_test_seeds() -> tuple[int, ...]:
    """The seeds `make test` runs at stretch 1: a deterministic spread (every STRIDE-th seed
    below SPREAD) and the first seed of each scenario kind below SPREAD that the spread
    misses, so every kind the full range held is still run (232 kinds, 270 seeds)."""
    if ALL_BELOW:
        return tuple(range(int(ALL_BELOW)))
    picked = set(range(0, SPREAD, STRIDE))
    kinds = {scenario_kind(seed) for seed in picked}
    for seed in range(SPREAD):
        kind = scenario_kind(seed)
        if kind not in kinds:
            kinds.add(kind)
            picked.add(seed)
    return tuple(sorted(picked))


@pytest.mark.skipif(bool(ALL_BELOW), reason="DCMIRROR_REPLICATION_SEEDS: every seed below it, not the fixed set")
def test_the_fixed_seeds_cover_every_scenario_kind_of_the_full_range() -> None:
    seeds = make_test_seeds()
    assert {scenario_kind(s) for s in seeds} >= {scenario_kind(s) for s in range(SPREAD)}
    assert set(range(0, SPREAD, STRIDE)) <= set(seeds)
    print(f"{len(seeds)} seeds, {len({scenario_kind(s) for s in seeds})} scenario kinds")


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_simulated_replication_is_safe(chunk: int) -> None:
    """make_test_seeds() across the chunks; every checker runs in each (see the sim's docstring)."""
    totals: Counter[str] = Counter()
    seeds = make_test_seeds()[chunk::CHUNKS]
    for seed in seeds:
        totals.update(_run(seed).stats)
    print(f"chunk {chunk}: {len(seeds)} seeds from {seeds[0]} to {seeds[-1]}: {dict(totals)}")
    # The faults and the traffic really happened (a simulation that injects nothing proves nothing).
    runs = len(seeds)
    for what in ("process_crashes", "machine_crashes", "bytes_lost", "partitions", "pauses", "truncations",
                 "controller_failovers", "clean_restarts", "elections"):
        assert totals[what] > 0, f"chunk {chunk}: no {what} in {runs} runs"
    assert totals["leader_changes"] > 2 * runs and totals["isr_changes_sent"] > 2 * runs
    assert totals["acked_all"] > 10 * runs and totals["consumed"] > 20 * runs


@pytest.mark.parametrize(("seed", "stretch"), REGRESSION_SEEDS.items())
def test_a_seed_that_found_a_bug_stays_safe(seed: int, stretch: int) -> None:
    """Each of REGRESSION_SEEDS at the stretch it failed with, every checker on."""
    print(f"seed {seed} stretch {stretch}: {dict(_run(seed, stretch).stats)}")


def test_a_seed_replays_exactly_whatever_the_hash_seed() -> None:
    """The same seed gives the same run: in this process, and in fresh interpreters with
    different string hashing (nothing may depend on set or dict order of str keys)."""
    digests = {ReplicationSim(11).run().digest, ReplicationSim(11).run().digest}
    code = "from tests.replication_sim import ReplicationSim; print(ReplicationSim(11).run().digest)"
    for hash_seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)})
        digests.add(out.stdout.strip())
    assert len(digests) == 1, digests


# ---- the last replica standing (KIP-966) -----------------------------------------------------

WINDOW_SEED = 1  # window_scenario(1): the window loses acknowledged writes without ELR


def _window(seed: int, *, elr: bool, consumers: bool = True) -> ReplicationSim:
    config, faults = window_scenario(seed)
    return ReplicationSim(seed, config=replace(config, elr=elr, consumers=consumers), faults=faults)


def test_without_elr_the_last_replica_standing_loses_acknowledged_writes() -> None:
    """RF 3, min.insync.replicas=2, acks=all: the followers drop out one by one, the leader,
    alone in the ISR, machine-crashes and loses its unsynced tail, and comes back first. Before
    KIP-966 it stays the last ISR member and leads again: writes the follower that left last
    still held (it left the ISR below min ISR) are gone. The checkers hold every run to Kafka
    4's promise, so this one fails them (no consumer here: its checker would fail first, on
    the records it read)."""
    sim = _window(WINDOW_SEED, elr=False, consumers=False)
    with pytest.raises(SafetyViolation, match=r"acknowledged \(acks=all at \d+ ms\) offsets .* are now"):
        sim.run()
    assert sim.stats["windows"] == 1 and sim.stats["window_losses"] == 1  # acked records left with the crash
    assert sim.stats["destroyed"] == 0  # a copy survived on the follower: no excuse


@pytest.mark.parametrize("consumers", [False, True])
def test_with_elr_the_same_window_loses_nothing(consumers: bool) -> None:
    """The same seed with ELR on: the crashed leader registers without a clean-shutdown
    epoch, leaves the ISR and ELR; the follower in the ELR leads once back, nothing
    acknowledged (or read) is lost."""
    sim = _window(WINDOW_SEED, elr=True, consumers=consumers).run()
    assert sim.stats["windows"] == 1 and sim.stats["window_losses"] == 1 and sim.stats["unclean_returns"] >= 1
    assert sim.stats["destroyed"] == 0 and sim.stats["acked_all"] > 0


def test_the_window_fails_without_elr_in_most_seeds() -> None:
    """Not one lucky seed: a few window seeds, each lost with ELR off unless the leader's
    tail happened to survive the crash (then no acknowledged write was at stake)."""
    failed = 0
    for seed in range(2, 6):
        sim = _window(seed, elr=False, consumers=False)
        try:
            sim.run()
            assert sim.stats["window_losses"] == 0, f"window seed {seed} lost nothing at stake?"
        except SafetyViolation:
            failed += 1
    assert failed >= 2


# ---- planted bugs: each checker must catch what it is there for ---------------------------------


def _first_violation(limit: int = 400, first: int = 0) -> tuple[int, str]:
    """The first seed from `first` on whose run a checker fails. `first`, where a scan from 0
    takes long, is a little below the seed that caught the bug when the test was written
    (it keeps `make test` short; should the runs change, the scan just goes on)."""
    for seed in range(first, first + limit):
        try:
            ReplicationSim(seed).run()
        except SafetyViolation as exc:
            return seed, str(exc)
    raise AssertionError(f"the planted bug went unnoticed in {limit} seeds")


@pytest.fixture
def plant(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[object, str, object], None]]:
    def put(owner: object, name: str, value: object) -> None:
        monkeypatch.setattr(owner, name, value)

    yield put


def test_planted_no_leader_epoch_truncation_is_caught(plant: Callable[[object, str, object], None]) -> None:
    """A follower that never truncates where its log diverged from its leader's keeps
    records the leader does not have: the replicas do not converge, or an ISR member lacks
    what the leader acknowledged."""

    def keep_everything(self: Partition, leader_epoch: int, end_offset: int, now_ms: int) -> Truncation | None:
        assert self.follower is not None
        self.follower.needs_truncation = False
        return None

    plant(Partition, "truncate_to_leader", keep_everything)
    seed, message = _first_violation()
    print(f"caught at seed {seed}: {message}")


def test_planted_truncation_to_the_high_watermark_is_caught(plant: Callable[[object, str, object], None]) -> None:
    """Before KIP-101 a follower cut its log at its high watermark, which may be stale."""

    def cut_at_high_watermark(self: Partition, leader_epoch: int, end_offset: int, now_ms: int) -> Truncation | None:
        assert self.follower is not None
        self.follower.needs_truncation = False
        before = self.log.log_end_offset
        if self.high_watermark >= before:
            return None
        self.log.truncate_to(self.high_watermark, now_ms)
        return Truncation(before, self.log.log_end_offset)

    plant(Partition, "truncate_to_leader", cut_at_high_watermark)
    seed, message = _first_violation(first=60)  # 67 with ELR on (0 before)
    print(f"caught at seed {seed}: {message}")


def test_planted_high_watermark_moving_back_is_caught(plant: Callable[[object, str, object], None]) -> None:
    def follow_the_slowest(self: Partition) -> bool:
        if not self.is_leader or (self.strict_min_isr and self.under_min_isr):
            return False
        leo = self.log.log_end_offset
        ends = [leo if r == self.local_id else self.replica_leo.get(r, 0) for r in self.maximal_isr]
        new = min(ends) if ends else leo
        moved, self.hw = new != self.hw, new  # no "never backwards"
        return moved

    plant(Partition, "_advance_high_watermark", follow_the_slowest)
    seed, message = _first_violation(first=150)  # 157 with ELR on (57 before)
    assert "moved back" in message or "consumer" in message, message
    print(f"caught at seed {seed}: {message}")


def test_planted_high_watermark_over_the_committed_isr_only_is_caught(
        plant: Callable[[object, str, object], None]) -> None:
    """Without the maximal ISR (KIP-497) a leader acknowledges records a replica the
    controller already counts as in sync does not have."""
    plant(Partition, "maximal_isr", property(lambda self: self.isr))
    seed, message = _first_violation()
    print(f"caught at seed {seed}: {message}")


def test_planted_lost_producer_deduplication_is_caught(plant: Callable[[object, str, object], None]) -> None:
    real = ProducerStateManager.check

    def never_a_duplicate(self: ProducerStateManager, header: object) -> Check:
        check = real(self, header)  # type: ignore[arg-type]
        if check.verdict is SequenceVerdict.DUPLICATE:
            return replace(check, verdict=SequenceVerdict.APPEND, duplicate_of=None)
        return check

    plant(ProducerStateManager, "check", never_a_duplicate)
    seed, message = _first_violation()
    assert "idempotent record" in message, message
    print(f"caught at seed {seed}: {message}")


def test_planted_high_watermark_under_min_isr_is_caught(plant: Callable[[object, str, object], None]) -> None:
    """Without strict min ISR (KIP-966) a leader alone in its ISR commits what the replicas
    in the ELR lack: the window's leader does, then crashes."""
    plant(Partition, "under_min_isr", property(lambda self: False))
    with pytest.raises(SafetyViolation, match="below min.insync.replicas|ELR"):
        _window(WINDOW_SEED, elr=True).run()


def test_planted_crash_not_told_from_clean_shutdown_is_caught(plant: Callable[[object, str, object], None]) -> None:
    """A controller that keeps a broker back from an unclean shutdown in the ELR (KAFKA-15586
    undone) elects the window's crashed leader, which lost acknowledged writes."""
    plant(QuorumController, "_forget_unclean", lambda self, broker_id: None)
    with pytest.raises(SafetyViolation, match="not the replicas KIP-966 keeps eligible"):
        _window(WINDOW_SEED, elr=True).run()


def test_the_checkers_see_this_module_s_partition_code() -> None:
    """The planted bugs patch the classes the simulation runs (not copies)."""
    assert ReplicationSim.__module__ == "tests.replication_sim"
    assert partition_module.Partition is Partition


@pytest.mark.soak
@pytest.mark.timeout(0)
def test_soak_every_seed_of_the_make_test_range() -> None:
    """Every seed below SPREAD at stretch 1 (make test runs make_test_seeds() of them)."""
    totals: Counter[str] = Counter()
    for seed in range(SPREAD):
        totals.update(_run(seed).stats)
    print(dict(totals))


@pytest.mark.soak
@pytest.mark.timeout(0)
def test_soak() -> None:
    """Many more seeds, each run four times longer (make soak; DCMIRROR_SOAK_SEEDS, default
    20,000). A failure replays with DCMIRROR_REPLICATION_SEED=<seed> DCMIRROR_REPLICATION_STRETCH=4."""
    seeds = int(os.environ.get("DCMIRROR_SOAK_SEEDS", "20000"))
    first = int(os.environ.get("DCMIRROR_SOAK_FIRST", "1000000"))
    totals: Counter[str] = Counter()
    for seed in range(first, first + seeds):
        try:
            totals.update(_run(seed, 4).stats)
        except SafetyViolation as exc:
            raise SafetyViolation(f"{exc} (stretch 4)") from exc
    print(dict(totals))
