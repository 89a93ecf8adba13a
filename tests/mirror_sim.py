"""The mirror and its disaster recovery in one process, driven by a seed (issue 40).

Two clusters, `east` (the flow's source) and `dr` (its target), one flow of mirror topics
between them, and everything around it, on a simulated clock in ticks of TICK_MS:

What runs for real (the code the product runs):
- the mirror's decisions: mirror/core/topic_copy.py (which topic pairs a direction copies,
  where a claim resumes, which chunk follows) and mirror/topic_sync.py's
  `plan_group_offsets` (committed offsets following the copy);
- disaster recovery: the procedures of mirror/core/disaster_recovery.py (`promote`,
  `failover`, `failback`), driven request by request with other actors moving between two
  requests, killed at random requests and run again, as an operator's command would be;
  failover's RPO from the workers' last status through mirror/failover.py's
  `gather_worker_views`;
- each partition's producer state: cluster/storage/producer_state.py's
  `ProducerStateManager` (idempotence, transactions, the last stable offset, and what a
  promotion forgets and carries), and cluster/storage/log.py's `plan_mirrored_append`.

Simulated (the shells): each cluster as one broker that never loses what it acknowledged
(replication inside a cluster is the replication simulation's concern), its producer-id
allocator (both from 0, so ids collide across clusters as in life), its transaction
coordinator (a commit answered once it is prepared, its markers written after, a fenced or
timed-out transaction aborted), consumer groups; the flow's worker (both directions, as
`MirrorTopicsFlowWorker`), which crashes and restarts and writes its status every tick; the
link between the worker's datacenter (dr) and east, cut and healed; whole datacenters lost
and back; applications: idempotent producers, transactional producers (commits, aborts,
transactions left open), a consumer group committing as it reads, on whichever cluster the
runbook says is the primary (and, for a while, some left behind on the old one); and the
operator, who follows the README's runbook (failover when east is gone, failback when it is
back, promote once the copy caught up, sometimes a planned promotion) and sometimes runs a
command at the wrong moment.

Checkers:
- no acknowledgement without its record: when a producer is answered, the batch at the
  answered offset is its own (producer id, epoch, sequences, values);
- nothing acknowledged is lost: after the faults stop and the runbook has run to the end,
  every acknowledged record (idempotent, or of a transaction whose commit was answered) is
  read committed exactly once in the primary's topic or in the side topic
  (`dcmirror.diverged.east.orders`), never in both; no record of a transaction that was
  aborted, or left open and never committed, is read committed anywhere, and a
  transaction is read whole or not at all;
- the RPO a failover reports is a lower bound, never above the truth (offsets the source
  held beyond the copy), and never called exact;
- diverged records are counted: each failback's per-partition counts are the records it
  put aside;
- the copy is byte-identical (batches, offsets, producer ids, sequences) to the primary;
  exactly one side is writable at the end;
- committed group offsets never pass the log end of their cluster, and a group that moves
  to the other cluster never resumes past where it had committed.

`run(seed)` returns a `Result`; `Result.violations` is empty when every checker held. A
failure names its seed: `DCMIRROR_MIRROR_SEED=<seed> pytest tests/unit/test_mirror_sim.py -k
replay -s` replays exactly that run.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from cluster.protocol.internal import mirror_fenced
from cluster.protocol.record_batch import CONTROL_MASK, TRANSACTIONAL_MASK, BatchHeader
from cluster.protocol.sentinels import NO_SEQUENCE
from cluster.storage.log import UnexpectedAppendOffset, plan_mirrored_append
from cluster.storage.producer_state import ProducerStateManager, SequenceVerdict
from cluster.storage.txn_index import Marker
from mirror.core import disaster_recovery as dr
from mirror.core import topic_copy
from mirror.failover import gather_worker_views
from mirror.topic_sync import NO_GROUP, TargetGroup, plan_group_offsets
from topology.model import MirrorSpec

TICK_MS = 100
EAST, DR = "east", "dr"
TOPIC = "orders"
GROUP = "app"
SIDE_TOPIC = f"{dr.DIVERGED_PREFIX}{EAST}.{TOPIC}"
FLOW = MirrorSpec(name="east-to-dr", source=EAST, target=DR, topics=TOPIC, rename="{topic}", mirror_topics=True,
                  mirror_groups=GROUP)
COMMIT, ABORT = 1, 0
TXN_TIMEOUT_TICKS = 100  # the coordinator aborts a transaction open this long (10 s)


class Unreachable(Exception):
    pass


# ---- one partition's log -------------------------------------------------------------------


@dataclass(frozen=True)
class SimRecord:
    value: str
    headers: tuple[tuple[str, bytes | None], ...] = ()


@dataclass(frozen=True)
class SimBatch:
    base: int
    records: tuple[SimRecord, ...]  # one record for a control batch (its value says which)
    producer_id: int = -1
    epoch: int = -1
    sequence: int = NO_SEQUENCE
    transactional: bool = False
    control: int | None = None  # COMMIT / ABORT marker
    coordinator_epoch: int = 0

    @property
    def count(self) -> int:
        return len(self.records)

    @property
    def last(self) -> int:
        return self.base + self.count - 1

    @property
    def next(self) -> int:
        return self.base + self.count

    def at(self, base: int) -> SimBatch:
        return SimBatch(base, self.records, self.producer_id, self.epoch, self.sequence, self.transactional,
                        self.control, self.coordinator_epoch)

    def header(self, base: int | None = None) -> BatchHeader:
        attributes = (TRANSACTIONAL_MASK if self.transactional or self.control is not None else 0) | \
            (CONTROL_MASK if self.control is not None else 0)
        return BatchHeader(self.base if base is None else base, 0, 0, 2, 0, attributes, self.count - 1, 0, 0,
                           self.producer_id, self.epoch, self.sequence, self.count)

    def identity(self) -> tuple[Any, ...]:
        """What must be the same in a copy (byte for byte but the leader epoch)."""
        return (self.base, self.records, self.producer_id, self.epoch, self.sequence, self.transactional,
                self.control, self.coordinator_epoch)


class SimLog:
    """One partition on one single-broker cluster: the high watermark is the log end."""

    def __init__(self) -> None:
        self.batches: list[SimBatch] = []
        self.lasts: list[int] = []  # each batch's last offset, for bisecting
        self.log_start = 0
        self.end = 0
        self.state = ProducerStateManager()
        self.mirror_appends = 0
        # Records decided visible (plain ones, and those of committed transactions), by offset;
        # read_committed is the part below the LSO.
        self.visible_offsets: list[int] = []
        self.visible: list[SimRecord] = []
        self.pending: dict[int, list[tuple[int, SimRecord]]] = {}

    def _append(self, batch: SimBatch) -> None:
        marker = Marker(batch.control, batch.coordinator_epoch) if batch.control is not None else None
        self.batches.append(batch)
        self.lasts.append(batch.last)
        self.end = batch.next
        if batch.control is not None:
            for o, r in self.pending.pop(batch.producer_id, []) if batch.control == COMMIT else ():
                i = bisect.bisect_left(self.visible_offsets, o)
                self.visible_offsets.insert(i, o)
                self.visible.insert(i, r)
            self.pending.pop(batch.producer_id, None)
        elif batch.transactional:
            self.pending.setdefault(batch.producer_id, []).extend((batch.base + i, r) for i, r in enumerate(batch.records))
        else:
            self.visible_offsets.extend(range(batch.base, batch.next))
            self.visible.extend(batch.records)
        self.state.record(batch.header(), marker)
        self.state.on_high_watermark(self.end)

    def produce(self, batch: SimBatch) -> tuple[str, int]:
        """A producer's batch at the log end: ("ok", base), ("duplicate", base of the cached
        batch), or ("error", why)."""
        check = self.state.check(batch.header(self.end))
        if check.verdict is SequenceVerdict.DUPLICATE:
            assert check.duplicate_of is not None
            return "duplicate", check.duplicate_of.base_offset
        if check.verdict is not SequenceVerdict.APPEND:
            return "error", check.verdict.value
        base = self.end
        self._append(batch.at(base))
        return "ok", base

    def marker(self, producer_id: int, epoch: int, control: int, coordinator_epoch: int, *,
               mirror: bool) -> bool:
        """A transaction marker (the broker's rules: on a mirror topic only for a transaction
        open there); whether it was written."""
        if mirror and producer_id not in self.state.ongoing:
            return False
        if self.state.check_marker(producer_id, epoch) is not None:
            return False
        self._append(SimBatch(self.end, (SimRecord(f"marker-{control}"),), producer_id, epoch, NO_SEQUENCE, True,
                              control, coordinator_epoch))
        return True

    def mirror_append(self, batches: list[SimBatch], log_start: int) -> int:
        """Log.append_mirrored's rules; the log end after. Raises UnexpectedAppendOffset."""
        if batches:
            first_kept, start_at = plan_mirrored_append("sim", self.log_start, self.end,
                                                        [(b.base, b.last) for b in batches])
            if start_at is not None:
                self.batches, self.lasts, self.log_start, self.end = [], [], start_at, start_at
                self.visible_offsets, self.visible, self.pending = [], [], {}
                self.state = ProducerStateManager()
            for b in batches[first_kept:]:
                self._append(b)
                self.mirror_appends += 1
        if log_start > self.log_start:
            self.log_start = min(log_start, self.end)
        return self.end

    def promote(self) -> None:
        """Promotion as ReplicaManager.reconcile applies it: the source's producers forgotten,
        those with an open transaction carried and aborted by the leader."""
        self.state.promote()
        for entry in self.state.carried_open():
            self.marker(entry.producer_id, entry.epoch, ABORT, max(0, entry.coordinator_epoch), mirror=False)

    def lso(self) -> int:
        first = self.state.first_unstable_offset(self.end)
        return self.end if first is None else first

    def committed(self, start: int = 0, end: int | None = None) -> list[tuple[int, SimRecord]]:
        """read_committed: (offset, record) in [start, min(end, LSO))."""
        lso = self.lso()
        lo = bisect.bisect_left(self.visible_offsets, max(start, self.log_start))
        hi = bisect.bisect_left(self.visible_offsets, lso if end is None else min(end, lso))
        return list(zip(self.visible_offsets[lo:hi], self.visible[lo:hi], strict=True))

    def tail(self, offset: int) -> topic_copy.BatchTail | None:
        """The batch holding `offset`, as a claim compares it."""
        i = bisect.bisect_left(self.lasts, offset)
        if i < len(self.batches) and self.batches[i].base <= offset:
            b = self.batches[i]
            return topic_copy.BatchTail(b.last, b.producer_id, b.epoch, b.control is not None,
                                        b.transactional or b.control is not None)
        return None

    def fetch(self, position: int, max_batches: int) -> list[SimBatch]:
        """Raw batches from the one holding `position`, below the high watermark (the end)."""
        i = bisect.bisect_left(self.lasts, position)
        return self.batches[i:i + max_batches]


