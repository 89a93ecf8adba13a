"""A flow with two workers, each its own process (no supervisor: nothing restarts them), while
records stream into the source: one worker dies, the other takes its partitions.

- kill -9: the survivor gets the partitions once the group coordinator expires the dead
  member's session; it fences the dead worker's producer id, resumes right after the last
  source offset the target partition holds (the group's committed offsets are kept far
  behind on purpose: offset.commit.interval.ms is a minute), and the target ends with every
  source record exactly once, in order.
- SIGTERM (with records in flight: the aggregate broker stalls for 1.5 s around it): the
  worker flushes, leaves the group and exits 0 within seconds, and the survivor takes over
  at once (well before the session timeout), with the same outcome.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable

import pytest

from tests.mirror.lab import (
    Flow,
    MirrorLab,
    SourceWriter,
    compare,
    end_offsets,
    new_topic,
    read_topic,
    wait_for,
)

TOPIC = "pageviews"
PARTITIONS = 6
FLOW = "east-to-aggregate"
RATE_PER_S = 1500.0
RECORDS_MAX = 200_000  # the writer stops AFTER_TAKEOVER_RECORDS after the takeover
AFTER_TAKEOVER_RECORDS = 3000
CLAIM = re.compile(r"(\S+) took (\S+)-(\d+) -> (\S+)-(\d+) \(fence at offset (\d+)(, previous writer (\d+) epoch "
                   r"(\d+) fenced)?\); resuming at source offset (\d+)")


def start(mirror_lab: Callable[..., MirrorLab], session_timeout_ms: int) -> tuple[MirrorLab, SourceWriter]:
    lab = mirror_lab({"east": 1, "aggregate": 1})
    new_topic(lab.bootstrap("east"), TOPIC, PARTITIONS)
    lab.write_topology([Flow("east", "aggregate", TOPIC, workers=2, config={
        "topic.refresh.ms": "1000", "offset.commit.interval.ms": "60000",
        "consumer.session.timeout.ms": str(session_timeout_ms), "consumer.heartbeat.interval.ms": "500"})])
    lab.start_worker(FLOW, 0)
    lab.start_worker(FLOW, 1)
    writer = SourceWriter(lab.bootstrap("east"), TOPIC, PARTITIONS, RECORDS_MAX, "east", rate_per_s=RATE_PER_S).start()

    def both_mirroring() -> bool:
        status = lab.worker_status(FLOW)
        owners = lab.owners(FLOW)
        return (len(owners) == PARTITIONS and set(owners.values()) == {f"{FLOW}-w0", f"{FLOW}-w1"}
                and all(status[w]["records"] > 300 for w in owners.values()))

    wait_for(both_mirroring, 60, "both workers own partitions and mirror records", interval_s=0.5,
             on_timeout=lab.mirror_log_tail)
    return lab, writer


def finish(lab: MirrorLab, writer: SourceWriter) -> tuple[dict[int, list], dict[int, list]]:
    """Writer done, mirror caught up; every source record exactly once in the target."""
    writer.finish()
    ends = end_offsets(lab.bootstrap("east"), TOPIC)
    assert sum(ends.values()) == writer.total
    lab.wait_caught_up({FLOW: {(TOPIC, p): end for p, end in ends.items()}}, timeout_s=90)
    source = read_topic(lab.bootstrap("east"), TOPIC)
    target = read_topic(lab.bootstrap("aggregate"), f"east.{TOPIC}")
    outcome = compare(source, target, "east")
    print(f"source {outcome.source_records} records, target {outcome.mirrored_records} mirrored + "
          f"{outcome.fences} fences", flush=True)
    outcome.assert_clean()
    return source, target


def takeover_claims(lab: MirrorLab, worker: str, partitions: set[int], after_chars: int) -> dict[int, re.Match[str]]:
    """The survivor's last claim line per partition in the mirror log written after `after_chars`."""
    found = {}
    for m in CLAIM.finditer(lab.mirror_log()[after_chars:]):
        if m.group(1) == worker and int(m.group(3)) in partitions:
            found[int(m.group(3))] = m
    return found


