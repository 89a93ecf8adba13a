"""Claims after a leader change: east and the aggregate with 3 brokers each (RF 3), one
worker. The leader of a source partition and the leader of a target partition are killed
with kill -9 and restarted (leadership moves to another replica); then a new matching topic
(a second worker joining) makes the group rebalance, so the worker claims its partitions
again: it must read the source's offsets and the target's tail at the partitions' new
leaders and mirror on.
Every record, written before and after, ends up in the target exactly once.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.cluster_helpers import metadata, partitions_of
from tests.fault_workload import wait_fully_replicated
from tests.mirror.lab import Flow, MirrorLab, TimedOut, new_topic, write

FLOW = "east-to-aggregate"
PARTITIONS = 3
RF = 3


class Stalled(AssertionError):
    """The mirror did not catch up after the leader changes (claims asking the old leader)."""


def kill_leader(lab: MirrorLab, cluster: str, topic: str, partition: int) -> int:
    victim = partitions_of(metadata(lab.bootstrap(cluster), topic), topic)[partition].leader
    lab[cluster][victim].kill9()
    lab[cluster][victim].restart()
    wait_fully_replicated(lab[cluster], topic, PARTITIONS, RF)
    leader = partitions_of(metadata(lab.bootstrap(cluster), topic), topic)[partition].leader
    assert leader != victim, f"{cluster}/{topic}-{partition}: leadership came back to {victim} at once"
    print(f"{cluster}/{topic}-{partition}: leader {victim} killed and restarted, now led by {leader}", flush=True)
    return victim


@pytest.mark.timeout(300)
def test_claims_after_source_and_target_leader_changes(mirror_lab: Callable[..., MirrorLab]) -> None:
    lab = mirror_lab({"east": 3, "aggregate": 3}, min_insync_replicas=2)
    east = lab.bootstrap("east")
    new_topic(east, "pageviews", PARTITIONS, RF)
    wait_fully_replicated(lab["east"], "pageviews", PARTITIONS, RF)
    write(east, "pageviews", PARTITIONS, 3000, "east")
    lab.write_topology([Flow("east", "aggregate", "pageviews", workers=2, config={"topic.refresh.ms": "1000"})],
                       replication_factor=RF)
    lab.start_worker(FLOW, 0)
    lab.check_exactly_once(FLOW, ["pageviews"], timeout_s=90)
    wait_fully_replicated(lab["aggregate"], "east.pageviews", PARTITIONS, RF)

    kill_leader(lab, "east", "pageviews", 0)
    kill_leader(lab, "aggregate", "east.pageviews", 1)
    write(east, "pageviews", PARTITIONS, 3000, "east", start=3000)
    # A second worker joins: the group rebalances and the first worker claims its share
    # again (range assignor, member ids ordered by client id: w0 gets partitions 0 and 1).
    # (Not a new topic: looking its leaders up would refresh the admin clients' metadata.)
    lab.start_worker(FLOW, 1)
    started = time.monotonic()
    try:
        lab.check_exactly_once(FLOW, ["pageviews"], timeout_s=40)
    except TimedOut as exc:
        failed_claims = [line for line in lab.mirror_log().splitlines() if "claim" in line and "failed" in line]
        raise Stalled(f"not caught up {time.monotonic() - started:.0f} s after the leader changes; "
                      f"{len(failed_claims)} failed claims, the last: {failed_claims[-1:]}\n{str(exc)[:2000]}") from None