@dataclass
class SimTopic:
    topic_id: int
    logs: list[SimLog]
    configs: dict[str, str] = field(default_factory=dict)
    created_ms: int = 0

    @property
    def marker(self) -> str | None:
        return self.configs.get(topic_copy.MIRROR_SOURCE_CONFIG)


# ---- a cluster -------------------------------------------------------------------------------


@dataclass
class TxnMeta:
    txn_id: str
    producer_id: int
    epoch: int
    state: str = "empty"  # ongoing, prepare-commit, prepare-abort
    partitions: set[tuple[str, int]] = field(default_factory=set)
    started_tick: int = 0


class SimCluster:
    def __init__(self, name: str, sim: Simulation) -> None:
        self.name, self.sim = name, sim
        self.up = True
        self.topics: dict[str, SimTopic] = {}
        self.next_producer_id = 0
        self.groups: dict[tuple[str, str, int], int] = {}
        self.txns: dict[str, TxnMeta] = {}
        self.ledger: dict[str, dict[str, Any]] = {}  # dcmirror.failovers: target topic -> last entry
        self.promotions = 0

    def create_topic(self, name: str, partitions: int, configs: dict[str, str]) -> None:
        if name not in self.topics:
            self.sim.topic_ids += 1
            self.topics[name] = SimTopic(self.sim.topic_ids, [SimLog() for _ in range(partitions)], dict(configs),
                                         self.sim.now_ms)

    def delete_topic(self, name: str) -> None:
        """As the broker does: the topic's committed group offsets go with it."""
        del self.topics[name]
        self.groups = {k: v for k, v in self.groups.items() if k[1] != name}

    def set_marker(self, topic: str, marker: str | None) -> None:
        t = self.topics[topic]
        if marker is None:
            if t.marker is not None:
                t.configs.pop(topic_copy.MIRROR_SOURCE_CONFIG)
                self.promotions += 1
                for lg in t.logs:
                    lg.promote()
        else:
            t.configs[topic_copy.MIRROR_SOURCE_CONFIG] = marker

    def allocate_producer_id(self) -> int:
        pid = self.next_producer_id
        self.next_producer_id += 1
        return pid

    # transactions: the coordinator
    def init_producer_id(self, txn_id: str) -> tuple[int, int] | None:
        """(producer id, epoch), or None while a transaction of the id completes."""
        meta = self.txns.get(txn_id)
        if meta is None:
            meta = self.txns[txn_id] = TxnMeta(txn_id, self.allocate_producer_id(), 0)
            return meta.producer_id, meta.epoch
        if meta.state.startswith("prepare"):
            self.complete(meta)
            return None
        if meta.state == "ongoing":
            meta.state = "prepare-abort"
            self.complete(meta)
        meta.epoch += 1
        return meta.producer_id, meta.epoch

    def complete(self, meta: TxnMeta) -> None:
        """Write the markers of a prepared transaction (done at once here)."""
        control = COMMIT if meta.state == "prepare-commit" else ABORT
        for topic, p in sorted(meta.partitions):
            t = self.topics.get(topic)
            if t is not None and p < len(t.logs):
                t.logs[p].marker(meta.producer_id, meta.epoch, control, 0, mirror=t.marker is not None)
        meta.state, meta.partitions = "empty", set()

    def coordinator_tick(self, tick: int) -> None:
        for meta in self.txns.values():
            if meta.state.startswith("prepare") and self.sim.rng.random() < 0.5:
                self.complete(meta)
            elif meta.state == "ongoing" and tick - meta.started_tick > TXN_TIMEOUT_TICKS:
                meta.state = "prepare-abort"
                meta.epoch += 1  # as Kafka's coordinator bumps it on a timeout abort
                self.complete(meta)