def check_resumed_from_target_tail(claims: dict[int, re.Match[str]], target: dict[int, list]) -> None:
    """Each takeover resumed right after the last source offset the target partition held
    before the survivor's fence, and fenced the dead worker's producer id (with an invisible
    transaction marker)."""
    for p, m in claims.items():
        fence_offset, resume = int(m.group(6)), int(m.group(10))
        before = [r for r in target[p] if r.offset < fence_offset and r.mirrored]
        last = int(before[-1].header("dcmirror.source.offset")) if before else -1
        assert resume == last + 1, f"partition {p}: resumed at {resume}, the target held up to {last}"
        assert resume > 0, f"partition {p}: the dead worker had mirrored nothing?"
        assert m.group(7), f"partition {p}: no previous writer fenced: {m.group(0)}"
        # The fence is an ABORT marker: a control batch, which no consumer is given.
        assert not [r for r in target[p] if r.offset == fence_offset], \
            f"partition {p}: a record a consumer reads at the fence's offset {fence_offset}"
        after = [r for r in target[p] if r.offset > fence_offset]
        assert not after or int(after[0].header("dcmirror.source.offset") or b"-1") == resume, \
            f"partition {p}: the first record after the fence is not source offset {resume}"


@pytest.mark.timeout(240)
def test_worker_killed_9_partitions_taken_over_after_session_timeout(
        mirror_lab: Callable[..., MirrorLab]) -> None:
    session_timeout_s = 6.0
    lab, writer = start(mirror_lab, int(session_timeout_s * 1000))
    victim = f"{FLOW}-w1"
    survivor = f"{FLOW}-w0"
    victim_partitions = {p for (_, p), w in lab.owners(FLOW).items() if w == victim}
    mark = len(lab.mirror_log())
    lab.kill_worker(FLOW, 1, signal.SIGKILL)
    killed_at = time.monotonic()
    print(f"kill -9 {victim} (partitions {sorted(victim_partitions)}) after {writer.sent} records sent", flush=True)

    def survivor_owns_all() -> bool:
        doc = lab.worker_status(FLOW)[survivor]
        return len({p["partition"] for p in doc["partitions"]}) == PARTITIONS and \
            len(takeover_claims(lab, survivor, victim_partitions, mark)) == len(victim_partitions)

    wait_for(survivor_owns_all, session_timeout_s + 30, f"{survivor} owns all {PARTITIONS} partitions",
             on_timeout=lab.mirror_log_tail)
    took_s = time.monotonic() - killed_at
    print(f"{survivor} took over after {took_s:.1f} s (session timeout {session_timeout_s} s)", flush=True)
    assert took_s >= session_timeout_s - 1.5, "taken over before the dead member's session could expire"
    assert writer.sent < RECORDS_MAX
    writer.stop_after(AFTER_TAKEOVER_RECORDS)
    _, target = finish(lab, writer)
    assert lab.workers[FLOW, 0].poll() is None, "the survivor exited"
    check_resumed_from_target_tail(takeover_claims(lab, survivor, victim_partitions, mark), target)


class SlowHandover(AssertionError):
    """The SIGTERM'd worker did not leave the group at once (it once flushed a producer whose
    tasks were already cancelled: ~30 s, then no LeaveGroup at all)."""


@pytest.mark.timeout(240)
def test_worker_stopped_with_sigterm_hands_over_at_once(mirror_lab: Callable[..., MirrorLab]) -> None:
    """Exactly once across the handover (a plain failure if not); the handover is prompt:
    the worker exits within 10 s and the survivor owns everything well before the session
    timeout (SlowHandover if not), also when the worker has records in flight
    to a target that answers only a second later."""
    session_timeout_s = 15.0
    lab, writer = start(mirror_lab, int(session_timeout_s * 1000))
    leaver = f"{FLOW}-w1"
    survivor = f"{FLOW}-w0"
    leaver_partitions = {p for (_, p), w in lab.owners(FLOW).items() if w == leaver}
    mark = len(lab.mirror_log())
    # Records in flight when the signal comes (otherwise it depends on timing): the aggregate
    # broker stalls (SIGSTOP) for 1.5 s around the SIGTERM; a prompt handover flushes them once
    # it answers again and leaves the group.
    aggregate = lab["aggregate"][1]
    aggregate.pause()
    try:
        time.sleep(0.5)
        lab.kill_worker(FLOW, 1, signal.SIGTERM)
        stopped_at = time.monotonic()
        time.sleep(1.0)
    finally:
        aggregate.resume()
    print(f"SIGTERM {leaver} (partitions {sorted(leaver_partitions)}) after {writer.sent} records sent, the "
          "aggregate broker stalled from 0.5 s before to 1 s after", flush=True)

    events: dict[str, float] = {}

    def handed_over() -> bool:
        now = time.monotonic() - stopped_at
        if "exited" not in events and lab.workers[FLOW, 1].poll() is not None:
            events["exited"] = now
        doc = lab.worker_status(FLOW)[survivor]
        if "taken" not in events and len({p["partition"] for p in doc["partitions"]}) == PARTITIONS and \
                len(takeover_claims(lab, survivor, leaver_partitions, mark)) == len(leaver_partitions):
            events["taken"] = now
            writer.stop_after(AFTER_TAKEOVER_RECORDS)
        return len(events) == 2

    wait_for(handed_over, session_timeout_s + 60, f"{leaver} exits and {survivor} owns all {PARTITIONS} partitions",
             on_timeout=lambda: f"{events}\n{lab.mirror_log_tail()}")
    rc = lab.workers[FLOW, 1].returncode
    took_s, exited_s = events["taken"], events["exited"]
    print(f"{leaver} exited with {rc} after {exited_s:.1f} s; {survivor} took over after {took_s:.1f} s "
          f"(session timeout {session_timeout_s} s)", flush=True)
    assert rc == 0, lab.mirror_log_tail()
    assert writer.total < RECORDS_MAX
    _, target = finish(lab, writer)
    check_resumed_from_target_tail(takeover_claims(lab, survivor, leaver_partitions, mark), target)
    if took_s > 8 or exited_s > 10:
        raise SlowHandover(f"{survivor} took over {took_s:.1f} s after the SIGTERM (session timeout "
                           f"{session_timeout_s} s); {leaver} had exited by {exited_s:.1f} s")


