"""ReplicaManager: the trio shell around this broker's partition replicas (Kafka's ReplicaManager).

It owns the `Partition` objects (sans-IO, partition.py) and everything about them that
waits or talks: it makes the local replicas match the metadata image, appends produced
batches and holds acks=all answers until the high watermark passes them, answers fetches
(long polls included), sends the ISR changes partitions decide to the controller in its
own nursery, runs the replica fetchers of the partitions it follows and checkpoints high
watermarks. Handlers of the Kafka APIs (cluster/broker) call it; it never sees a request
frame. Time comes from the injected clock; deadlines from trio's.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import trio

from cluster.common.backoff import Backoff
from cluster.common.clock import Clock
from cluster.controller.image import MetadataImage, PartitionState, TopicImage
from cluster.controller.service import ControllerUnavailable
from cluster.protocol.errors import ErrorCode
from cluster.protocol.internal import mirror_fenced
from cluster.protocol.record_batch import (
    BATCH_HEADER_SIZE,
    InvalidRecordBatch,
    UnsupportedMagic,
    read_header,
    scan_batches,
)
from cluster.protocol.sentinels import CONSUMER_REPLICA_ID, DEBUGGING_REPLICA_ID
from cluster.replication.fetch_sessions import FetchSessionCache
from cluster.replication.fetcher import FetcherSettings, FollowerContext, ReplicaFetcherManager
from cluster.replication.metrics import ReplicationMetrics
from cluster.replication.partition import (
    ISR_CHANGE_RETRY_BACKOFF_MS,
    AlterIsr,
    IsrAnswer,
    Partition,
    PartitionRole,
    ReadResult,
    isr_answer,
)
from cluster.replication.replica_selector import RACK_AWARE_SELECTOR
from cluster.storage.checkpoint import sync_filesystem
from cluster.storage.config import LogConfig
from cluster.storage.leader_epoch import LeaderEpochCache
from cluster.storage.log import (
    Log,
    NotEnoughReplicas,
    OutOfOrderSequence,
    ProducerFenced,
    RecordTooLarge,
    RejectedRecords,
    StorageError,
    UnexpectedAppendOffset,
)
from cluster.storage.log_manager import (
    REPLICATION_OFFSET_FILE,
    LogManager,
    read_offset_checkpoint,
    write_offset_checkpoint,
)
from cluster.storage.meta_properties import read_partition_topic_id, write_partition_topic_id

log = logging.getLogger(__name__)
# Leadership changes logged one line each up to this many per reconcile (operators and tests
# follow "broker N leads T-P"); more are summarized, the first few named.
LEADERSHIP_LINES_MAX = 100

Key = tuple[str, int]


class IsrChannel(Protocol):
    """How ISR changes reach the controller (the broker wires its controller channel)."""

    async def alter_partition(self, change: AlterIsr) -> int:
        """The controller's error code (none: committed, and this broker has applied the
        metadata carrying it). Raises ControllerUnavailable when no controller answered."""
        ...


class AppendWaiters:
    """Wakes long-polling fetches and acks=all producers when a partition they watch changes."""

    def __init__(self) -> None:
        self._waiters: dict[Key, set[trio.Event]] = {}

    def register(self, keys: Iterable[Key], event: trio.Event) -> None:
        for key in keys:
            self._waiters.setdefault(key, set()).add(event)

    def unregister(self, keys: Iterable[Key], event: trio.Event) -> None:
        for key in keys:
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiters[key]

    def notify(self, key: Key) -> None:
        waiters = self._waiters.pop(key, None)
        if waiters:
            for event in waiters:
                event.set()

    async def wait(self, keys: list[Key], deadline: float) -> None:
        """Until one of `keys` changes or trio's clock passes `deadline`."""
        event = trio.Event()
        self.register(keys, event)
        try:
            with trio.move_on_at(deadline):
                await event.wait()
        finally:
            self.unregister(keys, event)


class FetchPartition(NamedTuple):
    """What a fetch asks of one partition (Fetch request fields, any version). A tuple: a
    sessionless consumer names every partition it reads in every Fetch (10,000 of them)."""

    topic: str
    partition: int
    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int = -1
    log_start_offset: int = -1  # a follower's own log start (-1 from consumers)


@dataclass(frozen=True, slots=True)
class ReplicaSettings:
    """Broker configs the replica manager acts on (Kafka's names in the comments)."""

    replica_lag_time_max_ms: int = 30_000  # replica.lag.time.max.ms
    fetch_max_bytes: int = 57_671_680  # fetch.max.bytes
    fetch_session_cache_slots: int = 1000  # max.incremental.fetch.session.cache.slots
    fetcher: FetcherSettings = FetcherSettings()  # replica.fetch.*
    replica_selector: str = ""  # replica.selector.class (KIP-392; empty: consumers read from leaders)


# Metadata records about one topic (they carry its topic_id), and records that change nothing
# a replica depends on. Any other record (brokers, broker configs, features) may change every
# replica: ReplicaManager.reconcile then looks at all of them.
_TOPIC_RECORDS = frozenset({"Topic", "Partition", "PartitionChange", "TopicConfig", "RemoveTopic"})
_NOT_REPLICA_RECORDS = frozenset({"ProducerIds", "ScramCredential", "RemoveScramCredential", "Acl", "RemoveAcl",
                                  "ClientQuota"})


