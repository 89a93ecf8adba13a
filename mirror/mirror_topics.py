"""Mirror topics: a flow that keeps offsets (topology `mirror_topics = true`).

One worker of such a flow is a member of the consumer group `dcmirror.<source>.<target>` on
the source, as a record-copying worker is, but it copies whole record batches: it fetches
them at read_uncommitted with a consumer that never decodes them (data, transactional and
control batches alike) and appends them into the target partition at their own offsets
with the target's MirrorAppend (cluster/protocol/internal.py), as a follower appends what
its leader sent. The target's log is the position: a partition is resumed at the target
partition's log end, so nothing is committed for correctness (the source group's offsets
follow behind, for lag and tools), and an append that was done but not answered is skipped
by the target when it comes again.

The target topic carries `mirror.source = "<cluster>:<topic>"`, which makes it read-only
for producers; removing it (`dcmirror mirror promote|failover`) makes it an ordinary topic.
A target topic of the same name without that config is never written into.
"""

from __future__ import annotations

import collections
import logging
import socket
import struct
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import trio

from cluster.client.admin import Admin, AdminError
from cluster.client.consumer import Consumer, PartitionError, RawChunk
from cluster.client.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError
from cluster.client.mirror_append import mirror_append
from cluster.common.admin_http import prometheus_text
from cluster.common.clock import SYSTEM_CLOCK, Clock
from cluster.protocol.errors import ErrorCode
from mirror import flow_control, tail
from mirror.core import topic_copy
from mirror.core.topic_copy import (
    CONFIG_EXCLUDES,
    MIRROR_SOURCE_CONFIG,
    mirror_source_value,
)
from mirror.topic_sync import TopicSync
from mirror.worker import (
    INTERNAL_PREFIXES,
    FlowWorker,
    WorkerConfig,
    _admin_part,
    _topic_id,
    group_id,
)
from topology.model import MirrorSpec, Topology

log = logging.getLogger("dcmirror.mirror.topics")

RETRIABLE = (KafkaError, KafkaConnectionError, KafkaTimeoutError, OSError)
TopicPartition = tuple[str, int]
APPEND_TIMEOUT_S = 30.0
# Fetch connections per source broker (a flow's num.replica.fetchers, unless it says): over a
# 100 ms round trip one fetch in flight gave 0.62x of the loopback rate, four 0.85-0.91x
# (tests/perf/test_mirror_topics.py -k wan); on loopback they cost nothing.
REPLICA_FETCHERS = 4
ROUND_MAX_BYTES = 16 << 20  # raw batches taken from the consumer per round of appends
# Partition states (status, metrics): copying; waiting to be claimed again after an error;
# stopped for an operator (a divergence the mirror must not repair on its own).
ACTIVE, CLAIMING, FAILED = "ACTIVE", "CLAIMING", "FAILED"
PAUSED = "PAUSED"  # shown for an ACTIVE partition while its flow is paused (status and metrics only)


@dataclass
class TopicPartitionMirror:
    source: TopicPartition
    target: TopicPartition
    state: str = CLAIMING
    position: int = -1  # next source offset to copy (= the target's log end)
    target_log_end: int = -1
    batches: int = 0
    records: int = 0
    bytes: int = 0
    last_error: str = ""
    appended_at_ms: int = 0
    last_timestamp_ms: int = -1  # the max timestamp of the last batch copied
    log_start_sent: int = -1  # the source's log start the target was last told
    target_topic_id: uuid.UUID | None = None  # the target incarnation of the last claim


_BATCH_HEAD = struct.Struct(">qi")  # base offset, batch length
_MAX_TIMESTAMP_AT = 35  # maxTimestamp (int64) within a v2 record batch


def last_max_timestamp(data: bytes) -> int:
    """The maxTimestamp of the last whole v2 batch in `data` (-1: none)."""
    pos, found = 0, -1
    while pos + 12 <= len(data):
        _, length = _BATCH_HEAD.unpack_from(data, pos)
        end = pos + 12 + length
        if length <= 0 or end > len(data):
            break
        if data[pos + 16] == 2 and pos + _MAX_TIMESTAMP_AT + 8 <= end:
            (found,) = struct.unpack_from(">q", data, pos + _MAX_TIMESTAMP_AT)
        pos = end
    return found