@pytest.mark.timeout(240)
def test_worker_restarted_under_its_name_takes_its_partitions_back_at_once(
        mirror_lab: Callable[..., MirrorLab]) -> None:
    """Static membership (group.instance.id = the worker's name, KIP-345): a worker killed -9
    and started again under its name gets its own partitions back long before its old session
    (30 s) expires, and the other worker is not disturbed (no rebalance: it claims nothing
    again). A second copy of that worker started beside it fences it: the older exits 78
    saying why, instead of the two taking the partitions from each other in turn; the copy
    goes on, and every source record is in the target exactly once."""
    session_timeout_s = 30.0
    lab, writer = start(mirror_lab, int(session_timeout_s * 1000))
    victim, survivor = f"{FLOW}-w1", f"{FLOW}-w0"
    owners = lab.owners(FLOW)
    victim_partitions = {p for (_, p), w in owners.items() if w == victim}
    survivor_partitions = {p for (_, p), w in owners.items() if w == survivor}
    mark = len(lab.mirror_log())
    lab.kill_worker(FLOW, 1, signal.SIGKILL)
    killed_at = time.monotonic()
    lab.workers[FLOW, 1].wait(30)
    lab.start_worker(FLOW, 1)
    wait_for(lambda: len(takeover_claims(lab, victim, victim_partitions, mark)) == len(victim_partitions),
             session_timeout_s + 60, f"{victim} claims {sorted(victim_partitions)} again", interval_s=0.2,
             on_timeout=lab.mirror_log_tail)
    back_s = time.monotonic() - killed_at
    print(f"kill -9 {victim} after {writer.sent} records sent; started again, it claimed "
          f"{sorted(victim_partitions)} after {back_s:.1f} s (session timeout {session_timeout_s:g} s)", flush=True)
    assert back_s < session_timeout_s, "the restarted worker waited for its old session to expire"
    assert takeover_claims(lab, survivor, victim_partitions | survivor_partitions, mark) == {}, \
        f"{survivor} claimed partitions again: the group rebalanced"

    mark = len(lab.mirror_log())
    older = lab.workers[FLOW, 1]
    copy = lab._spawn(["--flow", FLOW, "--worker", "1"])
    wait_for(lambda: older.poll() is not None, 60, f"the older {victim} exits, fenced by its copy",
             on_timeout=lab.mirror_log_tail)
    lab.workers[FLOW, 1] = copy
    assert older.returncode == 78, lab.mirror_log_tail()
    said = lab.mirror_log()[mark:]
    assert f"worker {victim}: " in said and "group.instance.id" in said and "names are unique per flow" in said
    wait_for(lambda: len(takeover_claims(lab, victim, victim_partitions, mark)) == len(victim_partitions),
             60, f"the copy of {victim} claims {sorted(victim_partitions)}", interval_s=0.2,
             on_timeout=lab.mirror_log_tail)
    assert copy.poll() is None and lab.workers[FLOW, 0].poll() is None
    writer.stop_after(AFTER_TAKEOVER_RECORDS)
    finish(lab, writer)
