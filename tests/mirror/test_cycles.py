"""Flows both ways between two clusters (east -> west and west -> east, default renames, both
with topics = ".*pageviews", so each flow's regex also matches the topics the other flow
writes), and a chain of two flows (east -> aggregate -> dr).

Both ways: after N records into east/pageviews and M into west/pageviews, west holds east's
N once (west/east.pageviews) plus its own M, east holds west's M once plus its own N, no
other topic holds a mirrored record, and once the mirror has settled nothing more arrives:
no new topics, no new records.

A copy coming from the target: with east -> west copying pageviews and west -> east's regex
matching west's copy (east.pageviews), the second flow leaves that topic alone (no
west.east.pageviews in east, no record back in east) and its lag is 0.

A chain: dr/aggregate.east.pageviews holds every record of east exactly once, with the path
"east,aggregate" and the provenance of its copy in the aggregate; the fences the first
flow's workers wrote into the aggregate are not data and must not be copied on, and when
such fences are the last records of a partition (a takeover after the data) the second
flow's lag still reaches 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.mirror.lab import (
    FENCE,
    HEARTBEATS_TOPIC,
    Flow,
    MirrorLab,
    all_end_offsets,
    compare,
    end_offsets,
    new_topic,
    read_topic,
    topics_of,
    wait_for,
    write,
)

PARTITIONS = 3
N_EAST = 3000
M_WEST = 2000
REFRESH_MS = 1000
SETTLE_WINDOW_S = 3 * REFRESH_MS / 1000 + 3.0


class CycleLeak(AssertionError):
    """Something beyond the expected copies appeared (fences copied as data, a chain of
    east.west.east... topics): what the mirror once did."""


def internal(topic: str) -> bool:
    return topic.startswith(("__", "dcmirror.")) or topic == HEARTBEATS_TOPIC


def both_ways(mirror_lab: Callable[..., MirrorLab]) -> MirrorLab:
    """east and west, each with pageviews (N / M records), flows both ways running, and each
    flow checked: its source's pageviews exactly once in the other cluster."""
    lab = mirror_lab({"east": 1, "west": 1})
    for name, count in (("east", N_EAST), ("west", M_WEST)):
        new_topic(lab.bootstrap(name), "pageviews", PARTITIONS)
        write(lab.bootstrap(name), "pageviews", PARTITIONS, count, name)
    config = {"topic.refresh.ms": str(REFRESH_MS)}
    lab.write_topology([Flow("east", "west", ".*pageviews", config=config),
                        Flow("west", "east", ".*pageviews", config=config)])
    lab.start_mirror()
    # Settled by mirrored records, not end offsets (each rebalance adds fences), and by the
    # pageviews partitions' lag.
    for flow in ("east-to-west", "west-to-east"):
        lab.check_exactly_once(flow, ["pageviews"], timeout_s=60, count_mirrored=True, flow_lag=False)
    return lab


def snapshot(lab: MirrorLab) -> dict[str, dict[str, dict[int, int]]]:
    """cluster -> topic -> end offsets, internal topics left out."""
    return {name: all_end_offsets(lab.bootstrap(name), skip=internal) for name in lab.clusters}


@pytest.mark.timeout(240)
def test_flows_both_ways_copy_each_record_once_and_settle(mirror_lab: Callable[..., MirrorLab]) -> None:
    """The two copies are exact (a plain failure if not); beyond them no topic holds a mirrored
    record, and over a window of three topic refreshes (and then some) no topic appears and
    no record arrives (CycleLeak if either)."""
    started = time.monotonic()
    lab = both_ways(mirror_lab)
    print(f"both copies checked after {time.monotonic() - started:.1f} s", flush=True)
    expected = {"east": {"pageviews": (N_EAST, 0), "west.pageviews": (M_WEST, M_WEST)},
                "west": {"pageviews": (M_WEST, 0), "east.pageviews": (N_EAST, N_EAST)}}
    leaks = []
    for name in lab.clusters:
        bootstrap = lab.bootstrap(name)
        others = []
        for topic, ends in all_end_offsets(bootstrap, skip=internal).items():
            if topic in expected[name]:
                rows = [r for records in read_topic(bootstrap, topic).values() for r in records]
                got = (sum(1 for r in rows if not r.fence), sum(1 for r in rows if r.mirrored))
                assert got == expected[name][topic], \
                    f"{name}/{topic}: (records, mirrored) {got}, want {expected[name][topic]}"
            elif sum(ends.values()):
                others.append(topic)
        for topic in others[:3]:  # what they hold (the chain can be long)
            mirrored = [r for records in read_topic(bootstrap, topic).values() for r in records if r.mirrored]
            fences = sum(1 for r in mirrored if r.fence)
            leaks.append(f"{name}/{topic}: {len(mirrored)} mirrored records ({fences} of them copied fences)")
        if others:
            leaks.append(f"{name}: {len(others)} further topics hold records")
    print(f"{time.monotonic() - started:.1f} s: {leaks}", flush=True)

    before = snapshot(lab)
    deadline = time.monotonic() + SETTLE_WINDOW_S
    while time.monotonic() < deadline:
        now = snapshot(lab)
        if now != before:
            new_topics = {c: sorted(set(now[c]) - set(before[c]))[:3] for c in now}
            grown = {c: sorted(t for t in now[c] if t in before[c] and now[c][t] != before[c][t])[:5] for c in now}
            leaks.append(f"after the mirror settled: new topics (e.g.) {new_topics}; topics with new records "
                         f"(e.g.) {grown}")
            break
        time.sleep(0.5)
    if leaks:
        raise CycleLeak("; ".join(leaks[:10]))


