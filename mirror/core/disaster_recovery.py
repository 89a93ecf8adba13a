"""Promote, fail over and fail back a flow of mirror topics, sans-IO (docs/design.md,
"Failover and failback").

Each procedure is a generator: it yields a request (`ListTopics`, `SetMarker`, `Sleep`, ...),
and whoever drives it sends back the answer, or throws `Retriable` into it when the cluster
could not be asked. `mirror/failover.py` answers with real clients under trio; the
simulation (`tests/mirror_sim.py`) answers from simulated clusters, with other actors moving
between two requests, and may stop a procedure at any request and run it again later, as an
operator whose command was killed would. So every procedure is written to be run again:
what it did is read back from the clusters and from the failover ledger, never assumed.

Which side is the primary is kept in the clusters: the copy is the topic carrying
`mirror.source = "<cluster>:<topic>"`. The failover ledger (the compacted topic
`dcmirror.failovers` of the flow's target, one entry per target topic) keeps, per partition,
where the copy ended at the failover, its last stable offset then (transactions the source
left open and the failover aborted begin there), and how far the source was known to be;
the failback reads it to find every record the old primary acknowledged that the new one
does not hold: those it took after the copy's end, and those of transactions it committed
after the copy had their records but not their commit marker.
"""

from __future__ import annotations

import uuid
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from mirror.core.topic_copy import (
    CONFIG_EXCLUDES,
    MIRROR_SOURCE_CONFIG,
    fence,
    fenced_topic,
    mirror_source_value,
)
from topology.model import MirrorSpec

LEDGER_TOPIC = "dcmirror.failovers"
DIVERGED_PREFIX = "dcmirror.diverged."
INTERNAL_PREFIXES = ("__", "dcmirror.")
# Headers of a record kept aside at failback: where the old primary had it.
DIVERGED_CLUSTER = "dcmirror.diverged.cluster"
DIVERGED_TOPIC = "dcmirror.diverged.topic"
DIVERGED_OFFSET = "dcmirror.diverged.offset"
DIVERGED_FAILOVER = "dcmirror.diverged.failover"  # which failover it diverged at (ledger's failover_id)
POLL_S = 0.5

Side = Literal["source", "target"]  # the flow's source and target clusters
OTHER: dict[str, Side] = {"source": "target", "target": "source"}


class FailoverError(Exception):
    """A promotion, failover or failback that cannot go on; the message says why and what to do."""


class Retriable(Exception):
    """Thrown into a procedure by its driver: the request could not be answered this time
    (a cluster unreachable, a leader moving); the message says what happened."""


# ---- requests --------------------------------------------------------------------------


@dataclass(frozen=True)
class OpenTxn:
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    first_offset: int


@dataclass(frozen=True)
class Rec:
    """A committed record as read back (failback's diverged copy)."""

    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp_ms: int = -1

    def header(self, name: str) -> bytes | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None


@dataclass(frozen=True)
class ListTopics:
    """-> {topic: partition count} of the side's topics (not those in error)."""

    side: Side


@dataclass(frozen=True)
class GetMarker:
    """-> the topic's own `mirror.source` (None: an ordinary topic, or no such topic)."""

    side: Side
    topic: str


@dataclass(frozen=True)
class SetMarker:
    """Set (a copy, read-only) or delete (None: writable, the primary) the topic's mirror.source."""

    side: Side
    topic: str
    marker: str | None


@dataclass(frozen=True)
class GetEnds:
    """-> {partition: log end} (`committed`: the last stable offset) for partitions 0..n-1."""

    side: Side
    topic: str
    partitions: int
    committed: bool = False


@dataclass(frozen=True)
class GetOpenTxns:
    """-> the transactions open on the partition (DescribeProducers)."""

    side: Side
    topic: str
    partition: int


@dataclass(frozen=True)
class AbortTxn:
    """Write an ABORT marker for the open transaction (as `kafka-transactions abort`)."""

    side: Side
    topic: str
    partition: int
    txn: OpenTxn


@dataclass(frozen=True)
class EndTxns:
    """End these open transactions through their coordinator, which fences their producer
    (a transaction preparing to commit commits, one still open aborts, and its producer's
    later commit is refused: never answered and then lost); one that no coordinator has in
    progress on this partition (hanging, as kafka-transactions find-hanging says: a producer
    id no transactional id of the cluster has, or one whose transaction there is not open on
    this partition, such as a mirror topic's copy of another cluster's transaction whose
    marker the copy never got: producer ids collide across clusters) gets an ABORT marker."""

    side: Side
    topic: str
    partition: int
    txns: tuple[OpenTxn, ...]


@dataclass(frozen=True)
class GetConfigs:
    """-> the topic's own configs (DescribeConfigs source DYNAMIC_TOPIC_CONFIG)."""

    side: Side
    topic: str


@dataclass(frozen=True)
class AlterConfigs:
    side: Side
    topic: str
    set: tuple[tuple[str, str], ...]
    delete: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeleteTopic:
    side: Side
    topic: str


@dataclass(frozen=True)
class CreateTopic:
    """Create the topic (already there: nothing), with these configs."""

    side: Side
    topic: str
    partitions: int
    configs: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ReadLedger:
    """-> {target topic: LedgerEntry} of the flow, the last entry of each."""


