"""A whole Raft quorum in one process: simulated network, disk and clock, driven by a seed.

The network drops, delays, duplicates and reorders messages and partitions nodes; nodes
crash (sometimes mid-step, losing what they had not persisted) and restart from their
durable state. Checkers: at most one leader per epoch, committed entries never lost or
changed (and present in every new leader), logs match. A failing seed replays exactly:
`DCMIRROR_RAFT_SEED=<seed> pytest tests/unit/test_raft_sim.py`.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from cluster.quorum.raft import DurableState, Entry, Message, RaftConfig, RaftNode, Role


class SafetyViolation(AssertionError):
    pass


@dataclass
class Faults:
    drop: float = 0.05
    duplicate: float = 0.03
    max_delay_ms: int = 30
    crash_every_ms: int = 2500  # mean time between crashes (any node)
    crash_mid_step: float = 0.3  # of crashes: during a step, before persisting
    down_ms: tuple[int, int] = (200, 2500)
    partition_every_ms: int = 3000
    partition_ms: tuple[int, int] = (300, 3000)


@dataclass(order=True)
class _Event:
    at_ms: int
    seq: int
    kind: str = field(compare=False)
    node: int = field(compare=False)
    sender: int = field(compare=False, default=-1)
    msg: Message | None = field(compare=False, default=None)


class QuorumSim:
    def __init__(self, seed: int, *, nodes: int = 5, observers: int = 0, duration_ms: int = 8000,
                 settle_ms: int = 6000, faults: Faults | None = None, config: RaftConfig | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.voter_ids = list(range(1, nodes + 1))
        # Observers (brokers beside dedicated controllers) fetch the log but never vote.
        self.ids = self.voter_ids + list(range(nodes + 1, nodes + observers + 1))
        self.duration_ms = duration_ms
        self.settle_ms = settle_ms
        self.faults = faults or Faults()
        self.config = config or RaftConfig()
        self.now = 0
        self._seq = 0
        self._queue: list[_Event] = []
        self.durable: dict[int, DurableState] = {i: DurableState() for i in self.ids}
        self.nodes: dict[int, RaftNode | None] = {i: self._boot(i) for i in self.ids}
        self._tick_at: dict[int, int] = {}
        self.isolated: set[int] = set()
        self.leaders_by_epoch: dict[int, int] = {}
        self.committed: list[Entry] = []
        self._checked: dict[int, tuple[RaftNode, int, Entry]] = {}  # node id: (node, checked up to, entry there - 1)
        self.proposed = 0
        self.committed_when_faults_stopped = -1
        self.stats = {"events": 0, "crashes": 0, "partitions": 0, "elections": 0, "snapshots": 0, "resignations": 0}
        self._faults_on = True
        self.max_events = 40 * (duration_ms + settle_ms) * nodes // 10

    # ---- plumbing ----------------------------------------------------------------------

    def _boot(self, node_id: int) -> RaftNode:
        node_rng = random.Random(self.rng.getrandbits(64))
        return RaftNode(node_id, self.voter_ids, self.durable[node_id].copy(), self.config, node_rng, self.now)

    def _push(self, at_ms: int, kind: str, node: int, sender: int = -1, msg: Message | None = None) -> None:
        self._seq += 1
        heapq.heappush(self._queue, _Event(at_ms, self._seq, kind, node, sender, msg))

    def _schedule_tick(self, node_id: int) -> None:
        node = self.nodes[node_id]
        if node is None:
            return
        at = max(self.now, node.next_deadline_ms())
        if self._tick_at.get(node_id) != at:
            self._tick_at[node_id] = at
            self._push(at, "tick", node_id)

    def _connected(self, a: int, b: int) -> bool:
        return (a in self.isolated) == (b in self.isolated)

    def _after_step(self, node_id: int, before: DurableState, was_leader: bool) -> None:
        node = self.nodes[node_id]
        assert node is not None
        if self._faults_on and self.rng.random() < self.faults.crash_mid_step / 1000:
            # Crash before the step's state reached the disk: it and its messages are lost.
            self.durable[node_id] = before
            self._crash(node_id)
            return
        if node.dirty:
            self.durable[node_id] = node.durable_state().copy()
        for to, msg in node.take_outbox():
            if not self._connected(node_id, to) or self.rng.random() < self.faults.drop:
                continue
            copies = 2 if self.rng.random() < self.faults.duplicate else 1
            for _ in range(copies):
                self._push(self.now + self.rng.randint(1, self.faults.max_delay_ms), "deliver", to, node_id, msg)
        if node.role is Role.LEADER and not was_leader:
            self._on_new_leader(node)
        self._check_node(node)
        self._schedule_tick(node_id)

    def _crash(self, node_id: int) -> None:
        self.nodes[node_id] = None
        self._tick_at.pop(node_id, None)
        self.stats["crashes"] += 1
        self._push(self.now + self.rng.randint(*self.faults.down_ms), "restart", node_id)

    # ---- checkers ----------------------------------------------------------------------

    def _fail(self, what: str) -> None:
        raise SafetyViolation(f"seed {self.seed} at {self.now} ms: {what} "
                              f"(replay: DCMIRROR_RAFT_SEED={self.seed} pytest tests/unit/test_raft_sim.py)")

    def _on_new_leader(self, node: RaftNode) -> None:
        self.stats["elections"] += 1
        if node.node_id not in self.voter_ids:
            self._fail(f"observer {node.node_id} became leader in epoch {node.epoch}")
        prior = self.leaders_by_epoch.setdefault(node.epoch, node.node_id)
        if prior != node.node_id:
            self._fail(f"two leaders in epoch {node.epoch}: {prior} and {node.node_id}")
        # Leader completeness: every committed entry is in the new leader's log.
        for offset, entry in enumerate(self.committed):
            if offset >= node.state.log_start_offset and (
                offset >= node.log_end_offset or node.entry(offset) != entry
            ):
                self._fail(f"new leader {node.node_id} (epoch {node.epoch}) lacks committed offset {offset}")

    def _check_node(self, node: RaftNode, *, full: bool = False) -> None:
        """Each committed entry the node holds is the one committed at that offset.

        After a step only offsets past the last check are read, unless the entry that
        ended the last check is gone or replaced (the core changes its log only by
        appends, truncations and snapshots, each of which that detects); every 500
        events and at the end each live node is read in full."""
        start = node.state.log_start_offset
        first = max(start, 0)
        seen = self._checked.get(node.node_id)
        if not full and seen is not None and seen[0] is node:
            checked_to, anchor = seen[1], seen[2]
            if start < checked_to <= min(node.high_watermark, node.log_end_offset) and \
                    node.entry(checked_to - 1) is anchor:
                first = checked_to
        if node.high_watermark > node.log_end_offset:
            self._fail(f"node {node.node_id} high watermark {node.high_watermark} past its log end")
        offset = first
        while offset < node.high_watermark:
            entry = node.entry(offset)
            if offset < len(self.committed):
                if self.committed[offset] != entry:
                    self._fail(f"node {node.node_id} committed {entry} at {offset}, "
                               f"others committed {self.committed[offset]}")
            elif offset == len(self.committed):
                self.committed.append(entry)
            else:
                # The node's snapshot covers offsets the checker has not seen committed: fine.
                break
            offset += 1
        if offset > max(start, 0):
            self._checked[node.node_id] = (node, offset, node.entry(offset - 1))

    def check_logs_match(self) -> None:
        """Log matching: same epoch at an offset means identical prefixes (where both hold them)."""
        live = [n for n in self.nodes.values() if n is not None]
        for node in live:
            self._check_node(node, full=True)
        for i, a in enumerate(live):
            for b in live[i + 1 :]:
                lo = max(a.state.log_start_offset, b.state.log_start_offset)
                hi = min(a.log_end_offset, b.log_end_offset)
                last_same = None
                for offset in range(hi - 1, lo - 1, -1):
                    if a.entry(offset).epoch == b.entry(offset).epoch:
                        last_same = offset
                        break
                if last_same is None:
                    continue
                for offset in range(lo, last_same + 1):
                    if a.entry(offset) != b.entry(offset):
                        self._fail(f"logs of {a.node_id} and {b.node_id} differ at {offset} "
                                   f"below matching offset {last_same}")

    # ---- the run -----------------------------------------------------------------------

    def run(self) -> QuorumSim:
        for node_id in self.ids:
            self._schedule_tick(node_id)
        self._push(self.rng.randint(0, self.faults.crash_every_ms), "crash", 0)
        self._push(self.rng.randint(0, self.faults.partition_every_ms), "partition", 0)
        self._push(100, "propose", 0)
        end_faults = self.duration_ms
        end = self.duration_ms + self.settle_ms
        while self._queue:
            event = heapq.heappop(self._queue)
            if event.at_ms > end:
                break
            self.now = event.at_ms
            self._faults_on = self.now < end_faults
            if not self._faults_on and self.committed_when_faults_stopped < 0:
                self.committed_when_faults_stopped = len(self.committed)
            self.stats["events"] += 1
            if self.stats["events"] > self.max_events:
                self._fail(f"livelock: more than {self.max_events} events")
            try:
                self._handle(event, faults_on=self.now < end_faults)
            except SafetyViolation:
                raise
            except AssertionError as exc:  # an invariant the core asserts about itself
                self._fail(f"node {event.node} on {event.kind}: {exc}")
            if self.stats["events"] % 500 == 0:
                self.check_logs_match()
        self.check_logs_match()
        return self

    def _handle(self, e: _Event, *, faults_on: bool) -> None:
        if e.kind == "tick":
            node = self.nodes[e.node]
            if node is None or self._tick_at.get(e.node) != e.at_ms:
                return
            del self._tick_at[e.node]
            before, was_leader = self.durable[e.node], node.role is Role.LEADER
            node.tick(self.now)
            self._after_step(e.node, before, was_leader)
        elif e.kind == "deliver":
            node = self.nodes[e.node]
            if node is None or not self._connected(e.sender, e.node):
                return
            assert e.msg is not None
            before, was_leader = self.durable[e.node], node.role is Role.LEADER
            node.receive(e.sender, e.msg, self.now)
            self._after_step(e.node, before, was_leader)
        elif e.kind == "restart":
            if self.nodes[e.node] is None:
                self.nodes[e.node] = self._boot(e.node)
                self._schedule_tick(e.node)
        elif e.kind == "crash":
            if faults_on:
                victim = self.rng.choice(self.ids)
                if self.nodes[victim] is not None:
                    self._crash(victim)
                self._push(self.now + self.rng.randint(1, 2 * self.faults.crash_every_ms), "crash", 0)
        elif e.kind == "partition":
            if faults_on and not self.isolated:
                size = self.rng.randint(1, len(self.ids) // 2)
                self.isolated = set(self.rng.sample(self.ids, size))
                self.stats["partitions"] += 1
                self._push(self.now + self.rng.randint(*self.faults.partition_ms), "heal", 0)
            if faults_on:
                self._push(self.now + self.rng.randint(1, 2 * self.faults.partition_every_ms), "partition", 0)
        elif e.kind == "heal":
            self.isolated = set()
        elif e.kind == "propose":
            for node_id, node in self.nodes.items():
                if node is not None and node.role is Role.LEADER:
                    before = self.durable[node_id]
                    self.proposed += 1
                    node.propose(f"{self.seed}:{self.proposed}".encode(), self.now)
                    if self.rng.random() < 0.02 and node.high_watermark - node.state.log_start_offset > 20:
                        node.snapshot(node.high_watermark, b"image")
                        self.stats["snapshots"] += 1
                    if self._faults_on and self.rng.random() < 0.005:
                        node.resign(self.now)  # a controlled shutdown's step-down
                        self.stats["resignations"] += 1
                    self._after_step(node_id, before, True)
            self._push(self.now + self.rng.randint(5, 60), "propose", 0)

    # ---- after the run -----------------------------------------------------------------

    def leader(self) -> RaftNode | None:
        leaders = [n for n in self.nodes.values() if n is not None and n.role is Role.LEADER]
        return max(leaders, key=lambda n: n.epoch) if leaders else None