def changed_topic_ids(records: Iterable[dict[str, Any]]) -> set[str] | None:
    """The topics whose replicas a batch of applied metadata records may change, or None
    when the batch holds a record that may change any replica."""
    out: set[str] = set()
    for r in records:
        kind = r.get("type")
        if kind in _TOPIC_RECORDS:
            out.add(str(r["topic_id"]))
        elif kind not in _NOT_REPLICA_RECORDS:
            return None
    return out


class ReplicaManager:
    def __init__(self, node_id: int, data_dir: Path, logs: LogManager, settings: ReplicaSettings, *,
                 clock: Clock, image: Callable[[], MetadataImage], log_config: Callable[[dict[str, str]], LogConfig],
                 isr_channel: IsrChannel, metrics: ReplicationMetrics | None = None) -> None:
        self.node_id = node_id
        self.data_dir = data_dir
        self.logs = logs
        self.settings = settings
        self.clock = clock
        self._image = image
        self._log_config = log_config
        self.isr_channel = isr_channel
        self.metrics = metrics or ReplicationMetrics()
        self.partitions: dict[Key, Partition] = {}
        self.waiters = AppendWaiters()
        self.fetch_sessions = FetchSessionCache(settings.fetch_session_cache_slots)
        self.fetchers = ReplicaFetcherManager(FollowerContext(node_id, self.partitions, self._leader_address,
                                                              settings.fetcher, clock, self._log_start_moved,
                                                              self.waiters.notify, self._epochs_changed))
        self._log_start_lock = trio.Lock()  # one writer of the log-start-offset-checkpoint at a time
        # Called after every reconciliation with the keys of replicas dropped or recreated.
        self.on_partitions_changed: list[Callable[[], None]] = []
        self._hw_checkpoint: dict[str, int] = {}  # read at startup, consumed as replicas open
        self._reconciled_once = False
        self._nursery: trio.Nursery | None = None
        # partition.metadata files still to write: partition directory -> topic id. They are
        # written and fsynced in a worker thread (Kafka schedules its "flush-metadata-file"
        # too), not in `reconcile`: two fsyncs per new replica in the event loop held up the
        # quorum, heartbeats and requests alike, seconds for a 50-partition internal topic on
        # a busy disk, until the controller fenced the broker and the quorum lost its leader.
        self._unwritten_topic_ids: dict[Path, str] = {}
        # Leader epoch checkpoints a role change added an epoch to, written by the same
        # worker (LeaderEpochCache: 10,000 of them in the event loop missed heartbeats).
        self._unwritten_epochs: dict[Path, LeaderEpochCache] = {}
        self._unmade_index_files: dict[Path, Log] = {}  # new logs whose first segment has no index files yet
        self._checkpoint_writer_running = False

    @property
    def image(self) -> MetadataImage:
        return self._image()

    def broker_address(self, broker_id: int) -> tuple[str, int] | None:
        """Where a broker takes inter-broker requests."""
        return self._leader_address(broker_id)

    def _leader_address(self, broker_id: int) -> tuple[str, int] | None:
        reg = self.image.brokers.get(broker_id)
        return (reg.host, reg.port) if reg is not None else None

    # ---- running ---------------------------------------------------------------------

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """ISR changes, the ISR shrink check and the replica fetchers, in one nursery."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self.fetchers.run)
            task_status.started()
            await trio.sleep_forever()

    def start_background(self, nursery: trio.Nursery) -> None:
        nursery.start_soon(self.isr_shrink_loop)

    def load(self) -> None:
        """Read the high-watermark checkpoint; replicas pick their value up as they open."""
        self._hw_checkpoint = read_offset_checkpoint(self.data_dir / REPLICATION_OFFSET_FILE,
                                                     "high watermarks start at 0")

    def checkpoint_high_watermarks(self) -> Callable[[], None]:
        """What writes every replica's high watermark now (the file write may run in a thread)."""
        offsets = {key: part.high_watermark for key, part in self.partitions.items()}
        return functools.partial(write_offset_checkpoint, self.data_dir / REPLICATION_OFFSET_FILE, offsets)

    async def high_watermark_checkpoint_loop(self, interval_s: float, ready: trio.Event) -> None:
        while True:
            await trio.sleep(interval_s)
            if ready.is_set():
                try:
                    await trio.to_thread.run_sync(self.checkpoint_high_watermarks())
                except OSError as exc:
                    log.error("writing the high-watermark checkpoint failed: %s", exc)
                await self.checkpoint_log_starts()

    # ---- matching the metadata -------------------------------------------------------

    def reconcile(self, topic_ids: Collection[str] | None = None) -> None:
        """Make the local replicas match the metadata image: those of the topics `topic_ids`
        names (a metadata change that touched only them: the cost follows the change, not
        the partitions this broker holds), or all of them (None: start-up, a snapshot, a
        change of brokers, broker configs or features)."""
        image = self.image
        now = self.clock.now_ms()
        wanted: dict[Key, tuple[TopicImage, PartitionState]] = {}
        if topic_ids is None:
            for t, p in image.all_partitions():
                if self.node_id in p.replicas:
                    wanted[(t.name, p.partition)] = (t, p)
            candidates = list(self.partitions)
        else:
            for topic_id in sorted(topic_ids):  # an order that does not depend on string hashing
                found = image.topics.get(topic_id)
                if found is None:
                    continue
                for p in found.partitions.values():
                    if self.node_id in p.replicas:
                        wanted[(found.name, p.partition)] = (found, p)
            names = {t.name for t, _ in wanted.values()}
            candidates = [key for key, part in self.partitions.items() if part.topic_id in topic_ids or key[0] in names]
        for key in candidates:
            if key not in wanted or wanted[key][0].topic_id != self.partitions[key].topic_id:
                self._drop_replica(key)
        if topic_ids is None:
            for key in list(self.logs.logs):
                if key not in self.partitions and key not in wanted:
                    # Found on disk at startup but unknown to the metadata: never delete data on
                    # that evidence alone (a lost metadata directory would empty the broker).
                    self.logs.delete_log(*key, keep_as_stray=True)
        configs: dict[str, LogConfig] = {}  # one LogConfig per topic, not per partition
        led: list[Partition] = []  # replicas that became leader or lead in a new epoch
        for key, (t, p) in wanted.items():
            config = configs.get(t.topic_id)
            if config is None:
                config = configs[t.topic_id] = self._log_config(t.configs)
            part = self.partitions.get(key)
            if part is None:
                part = self._open_replica(t, p, config, now)
            if part.log.config != config:
                if part.log.config.mirror_source and not config.mirror_source:
                    # Promoted: the source's producer ids, copied with its batches, are no
                    # ids of this cluster (docs/design.md, "Mirror topics keep offsets").
                    forgotten, carried = part.log.promote_producers()
                    log.info("%s is promoted (mirror.source removed): %d mirrored producer id(s) forgotten, %d "
                             "with an open transaction carried until it ends", part.log.name, forgotten, len(carried))
                part.log.config = config
            if self._apply_role(part, p, now):
                led.append(part)
            if part.is_leader and part.log.producer_state.carried and not config.mirror_source:
                self._abort_carried(part, now)
        self._log_leadership(led)
        self._reconciled_once = True
        self._schedule_checkpoints()
        for listener in self.on_partitions_changed:
            listener()
        self.fetchers.update()

    def _abort_carried(self, part: Partition, now_ms: int) -> None:
        """The leader of a promoted mirror topic ends the source's open transactions with an
        ABORT marker before it takes any produce (their coordinator is in the other cluster
        and never will): no half of them is ever read committed, and the marker forgets their
        producer ids, which a producer of this cluster may be given."""
        for entry in part.log.producer_state.carried_open():
            try:
                part.append_marker(producer_id=entry.producer_id, producer_epoch=entry.epoch, commit=False,
                                   coordinator_epoch=max(0, entry.coordinator_epoch), now_ms=now_ms)
            except (ProducerFenced, StorageError) as exc:
                log.error("%s: aborting the open transaction of source producer %d: %s", part.log.name,
                          entry.producer_id, exc)
                continue
            log.info("%s: the open transaction of source producer %d (epoch %d) aborted at promotion",
                     part.log.name, entry.producer_id, entry.epoch)
            self.waiters.notify(part.key)

    def _open_replica(self, t: TopicImage, p: PartitionState, config: LogConfig, now_ms: int) -> Partition:
        lg = self.logs.get(t.name, p.partition)
        on_disk = None
        if lg is not None:
            on_disk = read_partition_topic_id(lg.dir)
            if on_disk is not None and on_disk != t.topic_id:
                log.info("%s belongs to an earlier topic of that name (id %s)", lg.dir.name, on_disk)
                self.logs.delete_log(t.name, p.partition, keep_as_stray=not self._reconciled_once)
                lg, on_disk = None, None
        if lg is None:
            # Its empty index files are made by the checkpoint writer, off the event loop
            # (file creation costs ~0.5 ms each on a slow disk: 10,000 new partitions...).
            lg = self.logs.create_log(t.name, p.partition, config, now_ms, index_files=False)
            self._unmade_index_files[lg.dir] = lg
        if on_disk != t.topic_id:
            self._unwritten_topic_ids[lg.dir] = t.topic_id
        part = Partition(t.name, p.partition, lg, t.topic_id, local_id=self.node_id)
        part.hw = min(self._hw_checkpoint.pop(lg.name, 0), lg.log_end_offset)
        self.partitions[(t.name, p.partition)] = part
        return part

    def _apply_role(self, part: Partition, p: PartitionState, now_ms: int) -> bool:
        """Apply the image's role; True when the replica became leader or leads in a new epoch."""
        change = part.apply_role(PartitionRole(p.leader, p.leader_epoch, p.partition_epoch, tuple(p.replicas),
                                               tuple(p.isr), self.image.elr_enabled), now_ms)
        self.metrics.isr_shrinks += change.isr_shrunk
        self.metrics.isr_expands += change.isr_expanded
        if part.log.leader_epochs.dirty:
            self._unwritten_epochs[part.log.dir] = part.log.leader_epochs
        if change.high_watermark_moved or change.became_leader or change.became_follower or change.epoch_changed \
                or change.isr_shrunk:
            self.waiters.notify(part.key)  # long polls and acks=all waits re-check (strict min ISR: a shrink)
        return change.became_leader or (part.is_leader and change.epoch_changed)

    def _epochs_changed(self, part: Partition) -> None:
        """A follower's fetched batch began a leader epoch: written soon, by the worker."""
        self._unwritten_epochs[part.log.dir] = part.log.leader_epochs
        self._schedule_checkpoints()

    def _log_leadership(self, led: list[Partition]) -> None:
        """One line per new leadership for a few; a summary for many (a broker taking 10,000
        partitions logged 10,000 lines per change), each at DEBUG."""
        if len(led) <= LEADERSHIP_LINES_MAX:
            for part in led:
                log.info("broker %d leads %s-%d (leader epoch %d)", self.node_id, part.topic, part.index,
                         part.leader_epoch)
            return
        log.info("broker %d leads %d more partition(s) or in new leader epochs (%s, ...; each at DEBUG)",
                 self.node_id, len(led), ", ".join(f"{p.topic}-{p.index}" for p in led[:10]))
        if log.isEnabledFor(logging.DEBUG):
            for part in led:
                log.debug("broker %d leads %s-%d (leader epoch %d)", self.node_id, part.topic, part.index,
                          part.leader_epoch)

    def _drop_replica(self, key: Key) -> None:
        self.partitions.pop(key, None)
        lg = self.logs.get(*key)
        if lg is not None:
            self._unwritten_topic_ids.pop(lg.dir, None)
            self._unwritten_epochs.pop(lg.dir, None)
            self._unmade_index_files.pop(lg.dir, None)
        self.logs.delete_log(*key)
        self.waiters.notify(key)

    def _schedule_checkpoints(self) -> None:
        """The partition.metadata files new replicas need and the leader epochs role changes
        added: in a worker thread once the replica manager runs (in order: a directory's
        latest id is written last), at once before (and in the sans-IO simulation, whose disk
        model wants them written)."""
        if not self._unwritten_topic_ids and not self._unwritten_epochs and not self._unmade_index_files:
            return
        if self._nursery is None:
            self._write_checkpoints(*self._take_unwritten())
        elif not self._checkpoint_writer_running:
            self._checkpoint_writer_running = True
            self._nursery.start_soon(self._checkpoint_writer)

    def _take_unwritten(self) -> tuple[dict[Path, str], list[LeaderEpochCache], list[Log]]:
        ids, self._unwritten_topic_ids = self._unwritten_topic_ids, {}
        epochs, self._unwritten_epochs = self._unwritten_epochs, {}
        new_logs, self._unmade_index_files = self._unmade_index_files, {}
        return ids, list(epochs.values()), list(new_logs.values())

    @staticmethod
    def _write_checkpoints(topic_ids: dict[Path, str], epochs: list[LeaderEpochCache], new_logs: list[Log]) -> None:
        for lg in new_logs:
            for seg in list(lg.segments):
                try:
                    seg.create_index_files()
                except FileNotFoundError:
                    pass  # the log was deleted meanwhile
                except OSError as exc:  # an index file first written creates itself; a load rebuilds a missing one
                    log.error("creating the index files of %s failed: %s", seg.log_path, exc)
        write_topic_ids(topic_ids)
        for cache in epochs:
            try:
                cache.write(fsync=False)
            except OSError as exc:  # as a failed flush: the next flush or close writes it again
                log.error("writing %s failed: %s", cache.path, exc)

    async def _checkpoint_writer(self) -> None:
        try:
            while self._unwritten_topic_ids or self._unwritten_epochs or self._unmade_index_files:
                await trio.to_thread.run_sync(self._write_checkpoints, *self._take_unwritten())
        finally:
            self._checkpoint_writer_running = False

    # ---- produce ---------------------------------------------------------------------

    def transaction_start(self, topic: str, index: int, records: bytes | None) -> tuple[int, int, object] | None:
        """KIP-890: (producer id, epoch, guard) when `records` would open a transaction at
        this leader (the producer has none ongoing here), so its coordinator must confirm the
        partition is in the transaction first; pass the guard to `append`. Requests of one
        producer verified at once share the guard; a marker meanwhile takes it away."""
        part = self.partitions.get((topic, index))
        if part is None or not part.is_leader or not records or len(records) < BATCH_HEADER_SIZE:
            return None
        header = read_header(records)
        state = part.log.producer_state
        if not header.is_transactional or header.is_control or header.producer_id < 0 \
                or header.producer_id in state.ongoing:
            return None
        guard = state.verifying.setdefault(header.producer_id, object())
        return header.producer_id, header.producer_epoch, guard

    def verification_failed(self, topic: str, index: int, producer_id: int) -> None:
        part = self.partitions.get((topic, index))
        if part is not None:
            part.log.producer_state.verifying.pop(producer_id, None)

    def append(self, topic: str, index: int, records: bytes | None, *, min_isr_checked: bool = False,
               verified: object | None = None) -> dict[str, Any]:
        """Append one partition's payload as its leader; the per-partition produce answer.
        `verified`: the guard of `transaction_start`, still valid unless the transaction
        ended while it was verified (then INVALID_TXN_STATE: the batch would hang open)."""
        part = self.partitions.get((topic, index))
        if part is None:
            code = ErrorCode.not_leader_or_follower if self.image.partition(topic, index) else ErrorCode.unknown_topic_or_partition
            return {"index": index, "error_code": code, "base_offset": -1}
        if not part.is_leader:
            return {"index": index, "error_code": ErrorCode.not_leader_or_follower, "base_offset": -1}
        if part.log.config.mirror_source:
            return mirror_topic_refusal(topic, part.log.config.mirror_source, index)
        if not records:
            return {"index": index, "error_code": ErrorCode.corrupt_message, "base_offset": -1,
                    "error_message": "produce carries no records"}
        if verified is not None:
            state = part.log.producer_state
            pid = read_header(records).producer_id
            if pid not in state.ongoing and state.verifying.get(pid) is not verified:
                return {"index": index, "error_code": ErrorCode.invalid_txn_state, "base_offset": -1,
                        "log_start_offset": -1,
                        "error_message": f"the transaction of producer {pid} ended while this produce was verified"}
        # Kafka answers the log start offset with a refusal, except for the errors its
        # ReplicaManager.appendToLocalLog lists (too large, corrupt, storage: -1)
        log_start = part.log.log_start_offset
        try:
            result = part.append_as_leader(records, min_isr_checked=min_isr_checked, now_ms=self.clock.now_ms())
        except NotEnoughReplicas:
            return {"index": index, "error_code": ErrorCode.not_enough_replicas, "base_offset": -1,
                    "log_start_offset": log_start, "error_message": part.not_enough_replicas_message()}
        except UnsupportedMagic as exc:
            return _produce_error(index, ErrorCode.unsupported_for_message_format, exc)
        except InvalidRecordBatch as exc:
            return _produce_error(index, ErrorCode.corrupt_message, exc)
        except RejectedRecords as exc:
            answer = _produce_error(index, ErrorCode.invalid_timestamp if exc.timestamp else ErrorCode.invalid_record,
                                    exc, log_start)
            answer["record_errors"] = [{"batch_index": i, "batch_index_error_message": m} for i, m in exc.errors]
            return answer
        except RecordTooLarge as exc:
            return _produce_error(index, ErrorCode.message_too_large, exc)
        except ProducerFenced as exc:
            return _produce_error(index, ErrorCode.invalid_producer_epoch, exc, log_start)
        except OutOfOrderSequence as exc:
            return _produce_error(index, ErrorCode.out_of_order_sequence_number, exc, log_start)
        except StorageError as exc:
            log.error("%s", exc)
            return _produce_error(index, ErrorCode.kafka_storage_error, exc)
        if not result.duplicate:
            self.waiters.notify((topic, index))
            counters = self.metrics.topic(topic)
            counters.records_in += result.record_count
            counters.bytes_in += len(records)
        return {
            "index": index,
            "error_code": ErrorCode.none,
            "base_offset": result.base_offset,
            "log_append_time": result.log_append_time_ms,
            "log_start_offset": result.log_start_offset,
        }

    def write_marker(self, topic: str, index: int, *, producer_id: int, producer_epoch: int, commit: bool,
                     coordinator_epoch: int) -> dict[str, Any]:
        """Append a transaction marker as the partition's leader; the per-partition answer
        (base_offset set, for wait_for_acks_all)."""
        part = self.partitions.get((topic, index))
        if part is None or not part.is_leader:
            code = (ErrorCode.not_leader_or_follower if self.image.partition(topic, index)
                    else ErrorCode.unknown_topic_or_partition)
            return {"index": index, "error_code": code, "base_offset": -1}
        if part.log.config.mirror_source and producer_id not in part.log.producer_state.ongoing:
            # Nothing of a transaction is on a mirror topic's partition but what its source
            # wrote (producers are refused): a marker there would take an offset the source's
            # next batch holds. Answered as done, so the coordinator completes the transaction.
            # A transaction open on it is another matter: one of this cluster's, begun before
            # the topic became a copy (a promotion or a failback made it read-only under it),
            # ends with its marker, or its commit would be answered and never read.
            return {"index": index, "error_code": ErrorCode.none, "base_offset": -1}
        try:
            result = part.append_marker(producer_id=producer_id, producer_epoch=producer_epoch, commit=commit,
                                        coordinator_epoch=coordinator_epoch, now_ms=self.clock.now_ms())
        except ProducerFenced as exc:
            return _produce_error(index, ErrorCode.invalid_producer_epoch, exc)
        except StorageError as exc:
            log.error("%s", exc)
            return _produce_error(index, ErrorCode.kafka_storage_error, exc)
        self.waiters.notify((topic, index))
        return {"index": index, "error_code": ErrorCode.none, "base_offset": result.base_offset}

    async def wait_for_acks_all(self, responses: list[dict[str, Any]], timeout_s: float) -> None:
        """acks=all: hold the answer until every appended batch is below the high watermark."""
        deadline = trio.current_time() + timeout_s
        for t in responses:
            for r in t["partition_responses"]:
                if r["error_code"] != ErrorCode.none or r.get("base_offset", -1) < 0:
                    continue
                await self._wait_for_high_watermark((t["name"], r["index"]), r["base_offset"] + 1, deadline, r)

    async def _wait_for_high_watermark(self, key: Key, needed: int, deadline: float, answer: dict[str, Any]) -> None:
        """Until the high watermark reaches `needed` (or leadership moves, the ISR shrinks
        below min.insync.replicas, trio's clock passes `deadline`: `answer` says which)."""
        while True:
            part = self.partitions.get(key)
            outcome = part.acks_all_outcome(needed) if part is not None else ErrorCode.not_leader_or_follower
            if outcome == ErrorCode.not_leader_or_follower:
                answer.update(error_code=outcome, error_message="leadership moved")
                return
            if outcome == ErrorCode.not_enough_replicas_after_append:
                assert part is not None
                answer.update(error_code=outcome, error_message=f"the ISR shrank to {list(part.isr)} while waiting")
                return
            if outcome is not None:
                return
            if trio.current_time() >= deadline:
                answer.update(error_code=ErrorCode.request_timed_out,
                              error_message="the in-sync replicas did not all acknowledge in time")
                return
            await self.waiters.wait([key], deadline)

    # ---- mirror topics ---------------------------------------------------------------

    async def append_mirrored(self, topic: str, index: int, records: bytes, log_start_offset: int,
                              deadline: float) -> dict[str, Any]:
        """Append batches copied from a mirror topic's source at their own offsets, as the
        partition's leader, and wait (until trio's clock passes `deadline`) until the high
        watermark covers them, as acks=all does; then follow the source's log start
        (`log_start_offset`, -1: not given) up to the high watermark. The answer: error code
        and message, log end offset, high watermark, log start offset."""
        answer: dict[str, Any] = {"partition": index, "error_code": ErrorCode.none, "error_message": None,
                                  "log_end_offset": -1, "high_watermark": -1, "log_start_offset": -1}
        part, code = self.leader_partition(topic, index)
        if part is None:
            answer["error_code"] = code
            return answer
        if not part.log.config.mirror_source:
            answer.update(error_code=ErrorCode.invalid_request,
                          error_message=f"{topic} is not a mirror topic (no mirror.source): only mirror topics "
                                        "take mirrored batches")
            return answer
        if mirror_fenced(part.log.config.mirror_source):
            answer.update(error_code=ErrorCode.invalid_request,
                          error_message=f"{topic} is held by a disaster-recovery step (mirror.source "
                                        f"{part.log.config.mirror_source}): it takes no mirrored batches")
            return answer
        needed = part.log.log_end_offset
        if records:
            try:
                result = part.append_mirrored(records, now_ms=self.clock.now_ms())
            except UnexpectedAppendOffset as exc:
                answer.update(error_code=ErrorCode.offset_out_of_range, error_message=str(exc))
            except UnsupportedMagic as exc:
                answer.update(error_code=ErrorCode.unsupported_for_message_format, error_message=str(exc))
            except InvalidRecordBatch as exc:
                answer.update(error_code=ErrorCode.corrupt_message, error_message=str(exc))
            except StorageError as exc:
                log.error("%s", exc)
                answer.update(error_code=ErrorCode.kafka_storage_error, error_message=str(exc))
            else:
                if result.offsets_appended:
                    self.waiters.notify(part.key)
                    counters = self.metrics.topic(topic)
                    counters.records_in += result.offsets_appended
                    counters.bytes_in += len(records)
                # A retry of batches already here waits for them too: answered only once committed.
                needed = min(scan_batches(records).next_offset, result.log_end_offset)
        if answer["error_code"] == ErrorCode.none:
            await self._wait_for_high_watermark(part.key, needed, deadline, answer)
        if answer["error_code"] == ErrorCode.none and log_start_offset > part.log.log_start_offset:
            if part.delete_records_before(min(log_start_offset, part.high_watermark)) == ErrorCode.none:
                await self.checkpoint_log_starts()
                self.waiters.notify(part.key)  # followers' long polls answer with the new log start
        answer.update(log_end_offset=part.log.log_end_offset, high_watermark=part.high_watermark,
                      log_start_offset=part.log.log_start_offset)
        return answer

    # ---- DeleteRecords ---------------------------------------------------------------

    async def delete_records(self, topic: str, index: int, offset: int, deadline: float) -> tuple[int, int]:
        """Move a led partition's log start to `offset` (-1: its high watermark), make that
        durable, then wait until every in-sync replica's start got there (or trio's clock
        passes `deadline`: REQUEST_TIMED_OUT). (error code, low watermark)."""
        part, code = self.leader_partition(topic, index)
        if part is None:
            return code, -1
        code = part.delete_records_before(offset)
        if code != ErrorCode.none:
            return code, -1
        target = part.log.log_start_offset
        await self.checkpoint_log_starts()
        self.waiters.notify(part.key)  # followers' long polls answer with the new log start
        while True:
            if not part.is_leader or self.partitions.get(part.key) is not part:
                return ErrorCode.not_leader_or_follower, -1
            low = part.low_watermark
            if low >= target:
                return ErrorCode.none, low
            if trio.current_time() >= deadline:
                return ErrorCode.request_timed_out, low
            await self.waiters.wait([part.key], deadline)

    async def checkpoint_log_starts(self) -> None:
        """Write where every log starts (after DeleteRecords moved one)."""
        async with self._log_start_lock:
            try:
                await trio.to_thread.run_sync(self.logs.checkpoint_log_start_offsets())
            except OSError as exc:
                log.error("writing the log-start-offset checkpoint failed: %s", exc)

    def _log_start_moved(self) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(self.checkpoint_log_starts)

    # ---- fetch -----------------------------------------------------------------------

    def _rack_of(self, broker_id: int) -> str | None:
        """A broker's rack; None for one that cannot serve now (fenced, shutting down,
        unknown), which a consumer is then never sent to (Kafka: no endpoint, not chosen)."""
        registration = self.image.brokers.get(broker_id)
        if registration is None or registration.fenced or registration.in_controlled_shutdown:
            return None
        return registration.rack

    def read_partition(self, fp: FetchPartition, replica_id: int, budget: int,
                       first: bool, read_committed: bool = False,
                       client_rack: str | None = None) -> tuple[dict[str, Any], int, bool]:
        """One partition of a fetch: (answer, bytes of records, whether it is an error or
        sends the consumer elsewhere). `client_rack` is the consumer's rack_id (Fetch v11+;
        None before): a leader may answer with a preferred read replica and no records
        (KIP-392), and a follower serves such a consumer."""
        part = self.partitions.get((fp.topic, fp.partition))
        preferred = -1
        if (part is not None and client_rack and replica_id < 0 and part.is_leader
                and self.settings.replica_selector == RACK_AWARE_SELECTOR):
            preferred = part.preferred_read_replica(client_rack, fp.fetch_offset, self.clock.now_ms(), self._rack_of)
        if part is None:
            code = (ErrorCode.not_leader_or_follower if self.image.partition(fp.topic, fp.partition)
                    else ErrorCode.unknown_topic_or_partition)
            result = ReadResult(code)
        elif preferred >= 0:
            epoch_error = part.check_leader_epoch(fp.current_leader_epoch, replica_id)
            result = ReadResult(epoch_error, b"", part.high_watermark, part.log.log_start_offset,
                                last_stable_offset=part.last_stable_offset)
            if epoch_error != ErrorCode.none:
                preferred = -1
        else:
            result = part.read_records(fp.fetch_offset, min(fp.partition_max_bytes, budget), replica_id=replica_id,
                                       current_leader_epoch=fp.current_leader_epoch, min_one_batch=first,
                                       now_ms=self.clock.now_ms(), read_committed=read_committed,
                                       replica_log_start=fp.log_start_offset, follower_read=client_rack is not None)
            if result.follower is not None:
                if result.follower.high_watermark_moved or result.follower.log_start_moved:
                    self.waiters.notify(part.key)
                if result.follower.alter_isr is not None:
                    self.send_isr_change(part, result.follower.alter_isr)
        answer = {"partition_index": fp.partition, "error_code": result.error,
                  "high_watermark": result.high_watermark, "last_stable_offset": result.last_stable_offset,
                  "log_start_offset": result.log_start_offset, "preferred_read_replica": preferred,
                  "records": result.records}
        if result.error == ErrorCode.unknown_topic_or_partition:
            answer["aborted_transactions"] = []  # Kafka's answer for a partition its metadata lacks
        elif result.error != ErrorCode.none and replica_id < 0:
            # As Kafka tells a consumer: no offsets with an error (its followers ask ListOffsets;
            # ours restart at the leader's log start carried here, so they keep it)
            answer.update(high_watermark=-1, last_stable_offset=-1, log_start_offset=-1)
        elif result.high_watermark >= 0:
            # read_committed: a list, empty when nothing read was aborted (Kafka); else null
            answer["aborted_transactions"] = (
                [] if result.aborted is None and read_committed else None if result.aborted is None
                else [{"producer_id": a.producer_id, "first_offset": a.first_offset} for a in result.aborted])
        return answer, len(result.records), result.error != ErrorCode.none or preferred >= 0

    def read_all(self, wanted: list[FetchPartition], replica_id: int, max_bytes: int,
                 read_committed: bool = False,
                 client_rack: str | None = None) -> tuple[list[tuple[str, dict[str, Any]]], int, bool]:
        limit = self.settings.fetch_max_bytes
        budget = min(max_bytes if max_bytes > 0 else limit, limit)
        total = 0
        any_error = False
        out: list[tuple[str, dict[str, Any]]] = []
        # A consumer's partitions with nothing new are answered from what their leaders keep
        # (Partition.idle_answer); not when a rack-aware selector may send it elsewhere.
        idle = replica_id == CONSUMER_REPLICA_ID and not (
            client_rack and self.settings.replica_selector == RACK_AWARE_SELECTOR)
        partitions = self.partitions
        append = out.append
        for fp in wanted:
            if idle:
                part = partitions.get((fp.topic, fp.partition))
                if part is not None:
                    kept = part.idle_answer(fp.fetch_offset, fp.current_leader_epoch, read_committed)
                    if kept is not None:
                        append((fp.topic, kept))
                        continue
            resp, size, error = self.read_partition(fp, replica_id, budget - total, total == 0, read_committed,
                                                    client_rack)
            append((fp.topic, resp))
            total += size
            any_error |= error
        return out, total, any_error

    async def fetch(self, wanted: list[FetchPartition], *, replica_id: int, max_wait_s: float, min_bytes: int,
                    max_bytes: int, read_committed: bool = False,
                    client_rack: str | None = None) -> tuple[list[tuple[str, dict[str, Any]]], int]:
        """Read every wanted partition; hold the answer (long poll) until `min_bytes` are
        there, a partition has an error or a preferred read replica, or `max_wait_s`
        passed. (answers, bytes). `client_rack`: see read_partition."""
        deadline = trio.current_time() + max(0.0, max_wait_s)
        keys: list[tuple[str, int]] | None = None  # made when the answer waits
        while True:
            answers, total, any_error = self.read_all(wanted, replica_id, max_bytes, read_committed, client_rack)
            if total >= min_bytes or any_error or trio.current_time() >= deadline or not wanted:
                break
            if keys is None:
                keys = [(fp.topic, fp.partition) for fp in wanted]
            await self.waiters.wait(keys, deadline)
        if replica_id >= 0:
            self.metrics.replication_bytes_out += total
        elif total and replica_id != DEBUGGING_REPLICA_ID:
            for topic, resp in answers:
                data = resp["records"]
                if data:
                    counters = self.metrics.topic(topic)
                    counters.bytes_out += len(data)
                    counters.records_out += scan_batches(data).records
        return answers, total

    # ---- ISR changes -----------------------------------------------------------------

    async def isr_shrink_loop(self) -> None:
        """Leader: followers not caught up for replica.lag.time.max.ms leave the ISR."""
        while True:
            await trio.sleep(self.settings.replica_lag_time_max_ms / 2000)
            self.check_isr_lag()

    def check_isr_lag(self) -> None:
        now = self.clock.now_ms()
        for part in list(self.partitions.values()):
            change = part.maybe_shrink_isr(now, self.settings.replica_lag_time_max_ms)
            if change is not None:
                self.send_isr_change(part, change)

    def send_isr_change(self, part: Partition, change: AlterIsr) -> None:
        """The one place an ISR decision leaves the replica manager: to the controller, in
        the background (the replication simulation routes it over its own network)."""
        if self._nursery is None:
            part.isr_change_answered(change, IsrAnswer.UNKNOWN, self.clock.now_ms())
            return
        self._nursery.start_soon(self._alter_isr, part, change)

    async def _alter_isr(self, part: Partition, change: AlterIsr) -> None:
        """Send `change` until its outcome is known (or no longer matters)."""
        backoff = Backoff(ISR_CHANGE_RETRY_BACKOFF_MS / 1000, 5.0)
        while True:
            try:
                code = await self.isr_channel.alter_partition(change)
                answer = isr_answer(code)
                detail = ErrorCode(code).name
            except ControllerUnavailable as exc:
                answer, detail = IsrAnswer.UNKNOWN, str(exc)
            if answer is IsrAnswer.COMMITTED:
                log.info("broker %d: ISR of %s-%d is now %s (%s)", self.node_id, part.topic, part.index,
                         list(change.isr), change.reason)
            else:
                log.info("ISR %s of %s-%d: %s (%s)", change.reason, part.topic, part.index, answer.value, detail)
            again = part.isr_change_answered(change, answer, self.clock.now_ms())
            self.waiters.notify(part.key)
            if not again or self.partitions.get(part.key) is not part:
                return
            await backoff.sleep()

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(fn, *args)

    # ---- helpers for the API handlers ------------------------------------------------

    def end_offset_for_epoch(self, topic: str, index: int, current_leader_epoch: int,
                             leader_epoch: int) -> tuple[int, int, int]:
        """OffsetForLeaderEpoch for one partition: (error, epoch, end offset)."""
        part = self.partitions.get((topic, index))
        if part is None:
            return ErrorCode.unknown_topic_or_partition, -1, -1
        if not part.is_leader:
            return ErrorCode.not_leader_or_follower, -1, -1
        code = part.check_leader_epoch(current_leader_epoch)
        if code != ErrorCode.none:
            return code, -1, -1
        if leader_epoch > part.leader_epoch:
            return ErrorCode.none, -1, -1  # an epoch this leader never had: undefined, as Kafka
        epoch, end = part.end_offset_for_epoch(leader_epoch)
        return ErrorCode.none, epoch, end

    def local_partition(self, topic: str, index: int) -> tuple[Partition | None, int]:
        """The replica if this broker holds one, leader or follower (Kafka's
        getPartitionOrError), else the error."""
        part = self.partitions.get((topic, index))
        if part is None:
            code = ErrorCode.not_leader_or_follower if self.image.partition(topic, index) \
                else ErrorCode.unknown_topic_or_partition
            return None, code
        return part, ErrorCode.none

    def leader_partition(self, topic: str, index: int, current_leader_epoch: int = -1) -> tuple[Partition | None, int]:
        """The replica if this broker leads it (and the client's epoch matches), else the error."""
        part = self.partitions.get((topic, index))
        if part is None or not part.is_leader:
            code = (ErrorCode.not_leader_or_follower if part is not None or self.image.partition(topic, index)
                    else ErrorCode.unknown_topic_or_partition)
            return None, code
        epoch_error = part.check_leader_epoch(current_leader_epoch)
        if epoch_error != ErrorCode.none:
            return None, epoch_error
        return part, ErrorCode.none

    def close(self) -> None:
        self._write_checkpoints(*self._take_unwritten())
        self.checkpoint_high_watermarks()()