@dataclass(frozen=True)
class WriteLedger:
    entry: LedgerEntry


@dataclass(frozen=True)
class ReadRecords:
    """-> the committed records of the partition in [start, end) (read_committed: from the
    log start when it is above `start`, to the last stable offset when it is below `end`)."""

    side: Side
    topic: str
    partition: int
    start: int
    end: int


@dataclass(frozen=True)
class Produce:
    """Write records (acks=all, idempotent) into the side's topic, creating it first with
    `partitions` partitions if it does not exist."""

    side: Side
    topic: str
    partitions: int
    records: tuple[tuple[int, Rec], ...]


@dataclass(frozen=True)
class Reachable:
    """-> whether the side answers now (a short, bounded try)."""

    side: Side


@dataclass(frozen=True)
class Now:
    """-> wall-clock milliseconds."""


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Say:
    """Progress for the operator."""

    text: str


Request = (ListTopics | GetMarker | SetMarker | GetEnds | GetOpenTxns | AbortTxn | EndTxns | GetConfigs | AlterConfigs
           | DeleteTopic | CreateTopic | ReadLedger | WriteLedger | ReadRecords | Produce | Reachable | Now | Sleep
           | Say)
Step = Generator[Request, Any, Any]


# ---- the ledger --------------------------------------------------------------------------

# A topic's entry moves through these (a command stopped midway goes on from its state):
# failover writes FAILING_OVER before it promotes the copy, FAILED_OVER after; failback
# FAILING_BACK once the old primary's topic is read-only, RECREATING once what it had alone
# is aside (its topic is then deleted and created again as a copy), FAILED_BACK at the end.
FAILING_OVER, FAILED_OVER = "failing-over", "failed-over"
FAILING_BACK, RECREATING, FAILED_BACK = "failing-back", "recreating", "failed-back"
UNFINISHED_FAILBACK = (FAILING_BACK, RECREATING)


@dataclass
class LedgerPartition:
    end_offset: int  # the copy's log end at the failover: the next offset the source had not copied
    stable_offset: int  # the copy's last stable offset then: open source transactions begin there
    source_known_end: int = -1  # the source's high watermark as last seen (-1: unknown)
    source_known_at_ms: int = -1  # when it was seen
    aborted: list[tuple[int, int]] = field(default_factory=list)  # (producer id, first offset) aborted
    diverged_records: int = 0  # kept aside at failback


@dataclass
class LedgerEntry:
    """A flow's last failover of one topic, and how far its failback got."""

    flow: str
    source: str
    source_topic: str
    target_topic: str
    state: str
    failover_id: str
    failed_over_ms: int
    partitions: dict[int, LedgerPartition]
    side_topic: str = ""
    failed_back_ms: int = -1  # when the failback ended (-1: not failed back)

    def key(self) -> bytes:
        return ledger_key(self.flow, self.target_topic)

    def as_json(self) -> dict[str, Any]:
        return {"flow": self.flow, "source": self.source, "source_topic": self.source_topic,
                "target_topic": self.target_topic, "state": self.state, "failover_id": self.failover_id,
                "failed_over_ms": self.failed_over_ms, "side_topic": self.side_topic,
                "failed_back_ms": self.failed_back_ms,
                "partitions": {str(p): {"end_offset": v.end_offset, "stable_offset": v.stable_offset,
                                        "source_known_end": v.source_known_end,
                                        "source_known_at_ms": v.source_known_at_ms,
                                        "aborted": [list(a) for a in v.aborted],
                                        "diverged_records": v.diverged_records}
                               for p, v in sorted(self.partitions.items())}}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> LedgerEntry:
        """Also the first ledger's documents (no state: failed over; stable = end)."""
        parts = {}
        for p, v in doc["partitions"].items():
            end = int(v["end_offset"])
            parts[int(p)] = LedgerPartition(end, int(v.get("stable_offset", end)), int(v.get("source_known_end", -1)),
                                            int(v.get("source_known_at_ms", -1)),
                                            [(int(a), int(b)) for a, b in v.get("aborted", [])],
                                            int(v.get("diverged_records", 0)))
        return cls(str(doc["flow"]), str(doc["source"]), str(doc["source_topic"]), str(doc["target_topic"]),
                   str(doc.get("state", FAILED_OVER)), str(doc.get("failover_id", "")),
                   int(doc.get("failed_over_ms", -1)), parts, str(doc.get("side_topic", "")),
                   int(doc.get("failed_back_ms", -1)))


def ledger_key(flow: str, target_topic: str) -> bytes:
    return f"{flow}/{target_topic}".encode()


# ---- reports -----------------------------------------------------------------------------


@dataclass
class KnownEnd:
    """The source's high watermark of a partition as a worker last saw it, and when."""

    high_watermark: int
    seen_ms: int


@dataclass
class PartitionReport:
    topic: str
    partition: int
    end_offset: int  # the copy's end: the next offset of the new primary's partition
    source_known_end: int = -1  # the old primary's high watermark as last seen (-1: unknown)
    source_known_at_ms: int = -1
    source_known_age_s: float | None = None  # how old that view was at the failover
    aborted_transactions: int = 0
    diverged_records: int = 0

    @property
    def rpo_records_at_least(self) -> int | None:
        """Offsets (records and transaction markers) the source was known to hold beyond the
        copy: a lower bound, since the source may have taken more after it was last seen."""
        return None if self.source_known_end < 0 else max(0, self.source_known_end - self.end_offset)


