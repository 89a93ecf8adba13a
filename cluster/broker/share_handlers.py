"""ShareFetch and ShareAcknowledge (KIP-932) at partition leaders: the trio shell over the
share sessions (cluster/groups/share_session.py) and the share partitions
(cluster/groups/share_partition.py) of the partitions this broker leads.

A share partition's durable state lives with the share coordinator (`__share_group_state`,
cluster/groups/share_state_service.py): before a leader first acquires records of a share
partition it reads that state (ReadShareGroupState with its leader epoch, which fences the
previous leader; a share partition never started begins where `share.auto.offset.reset`
says, and that start is written before anything is acquired); while the read is not done,
ShareFetch answers the partition with no records and no error. Every change that must
survive a crash (acknowledgements, releases, locks that ran out) marks the share partition
dirty; one writer task writes each dirty partition's snapshot (WriteShareGroupState),
coalescing what changed meanwhile, and an acknowledgement is answered only once the
snapshot holding it is written: an accepted record is never delivered again after the
leader dies. A write the coordinator fences (a newer leader or state epoch) drops the share
partition from memory; acquisitions are not written (as Kafka: a crash makes them available
again). A connection that ends takes its share sessions with it, and their members' records
go back.

The group's configs are read at every use, as Kafka's ShareGroupConfigProvider reads them
(`share_record_settings`: the group's own over the broker's group.share.* settings), so a
change reaches share partitions already loaded: the lock duration of the next lock taken or
renewed (and AcquisitionLockTimeoutMs), the delivery count limit of the next release or lock
expiry, the in-flight limit of the next acquisition, `share.isolation.level` of the next log
read (read_committed: up to the last stable offset, an aborted transaction's records archived,
never delivered), `share.renew.acknowledge.enable` of the next RENEW.

ShareFetch and ShareAcknowledge v2 (Kafka 4.2+, KIP-1206 and KIP-1222): ShareAcquireMode
(batch_optimized, the default and v1's: whole log batches acquired, MaxRecords may be exceeded
to the end of the batch where it was reached; record_limit: at most MaxRecords), RENEW
acknowledgements only with IsRenewAck, a renewing ShareFetch asking for nothing (MaxBytes,
MinBytes, MaxRecords and MaxWaitMs 0) and fetching nothing, AcquisitionLockTimeoutMs in
ShareAcknowledge's answer. docs/share_groups.md says what comes next.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import trio

from cluster.broker.context import RequestContext
from cluster.common.backoff import Backoff
from cluster.groups.group_configs import (
    ShareRecordSettings,
    share_group_config,
    share_record_settings,
)
from cluster.groups.share_group import MEMBER_ID_MAX_CHARS
from cluster.groups.share_partition import AcknowledgeType, SharePartition, ShareState
from cluster.groups.share_session import SharePartitionKey, ShareSessionCache
from cluster.groups.share_state_records import UNINITIALIZED, ShareKey, ShareStateValue
from cluster.groups.share_state_service import ShareStateService
from cluster.protocol.errors import ErrorCode
from cluster.protocol.record_batch import iter_committed, iter_headers
from cluster.replication.partition import Partition
from cluster.replication.replica_manager import ReplicaManager
from cluster.security.acl import AclOperation, ResourceType

SHARE_FETCH_WAIT_MAX_S = 1.0  # a ShareFetch that acquired nothing waits at most this for new records
SHARE_FETCH_POLL_S = 0.05
SHARE_FETCH_READ_BYTES = 1 << 20  # log bytes read per partition and fetch
SHARE_FETCH_RECORDS_MAX = 10_000  # MaxRecords is capped here
SHARE_PARTITIONS_MAX = 100_000  # share partitions one broker keeps (groups x partitions)
BATCH_OPTIMIZED, RECORD_LIMIT = 0, 1  # ShareFetch v2's ShareAcquireMode (KIP-1206)
EXPIRY_CHECK_MS = 100  # how often requests look for locks that ran out
ACK_DURABLE_WAIT_S = 30.0  # an acknowledgement waits this long at most for its state to be written
WRITE_RETRY_S = 30.0  # a snapshot the coordinator could not take now is tried again this long
_RETRIABLE_WRITE_ERRORS = frozenset({ErrorCode.not_coordinator, ErrorCode.coordinator_not_available,
                                     ErrorCode.coordinator_load_in_progress, ErrorCode.request_timed_out,
                                     ErrorCode.not_enough_replicas, ErrorCode.unknown_topic_or_partition})

log = logging.getLogger(__name__)

PartitionKey = tuple[str, str, int]  # (group, topic name, partition)


@dataclass
class _Durability:
    """How far one loaded share partition's changes are written."""

    topic_id: str
    leader_epoch: int
    version: int = 0  # changes made that must survive
    written: int = 0  # of those, how many the share coordinator holds
    failed: int = ErrorCode.none  # the write that failed for good: the share partition was dropped