@pytest.mark.timeout(240)
def test_a_copy_coming_from_the_target_is_not_mirrored_back(mirror_lab: Callable[..., MirrorLab]) -> None:
    """east -> west copies pageviews; west -> east's regex also matches west's copy
    (east.pageviews), but every record of it passed through east: the flow leaves it alone
    (no east topic west.east.pageviews, nothing assigned) and its lag is 0."""
    lab = mirror_lab({"east": 1, "west": 1})
    east = lab.bootstrap("east")
    new_topic(east, "pageviews", PARTITIONS)
    write(east, "pageviews", PARTITIONS, N_EAST, "east")
    config = {"topic.refresh.ms": str(REFRESH_MS)}
    lab.write_topology([Flow("east", "west", "pageviews", config=config),
                        Flow("west", "east", r"east\.pageviews", config=config)])
    lab.start_mirror()
    lab.check_exactly_once("east-to-west", ["pageviews"], timeout_s=60)

    def settled() -> bool:
        doc = {f["flow"]: f for f in lab.status()}["west-to-east"]
        return bool(doc["live_workers"]) and doc["lag_records"] == 0 and \
            not any(w["partitions"] for w in doc["workers"])

    wait_for(settled, 60, "west-to-east running with nothing to copy and lag 0", interval_s=1.0,
             on_timeout=lab.mirror_log_tail)
    time.sleep(3 * REFRESH_MS / 1000)  # a few topic refreshes: still nothing may appear
    assert "west.east.pageviews" not in topics_of(east)
    data_back = {t: sum(1 for rows in read_topic(east, t).values() for r in rows if r.mirrored and not r.fence)
                 for t in topics_of(east) if not internal(t)}
    assert not any(data_back.values()), f"records came back into east: {data_back}"


@pytest.mark.timeout(240)
def test_chained_flows_copy_records_once_and_not_fences(mirror_lab: Callable[..., MirrorLab]) -> None:
    lab = mirror_lab({"east": 1, "aggregate": 1, "dr": 1})
    east, aggregate, dr = lab.bootstrap("east"), lab.bootstrap("aggregate"), lab.bootstrap("dr")
    new_topic(east, "pageviews", PARTITIONS)
    write(east, "pageviews", PARTITIONS, N_EAST, "east")
    config = {"topic.refresh.ms": str(REFRESH_MS)}
    lab.write_topology([Flow("east", "aggregate", "pageviews", workers=2, config=config),
                        Flow("aggregate", "dr", r"east\.pageviews", config=config)])
    lab.start_mirror()
    first = lab.check_exactly_once("east-to-aggregate", ["pageviews"], timeout_s=60)["pageviews"]
    assert first.fences == 0  # takeovers fence with invisible markers
    ends = end_offsets(aggregate, "east.pageviews")
    lab.wait_caught_up({"aggregate-to-dr": {("east.pageviews", p): end for p, end in ends.items()}}, timeout_s=60)
    source = {p: [r for r in rows if r.mirrored] for p, rows in read_topic(aggregate, "east.pageviews").items()}
    target = read_topic(dr, "aggregate.east.pageviews")
    copied_fences = [(p, r.offset) for p, rows in target.items() for r in rows if r.fence and r.mirrored]
    without = {p: [r for r in rows if not (r.fence and r.mirrored)] for p, rows in target.items()}
    outcome = compare(source, without, "aggregate", path="east,aggregate")
    print(f"dr: {outcome.mirrored_records} records mirrored from the aggregate's {outcome.source_records}, "
          f"{outcome.fences} own fences, {len(copied_fences)} copied fences", flush=True)
    outcome.assert_clean()
    if copied_fences:
        p, offset = copied_fences[0]
        sample = next(r for r in target[p] if r.offset == offset)
        raise CycleLeak(f"{len(copied_fences)} fence records of the aggregate copied into dr as mirrored records "
                        f"({FENCE} and provenance headers), e.g. partition {p}: {sample}")

    # Takeovers in the first flow: new fences (transaction markers, invisible) are now the
    # last offsets of every partition of aggregate/east.pageviews; the second flow's consumer
    # moves past them and the flow counts them done (lag 0). Both workers are killed: each,
    # restarted by the supervisor under its name (a static member), claims its own partitions
    # again without a rebalance of the other.
    before = {p: end for p, end in end_offsets(aggregate, "east.pageviews").items()}
    for index in (0, 1):
        pid = lab.kill_worker("east-to-aggregate", index)
        print(f"kill -9 east-to-aggregate-w{index} (pid {pid})", flush=True)
    wait_for(lambda: all(e > before[p] for p, e in end_offsets(aggregate, "east.pageviews").items()), 60,
             "new fences in every partition of aggregate/east.pageviews", on_timeout=lab.mirror_log_tail)
    tail_fences = read_topic(aggregate, "east.pageviews")
    ends = end_offsets(aggregate, "east.pageviews")
    assert all(rows[-1].offset < ends[p] - 1 and not rows[-1].fence for p, rows in tail_fences.items()), \
        "the partitions do not end in invisible markers"
    lab.wait_caught_up({"aggregate-to-dr": {("east.pageviews", p): end for p, end in ends.items()}}, timeout_s=60)
    assert not [r for rows in read_topic(dr, "aggregate.east.pageviews").values() for r in rows
                if r.fence and r.mirrored], "fences copied into dr"