# ---- applications --------------------------------------------------------------------------


@dataclass
class Acked:
    value: str
    cluster: str
    partition: int
    offset: int


class IdempotentApp:
    """An idempotent acks=all producer: one batch in flight per partition, resent with the same
    sequences until answered (an answer may be lost)."""

    def __init__(self, sim: Simulation, cluster: SimCluster, name: str) -> None:
        self.sim, self.cluster, self.name = sim, cluster, name
        self.producer_id = -1
        self.sequences: dict[int, int] = {}
        self.in_flight: dict[int, SimBatch] = {}
        self.n = 0
        self.stopped = False

    def step(self) -> None:
        sim = self.sim
        if not self.cluster.up:
            return
        if self.producer_id < 0:
            self.producer_id = self.cluster.allocate_producer_id()
        t = self.cluster.topics.get(TOPIC)
        if t is None:
            return
        p = sim.rng.randrange(len(t.logs))
        batch = self.in_flight.get(p)
        if batch is None:
            if self.stopped:
                return
            count = sim.rng.randint(1, 3)
            seq = self.sequences.get(p, 0)
            records = tuple(SimRecord(f"{self.name}-{self.n + i}") for i in range(count))
            self.n += count
            batch = SimBatch(0, records, self.producer_id, 0, seq)
            self.sequences[p] = seq + count
            self.in_flight[p] = batch
        if t.marker is not None:
            # Refused (a read-only copy): INVALID_TOPIC_EXCEPTION is not retriable, the
            # client fails the batch.
            del self.in_flight[p]
            sim.unacknowledged.update(r.value for r in batch.records)
            return
        outcome, base = t.logs[p].produce(batch)
        if outcome == "error":
            sim.violation(f"{self.name}: {self.cluster.name}/{TOPIC}-{p} refused batch {batch.sequence} of producer "
                          f"{self.producer_id}: {base}")
            del self.in_flight[p]
            return
        if sim.rng.random() < 0.1:
            return  # the answer is lost: sent again later
        del self.in_flight[p]
        sim.check_ack(self.cluster, t, p, base, batch, self.name)
        for i, r in enumerate(batch.records):
            sim.acked[r.value] = Acked(r.value, self.cluster.name, p, base + i)


class TransactionalApp:
    """A transactional producer: transactions of one to three batches over the partitions,
    committed (most), aborted, or left open when its cluster dies."""

    def __init__(self, sim: Simulation, cluster: SimCluster, name: str) -> None:
        self.sim, self.cluster, self.name = sim, cluster, name
        self.txn_id = f"txn-{name}"
        self.producer_id, self.epoch = -1, -1
        self.sequences: dict[int, int] = {}
        self.current: list[tuple[int, SimBatch]] = []
        self.n = 0
        self.stopped = False

    def step(self) -> None:
        sim, c = self.sim, self.cluster
        if not c.up:
            return
        if self.producer_id < 0:
            got = c.init_producer_id(self.txn_id)
            if got is None:
                return
            self.producer_id, self.epoch = got
            self.sequences = {}
        meta = c.txns[self.txn_id]
        if meta.state.startswith("prepare"):
            return  # CONCURRENT_TRANSACTIONS until the coordinator completed the last one
        if meta.epoch != self.epoch:
            # Fenced (a failback ended its transaction, a timeout): what it had open is not
            # acknowledged; a new instance starts.
            self.abandon()
            self.producer_id = -1
            return
        t = c.topics.get(TOPIC)
        if t is None:
            return
        if len(self.current) < sim.rng.randint(1, 3) and not self.stopped:
            p = sim.rng.randrange(len(t.logs))
            if t.marker is not None:
                return  # AddPartitionsToTxn refused: a read-only copy
            count = sim.rng.randint(1, 2)
            seq = self.sequences.get(p, 0)
            records = tuple(SimRecord(f"{self.name}-{self.n + i}") for i in range(count))
            self.n += count
            batch = SimBatch(0, records, self.producer_id, self.epoch, seq, transactional=True)
            if meta.state == "empty":
                meta.state, meta.started_tick = "ongoing", sim.tick
            meta.partitions.add((TOPIC, p))
            outcome, base = t.logs[p].produce(batch)
            if outcome != "ok":
                sim.violation(f"{self.name}: transactional batch refused in {c.name}/{TOPIC}-{p}: {outcome} {base}")
                return
            sim.check_ack(c, t, p, base, batch, self.name)
            self.sequences[p] = seq + count
            self.current.append((p, batch))
            return
        if not self.current:
            return
        commit = sim.rng.random() < 0.8
        meta.state = "prepare-commit" if commit else "prepare-abort"
        records = [r.value for _, b in self.current for r in b.records]
        txn = sim.new_txn(records)
        if commit:
            sim.committed_txns.append(txn)
            for v in records:
                sim.acked[v] = Acked(v, c.name, -1, -1)
        else:
            sim.aborted_txns.append(txn)
        self.current = []

    def abandon(self) -> None:
        if self.current:
            self.sim.open_txns.append(self.sim.new_txn([r.value for _, b in self.current for r in b.records]))
        self.current = []