def _ack_error(code: int) -> int:
    """What an acknowledgement answers when its state could not be written (as Kafka's
    SharePartition maps its persister's errors)."""
    if code in (ErrorCode.fenced_leader_epoch, ErrorCode.fenced_state_epoch, ErrorCode.not_leader_or_follower):
        return ErrorCode.not_leader_or_follower
    return ErrorCode.coordinator_not_available


class ShareHandlers:
    def __init__(self, replicas: ReplicaManager, persister: ShareStateService | None = None,
                 broker_config: Mapping[str, Any] | None = None) -> None:
        self.replicas = replicas
        self.persister = persister  # None: share partitions in memory only
        self.broker_config: Mapping[str, Any] = broker_config or {}  # its group.share.* defaults
        self.sessions = ShareSessionCache()
        self.partitions: dict[PartitionKey, SharePartition] = {}
        self._expire_at_ms = 0
        self._durability: dict[PartitionKey, _Durability] = {}
        self._loading: set[PartitionKey] = set()
        self._dirty: set[PartitionKey] = set()
        self._idle: set[PartitionKey] = set()  # no session fetches from them: forgotten once written
        self._wake = trio.Event()
        self._written = trio.Event()  # set (and replaced) whenever a write ends

    # ---- shared steps ------------------------------------------------------------------

    def _name(self, topic_id: str) -> str | None:
        topic = self.replicas.image.topics.get(topic_id)
        return None if topic is None else topic.name

    def _refused(self, code: int, message: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"throttle_time": 0, "error_code": code, "error_message": message, "responses": [],
                "node_endpoints": [], **(extra or {})}

    def _checked(self, req: Any, ctx: RequestContext) -> tuple[int, str] | None:
        if not req.group_id:
            return ErrorCode.invalid_request, "GroupId must be set"
        if not ctx.allowed(AclOperation.READ, ResourceType.GROUP, req.group_id):
            return ErrorCode.group_authorization_failed, f"{ctx.principal} may not use group {req.group_id}"
        if not req.member_id or len(req.member_id) > MEMBER_ID_MAX_CHARS:
            return ErrorCode.invalid_request, "MemberId must be 1 to 36 characters"
        return None

    def settings(self, group_id: str) -> ShareRecordSettings:
        """The group's share-partition settings now (its configs over the broker's)."""
        return share_record_settings(self.replicas.image, group_id, self.broker_config)

    @staticmethod
    def _configured(sp: SharePartition, settings: ShareRecordSettings) -> SharePartition:
        sp.configure(lock_duration_ms=settings.lock_duration_ms, delivery_count_limit=settings.delivery_count_limit,
                     max_in_flight=settings.max_in_flight)
        return sp

    def _expire(self, now_ms: int) -> None:
        """Locks that ran out, released: checked by the requests that come, at most every
        EXPIRY_CHECK_MS (a walk over every share partition's records in flight)."""
        if now_ms < self._expire_at_ms:
            return
        self._expire_at_ms = now_ms + EXPIRY_CHECK_MS
        settings: dict[str, ShareRecordSettings] = {}
        for key, sp in self.partitions.items():
            deadline = sp.next_lock_deadline_ms()
            if deadline is None or deadline > now_ms:
                continue
            group = settings.get(key[0]) or settings.setdefault(key[0], self.settings(key[0]))
            if self._configured(sp, group).expire_locks(now_ms):
                self._changed(key)

    def _release(self, released: tuple[tuple[str, str, frozenset[SharePartitionKey]], ...]) -> None:
        for group_id, member_id, keys in released:
            settings = self.settings(group_id)
            for topic_id, index in keys:
                name = self._name(topic_id)
                sp = self.partitions.get((group_id, name, index)) if name is not None else None
                if sp is None:
                    continue
                key = (group_id, name, index)
                if self._configured(sp, settings).release_member(member_id):
                    self._changed(key)  # type: ignore[arg-type]
                if not self.sessions.in_use(group_id, (topic_id, index)):
                    self._idle.add(key)  # type: ignore[arg-type]
                    self._forget_idle(key)  # type: ignore[arg-type]

    def _forget_idle(self, key: PartitionKey) -> None:
        """A share partition no session fetches from leaves this leader's memory once all its
        changes are written and nothing of it is acquired: its next use reads the state again,
        so an AlterShareGroupOffsets, a DeleteShareGroupOffsets or a DeleteGroups made while
        the group was empty is what the next member gets (only an empty group's offsets can
        be altered or deleted)."""
        sp, d = self.partitions.get(key), self._durability.get(key)
        if key not in self._idle or sp is None or d is None or key in self._dirty or d.written < d.version \
                or sp.next_lock_deadline_ms() is not None:
            return
        self._idle.discard(key)
        del self.partitions[key], self._durability[key]

    def _acknowledge(self, group_id: str, member_id: str, topics: Any, now_ms: int, ctx: RequestContext,
                     settings: ShareRecordSettings, *, renew_allowed: bool) -> tuple[
                         dict[SharePartitionKey, int], dict[SharePartitionKey, tuple[_Durability, int]]]:
        """Each partition's acknowledgement batches applied: its error code, and for those
        applied the change whose write the answer waits for (`_durable`; a RENEW changes
        nothing durable, as Kafka writes nothing for it). RENEW (4) only where
        `renew_allowed` (v2 with IsRenewAck), else the partition's INVALID_REQUEST."""
        out: dict[SharePartitionKey, int] = {}
        waits: dict[SharePartitionKey, tuple[_Durability, int]] = {}
        for t in topics:
            topic_id = str(t.topic_id)
            name = self._name(topic_id)
            for p in t.partitions:
                if not p.acknowledgement_batches:
                    continue
                key = (topic_id, int(p.partition_index))
                if name is None:
                    out[key] = ErrorCode.unknown_topic_id
                elif not ctx.allowed(AclOperation.READ, ResourceType.TOPIC, name):
                    out[key] = ErrorCode.topic_authorization_failed
                else:
                    part, code = self.replicas.leader_partition(name, key[1])
                    if part is None:
                        out[key] = code
                        continue
                    sp = self._current((group_id, name, key[1]), part)
                    batches = [(int(b.first_offset), int(b.last_offset), [int(x) for x in b.acknowledge_types])
                               for b in p.acknowledgement_batches]
                    out[key] = (ErrorCode.invalid_record_state if sp is None
                                else self._configured(sp, settings).acknowledge(
                                    member_id, batches, now_ms, renew_allowed=renew_allowed,
                                    renew_enabled=settings.renew_enabled))
                    if out[key] == ErrorCode.none and any(
                            t != AcknowledgeType.RENEW for _, _, types in batches for t in types):
                        wait = self._changed((group_id, name, key[1]))
                        if wait is not None:
                            waits[key] = wait
        return out, waits

    # ---- durable state -----------------------------------------------------------------

    def _current(self, key: PartitionKey, part: Partition) -> SharePartition | None:
        """The share partition as loaded under the partition's current leader epoch; one
        loaded under an older epoch (leadership went and came back) is dropped: its state
        is read again."""
        sp = self.partitions.get(key)
        d = self._durability.get(key)
        if sp is not None and d is not None and d.leader_epoch != part.leader_epoch:
            self._drop(key, ErrorCode.not_leader_or_follower)
            return None
        return sp

    def _drop(self, key: PartitionKey, code: int) -> None:
        self.partitions.pop(key, None)
        self._dirty.discard(key)
        self._idle.discard(key)
        d = self._durability.pop(key, None)
        if d is not None:
            d.failed = code or ErrorCode.unknown_server_error
            self._notify_written()

    def _changed(self, key: PartitionKey) -> tuple[_Durability, int] | None:
        """A change to the share partition that must be written: (its durability, the
        version that holds it); None without a share coordinator."""
        d = self._durability.get(key)
        if self.persister is None or d is None:
            return None
        d.version += 1
        self._dirty.add(key)
        self._wake.set()
        return d, d.version

    def _notify_written(self) -> None:
        self._written.set()
        self._written = trio.Event()

    async def _durable(self, acks: dict[SharePartitionKey, int],
                       waits: dict[SharePartitionKey, tuple[_Durability, int]]) -> dict[SharePartitionKey, int]:
        """The acknowledgements' answers once their state is written (or could not be)."""
        with trio.move_on_after(ACK_DURABLE_WAIT_S):
            for d, version in waits.values():
                while d.written < version and not d.failed:
                    await self._written.wait()
        out = dict(acks)
        for key, (d, version) in waits.items():
            if d.written < version:
                out[key] = _ack_error(d.failed or ErrorCode.coordinator_not_available)
        return out

    def _start_offset(self, group_id: str, part: Partition) -> int:
        """Where a share partition no leader started begins: `share.auto.offset.reset`."""
        config = share_group_config(self.replicas.image, group_id)
        if config.auto_offset_reset == "earliest":
            return part.log.log_start_offset
        duration_ms = config.reset_duration_ms
        if duration_ms is not None:
            found = part.log.offset_for_timestamp(self.replicas.clock.now_ms() - duration_ms)
            if found is not None and found[0] < part.high_watermark:
                return found[0]
        return part.high_watermark

    async def _load(self, group_id: str, name: str, topic_id: str, part: Partition) -> SharePartition | None:
        """The share partition, its state read from the share coordinator first when this
        leader has none; None while that is not done (another request is reading it, or
        the read failed: the next fetch tries again)."""
        key = (group_id, name, part.index)
        self._idle.discard(key)  # a session fetches from it again
        sp = self._current(key, part)
        if sp is not None:
            return sp
        if key in self._loading or len(self.partitions) >= SHARE_PARTITIONS_MAX:
            return None
        settings = self.settings(group_id)
        if self.persister is None:
            sp = self.partitions[key] = SharePartition(
                self._start_offset(group_id, part), lock_duration_ms=settings.lock_duration_ms,
                delivery_count_limit=settings.delivery_count_limit, max_in_flight=settings.max_in_flight)
            return sp
        epoch = part.leader_epoch
        share_key = ShareKey(group_id, topic_id, part.index)
        self._loading.add(key)
        try:
            code, state = await self.persister.read_state(share_key, epoch)
            if code != ErrorCode.none or state is None:
                log.info("reading the share state of %s: error %s", share_key.coordinator_key(), code)
                return None
            if not part.is_leader or part.leader_epoch != epoch:
                return None
            if state.start_offset == UNINITIALIZED:
                start = self._start_offset(group_id, part)
                state = ShareStateValue(state.state_epoch, epoch, start)
                code = await self.persister.write_state(share_key, state)  # the start survives this leader
                if code != ErrorCode.none:
                    log.info("starting the share partition %s: error %s", share_key.coordinator_key(), code)
                    return None
                if not part.is_leader or part.leader_epoch != epoch:
                    return None
            settings = self.settings(group_id)  # the read took a while: the configs now
            sp = SharePartition.restore(ShareState(state.start_offset, state.state_epoch, state.batches),
                                        lock_duration_ms=settings.lock_duration_ms,
                                        delivery_count_limit=settings.delivery_count_limit,
                                        max_in_flight=settings.max_in_flight)
            self.partitions[key] = sp
            self._durability[key] = _Durability(topic_id, epoch)
            return sp
        finally:
            self._loading.discard(key)

    async def writer_loop(self) -> None:
        """Writes the dirty share partitions' snapshots, each at most once at a time; what
        changes during a round is written in the next."""
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            dirty, self._dirty = self._dirty, set()
            async with trio.open_nursery() as nursery:
                for key in dirty:
                    nursery.start_soon(self._write, key)

    async def _write(self, key: PartitionKey) -> None:
        assert self.persister is not None
        backoff = Backoff(0.1, 1.0)
        deadline = trio.current_time() + WRITE_RETRY_S
        while True:
            d, sp = self._durability.get(key), self.partitions.get(key)
            if d is None or sp is None:
                return
            version = d.version
            snap = sp.snapshot()
            code = await self.persister.write_state(ShareKey(key[0], d.topic_id, key[2]), ShareStateValue(
                snap.state_epoch, d.leader_epoch, snap.start_offset, snap.batches))
            if self._durability.get(key) is not d:
                return  # dropped, or read again, meanwhile
            if code == ErrorCode.none:
                d.written = max(d.written, version)
                self._notify_written()
                self._forget_idle(key)
                return
            if code not in _RETRIABLE_WRITE_ERRORS or trio.current_time() >= deadline:
                log.warning("writing the share state of %s: error %s; it is read again before its next use",
                            ShareKey(key[0], d.topic_id, key[2]).coordinator_key(), code)
                self._drop(key, code)
                return
            await backoff.sleep()

    def _leader(self, name: str, index: int) -> dict[str, int]:
        assignment = self.replicas.image.partition(name, index)
        if assignment is None:
            return {"leader_id": -1, "leader_epoch": -1}
        return {"leader_id": assignment.leader, "leader_epoch": assignment.leader_epoch}

    def _acquire(self, group_id: str, member_id: str, name: str, part: Partition, budget: int, now_ms: int,
                 settings: ShareRecordSettings, mode: int) -> tuple[bytes, list[dict[str, int]]]:
        """Records for `member_id` from the share partition: (the log's whole batches holding
        them, the acquired ranges), from the share partition `_load` made ready. Under
        read_committed the log is read up to the last stable offset and the batches of aborted
        transactions are archived with the transaction markers, never delivered."""
        sp = self._current((group_id, name, part.index), part)
        if sp is None:
            return b"", []
        self._configured(sp, settings).move_log_start(part.log.log_start_offset)
        start = sp.fetch_offset()
        if start is None or budget <= 0:
            return b"", []
        read = part.read_records(start, SHARE_FETCH_READ_BYTES, replica_id=-1, current_leader_epoch=-1,
                                 min_one_batch=True, now_ms=now_ms, read_committed=settings.read_committed)
        if read.error != ErrorCode.none or not read.records:
            return b"", []
        data = read.records
        kept: set[int] | None = None  # read_committed: the positions of the batches to deliver
        if settings.read_committed:
            kept = {pos for pos, _ in iter_committed(data, [(a.producer_id, a.first_offset)
                                                            for a in read.aborted or ()])}
        spans: list[tuple[int, int, int, int]] = []  # (position, bytes, base offset, last offset)
        delivered: list[tuple[int, int]] = []  # offset ranges of the records to deliver
        skipped: list[tuple[int, int]] = []  # and of the batches that are none
        for pos, header in iter_headers(data):
            if header.last_offset < start:
                continue
            spans.append((pos, header.size_bytes, header.base_offset, header.last_offset))
            deliver = not header.is_control and (kept is None or pos in kept)
            (delivered if deliver else skipped).append((max(header.base_offset, start), header.last_offset))
        batch_ends = [last for _, _, _, last in spans] if mode == BATCH_OPTIMIZED else []
        got = sp.acquire_ranges(member_id, delivered, now_ms, budget, skipped=skipped, batch_ends=batch_ends)
        if not got:
            return b"", []
        first, last = got[0].first_offset, got[-1].last_offset
        used = [(pos, size) for pos, size, base, end in spans if end >= first and base <= last]
        begin, finish = used[0][0], used[-1][0] + used[-1][1]
        return bytes(data[begin:finish]), [{"first_offset": r.first_offset, "last_offset": r.last_offset,
                                            "delivery_count": r.delivery_count} for r in got]

    def connection_closed(self, connection: object) -> None:
        """A client's connection ended (closed, or the client died): its share sessions end
        and what their members held goes back (Kafka's ShareSessionCache does the same)."""
        self._release(tuple(self.sessions.connection_closed(connection)))

    # ---- ShareFetch --------------------------------------------------------------------

    async def handle_share_fetch(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        problem = self._checked(req, ctx) or self._fetch_v2_problem(version, req)
        settings = self.settings(req.group_id or "")
        lock = {"acquisition_lock_timeout": settings.lock_duration_ms}
        if problem is not None:
            return self._refused(*problem, lock)
        renewing = version >= 2 and bool(req.is_renew_ack)
        mode = int(req.share_acquire_mode) if version >= 2 else BATCH_OPTIMIZED
        group_id, member_id, epoch = req.group_id, req.member_id, int(req.share_session_epoch)
        now = self.replicas.clock.now_ms()
        self._expire(now)
        acking = any(p.acknowledgement_batches for t in req.topics for p in t.partitions)
        if epoch == 0 and acking:
            return self._refused(ErrorCode.invalid_request, "a share session's first fetch acknowledges nothing",
                                 lock)
        update = self.sessions.fetch(group_id, member_id, epoch, ctx.connection,
                                     add=[(str(t.topic_id), int(p.partition_index)) for t in req.topics
                                          for p in t.partitions],
                                     forget=[(str(t.topic_id), int(p)) for t in req.forgotten_topics_data
                                             for p in t.partitions])
        if update.error != ErrorCode.none or update.session is None:
            self._release(update.released)
            return self._refused(update.error, f"share session: {ErrorCode(update.error).name}", lock)
        if epoch == 0:
            self._release(update.released)  # the member's previous session: replaced
        acks, waits = self._acknowledge(group_id, member_id, req.topics, now, ctx, settings, renew_allowed=renewing)
        if epoch == -1:
            self._release(update.released)  # closing: acknowledged first, what is left goes back
        acks = await self._durable(acks, waits)
        # A closing fetch and a renewing one (KIP-1222: fetching could outlast the renewed
        # locks) answer the acknowledged partitions only and fetch nothing.
        fetching = epoch != -1 and not renewing
        keys = sorted(update.session.partitions | set(acks)) if fetching else sorted(acks)
        answers: dict[SharePartitionKey, dict[str, Any]] = {}
        ready: list[tuple[SharePartitionKey, str, Partition]] = []
        for key in keys:
            topic_id, index = key
            name = self._name(topic_id)
            entry: dict[str, Any] = {"partition_index": index, "error_code": ErrorCode.none, "error_message": None,
                                     "acknowledge_error_code": acks.get(key, ErrorCode.none),
                                     "acknowledge_error_message": None,
                                     "current_leader": {"leader_id": -1, "leader_epoch": -1},
                                     "records": b"", "acquired_records": []}
            answers[key] = entry
            if name is None:
                entry["error_code"] = ErrorCode.unknown_topic_id
                continue
            entry["current_leader"] = self._leader(name, index)
            if not ctx.allowed(AclOperation.READ, ResourceType.TOPIC, name):
                entry["error_code"] = ErrorCode.topic_authorization_failed
                continue
            part, code = self.replicas.leader_partition(name, index)
            if part is None:
                entry["error_code"] = code
                continue
            if fetching and await self._load(group_id, name, topic_id, part) is None:
                continue  # its state is not read yet: no records this time
            ready.append((key, name, part))
        if fetching and ready:
            budget = min(max(0, int(req.max_records)), SHARE_FETCH_RECORDS_MAX)
            waited = min(max(0.0, req.max_wait.total_seconds()), SHARE_FETCH_WAIT_MAX_S)
            deadline = trio.current_time() + waited
            while True:
                now = self.replicas.clock.now_ms()
                settings = self.settings(group_id)  # changed while this fetch waited: from now on
                taken = 0
                for key, name, part in ready:
                    if taken >= budget:
                        break
                    data, acquired = self._acquire(group_id, member_id, name, part, budget - taken, now, settings,
                                                   mode)
                    if acquired:
                        answers[key]["records"] = data
                        answers[key]["acquired_records"] = acquired
                        taken += sum(r["last_offset"] - r["first_offset"] + 1 for r in acquired)
                if taken or budget == 0 or trio.current_time() >= deadline:
                    break
                await trio.sleep(SHARE_FETCH_POLL_S)
            lock["acquisition_lock_timeout"] = settings.lock_duration_ms
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (topic_id, _), entry in answers.items():
            by_topic.setdefault(topic_id, []).append(entry)
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, **lock,
                "responses": [{"topic_id": uuid.UUID(t), "partitions": ps} for t, ps in by_topic.items()],
                "node_endpoints": []}

    @staticmethod
    def _fetch_v2_problem(version: int, req: Any) -> tuple[int, str] | None:
        """ShareFetch v2's own checks, top-level INVALID_REQUEST as Kafka's: an unknown
        ShareAcquireMode; a renewing fetch (IsRenewAck) that asks for anything."""
        if version < 2:
            return None
        if int(req.share_acquire_mode) not in (BATCH_OPTIMIZED, RECORD_LIMIT):
            return ErrorCode.invalid_request, f"Unknown share acquire mode {int(req.share_acquire_mode)}"
        if req.is_renew_ack:
            asked = [name for name, value in (("maxBytes", int(req.max_bytes)), ("minBytes", int(req.min_bytes)),
                                              ("maxRecords", int(req.max_records)),
                                              ("maxWaitMs", int(req.max_wait.total_seconds() * 1000)))
                     if value != 0]
            if asked:
                return ErrorCode.invalid_request, ", ".join(f"{n} must be set to 0" for n in asked) + \
                    " if isRenewAck is true."
        return None

    # ---- ShareAcknowledge --------------------------------------------------------------

    async def handle_share_acknowledge(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        problem = self._checked(req, ctx)
        settings = self.settings(req.group_id or "")
        lock = {"acquisition_lock_timeout": settings.lock_duration_ms}  # v2's
        if problem is not None:
            return self._refused(*problem, lock)
        renewing = version >= 2 and bool(req.is_renew_ack)
        group_id, member_id, epoch = req.group_id, req.member_id, int(req.share_session_epoch)
        now = self.replicas.clock.now_ms()
        self._expire(now)
        update = self.sessions.acknowledge(group_id, member_id, epoch)
        if update.error != ErrorCode.none:
            return self._refused(update.error, f"share session: {ErrorCode(update.error).name}", lock)
        acks, waits = self._acknowledge(group_id, member_id, req.topics, now, ctx, settings, renew_allowed=renewing)
        self._release(update.released)  # a closing session: what its member still holds goes back
        acks = await self._durable(acks, waits)
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (topic_id, index), code in sorted(acks.items()):
            name = self._name(topic_id)
            by_topic.setdefault(topic_id, []).append({
                "partition_index": index, "error_code": code, "error_message": None,
                "current_leader": self._leader(name, index) if name is not None else
                {"leader_id": -1, "leader_epoch": -1}})
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, **lock,
                "responses": [{"topic_id": uuid.UUID(t), "partitions": ps} for t, ps in by_topic.items()],
                "node_endpoints": []}