class TopicMirrorWorker(FlowWorker):
    """One worker of a flow with mirror topics (see the module docstring), in one direction:
    the flow's (`reverse` False: its source's topics into mirror topics in its target) or,
    after a failover, back (`reverse`: the target's topics into the source's topics that were
    made mirror topics of them, docs/design.md "Failover and failback")."""

    def __init__(self, topology: Topology, flow: MirrorSpec, name: str | None = None, *,
                 reverse: bool = False, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self.topology = topology
        self.flow = flow
        self.reverse = reverse
        self.name = name or f"{flow.name}-{socket.gethostname()}-{id(self) & 0xFFFF:x}"
        # The clusters copied from and into in this direction (the flow's source and target,
        # or the other way round).
        self.source_name, self.target_name = (flow.target, flow.source) if reverse else (flow.source, flow.target)
        self.source = topology.cluster(self.source_name)
        self.target = topology.cluster(self.target_name)
        self.config = WorkerConfig.from_flow(flow)
        self.partitions: dict[TopicPartition, TopicPartitionMirror] = {}
        self.topics: dict[str, str] = {}  # source topic -> target topic
        self.refused_topics: dict[str, str] = {}  # source topic -> why its target is not written
        self.metrics: dict[str, Any] = {"records": 0, "bytes": 0, "batches": 0, "appends": 0, "claims": 0,
                                        "data_loss_records": 0, "started_ms": clock.now_ms()}
        self.events: collections.deque[dict[str, Any]] = collections.deque(maxlen=50)
        # The source's high watermark as last seen and when (wall-clock ms), kept after the
        # partition is revoked (a source that dies takes the group with it): `mirror failover`
        # reports what is known of the RPO from it.
        self.source_known_ends: dict[TopicPartition, tuple[int, int]] = {}
        self.last_problem: dict[str, Any] | None = None
        self._consumer: Consumer | None = None
        self._source_admin: Admin | None = None
        self._target_admin: Admin | None = None
        self._target_ids: dict[str, uuid.UUID] = {}
        self._source_names: set[str] = set()  # every topic of the cluster copied from, as last listed
        self._stopping = trio.Event()
        self._stopped = trio.Event()
        self._reclaim = trio.Event()
        # Group offsets and ACLs of the mirrored topics follow the side copied from
        # (mirror/topic_sync.py; in reverse the principal map is read backwards).
        self.topic_sync = TopicSync.from_flow(flow, reverse=reverse, clock=clock)
        # The flow's pause state lives in the flow's target: copied into in this direction, copied
        # from in reverse. Both directions pause with the flow.
        self.flow_pause = flow_control.FlowPause(flow.name)

    # ---- setup ----------------------------------------------------------------------

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        c = self.config
        source_client = self.source.client_config(c.target if self.reverse else c.source)
        target_client = self.target.client_config(c.source if self.reverse else c.target)
        consumer_config = {**source_client, "client.id": self.name, "group.id": self.group,
                           "group.instance.id": self.name,  # static membership (KIP-345), as the record flow's
                           "enable.auto.commit": False, "auto.offset.reset": "none",
                           # Everything the source holds: aborted data and markers are copied too,
                           # so read_committed on the copy answers as on the source.
                           "isolation.level": "read_uncommitted",
                           "session.timeout.ms": 10000, "heartbeat.interval.ms": 1000,
                           "metadata.max.age.ms": int(c.topic_refresh_s * 1000),
                           "fetch.max.bytes": 128 << 20, "max.partition.fetch.bytes": 16 << 20,
                           "queued.max.messages.kbytes": 128 << 10,
                           "client.rack": self.target.datacenter, **c.consumer}
        async with Admin(self.source.bootstrap(), client_id=self.name, config=_admin_part(source_client)) as sadmin, \
                Admin(self.target.bootstrap(), client_id=self.name, config=_admin_part(target_client)) as tadmin, \
                Consumer(consumer_config, raw_batches=True, fetch_lanes=c.replica_fetchers or REPLICA_FETCHERS) as consumer:
            self._source_admin, self._target_admin, self._consumer = sadmin, tadmin, consumer
            await self._sync_topics()
            control = sadmin if self.reverse else tadmin  # the flow's target
            if not self.reverse:
                try:
                    await flow_control.ensure_topic(tadmin, cluster_name=self.flow.target)
                except (*RETRIABLE, flow_control.FlowControlDenied) as exc:
                    log.warning("creating %s: %s", flow_control.FLOW_CONTROL_TOPIC, exc)
            await self._read_flow_control(control.cluster, self.flow.target)
            consumer.subscribe(sorted(self.topics), on_assign=self._on_assign, on_revoke=self._on_revoke)
            task_status.started()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._stop_when_asked, consumer, nursery)
                nursery.start_soon(self._watch_topics)
                nursery.start_soon(self._commit_loop)
                nursery.start_soon(self._reclaim_loop)
                nursery.start_soon(self._follow_flow_control, control.cluster, self.flow.target)
                nursery.start_soon(self.topic_sync.run, sadmin, tadmin, lambda: self.topics, self.partitions.__contains__)
                await self._copy_loop()

    @property
    def group(self) -> str:
        """The consumer group of this direction's workers on the cluster they copy from."""
        return group_id(self.flow) if not self.reverse else f"dcmirror.{self.flow.target}.{self.flow.source}"

    # ---- topics ---------------------------------------------------------------------

    async def _pairs(self) -> dict[str, tuple[str, int]]:
        """Topics copied in this direction: topic copied from -> (topic copied into, the
        partition count of the one copied from). The flow's topics as its source names them;
        in reverse only those its source made mirror topics of their targets (failback)."""
        assert self._source_admin is not None and self._target_admin is not None
        flow_side = self._target_admin if self.reverse else self._source_admin
        flow_cluster = self.topology.cluster(self.flow.source)
        meta = await flow_side.metadata(None)
        named = sorted(t.name for t in meta.topics
                       if t.error_code == 0 and not t.name.startswith(INTERNAL_PREFIXES) and self.flow.matches(t.name))
        pairs = {name: self.flow.target_topic(name, flow_cluster.datacenter) for name in named}
        if self.reverse:
            reversed_pairs = {}
            for name, target_topic in pairs.items():
                if await _mirror_source_of(self._target_admin, name) == mirror_source_value(self.flow.target,
                                                                                           target_topic):
                    reversed_pairs[target_topic] = name
            pairs = reversed_pairs
        counts = {t.name: len(t.partitions) for t in (await self._source_admin.metadata(None)).topics
                  if t.error_code == 0} if self.reverse else {t.name: len(t.partitions) for t in meta.topics
                                                              if t.error_code == 0}
        self._source_names = set(counts)
        return {a: (b, counts[a]) for a, b in pairs.items() if a in counts}

    async def _sync_topics(self) -> bool:
        """Topics copied from -> mirror topics with the same partition count and the copied
        topic's configs (minus CONFIG_EXCLUDES); returns whether the set changed. Only the
        flow's direction creates mirror topics; a source topic that is itself a mirror topic
        of its target was failed over (the reverse direction copies it, if anything does)."""
        assert self._source_admin is not None and self._target_admin is not None
        matching = await self._pairs()
        target_meta = await self._target_admin.metadata(None)
        target_counts = {t.name: len(t.partitions) for t in target_meta.topics if t.error_code == 0}
        for t in target_meta.topics:
            if t.error_code == 0 and (tid := _topic_id(t)) is not None:
                self._target_ids[t.name] = tid
        for pm in self.partitions.values():
            now_id = self._target_ids.get(pm.target[0])
            if pm.state == FAILED and pm.target_topic_id is not None and now_id not in (None, pm.target_topic_id):
                # The copy was created again (a failback): what diverged is gone with it.
                log.info("%s-%d: %s was created again: claiming it again", *pm.source, pm.target[0])
                pm.state, pm.last_error = CLAIMING, "the target topic was created again"
                self._reclaim.set()
        rf = min(self.topology.defaults.replication_factor, len(self.target.brokers))
        mapping: dict[str, str] = {}
        for name, (target_name, count) in sorted(matching.items()):
            source_entries = await self._source_admin.topic_configs(name)
            have = target_counts.get(target_name)
            target_configs = {} if have is None else {
                e.name: e.value for e in await self._target_admin.topic_configs(target_name)
                if getattr(e, "config_source", None) == 1}
            decision = topic_copy.topic_pair(topic_copy.PairFacts(
                self.source_name, name, self.target_name, target_name, self.reverse,
                _own_marker(source_entries), have is not None, target_configs.get(MIRROR_SOURCE_CONFIG)))
            if decision.action == "skip":
                continue
            if decision.action == "refuse":
                if self.refused_topics.get(name) != decision.why:
                    (log.info if decision.state != topic_copy.OTHER_SOURCE else log.error)("%s", decision.why)
                self.refused_topics[name] = decision.why
                continue
            source_configs = {e.name: e.value for e in source_entries
                              if getattr(e, "config_source", None) == 1 and e.value is not None
                              and e.name not in CONFIG_EXCLUDES}
            if decision.action == "create":
                marker = mirror_source_value(self.source_name, name)
                try:
                    await self._target_admin.create_topic(target_name, count, rf,
                                                          {**source_configs, MIRROR_SOURCE_CONFIG: marker})
                    log.info("created mirror topic %s in %s: %d partitions, RF %d, mirror of %s", target_name,
                             self.target_name, count, rf, marker)
                except AdminError as exc:
                    if exc.code != ErrorCode.topic_already_exists:
                        raise
                mapping[name] = target_name
                continue
            assert have is not None
            self.refused_topics.pop(name, None)
            if have < count:
                await self._target_admin.create_partitions(target_name, count)
                log.info("added partitions to mirror topic %s: %d -> %d", target_name, have, count)
            changed = {k: v for k, v in source_configs.items() if target_configs.get(k) != v}
            gone = [k for k in target_configs if k not in source_configs and k not in CONFIG_EXCLUDES]
            if changed or gone:
                await self._target_admin.alter_topic_configs(target_name, changed, gone)
                log.info("mirror topic %s follows its source's configs: set %s, removed %s", target_name,
                         sorted(changed), sorted(gone))
            mapping[name] = target_name
        if not self.reverse:
            await self._find_deleted_sources(target_counts, {b for b, _ in matching.values()})
        changed_set = mapping != self.topics
        self.topics = mapping
        return changed_set

    async def _find_deleted_sources(self, target_counts: Mapping[str, int], copied: set[str]) -> None:
        """The target's copies of source topics that are gone (deleted there): said in the
        status as SOURCE_DELETED, so a failover leaves them (mirror/failover.py)."""
        assert self._target_admin is not None
        for topic, why in list(self.refused_topics.items()):
            if why.startswith(topic_copy.SOURCE_DELETED) and topic in self._source_names:
                del self.refused_topics[topic]  # created again at the source
        for target_name in sorted(set(target_counts) - copied):
            if target_name.startswith(INTERNAL_PREFIXES):
                continue
            gone = topic_copy.deleted_source(self.source_name, target_name,
                                             await _mirror_source_of(self._target_admin, target_name),
                                             self._source_names)
            if gone is not None:
                why = topic_copy.deleted_why(self.source_name, gone, self.target_name, target_name)
                if self.refused_topics.get(gone) != why:
                    log.warning("%s", why)
                self.refused_topics[gone] = why

    # ---- partitions -----------------------------------------------------------------

    async def _on_assign(self, tps: list[TopicPartition]) -> None:
        assert self._consumer is not None
        self._consumer.pause(*tps)  # nothing is fetched before the target says where to resume
        for tp in tps:
            target_topic = self.topics.get(tp[0])
            if target_topic is None:
                continue
            pm = self.partitions[tp] = TopicPartitionMirror(tp, (target_topic, tp[1]))
            await self._claim(pm)

    async def _on_revoke(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            self.partitions.pop(tp, None)

    async def _claim(self, pm: TopicPartitionMirror) -> None:
        """Resume at the target partition's log end (its high watermark: what it holds for
        good); below the source's log start, the records between were lost to retention
        before they were copied (said, counted), and copying goes on from the log start."""
        assert self._consumer is not None and self._target_admin is not None and self._source_admin is not None
        self.metrics["claims"] += 1
        try:
            _, target_end = await tail.offsets(self._target_admin.cluster, *pm.target)
            source_start, source_hw = await tail.offsets(self._source_admin.cluster, *pm.source)
        except RETRIABLE as exc:
            pm.state, pm.last_error = CLAIMING, f"claim: {exc}"
            self._reclaim.set()
            return
        if self.partitions.get(pm.source) is not pm:
            return  # revoked (a rebalance) while its offsets were read: the consumer no longer has it
        both_marked = target_end > source_hw and await _mirror_source_of(self._source_admin, pm.source[0]) == \
            mirror_source_value(self.target_name, pm.target[0])
        matches: bool | None = None
        if source_start < target_end <= source_hw:
            try:
                matches = topic_copy.tails_match(
                    await _batch_tail(self._source_admin.cluster, *pm.source, target_end - 1),
                    await _batch_tail(self._target_admin.cluster, *pm.target, target_end - 1))
            except RETRIABLE as exc:
                pm.state, pm.last_error = CLAIMING, f"claim: {exc}"
                self._reclaim.set()
                return
        if self.partitions.get(pm.source) is not pm:
            return
        pm.target_topic_id = self._target_ids.get(pm.target[0])
        decision = topic_copy.claim(topic_copy.ClaimFacts(target_end, source_start, source_hw, both_marked, matches))
        if isinstance(decision, topic_copy.WaitPromotion):
            # The other direction copies into the one copied from here; nothing to do until
            # it made the topic there an ordinary one again.
            if not pm.last_error.startswith("waiting"):
                log.info("%s-%d -> %s-%d: %s", *pm.source, *pm.target, decision.why)
            pm.state, pm.last_error = CLAIMING, decision.why
            self._reclaim.set()
            return
        if isinstance(decision, topic_copy.Diverged):
            pm.state, pm.last_error = FAILED, decision.why
            log.error("%s-%d -> %s-%d: %s", *pm.source, *pm.target, pm.last_error)
            self._event("diverged", pm, target_end=target_end, source_high_watermark=source_hw)
            return
        position = decision.position
        if decision.lost is not None:
            first, last = decision.lost
            self.metrics["data_loss_records"] += last - first + 1
            log.error("DATA LOSS: %s-%d offsets %d..%d were deleted at the source before they were mirrored "
                      "(%d offsets)", *pm.source, first, last, last - first + 1)
            self._event("data_loss", pm, first=first, last=last)
        elif position != target_end:
            log.info("%s-%d: the copy starts at the source's log start %d", *pm.source, position)
        pm.position = pm.target_log_end = position
        pm.state, pm.last_error = ACTIVE, ""
        self._consumer.seek(pm.source, position)
        self._resume_fetching(pm.source)
        log.info("%s took %s-%d -> %s-%d at offset %d%s", self.name, *pm.source, *pm.target, position,
                 " (the flow is paused: copying once it is resumed)" if self.flow_pause.paused else "")

    def _claimed(self) -> list[TopicPartition]:
        return [tp for tp, pm in self.partitions.items() if pm.state == ACTIVE]

    async def _reclaim_loop(self) -> None:
        while True:
            await self._reclaim.wait()
            self._reclaim = trio.Event()
            await trio.sleep(0.5)
            for pm in list(self.partitions.values()):
                if pm.state == CLAIMING and self.partitions.get(pm.source) is pm:
                    await self._claim(pm)

    def _event(self, kind: str, pm: TopicPartitionMirror, **details: Any) -> None:
        self.events.append({"kind": kind, "at_ms": self.clock.now_ms(), "topic": pm.source[0],
                            "partition": pm.source[1], "target_topic": pm.target[0], **details})

    # ---- copying --------------------------------------------------------------------

    async def _copy_loop(self) -> None:
        assert self._consumer is not None
        while True:
            try:
                chunks = await self._consumer.getmany_raw(timeout_s=0.5, max_bytes=ROUND_MAX_BYTES)
            except PartitionError as exc:
                pm = self.partitions.get(exc.tp) if exc.tp is not None else None
                if pm is None:
                    # A position the consumer looked up before the claim set it (the group's
                    # committed offsets are not where a mirror topic resumes): nothing to do.
                    log.debug("consumer: %s (the claims set the positions)", exc)
                    continue
                log.warning("fetching %s-%d: %s; claiming it again", *pm.source, exc)
                if pm is not None:
                    self._consumer.pause(pm.source)
                    pm.state, pm.last_error = CLAIMING, str(exc)
                    self._reclaim.set()
                continue
            if chunks:
                await self._append_round(chunks)
            elif not self.flow_pause.paused:  # paused: nothing at all is written into the target
                await self._follow_log_starts()

    async def _append_round(self, chunks: list[RawChunk]) -> None:
        """Append one round of fetched chunks: per target leader and topic one MirrorAppend,
        the leaders in parallel; a partition's chunks go in order (joined into one payload)."""
        assert self._target_admin is not None
        cluster = self._target_admin.cluster
        joined: dict[TopicPartition, list[RawChunk]] = {}
        for chunk in chunks:
            pm = self.partitions.get(chunk.tp)
            if pm is None or pm.state != ACTIVE:
                continue
            before = joined[chunk.tp][-1].next_offset if chunk.tp in joined else pm.position
            if not topic_copy.follows(chunk.fetch_offset, before):
                # Not the data that follows what the target holds (a chunk of a position
                # given up meanwhile): nothing of the partition is appended this round.
                log.warning("%s-%d: fetched from %d where the copy is at %d; taking it again", *chunk.tp,
                            chunk.fetch_offset, before)
                joined.pop(chunk.tp, None)
                self._consumer_pause_and_reclaim(pm, f"fetched from {chunk.fetch_offset}, the copy is at {before}")
                continue
            joined.setdefault(chunk.tp, []).append(chunk)
        if not joined:
            return
        by_leader: dict[tuple[int, str], dict[int, tuple[TopicPartitionMirror, list[RawChunk]]]] = {}
        for tp, parts in joined.items():
            pm = self.partitions[tp]
            leader = cluster.metadata.leader(*pm.target)
            if leader < 0:
                await cluster.refresh({pm.target[0]})
                leader = cluster.metadata.leader(*pm.target)
            by_leader.setdefault((leader, pm.target[0]), {})[pm.target[1]] = (pm, parts)
        async with trio.open_nursery() as nursery:
            for (leader, topic), parts_of in by_leader.items():
                nursery.start_soon(self._append_to, leader, topic, parts_of)

    async def _append_to(self, leader: int, topic: str,
                         parts_of: dict[int, tuple[TopicPartitionMirror, list[RawChunk]]]) -> None:
        assert self._target_admin is not None and self._consumer is not None
        cluster = self._target_admin.cluster
        payload = {p: b"".join(c.data for c in chunks) for p, (_, chunks) in parts_of.items()}
        answers: Mapping[int, Mapping[str, Any]] = {}
        error: str | None = None
        try:
            if leader < 0:
                raise KafkaError(f"{topic}: no leader in {self.target_name}", ErrorCode.leader_not_available)
            topic_id = self._target_ids.get(topic) or cluster.metadata.topic_id(topic)
            if topic_id is None:
                raise KafkaError(f"{topic}: no topic id in {self.target_name}'s metadata", ErrorCode.unknown_topic_id)
            # The mirror follows the source's log start (retention, DeleteRecords) as a follower does.
            starts = {p: self._consumer.log_start(pm.source) for p, (pm, _) in parts_of.items()}
            answers = await mirror_append(await cluster.connection(leader), topic, str(topic_id), payload,
                                          APPEND_TIMEOUT_S, log_start_offsets={p: s for p, s in starts.items() if s >= 0})
            self.metrics["appends"] += 1
        except RETRIABLE as exc:
            error = str(exc)
        for p, (pm, chunks) in parts_of.items():
            answer = answers.get(p)
            code = int(answer.get("error_code", -1)) if answer is not None else -1
            if error is None and code == 0:
                assert answer is not None
                pm.position = chunks[-1].next_offset
                pm.target_log_end = int(answer.get("log_end_offset", pm.position))
                pm.batches += sum(c.batches for c in chunks)
                pm.records += sum(c.records for c in chunks)
                pm.bytes += len(payload[p])
                pm.appended_at_ms = self.clock.now_ms()
                pm.last_timestamp_ms = max(pm.last_timestamp_ms, last_max_timestamp(chunks[-1].data))
                pm.log_start_sent = max(pm.log_start_sent, starts.get(p, -1))
                self.metrics["batches"] += sum(c.batches for c in chunks)
                self.metrics["records"] += sum(c.records for c in chunks)
                self.metrics["bytes"] += len(payload[p])
                continue
            why = error or (f"error {code}: {answer.get('error_message') or ''}" if answer is not None
                            else "no answer for the partition")
            # Whatever went wrong, the partition is taken again from the target's log end:
            # an append that was done is skipped there when the same batches come again.
            log.warning("appending to %s-%d in %s: %s; taking it again from the target's log end", topic, p,
                        self.target_name, why)
            cluster.metadata.updated_s = -1e18
            self._consumer_pause_and_reclaim(pm, why)

    async def _follow_log_starts(self) -> None:
        """An idle partition whose source log start moved (retention, DeleteRecords) after
        its last copied batch: an append without batches carries the new start (the target
        follows it up to its high watermark)."""
        assert self._consumer is not None and self._target_admin is not None
        cluster = self._target_admin.cluster
        moved: dict[tuple[int, str], dict[int, tuple[TopicPartitionMirror, int]]] = {}
        for pm in self.partitions.values():
            start = self._consumer.log_start(pm.source)
            if pm.state == ACTIVE and start > pm.log_start_sent and pm.position >= start:
                leader = cluster.metadata.leader(*pm.target)
                moved.setdefault((leader, pm.target[0]), {})[pm.target[1]] = (pm, start)
        for (leader, topic), parts in moved.items():
            topic_id = self._target_ids.get(topic) or cluster.metadata.topic_id(topic)
            if leader < 0 or topic_id is None:
                continue
            try:
                answers = await mirror_append(await cluster.connection(leader), topic, str(topic_id),
                                              {p: b"" for p in parts}, APPEND_TIMEOUT_S,
                                              log_start_offsets={p: start for p, (_, start) in parts.items()})
            except RETRIABLE as exc:
                log.info("telling %s in %s its source's log start: %s", topic, self.target_name, exc)
                continue
            for p, (pm, start) in parts.items():
                if int(answers.get(p, {}).get("error_code", -1)) == 0:
                    pm.log_start_sent = start

    def _consumer_pause_and_reclaim(self, pm: TopicPartitionMirror, why: str) -> None:
        assert self._consumer is not None
        self._consumer.pause(pm.source)
        pm.state, pm.last_error = CLAIMING, why
        self._reclaim.set()

    # ---- offsets, status ------------------------------------------------------------

    async def _commit_loop(self) -> None:
        """The source group's offsets follow the copy (lag in the source's tools)."""
        while True:
            await trio.sleep(self.config.commit_interval_s)
            consumer = self._consumer
            offsets = {tp: pm.position for tp, pm in self.partitions.items() if pm.state == ACTIVE and pm.position >= 0}
            if consumer is None or not offsets:
                continue
            try:
                await consumer.commit(offsets)
            except RETRIABLE as exc:
                log.info("committing the source group's offsets: %s", exc)

    def lag_records(self) -> int:
        consumer = self._consumer
        if consumer is None:
            return 0
        return sum(max(0, consumer.highwater(tp) - pm.position) for tp, pm in self.partitions.items()
                   if pm.position >= 0 and consumer.highwater(tp) >= 0)

    def status(self) -> dict[str, Any]:
        """The record-copying worker's status shape (deploy/status_http.py, `mirror status`),
        with each partition's state and the mode."""
        consumer = self._consumer
        partitions = []
        now_ms = self.clock.now_ms()
        for tp, pm in sorted(self.partitions.items()):
            hw = consumer.highwater(tp) if consumer is not None else -1
            if hw >= 0 and consumer is not None:
                age_s = consumer.since_last_answer_s(tp)
                seen_ms = now_ms - int((age_s or 0.0) * 1000)
                if (hw, seen_ms) > self.source_known_ends.get(tp, (-1, -1)):
                    self.source_known_ends[tp] = (hw, seen_ms)
            lag = max(0, hw - pm.position) if hw >= 0 and pm.position >= 0 else None
            # Behind: at most the age of the last copied batch (the first one not copied is
            # younger); caught up: 0.
            lag_s = (0.0 if lag == 0 else max(0.0, (now_ms - pm.last_timestamp_ms) / 1000)
                     if lag is not None and pm.last_timestamp_ms >= 0 else None)
            partitions.append({"topic": tp[0], "partition": tp[1], "target_topic": pm.target[0],
                               "state": self._state_of(pm), "position": pm.position, "source_high_watermark": hw,
                               "lag_records": lag, "lag_s": lag_s,
                               "records": pm.records, "batches": pm.batches, "bytes": pm.bytes,
                               "last_error": pm.last_error})
        elapsed_s = max(1e-3, (self.clock.now_ms() - self.metrics["started_ms"]) / 1000)
        return {"worker": self.name, "flow": self.flow.name, "mode": "mirror_topics",
                "direction": "reverse" if self.reverse else "forward", "source": self.source_name,
                "target": self.target_name, "topics": dict(sorted(self.topics.items())),
                "refused_topics": dict(self.refused_topics), "partitions": partitions,
                "lag_records": self.lag_records(), "records": self.metrics["records"],
                "bytes": self.metrics["bytes"], "records_per_s": self.metrics["records"] / elapsed_s,
                "claims": self.metrics["claims"], "data_loss_records": self.metrics["data_loss_records"],
                "events": list(self.events), "last_problem": self.last_problem,
                "source_known_ends": [{"topic": t, "partition": p, "high_watermark": hw, "seen_ms": seen_ms}
                                      for (t, p), (hw, seen_ms) in sorted(self.source_known_ends.items())],
                "topic_sync": self.topic_sync.status(), **self.pause_status()}

    def _state_of(self, pm: TopicPartitionMirror) -> str:
        return PAUSED if pm.state == ACTIVE and self.flow_pause.paused else pm.state

    def prometheus(self) -> bytes:
        return prometheus_text(self.metric_families())

    def metric_families(self) -> dict[str, tuple[str, str, list[tuple[dict[str, str], float]]]]:
        labels = {"flow": self.flow.name, "worker": self.name, "direction": "reverse" if self.reverse else "forward"}
        per_partition = [({**labels, "topic": pm.source[0], "partition": str(pm.source[1]),
                           "state": self._state_of(pm)}, 1.0)
                         for pm in self.partitions.values()]
        parts = self.status()["partitions"]

        def by_partition(key: str) -> list[tuple[dict[str, str], float]]:
            return [(labels | {"topic": p["topic"], "partition": str(p["partition"])}, float(p[key]))
                    for p in parts if p[key] is not None]

        return {
            "dcmirror_mirror_topic_records_total": ("counter", "Records copied into mirror topics",
                                                    [(labels, self.metrics["records"])]),
            "dcmirror_mirror_topic_bytes_total": ("counter", "Batch bytes copied into mirror topics",
                                                  [(labels, self.metrics["bytes"])]),
            "dcmirror_mirror_topic_lag_records": ("gauge", "Source records not yet in the mirror topics",
                                                  [(labels, self.lag_records())]),
            "dcmirror_mirror_topic_partition_state": ("gauge", "1 per partition in the state labelled",
                                                      per_partition),
            "dcmirror_mirror_flow_paused": ("gauge", "1 while the flow is paused (dcmirror mirror pause)",
                                            [(labels, 1.0 if self.flow_pause.paused else 0.0)]),
            # The record-copying flows' names: their alerts and dashboard panels cover both.
            "dcmirror_mirror_lag_records": ("gauge", "Source records not yet in the mirror topic",
                                            by_partition("lag_records")),
            "dcmirror_mirror_lag_seconds": ("gauge", "Age of the oldest uncopied data, at most (0 when caught up)",
                                            by_partition("lag_s")),
            **self.topic_sync.prometheus_metrics(labels),
        }

    def routes(self) -> dict[str, Any]:
        return {"/healthz": lambda: ("text/plain", b"ok\n"),
                "/metrics": lambda: ("text/plain; version=0.0.4", self.prometheus()),
                "/v1/status": lambda: ("application/json", orjson.dumps(self.status()))}


class MirrorTopicsFlowWorker:
    """A mirror-topics flow's worker process: the flow's direction, and the reverse one,
    which copies nothing until a failback made the source's topics mirror topics of the
    target's (`dcmirror mirror failback`). One status, one set of metrics for both."""

    def __init__(self, topology: Topology, flow: MirrorSpec, name: str | None = None, *,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.forward = TopicMirrorWorker(topology, flow, name, clock=clock)
        self.backward = TopicMirrorWorker(topology, flow, f"{self.forward.name}-reverse", reverse=True, clock=clock)
        self.flow, self.name, self.config = flow, self.forward.name, self.forward.config
        self.last_problem: dict[str, Any] | None = None

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.forward.run)
            await nursery.start(self.backward.run)
            task_status.started()

    async def stop(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.forward.stop)
            nursery.start_soon(self.backward.stop)

    def fenced(self) -> Exception | None:
        return self.forward.fenced() or self.backward.fenced()

    def status(self) -> dict[str, Any]:
        forward, backward = self.forward.status(), self.backward.status()
        out = dict(forward)
        for key in ("lag_records", "records", "bytes", "records_per_s", "claims", "data_loss_records"):
            out[key] = forward[key] + backward[key]
        out["partitions"] = [{**p, "direction": "forward"} for p in forward["partitions"]] + \
            [{**p, "direction": "reverse"} for p in backward["partitions"]]
        out["events"] = sorted(forward["events"] + backward["events"], key=lambda e: e["at_ms"])
        out["reverse"] = {k: backward[k] for k in ("source", "target", "topics", "refused_topics", "topic_sync",
                                                   "paused", "flow_control")}
        out["last_problem"] = self.last_problem
        return out

    def prometheus(self) -> bytes:
        families = self.forward.metric_families()
        for name, (kind, text, samples) in self.backward.metric_families().items():
            families[name] = (kind, text, families[name][2] + samples)
        return prometheus_text(families)

    def routes(self) -> dict[str, Any]:
        return {"/healthz": lambda: ("text/plain", b"ok\n"),
                "/metrics": lambda: ("text/plain; version=0.0.4", self.prometheus()),
                "/v1/status": lambda: ("application/json", orjson.dumps(self.status()))}


async def _batch_tail(cluster: Any, topic: str, partition: int, offset: int) -> topic_copy.BatchTail | None:
    """The batch holding `offset` as a claim compares it (None: the partition holds none)."""
    batches = await tail.fetch_batches(cluster, topic, partition, offset, max_bytes=1)
    for b in batches:
        h = b.header
        if h.base_offset <= offset <= h.last_offset:
            return topic_copy.BatchTail(h.last_offset, h.producer_id, h.producer_epoch, h.is_control,
                                        h.is_transactional)
    return None


def _own_marker(entries: list[Any]) -> str | None:
    """The mirror.source a topic's own configs carry (None: an ordinary topic)."""
    for e in entries:
        if e.name == MIRROR_SOURCE_CONFIG and getattr(e, "config_source", None) == 1:
            return str(e.value) if e.value else None
    return None


async def _mirror_source_of(admin: Admin, topic: str) -> str | None:
    """The topic's mirror.source (None: an ordinary topic, or no such topic)."""
    try:
        return _own_marker(await admin.topic_configs(topic))
    except AdminError:
        return None