class ConsumerApp:
    """A member of the consumer group: reads committed records from its committed offsets and
    commits after them."""

    def __init__(self, sim: Simulation, cluster: SimCluster) -> None:
        self.sim, self.cluster = sim, cluster
        self.started = False

    def step(self) -> None:
        sim, c = self.sim, self.cluster
        t = c.topics.get(TOPIC)
        if not c.up or t is None:
            return
        for p, lg in enumerate(t.logs):
            key = (GROUP, TOPIC, p)
            position = c.groups.get(key, lg.log_start)
            got = lg.committed(position)[: sim.rng.randint(0, 4)]
            if got:
                c.groups[key] = got[-1][0] + 1
                sim.group_high[p] = max(sim.group_high.get(p, 0), got[-1][0] + 1)
        self.started = True


# ---- the worker ----------------------------------------------------------------------------


@dataclass
class PartitionCopy:
    state: str = "CLAIMING"
    position: int = -1
    why: str = ""
    target_id: int = -1  # the target incarnation of the last claim


class Direction:
    """One direction of the flow's worker (`TopicMirrorWorker`)."""

    def __init__(self, sim: Simulation, reverse: bool) -> None:
        self.sim, self.reverse = sim, reverse
        self.source, self.target = (sim.dr, sim.east) if reverse else (sim.east, sim.dr)
        self.partitions: dict[int, PartitionCopy] = {}
        self.refused: dict[str, str] = {}
        self.copying = False
        self.known: dict[tuple[str, int], tuple[int, int]] = {}

    def reach(self, c: SimCluster) -> bool:
        return self.sim.reachable(DR, c)

    def sync_topics(self) -> None:
        s, t = self.source, self.target
        if not (self.reach(s) and self.reach(t)):
            return
        st = s.topics.get(TOPIC)
        if st is None:
            self.copying = False
            return
        tt = t.topics.get(TOPIC)
        decision = topic_copy.topic_pair(topic_copy.PairFacts(
            s.name, TOPIC, t.name, TOPIC, self.reverse, st.marker, tt is not None, tt.marker if tt else None))
        if decision.action == "create":
            configs = {k: v for k, v in st.configs.items() if k not in topic_copy.CONFIG_EXCLUDES}
            t.create_topic(TOPIC, len(st.logs), {**configs, topic_copy.MIRROR_SOURCE_CONFIG:
                                                 topic_copy.mirror_source_value(s.name, TOPIC)})
            decision = topic_copy.PairAction("copy")
        if decision.action == "refuse":
            self.refused[TOPIC] = decision.why
        else:
            self.refused.pop(TOPIC, None)
        copying = decision.action == "copy"
        if copying and not self.copying or not copying:
            self.partitions = {p: PartitionCopy() for p in range(len(st.logs))} if copying else {}
        self.copying = copying

    def sync_group_offsets(self) -> None:
        s, t = self.source, self.target
        if not (self.copying and self.reach(s) and self.reach(t)) or TOPIC not in t.topics:
            return
        source_committed = {(TOPIC, p): o for (g, topic, p), o in s.groups.items() if g == GROUP}
        live = self.sim.consumer is not None and self.sim.consumer.cluster is t
        target_group = TargetGroup("Stable", 1) if live else NO_GROUP
        ends = {(TOPIC, p): lg.end for p, lg in enumerate(t.topics[TOPIC].logs)}
        plan = plan_group_offsets(GROUP, source_committed, {TOPIC: TOPIC}, target_group,
                                  {(TOPIC, p): o for (g, topic, p), o in t.groups.items() if g == GROUP}, ends)
        for (topic, p), offset in plan.commit.items():
            t.groups[(GROUP, topic, p)] = offset

    def copy(self) -> None:
        sim, s, t = self.sim, self.source, self.target
        if not self.copying:
            return
        st, tt = s.topics.get(TOPIC), t.topics.get(TOPIC)
        for p, pc in self.partitions.items():
            if st is None or tt is None or p >= len(tt.logs) or p >= len(st.logs):
                continue
            if not (self.reach(s) and self.reach(t)):
                continue
            src, dst = st.logs[p], tt.logs[p]
            if pc.state == "FAILED" and pc.target_id != tt.topic_id:
                pc.state = "CLAIMING"  # the copy was created again (a failback)
            if pc.state == "CLAIMING":
                both = dst.end > src.end and st.marker == topic_copy.mirror_source_value(t.name, TOPIC)
                matches = None
                if src.log_start < dst.end <= src.end:
                    matches = topic_copy.tails_match(src.tail(dst.end - 1), dst.tail(dst.end - 1))
                pc.target_id = tt.topic_id
                decision = topic_copy.claim(topic_copy.ClaimFacts(dst.end, src.log_start, src.end, both, matches))
                if isinstance(decision, topic_copy.Resume):
                    pc.state, pc.position = "ACTIVE", decision.position
                    if decision.lost is not None:
                        sim.violation(f"worker: {s.name}/{TOPIC}-{p} lost {decision.lost} to retention (none runs)")
                elif isinstance(decision, topic_copy.Diverged):
                    pc.state, pc.why = "FAILED", decision.why
                continue
            if pc.state == "FAILED":
                continue
            chunk = src.fetch(pc.position, sim.rng.randint(1, 4))
            if not self.reverse:
                self.known[(TOPIC, p)] = (src.end, sim.now_ms)  # the latest view (gather_worker_views)
            if not chunk:
                continue
            if tt.marker is None or mirror_fenced(tt.marker):
                pc.state = "CLAIMING"  # MirrorAppend refused: only mirror topics take mirrored batches
                continue
            try:
                end = dst.mirror_append(chunk, src.log_start)
            except UnexpectedAppendOffset:
                pc.state = "CLAIMING"
                continue
            if sim.rng.random() < 0.05:
                pc.state = "CLAIMING"  # the answer was lost: claimed again from the target's end
                continue
            pc.position = end