@dataclass
class Outcome:
    action: str
    flow: str
    primary: str  # the cluster whose topics are writable afterwards
    topics: dict[str, list[PartitionReport]] = field(default_factory=dict)
    side_topics: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # topic -> why it was left alone
    source_reachable: bool | None = None  # failover: whether the source answered

    def as_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "action": self.action, "flow": self.flow, "primary": self.primary, "side_topics": self.side_topics,
            "skipped": self.skipped,
            "topics": {t: [_report_json(p, self.action) for p in ps] for t, ps in self.topics.items()}}
        if self.action == "failover":
            doc["source_reachable"] = self.source_reachable
        return doc

    def lines(self) -> list[str]:
        out = [f"{self.action} of flow {self.flow}: {self.primary} is the primary"]
        for topic, why in sorted(self.skipped.items()):
            out.append(f"  {topic}: skipped: {why}")
        for topic, parts in sorted(self.topics.items()):
            for p in parts:
                text = f"  {topic}-{p.partition}: copy ends at offset {p.end_offset}"
                if self.action == "failover":
                    text += "; " + rpo_text(p, self.source_reachable is True)
                    if p.aborted_transactions:
                        text += f"; {p.aborted_transactions} open transaction(s) aborted"
                if self.action == "failback" and p.diverged_records:
                    text += f"; {p.diverged_records} record(s) the old source has that the copy does not " \
                            f"-> {self.side_topics.get(topic, '?')}"
                out.append(text)
        return out


def rpo_text(p: PartitionReport, source_reachable: bool) -> str:
    at_least = p.rpo_records_at_least
    if at_least is None:
        return ("RPO unknown: no worker reported the source's high watermark" +
                ("" if source_reachable else " and the source is unreachable"))
    age = f"{p.source_known_age_s:.1f} s" if p.source_known_age_s is not None else "an unknown time"
    if source_reachable:
        return (f"RPO at least {at_least} record(s): the source answered the failover with high watermark "
                f"{p.source_known_end}; it still takes writes until a failback makes it a copy (they are kept aside)")
    return (f"RPO at least {at_least} record(s): the source's high watermark was {p.source_known_end} when last "
            f"seen, {age} before the failover; unknown beyond this (the source is unreachable)")


def _report_json(p: PartitionReport, action: str) -> dict[str, Any]:
    doc: dict[str, Any] = {"topic": p.topic, "partition": p.partition, "end_offset": p.end_offset,
                           "aborted_transactions": p.aborted_transactions, "diverged_records": p.diverged_records}
    if action == "failover":
        doc.update(source_known_end=p.source_known_end, source_known_at_ms=p.source_known_at_ms,
                   source_known_age_s=p.source_known_age_s, rpo_records_at_least=p.rpo_records_at_least,
                   rpo_exact=False)
    return doc


# ---- which side is the copy --------------------------------------------------------------


@dataclass
class TopicSides:
    """One topic of the flow on both sides, and which one is the copy."""

    source_topic: str  # the name in the flow's source cluster
    target_topic: str  # the name in the flow's target cluster
    source_marker: str | None = None  # mirror.source of the source's topic
    target_marker: str | None = None
    partitions: int = 0  # the target topic's partition count (0: no target topic)
    source_partitions: int = 0  # the source topic's (0: none, or the source was not asked)
    source_deleted: bool = False  # the target's topic is a copy of a source topic that is gone
    ledger_state: str = ""  # the failover ledger's state of the topic ("": none, or not read)

    def direction(self, flow: MirrorSpec) -> str:
        """forward (the target copies the source), reverse (failed back: the source copies
        the target), promoting (both are copies), primary-target (failed over), fenced (a
        failover or failback under way holds a side still) or none."""
        forward = self.target_marker == mirror_source_value(flow.source, self.source_topic)
        reverse = self.source_marker == mirror_source_value(flow.target, self.target_topic)
        if fenced_topic(self.target_marker) is not None or fenced_topic(self.source_marker) is not None:
            return "fenced"
        if self.target_marker is None and self.partitions and self.ledger_state in (FAILED_OVER, *UNFINISHED_FAILBACK):
            # Failed over and not failed back: whatever the old source's topic says (a
            # promotion the failover cut short left it marked as a copy), it holds records of
            # its own until a failback keeps them aside.
            return "primary-target"
        if forward and reverse:
            return "promoting"
        if forward:
            return "forward"
        if reverse:
            return "reverse"
        return "primary-target" if self.target_marker is None and self.partitions else "none"