def write_topic_ids(topic_ids: dict[Path, str]) -> None:
    """Write each partition directory's partition.metadata, durably: one alone fsynced, a
    batch synced once at the end (sync_filesystem). A directory deleted meanwhile (its replica
    dropped) is skipped; other failures are logged, as a failed checkpoint is: the log itself
    is fine, and the next start writes the file again."""
    batch = len(topic_ids) > 1
    written: Path | None = None
    for directory, topic_id in topic_ids.items():
        try:
            if write_partition_topic_id(directory, topic_id, fsync=not batch):
                written = directory
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.error("writing %s/partition.metadata failed: %s", directory, exc)
    if batch and written is not None:
        try:
            sync_filesystem(written.parent)
        except OSError as exc:
            log.error("syncing the partition.metadata files under %s failed: %s", written.parent, exc)


def mirror_topic_refusal(topic: str, source: str, index: int) -> dict[str, Any]:
    """A produce answer for a partition of a mirror topic: INVALID_TOPIC_EXCEPTION, the code
    every client knows (KIP-1279 proposes a new READ_ONLY_TOPIC that old clients would not)."""
    return {"index": index, "error_code": ErrorCode.invalid_topic_exception, "base_offset": -1, "log_start_offset": -1,
            "error_message": f"topic {topic} is a read-only mirror of {source}: it takes no produce until it is "
                             "promoted (mirror.source deleted)"}


def _produce_error(index: int, code: int, exc: Exception, log_start_offset: int = -1) -> dict[str, Any]:
    return {"index": index, "error_code": code, "base_offset": -1, "log_start_offset": log_start_offset,
            "error_message": str(exc)}