class SimWorker:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.alive = True
        self.directions = [Direction(sim, False), Direction(sim, True)]
        self.known_forward: dict[tuple[str, int], tuple[int, int]] = {}

    def start(self) -> None:
        self.alive = True
        self.directions = [Direction(self.sim, False), Direction(self.sim, True)]

    def step(self) -> None:
        if not self.alive:
            return
        sim = self.sim
        for d in self.directions:
            if sim.tick % 5 == 0 or not d.copying:
                d.sync_topics()
            if sim.tick % 7 == 0:
                d.sync_group_offsets()
            d.copy()
        forward = self.directions[0]
        # The status file, written every tick: what `mirror failover` reads.
        sim.status = {"workers": [{
            "worker": "w0",
            "source_known_ends": [{"topic": t, "partition": p, "high_watermark": hw, "seen_ms": seen}
                                  for (t, p), (hw, seen) in sorted(forward.known.items())],
            "refused_topics": dict(forward.refused)}]}
        # The worker's known ends survive in its status file across crashes; a new worker
        # starts from what it sees.


# ---- the operator --------------------------------------------------------------------------


class Operator:
    """Follows the runbook from dr's datacenter: each command is a disaster_recovery
    procedure answered by the simulated clusters, one request a tick (Sleep waits). What to
    do next it reads off the clusters, as `topology plan` shows it (which side is the copy)."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.running: Generator[dr.Request, Any, Any] | None = None
        self.action = ""
        self.wake_ms = 0
        self.answer: Any = None
        self.error: BaseException | None = None
        self.pending = ""  # a command that was stopped, to run again if it still applies
        self.started_in = ""  # the state a pending promote started in
        self.east_gone_ticks = 0
        self.seen = "forward"

    def state(self) -> str:
        """forward, failed-over, reverse or promoting, as the markers say (the last seen while a
        cluster cannot be asked)."""
        sim = self.sim
        if not (sim.reachable(DR, sim.east) and sim.dr.up):
            return self.seen
        e, d = sim.east.topics.get(TOPIC), sim.dr.topics.get(TOPIC)
        if d is None:
            return "forward"  # the worker has not made the copy yet
        east_marked = e is not None and e.marker == topic_copy.mirror_source_value(DR, TOPIC)
        dr_marked = d is not None and d.marker == topic_copy.mirror_source_value(EAST, TOPIC)
        entry = sim.dr.ledger.get(TOPIC)
        failed_over = entry is not None and entry["state"] in (dr.FAILED_OVER, *dr.UNFINISHED_FAILBACK)
        self.seen = ("fenced" if mirror_fenced(d.marker) or (e is not None and mirror_fenced(e.marker)) else
                     "failed-over" if d.marker is None and failed_over else
                     "promoting" if east_marked and dr_marked else "forward" if dr_marked else
                     "reverse" if east_marked else "failed-over")
        return self.seen

    def start(self, action: str) -> None:
        sim = self.sim
        declared = {(EAST, TOPIC): {"min.insync.replicas": "1"}, (DR, TOPIC): {"min.insync.replicas": "1"}}
        if action == "failover":
            known, deleted = gather_worker_views([sim.status])
            step = dr.failover(FLOW, EAST, known=known, deleted_sources=deleted, timeout_s=30, declared=declared)
        elif action == "failback":
            step = dr.failback(FLOW, EAST, timeout_s=30, declared=declared)
        else:
            step = dr.promote(FLOW, EAST, timeout_s=30, declared=declared)
            self.started_in = self.state()
        self.running, self.action, self.answer, self.error = step, action, None, None
        sim.log(f"operator: {action}")

    def step(self) -> None:
        sim = self.sim
        if self.running is None:
            self.decide()
            return
        if sim.now_ms < self.wake_ms:
            return
        if sim.rng.random() < sim.kill_command_p:
            self.running.close()
            self.running, self.pending = None, self.action
            sim.log(f"operator: {self.action} killed")
            return
        try:
            request = self.running.send(self.answer) if self.error is None else self.running.throw(self.error)
        except StopIteration as done:
            self.finished(done.value)
            return
        except dr.FailoverError as exc:
            sim.log(f"operator: {self.action} refused: {exc}")
            self.running, self.pending = None, ""
            return
        except dr.Retriable as exc:
            sim.log(f"operator: {self.action} failed: {exc}")
            self.running, self.pending = None, self.action
            return
        self.answer, self.error = None, None
        try:
            self.answer = sim.answer(request)
        except Unreachable as exc:
            self.error = dr.Retriable(str(exc))
        if sim.trace and not isinstance(request, (dr.Now, dr.Say)):
            sim.log(f"    {request} -> {self.error or self.answer}")
        if isinstance(request, dr.Sleep):
            self.wake_ms = sim.now_ms + int(request.seconds * 1000)

    def finished(self, outcome: dr.Outcome) -> None:
        sim = self.sim
        self.running, self.pending = None, ""
        sim.log(f"operator: {self.action} done: {outcome.lines()}")
        if self.action == "failover":
            doc = outcome.as_json()
            east = sim.east.topics.get(TOPIC)
            if not outcome.source_reachable and east is not None:
                for row in doc["topics"].get(TOPIC, []):
                    # what the source has that the copy lacks (none when the source is behind:
                    # a failover during a promotion that had not caught up)
                    truth = max(0, east.logs[row["partition"]].end - row["end_offset"])
                    lower = row["rpo_records_at_least"]
                    if row["rpo_exact"] and lower != truth:
                        sim.violation(f"failover RPO called exact: {lower}, truth {truth} (partition "
                                      f"{row['partition']})")
                    if lower is not None and lower > truth:
                        sim.violation(f"failover RPO at least {lower} > truth {truth} (partition {row['partition']})")
                    seen_ms = row.get("source_known_at_ms", -1)
                    if row.get("source_known_end", -1) >= 0 and 0 <= seen_ms < east.created_ms:
                        sim.violation(f"failover RPO from a view of an older history: seen at {seen_ms} ms, the "
                                      f"source topic created at {east.created_ms} ms (partition {row['partition']})")
        elif self.action == "failback":
            counted = sum(p.diverged_records for p in outcome.topics.get(TOPIC, []))
            entry = sim.dr.ledger[TOPIC]
            aside = sim.side_records(entry["failover_id"])
            if aside != counted:
                sim.violation(f"failback counted {counted} diverged record(s), {aside} are aside")
        self.follow_primary()

    def follow_primary(self) -> None:
        """The runbook's last step: the applications move to the primary."""
        state = self.state()
        primary = {"forward": self.sim.east, "failed-over": self.sim.dr, "reverse": self.sim.dr}.get(state)
        if primary is not None and primary is not self.sim.primary:
            self.sim.move_apps(primary)

    def decide(self) -> None:
        sim = self.sim
        east_reachable = sim.reachable(DR, sim.east)
        self.east_gone_ticks = 0 if east_reachable else self.east_gone_ticks + 1
        if not sim.dr.up:
            return
        state = self.state()
        self.follow_primary()
        if self.pending:
            if sim.rng.random() < 0.2:
                if self.pending == "promote" and state != "promoting" and state != self.started_in:
                    sim.log(f"operator: the stopped promote went through ({state})")
                    self.pending = ""
                    return
                self.start(self.pending)
            return
        if state == "promoting":
            self.start("promote")
        elif state == "fenced" and east_reachable:
            # A failover or failback that stopped (`topology plan` says fenced): run it again.
            d = sim.dr.topics.get(TOPIC)
            self.start("failover" if d is not None and mirror_fenced(d.marker) else "failback")
        elif state == "forward" and self.east_gone_ticks > 30 and sim.failovers_left > 0:
            sim.failovers_left -= 1
            self.start("failover")
        elif state == "failed-over" and east_reachable and sim.rng.random() < 0.1:
            self.start("failback")
        elif state == "reverse" and east_reachable and sim.copy_caught_up(reverse=True) and \
                sim.rng.random() < (0.2 if not sim.faulting else 0.02):
            self.start("promote")
        elif state == "forward" and east_reachable and sim.faulting and sim.rng.random() < sim.planned_promote_p:
            self.start("promote")
        elif sim.faulting and sim.rng.random() < sim.wrong_command_p:
            self.start(sim.rng.choice(["failover", "failback", "promote"]))


