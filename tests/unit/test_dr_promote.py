"""mirror/core/disaster_recovery.py's `promote` driven against two scripted clusters, for
defects the mirror simulation found (tests/mirror_sim.py):

- soak seed 706596315 (stretch 3): a promotion the east datacenter's loss cut short, then a
  failover, left east's topic marked as a copy of dr's while it held records of its own;
  promote read no ledger, took that marker for a failback, made dr's topic a copy of east's
  and waited for a copy whose histories differ (both partitions FAILED, never settled);
- seed 663 (of SEEDS, once promote asked for the ledger): promote read the old primary's log
  end, then its last stable offset; a transaction's commit marker came in between, so the
  LSO read was above the end read, "nothing open", and the copy was promoted without the
  marker (the transaction's acknowledged records lost, the copy no longer byte-identical);
- read before the mark, a copy's end read after its (still writable) primary's may have
  passed it: promote skipped the topic as "a copy of an earlier topic of that name".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from mirror.core import disaster_recovery as dr
from tests.mirror_sim import FLOW

TOPIC = "orders"


class Clusters:
    """One topic of one partition on each side: its marker, log end and last stable offset."""

    def __init__(self, ledger: dict[str, dr.LedgerEntry] | None = None) -> None:
        self.ledger = ledger or {}
        self.marker: dict[str, str | None] = {"source": None, "target": f"{FLOW.source}:{TOPIC}"}
        self.end = {"source": 10, "target": 10}
        self.stable = {"source": 10, "target": 10}
        self.reads_since_mark = 0
        self.on_read: Callable[[Clusters, str], None] = lambda clusters, side: None
        self.log: list[str] = []

    def answer(self, r: dr.Request) -> Any:
        if isinstance(r, dr.ReadLedger):
            return dict(self.ledger)
        if isinstance(r, dr.ListTopics):
            return {TOPIC: 1}
        if isinstance(r, dr.GetMarker):
            return self.marker[r.side]
        if isinstance(r, dr.SetMarker):
            self.marker[r.side] = r.marker
            self.log.append(f"{r.side} marker {r.marker} at ends {self.end}")
            return None
        if isinstance(r, dr.GetEnds):
            self.on_read(self, r.side)
            return {0: self.stable[r.side] if r.committed else self.end[r.side]}
        if isinstance(r, dr.GetOpenTxns):
            return []
        if isinstance(r, dr.GetConfigs):
            return {}
        if isinstance(r, dr.Sleep):  # the forward direction copies meanwhile
            self.end["target"] = self.stable["target"] = self.end["source"]
            return None
        if isinstance(r, dr.Now):
            return 0
        if isinstance(r, dr.Say):
            return None
        raise AssertionError(f"not scripted: {r}")

    def run(self) -> dr.Outcome:
        step = dr.promote(FLOW, "east-dc", timeout_s=30)
        answer: Any = None
        while True:
            try:
                request = step.send(answer)
            except StopIteration as done:
                outcome: dr.Outcome = done.value
                return outcome
            answer = self.answer(request)


def test_promote_refuses_a_topic_failed_over_whatever_the_old_sources_marker_says() -> None:
    entry = dr.LedgerEntry(FLOW.name, FLOW.source, TOPIC, TOPIC, dr.FAILED_OVER, "f1", 0,
                           {0: dr.LedgerPartition(8, 8)})
    clusters = Clusters({TOPIC: entry})
    # A promotion marked east's topic a copy of dr's, east was lost, a failover promoted dr.
    clusters.marker = {"source": f"{FLOW.target}:{TOPIC}", "target": None}
    clusters.end = {"source": 12, "target": 20}  # east holds offsets 8..11 of its own
    with pytest.raises(dr.FailoverError, match="failback"):
        clusters.run()
    assert clusters.marker == {"source": f"{FLOW.target}:{TOPIC}", "target": None}, clusters.log


def test_promote_after_a_failback_still_runs_the_reverse_way() -> None:
    entry = dr.LedgerEntry(FLOW.name, FLOW.source, TOPIC, TOPIC, dr.FAILED_BACK, "f1", 0,
                           {0: dr.LedgerPartition(8, 8)}, failed_back_ms=1)
    clusters = Clusters({TOPIC: entry})
    clusters.marker = {"source": f"{FLOW.target}:{TOPIC}", "target": None}
    clusters.end, clusters.stable = {"source": 20, "target": 20}, {"source": 20, "target": 20}
    assert clusters.run().primary == FLOW.source
    assert clusters.marker == {"source": None, "target": f"{FLOW.source}:{TOPIC}"}


def test_promote_waits_for_a_commit_marker_written_between_its_reads() -> None:
    clusters = Clusters()
    clusters.stable["source"] = 8  # a transaction open from offset 8; its commit is answered

    def commit_marker(c: Clusters, side: str) -> None:
        # East, read-only since the mark, writes the commit marker as it is read the second time.
        if side == "source" and c.marker["source"] is not None:
            c.reads_since_mark += 1
            if c.reads_since_mark == 2:
                c.end["source"] = c.stable["source"] = 11

    clusters.on_read = commit_marker
    clusters.run()
    assert clusters.end == {"source": 11, "target": 11}
    assert clusters.log[-1] == "target marker None at ends {'source': 11, 'target': 11}", clusters.log


def test_promote_takes_no_copy_that_passed_the_primary_between_its_reads_for_an_old_one() -> None:
    clusters = Clusters()

    def producers_and_worker(c: Clusters, side: str) -> None:
        # East is still writable before the mark: a record comes in and is copied at once.
        if c.marker["source"] is None:
            c.end["source"] = c.stable["source"] = c.end["target"] = c.stable["target"] = c.end["source"] + 1

    clusters.on_read = producers_and_worker
    outcome = clusters.run()
    assert outcome.primary == FLOW.target and not outcome.skipped