def flow_topics(flow: MirrorSpec, source_datacenter: str, *, source: bool,
                ledger: Mapping[str, LedgerEntry] | None = None) -> Step:
    """-> [TopicSides] of the flow as the reachable sides name them. `source`: the source is
    asked (its matching topics, and the target's copies of source topics that are gone);
    else the target's mirror topics of the source. `ledger`: also the topics a failover or a
    failback of the flow left unfinished."""
    found: dict[str, TopicSides] = {}
    source_counts: dict[str, int] = {}
    if source:
        source_counts = yield ListTopics("source")
        for name, count in source_counts.items():
            if not name.startswith(INTERNAL_PREFIXES) and flow.matches(name):
                found[name] = TopicSides(name, flow.target_topic(name, source_datacenter), source_partitions=count)
    counts: dict[str, int] = yield ListTopics("target")
    for name in sorted(counts):
        if name.startswith(INTERNAL_PREFIXES):
            continue
        marker = yield GetMarker("target", name)
        held = fenced_topic(marker)
        if held is not None and flow.matches(held) and flow.target_topic(held, source_datacenter) == name:
            # Held still by a failover that has not promoted it yet.
            found.setdefault(held, TopicSides(held, name, target_marker=marker))
        elif marker is not None and marker.startswith(f"{flow.source}:"):
            source_topic = marker.split(":", 1)[1]
            if source_topic not in found:
                found[source_topic] = TopicSides(source_topic, name, target_marker=marker,
                                                 source_deleted=source and source_topic not in source_counts)
    for entry in (ledger or {}).values():
        if entry.target_topic in counts and entry.source_topic not in found:
            found[entry.source_topic] = TopicSides(entry.source_topic, entry.target_topic)
    for sides in found.values():
        found_entry = (ledger or {}).get(sides.target_topic)
        sides.ledger_state = found_entry.state if found_entry is not None and \
            found_entry.source_topic == sides.source_topic else ""
        sides.partitions = counts.get(sides.target_topic, 0)
        if source and sides.source_topic in source_counts:
            sides.source_partitions = source_counts[sides.source_topic]
            sides.source_marker = yield GetMarker("source", sides.source_topic)
        if sides.partitions and sides.target_marker is None:
            sides.target_marker = yield GetMarker("target", sides.target_topic)
    return [found[k] for k in sorted(found)]


# ---- helpers -----------------------------------------------------------------------------


def wait(what: str, timeout_s: float, check: Any) -> Step:
    """Run the procedure `check()` (a generator) until it returns True, at most `timeout_s`;
    a falsy-but-not-False string it returns is the progress said (once per change)."""
    start_ms = yield Now()
    last: Any = None
    while True:
        try:
            value = yield from check()
        except Retriable as exc:
            value, last = None, str(exc)
        if value is True:
            return
        if value and value != last:
            yield Say(f"  waiting: {what}: {value}")
            last = value
        now_ms = yield Now()
        if now_ms - start_ms >= timeout_s * 1000:
            raise FailoverError(f"not within {timeout_s:.0f} s: {what} (last seen: {last})")
        yield Sleep(POLL_S)


def retrying(what: str, timeout_s: float, request: Request) -> Step:
    """One request, asked again while it fails retriably, at most `timeout_s`."""
    answer: list[Any] = []

    def once() -> Step:
        answer.append((yield request))
        return True

    yield from wait(what, timeout_s, once)
    return answer[-1]


def declared_configs(declared: Mapping[tuple[str, str], Mapping[str, str]], cluster: str,
                     topic: str) -> dict[str, str]:
    return dict(declared.get((cluster, topic), {}))


def apply_declared(side: Side, cluster: str, topic: str, declared: Mapping[tuple[str, str], Mapping[str, str]],
                   timeout_s: float) -> Step:
    """The topology's own configs for a topic that just became its cluster's primary copy
    (the mirror does not copy min.insync.replicas and the like: the file says them)."""
    want = declared_configs(declared, cluster, topic)
    if not want:
        return
    have = yield from retrying(f"{cluster}:{topic} configs", timeout_s, GetConfigs(side, topic))
    change = tuple(sorted((k, v) for k, v in want.items() if have.get(k) != v))
    if change:
        yield from retrying(f"{cluster}:{topic} configs", timeout_s, AlterConfigs(side, topic, change))
        yield Say(f"{cluster}:{topic}: the topology's configs again: " + ", ".join(f"{k}={v}" for k, v in change))


def _names(flow: MirrorSpec, side: Side) -> str:
    return flow.source if side == "source" else flow.target


# ---- promote ---------------------------------------------------------------------------