# ---- the simulation --------------------------------------------------------------------------


@dataclass
class Result:
    seed: int
    violations: list[str]
    stats: dict[str, int]
    log: list[str]


class Simulation:
    def __init__(self, seed: int, *, faults_ticks: int = 600, settle_ticks: int = 1500, trace: bool = False) -> None:
        self.seed = seed
        self.trace = trace
        self.rng = random.Random(seed)
        self.tick = 0
        self.topic_ids = 0
        self.faults_ticks, self.settle_ticks = faults_ticks, settle_ticks
        self.faulting = True
        self.violations: list[str] = []
        self.events: list[str] = []
        self.east = SimCluster(EAST, self)
        self.dr = SimCluster(DR, self)
        self.link_cut = False
        self.acked: dict[str, Acked] = {}
        self.unacknowledged: set[str] = set()
        self.committed_txns: list[list[str]] = []
        self.aborted_txns: list[list[str]] = []
        self.open_txns: list[list[str]] = []
        self.status: dict[str, Any] = {}
        self.failovers_left = self.rng.randint(1, 2)
        # The kinds of fault this seed draws (each seed a mix).
        self.kill_command_p = self.rng.choice([0.0, 0.01, 0.03])
        self.wrong_command_p = self.rng.choice([0.0, 0.002, 0.01])
        self.planned_promote_p = self.rng.choice([0.0, 0.002, 0.005])
        self.worker_crash_p = self.rng.choice([0.0, 0.005, 0.02])
        self.cut_p = self.rng.choice([0.0, 0.01, 0.03])
        self.east_loss_p = self.rng.choice([0.003, 0.006, 0.01])
        self.dr_loss_p = self.rng.choice([0.0, 0.0, 0.002])
        self.partitions = self.rng.randint(1, 3)
        self.worker = SimWorker(self)
        self.operator = Operator(self)
        self.apps: list[Any] = []
        self.consumer: ConsumerApp | None = None
        self.primary = self.east
        self.app_seq = 0
        self.moves: list[tuple[int, dict[int, int], dict[int, int]]] = []
        self.group_high: dict[int, int] = {}  # the highest offset the group ever committed, per partition

    # ---- time, reachability, log
    @property
    def now_ms(self) -> int:
        return 1_700_000_000_000 + self.tick * TICK_MS

    def reachable(self, from_dc: str, c: SimCluster) -> bool:
        return c.up and not (self.link_cut and from_dc != c.name)

    def log(self, text: str) -> None:
        self.events.append(f"[{self.tick}] {text}")

    def violation(self, text: str) -> None:
        self.violations.append(f"seed {self.seed} tick {self.tick}: {text}")

    def new_txn(self, records: list[str]) -> list[str]:
        return list(records)

    def side_records(self, failover_id: str | None = None) -> int:
        """Records in the side topic (of one failover)."""
        t = self.dr.topics.get(SIDE_TOPIC)
        want = None if failover_id is None else failover_id.encode()
        return sum(1 for lg in t.logs for _, r in lg.committed()
                   if want is None or dict(r.headers).get(dr.DIVERGED_FAILOVER) == want) if t else 0

    # ---- checkers while running
    def check_ack(self, c: SimCluster, t: SimTopic, p: int, base: int, batch: SimBatch, who: str) -> None:
        """No acknowledgement without its record: the batch at `base` is this one."""
        found = next((b for b in t.logs[p].batches if b.base == base), None)
        if found is None or (found.producer_id, found.epoch, found.sequence, found.records) != \
                (batch.producer_id, batch.epoch, batch.sequence, batch.records):
            self.violation(f"{who}: {c.name}/{TOPIC}-{p} acknowledged producer {batch.producer_id} sequence "
                           f"{batch.sequence} ({[r.value for r in batch.records]}) at offset {base}, which holds "
                           f"{None if found is None else (found.producer_id, found.sequence, [r.value for r in found.records])}")

    def check_groups(self) -> None:
        for c in (self.east, self.dr):
            for (g, topic, p), offset in c.groups.items():
                t = c.topics.get(topic)
                if t is not None and p < len(t.logs) and offset > t.logs[p].end:
                    self.violation(f"group {g} committed {offset} in {c.name}/{topic}-{p}, past its end "
                                   f"{t.logs[p].end}")

    # ---- apps
    def start_apps(self, c: SimCluster) -> None:
        self.app_seq += 1
        made = [IdempotentApp(self, c, f"{c.name}-i{self.app_seq}"), TransactionalApp(self, c, f"{c.name}-t{self.app_seq}")]
        for app in made:
            app.stopped = not self.faulting  # the faults stopped: the workload is over
        self.apps += made

    def move_apps(self, c: SimCluster) -> None:
        """The runbook's last step: producers and consumers move to the new primary; some of
        the old ones are left running against the old one for a while."""
        for app in self.apps:
            if app.cluster is not c and (not self.faulting or self.rng.random() < 0.7):
                app.stopped = True
        if self.consumer is not None and self.consumer.cluster is not c:
            old = self.consumer.cluster
            before = {p: o for (g, _, p), o in old.groups.items() if g == GROUP}
            after = {p: o for (g, _, p), o in c.groups.items() if g == GROUP}
            self.moves.append((self.tick, before, after))
            for p, o in after.items():
                # Never past anything the group committed (offsets mean the same on both sides).
                if o > max(before.get(p, 0), self.group_high.get(p, 0)):
                    self.violation(f"group {GROUP} resumes in {c.name} at {o} in partition {p}, past its "
                                   f"{before.get(p)} in {old.name} and anything it committed ({self.group_high.get(p)})")
        self.consumer = ConsumerApp(self, c)
        self.primary = c
        self.start_apps(c)

    # ---- answers to the operator's requests
    def side(self, side: str) -> SimCluster:
        c = self.east if side == "source" else self.dr
        if not self.reachable(DR, c):
            raise Unreachable(f"{c.name} is unreachable")
        return c

    def answer(self, r: dr.Request) -> Any:  # noqa: C901 - one case per request
        if isinstance(r, dr.Say):
            self.log(f"  {r.text}")
            return None
        if isinstance(r, dr.Now):
            return self.now_ms
        if isinstance(r, dr.Sleep):
            return None
        if isinstance(r, dr.Reachable):
            return self.reachable(DR, self.east if r.side == "source" else self.dr)
        if isinstance(r, dr.ReadLedger):
            c = self.side("target")
            return {k: dr.LedgerEntry.from_json(v) for k, v in c.ledger.items() if v["flow"] == FLOW.name}
        if isinstance(r, dr.WriteLedger):
            self.side("target").ledger[r.entry.target_topic] = r.entry.as_json()
            return None
        c = self.side(r.side)
        if isinstance(r, dr.ListTopics):
            return {name: len(t.logs) for name, t in c.topics.items()}
        t = c.topics.get(r.topic)
        if isinstance(r, dr.GetMarker):
            return t.marker if t else None
        if isinstance(r, dr.CreateTopic):
            c.create_topic(r.topic, r.partitions, dict(r.configs))
            return None
        if isinstance(r, dr.Produce):
            c.create_topic(r.topic, r.partitions, {})
            for p, rec in r.records:
                lg = c.topics[r.topic].logs[p]
                lg._append(SimBatch(lg.end, (SimRecord(rec.value.decode() if rec.value else "", rec.headers),)))
            return None
        if isinstance(r, dr.GetEnds):
            if t is None:
                return {}
            return {p: (t.logs[p].lso() if r.committed else t.logs[p].end) for p in range(r.partitions)}
        if t is None:
            raise Unreachable(f"no topic {r.topic} in {c.name}")  # as the admin's UNKNOWN_TOPIC_OR_PARTITION
        if isinstance(r, dr.SetMarker):
            c.set_marker(r.topic, r.marker)
            return None
        if isinstance(r, dr.GetOpenTxns):
            lg = t.logs[r.partition]
            return [dr.OpenTxn(pid, lg.state.producers[pid].epoch, lg.state.producers[pid].coordinator_epoch, first)
                    for pid, first in sorted(lg.state.ongoing.items()) if pid in lg.state.producers]
        if isinstance(r, dr.AbortTxn):
            t.logs[r.partition].marker(r.txn.producer_id, r.txn.producer_epoch, ABORT,
                                       max(0, r.txn.coordinator_epoch), mirror=t.marker is not None)
            return None
        if isinstance(r, dr.EndTxns):
            ids = {m.producer_id: m for m in c.txns.values()}
            for txn in r.txns:
                meta = ids.get(txn.producer_id)
                # Its coordinator ends it only while that id's transaction is open on this
                # partition (DescribeTransactions); else it is hanging (a copy's transaction of
                # the other cluster, whose producer id only collides with one of this cluster).
                if meta is not None and meta.state != "empty" and (r.topic, r.partition) in meta.partitions:
                    if c.init_producer_id(meta.txn_id) is None:
                        c.init_producer_id(meta.txn_id)
                else:
                    t.logs[r.partition].marker(txn.producer_id, txn.producer_epoch, ABORT,
                                               max(0, txn.coordinator_epoch), mirror=t.marker is not None)
            return None
        if isinstance(r, dr.GetConfigs):
            return dict(t.configs)
        if isinstance(r, dr.AlterConfigs):
            t.configs.update(dict(r.set))
            for k in r.delete:
                t.configs.pop(k, None)
            return None
        if isinstance(r, dr.DeleteTopic):
            c.delete_topic(r.topic)
            return None
        if isinstance(r, dr.ReadRecords):
            lg = t.logs[r.partition]
            return [dr.Rec(o, None, rec.value.encode(), rec.headers, -1) for o, rec in lg.committed(r.start, r.end)]
        raise AssertionError(f"no answer for {r!r}")

    # ---- the end
    def copy_caught_up(self, *, reverse: bool) -> bool:
        src, dst = (self.dr, self.east) if reverse else (self.east, self.dr)
        st, tt = src.topics.get(TOPIC), dst.topics.get(TOPIC)
        return (st is not None and tt is not None and tt.marker == topic_copy.mirror_source_value(src.name, TOPIC)
                and all(a.end == b.end for a, b in zip(st.logs, tt.logs, strict=False)))

    def step(self) -> None:
        rng = self.rng
        if self.faulting:
            if rng.random() < self.east_loss_p:
                self.east.up = not self.east.up
                self.log(f"east {'back' if self.east.up else 'lost (kill -9 of the datacenter)'}")
            if rng.random() < self.dr_loss_p:
                self.dr.up = not self.dr.up
                self.log(f"dr {'back' if self.dr.up else 'lost'}")
            if rng.random() < self.cut_p:
                self.link_cut = not self.link_cut
                self.log(f"link east-dr {'cut' if self.link_cut else 'healed'}")
            if rng.random() < self.worker_crash_p:
                self.worker.alive = not self.worker.alive
                if self.worker.alive:
                    self.worker.start()
                self.log(f"worker {'restarted' if self.worker.alive else 'killed -9'}")
        for c in (self.east, self.dr):
            if c.up:
                c.coordinator_tick(self.tick)
        actors: list[Callable[[], None]] = [*(a.step for a in self.apps), self.worker.step, self.operator.step]
        if self.consumer is not None:
            actors.append(self.consumer.step)
        rng.shuffle(actors)
        for act in actors:
            act()
        self.check_groups()
        self.tick += 1

    def settle(self) -> None:
        """Faults stop: everything back, the runbook run to its end, the copy caught up."""
        self.faulting = False
        self.east.up = self.dr.up = True
        self.link_cut = False
        if not self.worker.alive:
            self.worker.alive = True
            self.worker.start()
        for app in self.apps:
            app.stopped = True
        self.kill_command_p = 0.0
        for _ in range(self.settle_ticks):
            self.step()
            in_flight = any(getattr(a, "in_flight", None) or getattr(a, "current", None) for a in self.apps)
            if self.operator.running is None and not in_flight and not self.operator.pending:
                state = self.operator.state()
                if state in ("forward", "reverse") and self.primary is (self.east if state == "forward" else self.dr):
                    if self.copy_caught_up(reverse=state == "reverse") and \
                            not any(m.state != "empty" for c in (self.east, self.dr) for m in c.txns.values()):
                        return
            for app in self.apps:
                if isinstance(app, TransactionalApp) and app.current:
                    app.step()  # finish what is open
        self.violation(f"not settled after {self.settle_ticks} ticks: state {self.operator.state()}, pending "
                       f"{self.operator.pending!r}, running {self.operator.action if self.operator.running else None}, "
                       f"worker {[(d.reverse, d.copying, d.refused, {p: (c.state, c.position, c.why) for p, c in d.partitions.items()}) for d in self.worker.directions]}")

    def final_checks(self) -> None:
        primary = self.dr if self.operator.state() == "reverse" else self.east
        copy = self.east if primary is self.dr else self.dr
        pt, ct = primary.topics.get(TOPIC), copy.topics.get(TOPIC)
        if pt is None or ct is None:
            self.violation(f"a side has no {TOPIC}: {primary.name} {pt is not None}, {copy.name} {ct is not None}")
            return
        if pt.marker is not None or ct.marker != topic_copy.mirror_source_value(primary.name, TOPIC):
            self.violation(f"roles at the end: {primary.name} marker {pt.marker!r}, {copy.name} marker {ct.marker!r}")
        for p, (a, b) in enumerate(zip(pt.logs, ct.logs, strict=True)):
            mine = [x.identity() for x in a.batches if x.base >= b.log_start]
            theirs = [x.identity() for x in b.batches if x.base >= a.log_start]
            if mine != theirs:
                first = next((i for i, (x, y) in enumerate(zip(mine, theirs, strict=False)) if x != y), None)
                self.violation(f"{copy.name}/{TOPIC}-{p} is no byte-identical copy of {primary.name}'s: "
                               f"{len(theirs)} vs {len(mine)} batches, first difference at batch {first}")
        seen: dict[str, int] = {}
        for lg in pt.logs:
            for _, r in lg.committed():
                seen[r.value] = seen.get(r.value, 0) + 1
        side = self.dr.topics.get(SIDE_TOPIC)
        aside: dict[str, int] = {}
        for lg in side.logs if side else []:
            for _, r in lg.committed():
                aside[r.value] = aside.get(r.value, 0) + 1
        for v, a in self.acked.items():
            n, m = seen.get(v, 0), aside.get(v, 0)
            if n + m != 1:
                self.violation(f"acknowledged {v} (by {a.cluster}) is {n} time(s) in {primary.name}/{TOPIC} and "
                               f"{m} aside")
        for txns, what in ((self.aborted_txns, "aborted"), (self.open_txns, "left open")):
            for txn in txns:
                shown = [v for v in txn if v in seen or v in aside]
                if shown:
                    self.violation(f"a transaction {what} is read committed: {shown}")
        for txn in self.committed_txns:
            shown = [v for v in txn if v in seen or v in aside]
            if shown and len(shown) != len(txn):
                self.violation(f"a committed transaction is read in part: {shown} of {txn}")

    def run(self) -> Result:
        self.east.create_topic(TOPIC, self.partitions, {"min.insync.replicas": "1"})
        self.start_apps(self.east)
        self.consumer = ConsumerApp(self, self.east)
        for _ in range(self.faults_ticks):
            self.step()
        self.settle()
        if not any("not settled" in v for v in self.violations):
            self.final_checks()
        stats = {"acked": len(self.acked), "committed_txns": len(self.committed_txns),
                 "aborted_txns": len(self.aborted_txns), "open_txns": len(self.open_txns),
                 "failovers": sum(1 for e in self.events if "operator: failover done" in e),
                 "failbacks": sum(1 for e in self.events if "operator: failback done" in e),
                 "promotes": sum(1 for e in self.events if "operator: promote done" in e),
                 "killed_commands": sum(1 for e in self.events if "killed" in e and "operator" in e),
                 "aside": self.side_records(), "ticks": self.tick}
        return Result(self.seed, self.violations, stats, self.events)


def run(seed: int, **kwargs: Any) -> Result:
    return Simulation(seed, **kwargs).run()