def promote(flow: MirrorSpec, source_datacenter: str, *, timeout_s: float,
            declared: Mapping[tuple[str, str], Mapping[str, str]] | None = None) -> Step:
    """Planned: the copy side of every topic of the flow becomes the primary, nothing lost.
    The primary's topics are made read-only first (marked as mirrors of their copies), then
    this waits until no transaction is open there and every copy holds all of it, then the
    copies become ordinary topics; the old primary's are copies of them from then on."""
    declared = declared or {}
    # The ledger too: a topic failed over and not failed back is the primary whatever the old
    # source's topic says (a promotion the failover cut short left it marked as a copy of the
    # target's, though it holds records of its own): a failback comes first, never a promote.
    ledger: dict[str, LedgerEntry] = yield ReadLedger()
    sides = yield from flow_topics(flow, source_datacenter, source=True, ledger=ledger)
    outcome = Outcome("promote", flow.name, "")
    for s in sides:
        if s.source_deleted:
            outcome.skipped[s.target_topic] = (f"a copy of {flow.source}:{s.source_topic}, which was deleted: "
                                               "delete it, or make it an ordinary topic by hand")
    sides = [s for s in sides if not s.source_deleted]
    if not sides:
        raise FailoverError(f"flow {flow.name} has no mirror topics")
    plan: list[tuple[Side, str, Side, str, int]] = []  # old side, old topic, new side, new topic, partitions
    for s in sides:
        d = s.direction(flow)
        if d == "promoting":
            # An interrupted promotion: the side behind is the one being promoted.
            ahead = sum((yield GetEnds("source", s.source_topic, s.source_partitions)).values())
            behind = sum((yield GetEnds("target", s.target_topic, s.partitions)).values())
            d = "forward" if behind <= ahead else "reverse"
        if d in ("forward", "reverse"):
            primary_side: Side = "source" if d == "forward" else "target"
            copy_side: Side = OTHER[primary_side]
            primary_topic, copy_topic = (s.source_topic, s.target_topic) if d == "forward" else \
                (s.target_topic, s.source_topic)
            # The copy's ends first: the primary still takes writes and the workers copy them,
            # so a copy read after the primary may have passed the primary's ends as read.
            copy_ends = yield GetEnds(copy_side, copy_topic, s.partitions)
            primary_ends = yield GetEnds(primary_side, primary_topic, s.partitions)
            ahead = {p: e for p, e in copy_ends.items() if e > primary_ends.get(p, 0)}
            if ahead:
                # A copy holding offsets its primary does not: the copy of an earlier topic of
                # that name (deleted and created again); the worker does not extend it either.
                outcome.skipped[copy_topic] = (
                    f"{_names(flow, copy_side)}:{copy_topic} holds offsets {_names(flow, primary_side)}:{primary_topic} "
                    f"does not (partitions {sorted(ahead)}): a copy of an earlier topic of that name, deleted and "
                    "created again; left alone: delete it, and the flow's workers copy the new one")
                continue
        if d == "forward":
            plan.append(("source", s.source_topic, "target", s.target_topic, s.source_partitions))
        elif d == "reverse":
            plan.append(("target", s.target_topic, "source", s.source_topic, s.partitions))
        else:
            raise FailoverError(f"{s.source_topic} / {s.target_topic}: neither side is a mirror topic of the other "
                                f"({d}); after a failover, `dcmirror mirror failback` makes the old source a "
                                "mirror first")
    if not plan:
        raise FailoverError(f"flow {flow.name}: no topic to promote ({'; '.join(outcome.skipped.values())})")
    if len({p[2] for p in plan}) != 1:
        raise FailoverError("the flow's topics are not all mirrored in the same direction: " +
                            ", ".join(f"{s.source_topic}: {s.direction(flow)}" for s in sides))
    new_side = plan[0][2]
    outcome.primary = _names(flow, new_side)
    for old_side, old_topic, new_side, new_topic, _ in plan:
        yield Say(f"{_names(flow, old_side)}:{old_topic} takes no more writes (mirror of "
                  f"{_names(flow, new_side)}:{new_topic})")
        yield from retrying(f"marking {old_topic}", timeout_s,
                            SetMarker(old_side, old_topic, mirror_source_value(_names(flow, new_side), new_topic)))
    for old_side, old_topic, new_side, new_topic, partitions in plan:

        def caught_up(old_side: Side = old_side, new_side: Side = new_side, old_topic: str = old_topic,
                      new_topic: str = new_topic, partitions: int = partitions) -> Step:
            # The last stable offset first, then the log end: the old primary still takes the
            # markers of the transactions open when it was marked, so a log end read first
            # may be passed by a marker before the LSO is read (LSO above that end: "nothing
            # open", and a copy without the commit marker was promoted). Read after it, an end
            # no higher than the LSO is where the log stays: nothing open, nothing to come.
            stable = yield GetEnds(old_side, old_topic, partitions, committed=True)
            ends = yield GetEnds(old_side, old_topic, partitions)
            copied = yield GetEnds(new_side, new_topic, partitions)
            open_txns = [p for p in ends if stable[p] < ends[p]]
            behind = {p: ends[p] - copied[p] for p in ends if copied[p] < ends[p]}
            if not open_txns and not behind:
                outcome.topics[new_topic] = [PartitionReport(new_topic, p, copied[p]) for p in sorted(copied)]
                return True
            return (f"{old_topic}: open transactions in partitions {open_txns}" if open_txns
                    else f"{new_topic}: {sum(behind.values())} record(s) to copy ({behind})")

        yield from wait(f"{_names(flow, new_side)}:{new_topic} holds all of {_names(flow, old_side)}:{old_topic}",
                        timeout_s, caught_up)
    for _, _, new_side, new_topic, _ in plan:
        yield from retrying(f"promoting {new_topic}", timeout_s, SetMarker(new_side, new_topic, None))
        yield from apply_declared(new_side, _names(flow, new_side), new_topic, declared, timeout_s)
        yield Say(f"{_names(flow, new_side)}:{new_topic} is writable: the primary")
    return outcome


# ---- failover --------------------------------------------------------------------------


def view_of_today(view: KnownEnd | None, before: LedgerEntry | None) -> KnownEnd | None:
    """A worker's view of a source partition, unless it was seen before the topic's last
    failback: then it is of the old primary's history, which the failback set aside (the
    topic created again), and says nothing of the source's today (a failover during a
    promotion that had not caught up once reported an RPO from it)."""
    if view is not None and before is not None and before.state == FAILED_BACK and view.seen_ms <= before.failed_back_ms:
        return None
    return view


def failover(flow: MirrorSpec, source_datacenter: str, *, known: Mapping[tuple[str, int], KnownEnd],
             deleted_sources: Mapping[str, str] | None = None, timeout_s: float,
             declared: Mapping[tuple[str, str], Mapping[str, str]] | None = None) -> Step:
    """Unplanned: the source is gone. Each mirror topic of the flow in the target becomes an
    ordinary topic; the transactions the source had open are aborted there (its leader does
    it as it applies the promotion: no half of them is ever read committed). Per partition
    the copy's end and what is known of the RPO (`known`: the source's high watermark as the
    workers last saw it, by source topic and partition) are reported; the ledger keeps them
    for the failback, written before the topic is promoted, so a failover run again after
    being stopped finishes what it began. `deleted_sources`: source topics the workers saw
    deleted (their copies are left alone)."""
    declared = declared or {}
    ledger: dict[str, LedgerEntry] = yield ReadLedger()
    sides = yield from flow_topics(flow, source_datacenter, source=False)
    unfinished = [e for e in ledger.values() if e.state == FAILING_OVER]
    names = {s.target_topic for s in sides}
    outcome = Outcome("failover", flow.name, flow.target)
    for s in list(sides):
        why = (deleted_sources or {}).get(s.source_topic)
        if why is not None:
            outcome.skipped[s.target_topic] = f"{flow.source}:{s.source_topic} was deleted ({why}): left a copy"
            sides.remove(s)
    if not sides and not unfinished:
        raise FailoverError(f"{flow.target} has no mirror topics of {flow.source} in flow {flow.name} "
                            "(failed over already?)")
    reachable = yield Reachable("source")
    outcome.source_reachable = bool(reachable)
    now_ms: int = yield Now()
    entries: list[LedgerEntry] = []
    for s in sides:
        held = fence(s.source_topic)
        if s.target_marker != held:
            # Held still first: no worker appends once this is in (MirrorAppend refuses it),
            # so the ends read next are where the copy ends for good.
            yield from retrying(f"holding {s.target_topic}", timeout_s, SetMarker("target", s.target_topic, held))
        ends = yield from retrying(f"{s.target_topic} ends", timeout_s, GetEnds("target", s.target_topic, s.partitions))
        stable = yield from retrying(f"{s.target_topic} stable ends", timeout_s,
                                     GetEnds("target", s.target_topic, s.partitions, committed=True))
        source_now: dict[int, int] = {}
        if reachable:
            try:
                source_now = yield GetEnds("source", s.source_topic, s.partitions)
            except Retriable:
                outcome.source_reachable = False
        parts: dict[int, LedgerPartition] = {}
        for p in range(s.partitions):
            aborted: list[tuple[int, int]] = []
            if stable[p] < ends[p]:
                txns = yield from retrying(f"{s.target_topic}-{p} producers", timeout_s,
                                           GetOpenTxns("target", s.target_topic, p))
                aborted = [(t.producer_id, t.first_offset) for t in txns]
            view = view_of_today(known.get((s.source_topic, p)), ledger.get(s.target_topic))
            if p in source_now and (view is None or source_now[p] >= view.high_watermark):
                view = KnownEnd(source_now[p], now_ms)
            parts[p] = LedgerPartition(ends[p], min(stable[p], ends[p]), view.high_watermark if view else -1,
                                       view.seen_ms if view else -1, aborted)
        entry = LedgerEntry(flow.name, flow.source, s.source_topic, s.target_topic, FAILING_OVER,
                            uuid.uuid4().hex, now_ms, parts)
        yield from retrying("writing the failover ledger", timeout_s, WriteLedger(entry))
        entries.append(entry)
    for entry in unfinished:
        if entry.target_topic not in names:
            entries.append(entry)  # promoted by a failover that stopped before it said so
    for entry in entries:
        yield from retrying(f"promoting {entry.target_topic}", timeout_s, SetMarker("target", entry.target_topic, None))
        for p, part in sorted(entry.partitions.items()):

            def settled(topic: str = entry.target_topic, p: int = p, part: LedgerPartition = part) -> Step:
                # The leader aborts the source's open transactions as it applies the
                # promotion: until none of them is open. (Transactions of this cluster's
                # producers, which may write from the promotion on, are theirs.)
                if (yield GetMarker("target", topic)) is not None:
                    return "the promotion is not applied yet"
                carried = {tuple(a) for a in part.aborted}
                still = [t for t in (yield GetOpenTxns("target", topic, p))
                         if (t.producer_id, t.first_offset) in carried]
                if not still:
                    return True
                # Another cluster's broker that does not abort at promotion: as kafka-transactions would.
                for txn in still:
                    yield AbortTxn("target", topic, p, txn)
                return f"{len(still)} transaction(s) of the source still open"

            yield from wait(f"{entry.target_topic}-{p}: no open transaction of the source", timeout_s, settled)
        entry.state = FAILED_OVER
        yield from retrying("writing the failover ledger", timeout_s, WriteLedger(entry))
        yield from apply_declared("target", flow.target, entry.target_topic, declared, timeout_s)
        reports = []
        for p, v in sorted(entry.partitions.items()):
            reports.append(PartitionReport(entry.target_topic, p, v.end_offset, v.source_known_end,
                                           v.source_known_at_ms,
                                           None if v.source_known_at_ms < 0 else
                                           max(0.0, (entry.failed_over_ms - v.source_known_at_ms) / 1000),
                                           len(v.aborted)))
        outcome.topics[entry.target_topic] = reports
        yield Say(f"{flow.target}:{entry.target_topic} is writable: the primary")
    return outcome


# ---- failback --------------------------------------------------------------------------


def diverged_records(source_records: list[Rec], target_records: list[Rec]) -> list[Rec]:
    """The old primary's committed records the new primary does not hold: those the new one
    does not read committed at the same offset, the same record (key, value, headers,
    timestamp). Beyond the copy's end that is everything the old one took alone; below it,
    the transactions the failover aborted that the old one committed after the copy; and a
    tail a worker copied into it from the new one before the failback held it still is held
    by both, not diverged."""
    held = {r.offset: (r.key, r.value, r.headers, r.timestamp_ms) for r in target_records}
    return [r for r in source_records if held.get(r.offset) != (r.key, r.value, r.headers, r.timestamp_ms)]


def failback(flow: MirrorSpec, source_datacenter: str, *, timeout_s: float,
             declared: Mapping[tuple[str, str], Mapping[str, str]] | None = None) -> Step:
    """The old source is back: each of its topics the flow failed over becomes a mirror topic
    of the target's. Every committed record it holds that the target does not (taken after
    the copy's end, or committed after the copy had the records but not the commit) is first
    copied into `dcmirror.diverged.<source>.<topic>` in the target and counted; then the
    topic is created again as a mirror topic, which the flow's workers fill from the target
    (the reverse direction). `promote` later restores the flow's direction. Run again after
    it stopped, it goes on where the ledger says it was (a record already aside is never
    copied twice)."""
    declared = declared or {}
    ledger: dict[str, LedgerEntry] = yield ReadLedger()
    sides = yield from flow_topics(flow, source_datacenter, source=True, ledger=ledger)
    outcome = Outcome("failback", flow.name, flow.target)
    todo: list[tuple[TopicSides, LedgerEntry]] = []
    for s in sides:
        entry = ledger.get(s.target_topic)
        d = s.direction(flow)
        unfinished = entry is not None and entry.state in UNFINISHED_FAILBACK
        if d == "fenced" and not unfinished and fenced_topic(s.source_marker) is not None:
            unfinished = entry is not None and entry.state == FAILED_OVER  # fenced, then stopped: go on
        if d == "primary-target" or unfinished:
            if entry is None or entry.state == FAILING_OVER:
                raise FailoverError(f"no failover of {flow.target}:{s.target_topic} is recorded in {LEDGER_TOPIC}"
                                    + (" as finished: run `dcmirror mirror failover` again first" if entry else
                                       ": was it promoted by hand? make the source's topic a mirror topic by hand"))
            if not s.source_partitions and not unfinished:
                outcome.skipped[s.target_topic] = (f"{flow.source} has no topic {s.source_topic} (deleted there?): "
                                                   "nothing to fail back")
                continue
            todo.append((s, entry))
    if not todo:
        raise FailoverError(f"flow {flow.name}: no topic is failed over to {flow.target} "
                            f"({', '.join(f'{s.source_topic}: {s.direction(flow)}' for s in sides) or 'no topics'})")
    for s, entry in todo:
        side_topic = f"{DIVERGED_PREFIX}{flow.source}.{s.source_topic}"
        back_marker = mirror_source_value(flow.target, s.target_topic)
        if entry.state != RECREATING and s.source_partitions:
            if s.source_marker != fence(s.target_topic):
                # Read-only for producers, and copied into by no worker, while what it holds
                # alone is found and kept aside.
                yield from retrying(f"marking {s.source_topic}", timeout_s,
                                    SetMarker("source", s.source_topic, fence(s.target_topic)))
                yield Say(f"{flow.source}:{s.source_topic} takes no more writes")
            if entry.state != FAILING_BACK:
                entry.state, entry.side_topic = FAILING_BACK, side_topic
                yield from retrying("writing the failover ledger", timeout_s, WriteLedger(entry))
            for p in range(s.source_partitions):
                # Its own transactions still open end first, through their coordinator: one
                # it committed is kept, one it never will is aborted, its producer fenced
                # (those no coordinator of it has open here, hanging, are aborted).

                def ended(p: int = p, topic: str = s.source_topic) -> Step:
                    end = (yield GetEnds("source", topic, p + 1))[p]
                    stable = (yield GetEnds("source", topic, p + 1, committed=True))[p]
                    if stable >= end:
                        return True
                    txns = yield GetOpenTxns("source", topic, p)
                    if txns:
                        yield EndTxns("source", topic, p, tuple(txns))
                    return f"last stable offset {stable} < log end {end}: transactions open"

                yield from wait(f"{flow.source}:{s.source_topic}-{p}: no open transaction", timeout_s, ended)
            counts = yield from _keep_diverged(flow, s, entry, side_topic, timeout_s)
            for p, n in counts.items():
                entry.partitions.setdefault(p, LedgerPartition(0, 0)).diverged_records = n
            total = sum(counts.values())
            if total:
                yield Say(f"{total} record(s) {flow.source}:{s.source_topic} has that {flow.target}:{s.target_topic} "
                          f"does not -> {flow.target}:{side_topic}")
            entry.state = RECREATING
            yield from retrying("writing the failover ledger", timeout_s, WriteLedger(entry))
        if s.source_partitions:
            # What it held alone is aside: the topic goes, and comes again as a copy (run
            # again in this state, a copy already created is deleted and created once more:
            # it holds nothing of its own).
            yield from retrying(f"deleting {s.source_topic}", timeout_s, DeleteTopic("source", s.source_topic))

            def gone(name: str = s.source_topic) -> Step:
                return True if name not in (yield ListTopics("source")) else "still listed"

            yield from wait(f"{flow.source}:{s.source_topic} deleted", timeout_s, gone)
        configs = yield from retrying(f"{s.target_topic} configs", timeout_s, GetConfigs("target", s.target_topic))
        wanted = {k: v for k, v in configs.items() if k not in CONFIG_EXCLUDES}
        wanted |= declared_configs(declared, flow.source, s.source_topic)
        wanted[MIRROR_SOURCE_CONFIG] = back_marker

        def created(s: TopicSides = s, wanted: dict[str, str] = wanted, back_marker: str = back_marker) -> Step:
            yield CreateTopic("source", s.source_topic, s.partitions, tuple(sorted(wanted.items())))
            marker = yield GetMarker("source", s.source_topic)
            return True if marker == back_marker else f"mirror.source is {marker!r}"

        yield from wait(f"{flow.source}:{s.source_topic} created as a mirror topic", timeout_s, created)
        entry.state = FAILED_BACK
        entry.failed_back_ms = yield Now()
        yield from retrying("writing the failover ledger", timeout_s, WriteLedger(entry))
        yield Say(f"{flow.source}:{s.source_topic} is a mirror topic of {flow.target}:{s.target_topic}; the flow's "
                  "workers copy it back")
        outcome.topics[s.target_topic] = [PartitionReport(s.target_topic, p, v.end_offset,
                                                          diverged_records=v.diverged_records)
                                          for p, v in sorted(entry.partitions.items())]
        if any(v.diverged_records for v in entry.partitions.values()):
            outcome.side_topics[s.target_topic] = side_topic
    return outcome


def _keep_diverged(flow: MirrorSpec, s: TopicSides, entry: LedgerEntry, side_topic: str,
                   timeout_s: float) -> Step:
    """-> {partition: records aside}: the old primary's records the new one lacks, copied into
    the side topic once (those a stopped failback already copied are found by their headers)."""
    ends = yield from retrying(f"{s.source_topic} ends", timeout_s,
                               GetEnds("source", s.source_topic, s.source_partitions))
    counts: dict[int, int] = {}
    failover_id = entry.failover_id.encode()
    for p in range(s.source_partitions):
        part = entry.partitions.get(p) or LedgerPartition(0, 0)
        start = min(part.stable_offset, part.end_offset)
        if ends[p] <= start:
            counts[p] = 0
            continue
        source_records = yield from retrying(f"{s.source_topic}-{p}", timeout_s,
                                             ReadRecords("source", s.source_topic, p, start, ends[p]))
        target_records = yield from retrying(f"{s.target_topic}-{p}", timeout_s,
                                             ReadRecords("target", s.target_topic, p, start, ends[p]))
        keep = diverged_records(source_records, target_records)
        counts[p] = len(keep)
        if not keep:
            continue
        side_ends = yield from retrying(f"{side_topic} ends", timeout_s, _side_ends(side_topic, s))
        already: set[int] = set()
        if side_ends.get(p, 0) > 0:
            for r in (yield from retrying(f"{side_topic}-{p}", timeout_s,
                                          ReadRecords("target", side_topic, p, 0, side_ends[p]))):
                if r.header(DIVERGED_TOPIC) == s.source_topic.encode() and r.header(DIVERGED_FAILOVER) == failover_id:
                    offset = r.header(DIVERGED_OFFSET)
                    if offset is not None and offset.isdigit():
                        already.add(int(offset))
        new = tuple((p, Rec(r.offset, r.key, r.value, (*r.headers, (DIVERGED_CLUSTER, flow.source.encode()),
                                                        (DIVERGED_TOPIC, s.source_topic.encode()),
                                                        (DIVERGED_OFFSET, str(r.offset).encode()),
                                                        (DIVERGED_FAILOVER, failover_id)), r.timestamp_ms))
                    for r in keep if r.offset not in already)
        if new:
            yield from retrying(f"copying into {side_topic}", timeout_s,
                                Produce("target", side_topic, s.source_partitions, new))
    return counts


def _side_ends(side_topic: str, s: TopicSides) -> Request:
    return GetEnds("target", side_topic, s.source_partitions)
