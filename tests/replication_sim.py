"""A whole cluster's data path in one process: simulated network, disk and clock, driven by a seed.

What runs for real: the partition logs on disk with their recovery (cluster/storage: `Log`,
`LogManager`), the replica manager and its sans-IO `Partition`s (cluster/replication), and
the active controller's decisions on brokers, leaders and ISRs (cluster/controller:
`QuorumController` applied to `MetadataImage`s). The simulation is the shell around them,
as the trio shells are in a broker: the network (drops, delays, reorders, partitions), the
metadata log's propagation to brokers, registration and heartbeats, replica fetchers,
acks=all waits and long polls, flushes and the page cache, crashes, pauses, restarts, and
the clients: producers (acks 0/1/all, idempotent ones with acks=all, as Kafka requires) and
consumers reading below the high watermark.

Disk model. Every broker has a real data directory. What survives a *machine* crash is the
durable state: each file as of its last sync (the log flush on a segment roll or
flush.messages, or the operating system's periodic writeback), plus a torn piece of what a
segment had appended since; files written atomically with fsync (recovery points, high
watermarks, partition.metadata) survive as written; unsynced deletions come back. A
*process* crash loses nothing written. Either way the broker restarts like a real one:
registers anew, applies metadata up to its registration, recovers its logs from the recovery
point, then reconciles its replicas.

The cluster runs with KIP-966 eligible leader replicas (ELR) by default, as a new Kafka 4
cluster: the controller is bootstrapped, brokers send the epoch of their last clean shutdown
(`previous_broker_epoch`, -1 after a crash) when they register. `SimConfig.elr=False` formats
the cluster with the feature at 0.

Checkers, while running and after the faults stop and everything settled:
- every acks=all batch is, when acknowledged, in the log of every live member of the
  controller's ISR, and is in the final log at its offset with its records, unless the
  faults destroyed every eligible copy: every replica of the ISR or ELR (KIP-966's, worked
  out from the controller's ISRs, so a run without ELR is held to the same promise) lost
  it in machine crashes; Kafka promises nothing then, and the run reports how often that
  happened (`destroyed`);
- with ELR on, the controller's ISR and ELR are KIP-966's; a leader's high watermark never
  advances while its ISR is below min.insync.replicas, and every live replica of the
  controller's ELR holds what comes below it;
- a leader's high watermark never moves backwards within its leader epoch;
- consumers see only offsets below the high watermark of the answer, contiguously, and
  never a record that later disappears or changes;
- no idempotent producer's record is in the final log twice, and none of them ever gets
  OUT_OF_ORDER_SEQUENCE (the broker lost its sequence state or acknowledged data);
- after the faults stop, every partition has a leader, every replica is back in the ISR and
  the replicas' logs are byte-identical;
- every batch a producer had to send before the faults stopped is acknowledged by the end.

A failure names its seed; `DCMIRROR_REPLICATION_SEED=<seed> pytest tests/unit/test_replication_sim.py`
replays exactly that run.
"""

from __future__ import annotations

import hashlib
import heapq
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.broker.config import BrokerConfig
from cluster.controller.controller import ControllerConfig, QuorumController
from cluster.controller.image import ELR_FEATURE, MetadataImage
from cluster.protocol.errors import ErrorCode
from cluster.protocol.record_batch import iter_headers
from cluster.protocol.records import decode_batch
from cluster.replication.fetcher import ERROR_PAUSE_S
from cluster.replication.partition import (
    ISR_CHANGE_RETRY_BACKOFF_MS,
    AlterIsr,
    IsrAnswer,
    Partition,
    isr_answer,
)
from cluster.replication.replica_manager import (
    FetchPartition,
    ReplicaManager,
    ReplicaSettings,
    changed_topic_ids,
)
from cluster.storage.log import Log, StorageError
from cluster.storage.log_manager import CLEAN_SHUTDOWN_FILE, LogManager
from tests.batches import encode_batch

TOPIC = "t"
# Addresses on the simulated network: the controller, brokers 1..n, clients above.
CONTROLLER = 0
PRODUCERS = 1000
CONSUMERS = 2000
ERROR_PAUSE_MS = int(ERROR_PAUSE_S * 1000)  # the replica fetcher's pause after an error
# Files written atomically with fsync (write_atomic): durable as soon as they exist.
# Deleted durably (the directory fsynced after the unlink): LogManager.load_all's clean
# shutdown marker.
DURABLE_ON_DELETE = (".dcmirror-clean-shutdown",)
DURABLE_ON_WRITE = ("partition.metadata", "recovery-point-offset-checkpoint", "replication-offset-checkpoint",
                    "meta.properties", "cleaner-offset-checkpoint")


class SafetyViolation(AssertionError):
    pass


@dataclass
class Faults:
    drop: float = 0.02  # of messages
    max_delay_ms: int = 15
    crash_every_ms: int = 900  # mean time between crashes (any broker)
    machine_crash: float = 0.5  # of crashes: the machine, losing what was not synced
    down_ms: tuple[int, int] = (50, 900)
    partition_every_ms: int = 1200
    partition_ms: tuple[int, int] = (100, 1200)
    pause_every_ms: int = 1500
    pause_ms: tuple[int, int] = (50, 1200)  # a GC pause or SIGSTOP longer than the session timeout, too
    elect_every_ms: int = 700  # preferred-leader elections
    controller_failover_every_ms: int = 2500
    clean_restart_every_ms: int = 1800  # controlled shutdown, clean close, restart
    # The last-replica-standing window (KIP-966), scripted once at this time (None: not run):
    # partition 0's followers drop out one by one (clean shutdown, pause or network
    # partition), its leader machine-crashes with an unsynced tail once alone in the ISR, and
    # comes back first; the followers come back later.
    window_at_ms: int | None = None


@dataclass
class SimConfig:
    brokers: int = 3
    partitions: int = 2
    replication_factor: int = 3
    min_insync_replicas: int = 2
    segment_bytes: int = 2048
    flush_messages: int | None = None  # topic flush.messages (None: flush on segment roll only)
    writeback_ms: tuple[int, int] = (100, 600)  # the page cache's periodic writeback
    session_timeout_ms: int = 600  # broker.session.timeout.ms
    heartbeat_ms: int = 100
    replica_lag_time_max_ms: int = 400
    replica_fetch_wait_ms: int = 80
    request_timeout_ms: int = 250
    produce_interval_ms: tuple[int, int] = (10, 60)
    consume_interval_ms: tuple[int, int] = (20, 80)
    hw_checkpoint_ms: int = 150
    duration_ms: int = 2500
    settle_ms: int = 3000
    producers: int = 3
    # KIP-966 eligible leader replicas: the controller bootstraps a new cluster (level 1), or
    # formats with eligible.leader.replicas.version=0 (off, as a cluster from before).
    elr: bool = True
    consumers: bool = True  # one per partition (their checker fails first when read records go)


def scenario(seed: int) -> tuple[SimConfig, Faults]:
    """The cluster and fault mix a seed runs (its own random stream, so a seed's scenario
    does not change when the simulation's use of randomness does)."""
    rng = random.Random(f"scenario-{seed}")
    brokers = rng.choice((3, 3, 4, 5))
    rf = min(brokers, rng.choice((2, 3, 3)))
    config = SimConfig(
        brokers=brokers, partitions=rng.choice((1, 2, 3)), replication_factor=rf,
        min_insync_replicas=min(rf, rng.choice((1, 2, 2))), segment_bytes=rng.choice((1024, 2048, 8192)),
        flush_messages=rng.choice((None, None, 1, 5)), producers=rng.choice((2, 3, 4)))
    storm = rng.choice((0.5, 1.0, 1.0, 2.0))  # fault rate: calm, usual, stormy

    def every(ms: int) -> int:
        return max(100, int(ms / storm))

    faults = Faults(
        drop=rng.choice((0.0, 0.02, 0.05)), max_delay_ms=rng.choice((5, 15, 40)),
        crash_every_ms=every(900), machine_crash=rng.choice((0.0, 0.5, 0.5, 1.0)),
        partition_every_ms=every(1200), pause_every_ms=every(1500), elect_every_ms=every(700),
        controller_failover_every_ms=every(2500), clean_restart_every_ms=every(1800))
    if rng.random() < 0.25:
        faults.window_at_ms = rng.randint(500, 1500)
    return config, faults


def window_scenario(seed: int) -> tuple[SimConfig, Faults]:
    """The last-replica-standing window alone (KIP-966's case): RF 3, min.insync.replicas=2,
    one partition, writes at acks=all, a page cache that writes back seldom, no faults but
    the scripted window (and some drops and delays)."""
    rng = random.Random(f"window-{seed}")
    never = 10**9
    config = SimConfig(brokers=3, partitions=1, replication_factor=3, min_insync_replicas=2,
                       segment_bytes=8192, producers=3, writeback_ms=(1500, 3000), duration_ms=3500)
    faults = Faults(drop=rng.choice((0.0, 0.02)), max_delay_ms=rng.choice((5, 15)), crash_every_ms=never,
                    partition_every_ms=never, pause_every_ms=never, elect_every_ms=never,
                    controller_failover_every_ms=never, clean_restart_every_ms=never,
                    window_at_ms=rng.randint(500, 1000))
    return config, faults


@dataclass(order=True)
class _Event:
    at_ms: int
    seq: int
    fn: Callable[..., None] = field(compare=False)
    args: tuple[Any, ...] = field(compare=False)
    node: int = field(compare=False, default=-1)  # a broker's process that runs it (-1: the environment)
    incarnation: int = field(compare=False, default=-1)


class SimClock:
    def __init__(self, sim: ReplicationSim) -> None:
        self.sim = sim

    def now_ms(self) -> int:
        return self.sim.wall0_ms + self.sim.now


# ---- the disk ----------------------------------------------------------------------------------


class SimDisk:
    """A broker's data directory and what of it is durable."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.durable: dict[str, bytes] = {}
        self._synced: dict[str, tuple[int, int]] = {}  # (size, mtime) when last made durable

    def _files(self) -> list[Path]:
        out: list[Path] = []
        stack = [self.root]
        while stack:
            with os.scandir(stack.pop()) as entries:
                for e in entries:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(Path(e.path))
                    else:
                        out.append(Path(e.path))
        return sorted(out)

    def sync_all(self) -> None:
        """The operating system wrote every dirty page back."""
        durable: dict[str, bytes] = {}
        for path in self._files():
            rel = str(path.relative_to(self.root))
            st = path.stat()
            stamp = (st.st_size, st.st_mtime_ns)
            if self._synced.get(rel) == stamp and rel in self.durable:
                durable[rel] = self.durable[rel]
            else:
                durable[rel] = path.read_bytes()
                self._synced[rel] = stamp
        self.durable = durable

    def sync(self, paths: list[Path]) -> None:
        for p in paths:
            if p.exists():
                rel = str(p.relative_to(self.root))
                self.durable[rel] = p.read_bytes()
                self._synced.pop(rel, None)

    def machine_crash(self, rng: random.Random) -> int:
        """Put the directory back to its durable state (plus torn segment tails); returns
        the bytes lost."""
        lost = 0
        now = {str(p.relative_to(self.root)): p for p in self._files()}
        for rel, path in now.items():
            if path.name in DURABLE_ON_WRITE:
                continue
            current = path.read_bytes()
            old = self.durable.get(rel)
            if old is None:
                lost += len(current)
                path.unlink()
                continue
            if path.suffix == ".log" and len(current) > len(old) and current.startswith(old):
                kept = old + current[len(old):len(old) + rng.randint(0, len(current) - len(old))]
            else:
                kept = old
            lost += max(0, len(current) - len(kept))
            if kept != current:
                path.write_bytes(kept)
        for rel, content in self.durable.items():
            if rel not in now and Path(rel).name not in DURABLE_ON_DELETE:
                path = self.root / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(content)  # its deletion never reached the disk
        self._synced = {}
        return lost


# ---- the controller ----------------------------------------------------------------------------


class SimController:
    """The active controller (reliable: the Raft quorum under it is simulated elsewhere) and
    the committed metadata log the brokers fetch."""

    def __init__(self, sim: ReplicationSim) -> None:
        self.sim = sim
        c = sim.config
        self.config = ControllerConfig(
            session_timeout_ms=c.session_timeout_ms, num_partitions=c.partitions,
            default_replication_factor=c.replication_factor, auto_leader_rebalance_enable=True,
            leader_imbalance_check_interval_ms=500, leader_imbalance_per_broker_percentage=0,
            min_insync_replicas=c.min_insync_replicas)
        self.log: list[list[dict[str, Any]]] = []
        self.image = MetadataImage()
        self.controller = self._new_controller(MetadataImage())
        self.parked: list[tuple[int, int, int]] = []  # metadata fetches waiting: (broker, incarnation, from)

    def _new_controller(self, image: MetadataImage) -> QuorumController:
        return QuorumController(image, self.config, self.sim.broker_config.log_config,
                                random.Random(self.sim.rng.getrandbits(32)), self.sim.clock.now_ms())

    def bootstrap(self) -> None:
        """The first active controller formats the new cluster: ELR on (as every new cluster),
        or off when the simulation runs a cluster without it."""
        off = [{"type": "FeatureLevel", "v": 1, "name": ELR_FEATURE, "level": 0}]
        self.controller.bootstrap([] if self.sim.config.elr else off)
        self._commit()

    def failover(self) -> None:
        """A new active controller starts from the committed image (as MetadataService does)."""
        self.controller = self._new_controller(self.image.copy())
        self.sim.stats["controller_failovers"] += 1

    def run(self, op: str, args: dict[str, Any], with_time: bool) -> dict[str, Any]:
        """One controller operation, its records committed at once; the answer."""
        method = getattr(self.controller, op)
        result: dict[str, Any] = method(args, self.sim.clock.now_ms()) if with_time else method(args)
        self._commit()
        result["metadata_offset"] = len(self.log)
        return result

    def tick(self) -> None:
        self.controller.tick(self.sim.clock.now_ms())
        self._commit()

    def _commit(self) -> None:
        records = self.controller.take_records()
        if not records:
            return
        self.log.append(records)
        for r in records:
            self.image.apply(r)
            if r["type"] in ("Partition", "PartitionChange"):
                self.sim.track_eligible(r["topic_id"], r["partition"])
        self.image.offset = len(self.log)
        self.sim.on_metadata_committed()
        parked, self.parked = self.parked, []
        for broker, incarnation, from_offset in parked:
            self.fetch(broker, incarnation, from_offset)

    def fetch(self, broker: int, incarnation: int, from_offset: int) -> None:
        """A broker's metadata fetch: answered when there is something new (long poll)."""
        if from_offset < len(self.log):
            self.sim.send(CONTROLLER, broker, "metadata", self.log[from_offset:], from_offset, dst_incarnation=incarnation)
        else:
            self.parked = [x for x in self.parked if x[0] != broker] + [(broker, incarnation, from_offset)]

    def _answer_parked(self) -> None:
        parked, self.parked = self.parked, []
        for broker, incarnation, from_offset in parked:
            self.fetch(broker, incarnation, from_offset)


# ---- a broker ----------------------------------------------------------------------------------


class SimReplicaManager(ReplicaManager):
    """The real replica manager; its ISR decisions travel over the simulated network."""

    def __init__(self, broker: SimBroker, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sim_broker = broker

    def send_isr_change(self, part: Partition, change: AlterIsr) -> None:
        self.sim_broker.send_alter_isr(part, change)


@dataclass
class _AcksAll:
    """A produce request with acks=all waiting for the high watermark."""

    producer: int
    request_id: int
    key: tuple[str, int]
    base_offset: int
    deadline_ms: int
    values: tuple[bytes, ...]


@dataclass
class _ParkedFetch:
    """A fetch with nothing to return yet, held until data comes or its wait ends (long poll)."""

    deadline_ms: int
    src: int
    src_incarnation: int
    request: int
    fp: FetchPartition
    replica_id: int


class SimBroker:
    """One broker process as the trio shells run it, on the simulated network."""

    def __init__(self, sim: ReplicationSim, node_id: int) -> None:
        self.sim = sim
        self.node_id = node_id
        self.dir = sim.root / f"node-{node_id}"
        self.dir.mkdir(parents=True)
        self.disk = SimDisk(self.dir)
        self.alive = False
        self.incarnation = 0
        self.paused_until = 0
        self.hw_seen: dict[tuple[tuple[str, int], int], int] = {}  # (partition, leader epoch) → high watermark
        self.commit_scan: dict[tuple[str, int], int] = {}  # how far committed records were noted
        self._reset()

    def _reset(self) -> None:
        self.commit_scan = {}
        self.rm: SimReplicaManager | None = None
        self.logs: LogManager | None = None
        self.image = MetadataImage()
        self.broker_epoch = -1
        self.registration_offset: int | None = None
        self.logs_loaded = False
        self.ready = False
        self.parked_fetches: list[_ParkedFetch] = []
        self.acks_waiting: list[_AcksAll] = []
        self.isr_in_flight: dict[int, tuple[Partition, AlterIsr]] = {}
        self.isr_committed: list[tuple[int, Partition, AlterIsr]] = []  # answered, until the metadata arrives
        self.fetching: dict[tuple[str, int], tuple[int, int, int]] = {}  # key → (leader, leader epoch, request)
        self.requests = 0
        self.shutting_down = False
        self.previous_broker_epoch = -1

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        sim = self.sim
        self.incarnation += 1
        self.alive = True
        self.paused_until = 0
        self._reset()
        self.incarnation_id = f"{self.node_id}-{self.incarnation}"
        self.logs = LogManager(self.dir)
        # Read before registering (Broker.start): the epoch its last clean shutdown recorded.
        self.previous_broker_epoch = self.logs.clean_shutdown_epoch()
        self.logs.on_flush_request = lambda: self.schedule(sim.rng.randint(1, 20), self.flush)
        self.rm = SimReplicaManager(
            self, self.node_id, self.dir, self.logs,
            ReplicaSettings(replica_lag_time_max_ms=sim.config.replica_lag_time_max_ms),
            clock=sim.clock, image=lambda: self.image, log_config=sim.broker_config.log_config,
            isr_channel=None)  # type: ignore[arg-type]  # send_isr_change is the simulation's
        self.schedule(0, self.fetch_metadata)
        self.schedule(0, self.register)
        self.schedule(sim.rng.randint(*sim.config.writeback_ms), self.writeback)

    def stop_process(self) -> None:
        """The process dies: open files close, nothing is finalised (no clean-shutdown marker)."""
        if self.logs is not None:
            for lg in self.logs.logs.values():
                for seg in lg.segments:
                    seg.close()
        self.alive = False
        self._reset()

    def begin_shutdown(self) -> None:
        """SIGTERM: a controlled shutdown (BrokerLifecycle.controlled_shutdown), then a clean close."""
        self.shutting_down = True
        self.schedule(self.sim.config.session_timeout_ms, self.finish_shutdown)  # controlled.shutdown.timeout

    def finish_shutdown(self) -> None:
        """Broker.close: high watermarks checkpointed, every log flushed, the clean-shutdown marker."""
        if not self.alive:
            return
        if self.logs_loaded and self.rm is not None and self.logs is not None:
            self.sim.down_holdings[self.node_id] = {
                (TOPIC, i): self.sim._holdings(self, (TOPIC, i)) for i in range(self.sim.config.partitions)}
            self.rm.close()
            self.logs.close(self.broker_epoch)
            self.disk.sync_all()  # close fsyncs what it wrote
            self.alive = False
            self._reset()
        else:
            self.stop_process()
        self.sim.stats["clean_restarts"] += 1
        if self.node_id not in self.sim.held_down:
            self.sim.push(self.sim.now + self.sim.rng.randint(*self.sim.faults.down_ms), self.sim.restart,
                          (self.node_id,))

    def schedule(self, delay_ms: int, fn: Callable[..., None], *args: Any) -> None:
        self.sim.push(self.sim.now + delay_ms, fn, args, self.node_id, self.incarnation)

    def next_request(self) -> int:
        self.requests += 1
        return self.requests

    # ---- metadata, registration, heartbeats ----------------------------------------------

    def fetch_metadata(self) -> None:
        self.sim.send(self.node_id, CONTROLLER, "metadata_fetch", self.node_id, self.incarnation, self.image.offset)
        self.schedule(self.sim.config.request_timeout_ms * 2, self.metadata_timeout, self.image.offset)

    def metadata_timeout(self, offset: int) -> None:
        if self.image.offset == offset:
            self.fetch_metadata()  # the fetch, or its answer, may have been lost

    def on_metadata(self, entries: list[list[dict[str, Any]]], from_offset: int) -> None:
        if from_offset != self.image.offset:
            return  # a late answer to an earlier fetch
        records = []
        for entry in entries:
            for r in entry:
                self.image.apply(r)
                records.append(r)
            self.image.offset += 1
        self.after_metadata(records)
        self.fetch_metadata()

    def after_metadata(self, records: list[dict[str, Any]] | None = None) -> None:
        """What Broker._on_metadata_applied and the lifecycle do with new metadata: a
        reconcile of the topics the records name (all for other records, or none given)."""
        assert self.rm is not None
        if not self.logs_loaded:
            if self.registration_offset is not None and self.image.offset >= self.registration_offset:
                self.load_logs()
        else:
            self.rm.reconcile(None if records is None else changed_topic_ids(records))
            self.follow()
        committed, self.isr_committed = self.isr_committed, []
        for offset, part, change in committed:
            if self.image.offset >= offset:
                part.isr_change_answered(change, IsrAnswer.COMMITTED, self.sim.clock.now_ms())
            else:
                self.isr_committed.append((offset, part, change))
        reg = self.image.brokers.get(self.node_id)
        if self.logs_loaded and not self.ready and reg is not None and reg.broker_epoch == self.broker_epoch \
                and not reg.fenced:
            self.ready = True
        self.after_request()

    def register(self) -> None:
        self.sim.send(self.node_id, CONTROLLER, "register", self.node_id, self.incarnation, self.incarnation_id,
                      self.previous_broker_epoch)
        self.schedule(self.sim.config.request_timeout_ms * 2, self.register_timeout)

    def register_timeout(self) -> None:
        if self.broker_epoch < 0:
            self.register()

    def on_registered(self, result: dict[str, Any]) -> None:
        if result["error_code"] != ErrorCode.none or self.broker_epoch >= 0:
            return
        first = self.registration_offset is None and not self.logs_loaded
        self.broker_epoch = int(result["broker_epoch"])
        self.registration_offset = int(result["metadata_offset"])
        if first:
            self.schedule(0, self.heartbeat)
        self.after_metadata()

    def load_logs(self) -> None:
        """Broker.start after registration: recover the logs, then match the metadata."""
        assert self.logs is not None and self.rm is not None
        config = self.sim.broker_config

        def config_for(topic: str) -> Any:
            t = self.image.topic(topic)
            return config.log_config(t.configs if t is not None else {})

        self.logs.load_all(config_for, self.sim.clock.now_ms())
        self.rm.load()
        self.logs_loaded = True
        self.sim.down_holdings.pop(self.node_id, None)
        self.rm.reconcile()
        self.follow()
        self.schedule(self.sim.config.replica_lag_time_max_ms // 2, self.check_isr_lag)
        self.schedule(self.sim.config.hw_checkpoint_ms, self.checkpoint_high_watermarks)

    def heartbeat(self) -> None:
        reg = self.image.brokers.get(self.node_id)
        caught_up = reg is not None and reg.broker_epoch == self.broker_epoch
        self.sim.send(self.node_id, CONTROLLER, "heartbeat", self.node_id, self.incarnation, self.broker_epoch,
                      caught_up, self.shutting_down)
        self.schedule(self.sim.config.heartbeat_ms, self.heartbeat)

    def on_heartbeat(self, result: dict[str, Any]) -> None:
        if self.shutting_down and result["error_code"] == ErrorCode.none and result.get("should_shut_down"):
            self.finish_shutdown()  # the controller moved leadership away
            return
        if result["error_code"] == ErrorCode.stale_broker_epoch and self.broker_epoch >= 0:
            # Registered again elsewhere or forgotten: register anew (BrokerLifecycle does).
            self.incarnation_id += "+"
            self.previous_broker_epoch = self.broker_epoch  # the same process vouches for its logs
            self.broker_epoch = -1
            self.register()

    # ---- background work of the broker -------------------------------------------------

    def check_isr_lag(self) -> None:
        assert self.rm is not None
        self.rm.check_isr_lag()
        self.schedule(self.sim.config.replica_lag_time_max_ms // 2, self.check_isr_lag)

    def checkpoint_high_watermarks(self) -> None:
        assert self.rm is not None
        self.rm.checkpoint_high_watermarks()()
        self.schedule(self.sim.config.hw_checkpoint_ms, self.checkpoint_high_watermarks)

    def flush(self) -> None:
        """The flush task (LogTasks.flush_loop): fsync segments below the requested offsets,
        move the recovery points, checkpoint them."""
        assert self.logs is not None
        now = self.sim.clock.now_ms()
        pending = self.logs.take_pending_flushes() + self.logs.due_time_flushes(now)
        for lg, offset in pending:
            if self.logs.get(lg.topic, lg.partition) is not lg:
                continue
            bases = {seg.base_offset for seg in lg.segments if seg.base_offset < offset}
            lg.leader_epochs.write(fsync=False)  # Log.flush_segments writes them too (its fsync: the sync below)
            self.disk.sync([f for f in lg.dir.iterdir() if f.stem.isdigit() and int(f.stem) in bases]
                           + [lg.leader_epochs.path])
            lg.mark_flushed(offset, now)
        if pending:
            self.logs.checkpoint_recovery_points()

    def writeback(self) -> None:
        self.disk.sync_all()
        self.schedule(self.sim.rng.randint(*self.sim.config.writeback_ms), self.writeback)

    # ---- ISR changes (ControllerChannel.alter_partition and ReplicaManager._alter_isr) ----

    def send_alter_isr(self, part: Partition, change: AlterIsr) -> None:
        self.sim.stats["isr_changes_sent"] += 1
        request = self.next_request()
        self.isr_in_flight[request] = (part, change)
        self.sim.send(self.node_id, CONTROLLER, "alter_partition", self.node_id, self.incarnation, request, {
            "broker_id": self.node_id, "broker_epoch": self.broker_epoch, "topic_id": change.topic_id,
            "partition": change.partition, "leader_epoch": change.leader_epoch,
            "partition_epoch": change.partition_epoch, "isr": list(change.isr)})
        self.schedule(self.sim.config.request_timeout_ms * 2, self.alter_isr_timeout, request)

    def alter_isr_timeout(self, request: int) -> None:
        entry = self.isr_in_flight.pop(request, None)
        if entry is not None:
            self._isr_answered(*entry, IsrAnswer.UNKNOWN)

    def on_alter_isr(self, request: int, result: dict[str, Any]) -> None:
        entry = self.isr_in_flight.pop(request, None)
        if entry is None:
            return
        answer = isr_answer(result["error_code"])
        if answer is IsrAnswer.COMMITTED and self.image.offset < result["metadata_offset"]:
            self.isr_committed.append((result["metadata_offset"], *entry))  # answered once applied here
            return
        self._isr_answered(*entry, answer)

    def _isr_answered(self, part: Partition, change: AlterIsr, answer: IsrAnswer) -> None:
        again = part.isr_change_answered(change, answer, self.sim.clock.now_ms())
        if again and self.rm is not None and self.rm.partitions.get(part.key) is part:
            self.schedule(ISR_CHANGE_RETRY_BACKOFF_MS, self.send_alter_isr, part, change)
        self.after_request()

    # ---- followers (ReplicaFetcher) ------------------------------------------------------

    def follow(self) -> None:
        """A fetch loop for each follower replica, restarted when its leader or epoch changes."""
        assert self.rm is not None
        for key, part in self.rm.partitions.items():
            if part.follower is None:
                self.fetching.pop(key, None)
                continue
            leader, epoch = part.follower.leader_id, part.follower.leader_epoch
            current = self.fetching.get(key)
            if current is None or current[:2] != (leader, epoch):
                self.fetching[key] = (leader, epoch, -1)
                self.schedule(0, self.fetch_step, key, leader, epoch)

    def fetch_step(self, key: tuple[str, int], leader: int, epoch: int) -> None:
        part = self._follower(key, leader, epoch)
        if part is None:
            return
        request = self.next_request()
        self.fetching[key] = (leader, epoch, request)
        if part.needs_truncation:
            self.sim.send(self.node_id, leader, "epoch_request", self.node_id, self.incarnation, request, key,
                          part.leader_epoch, part.log.leader_epochs.latest_epoch)
        else:
            fp = FetchPartition(key[0], key[1], part.log.log_end_offset, 4096, part.leader_epoch)
            self.sim.send(self.node_id, leader, "fetch", self.node_id, self.incarnation, request, fp, self.node_id)
        self.sim.stats["fetches"] += 1
        self.schedule(self.sim.config.replica_fetch_wait_ms + self.sim.config.request_timeout_ms,
                      self.fetch_timeout, key, leader, epoch, request)

    def _follower(self, key: tuple[str, int], leader: int, epoch: int, request: int | None = None) -> Partition | None:
        current = self.fetching.get(key)
        if current is None or current[:2] != (leader, epoch) or (request is not None and current[2] != request):
            return None
        part = self.rm.partitions.get(key) if self.rm is not None else None
        if part is None or part.follower is None:
            return None
        return part

    def fetch_timeout(self, key: tuple[str, int], leader: int, epoch: int, request: int) -> None:
        if self._follower(key, leader, epoch, request) is not None:
            self.fetch_step(key, leader, epoch)  # no answer: ask again

    def on_epoch_answer(self, request: int, key: tuple[str, int], code: int, epoch: int, end: int) -> None:
        current = self.fetching.get(key)
        part = self._follower(key, *current[:2], request) if current is not None else None
        if part is None or current is None:
            return
        if code == ErrorCode.none and part.needs_truncation:
            if part.truncate_to_leader(epoch, end, self.sim.clock.now_ms()) is not None:
                self.sim.stats["truncations"] += 1
            self.schedule(0, self.fetch_step, key, *current[:2])
        else:
            self.schedule(ERROR_PAUSE_MS, self.fetch_step, key, *current[:2])
        self.sim.check_node(self)

    def on_fetch_answer(self, request: int, key: tuple[str, int], answer: dict[str, Any]) -> None:
        current = self.fetching.get(key)
        part = self._follower(key, *current[:2], request) if current is not None else None
        if part is None or current is None:
            return
        retry = True
        if part.fetching:
            try:
                outcome = part.handle_fetch_answer(answer["error_code"], answer["records"], answer["high_watermark"],
                                                   answer["log_start_offset"], self.sim.clock.now_ms())
                retry = outcome.retry
            except StorageError:
                pass
        self.schedule(ERROR_PAUSE_MS if retry else 0, self.fetch_step, key, *current[:2])
        self.sim.check_node(self)

    # ---- requests from followers, producers and consumers --------------------------------

    def on_epoch_request(self, src: int, inc: int, request: int, key: tuple[str, int], current_epoch: int,
                         epoch: int) -> None:
        if not self.ready or self.rm is None:
            return  # a broker answers Kafka requests once ready (RequestRouter)
        code, found, end = self.rm.end_offset_for_epoch(key[0], key[1], current_epoch, epoch)
        self.sim.send(self.node_id, src, "epoch_answer", request, key, code, found, end, dst_incarnation=inc)

    def on_fetch(self, src: int, inc: int, request: int, fp: FetchPartition, replica_id: int) -> None:
        if not self.ready or self.rm is None:
            return
        wait_ms = self.sim.config.replica_fetch_wait_ms if replica_id >= 0 else 0
        if self._read(_ParkedFetch(self.sim.now + wait_ms, src, inc, request, fp, replica_id)):
            self.schedule(wait_ms, self.after_request)  # the long poll's end
        self.after_request()

    def _read(self, f: _ParkedFetch) -> bool:
        """Answer a fetch, or park it until it has something (True: parked)."""
        assert self.rm is not None
        answer, size, error = self.rm.read_partition(f.fp, f.replica_id, 1 << 20, True)
        if size == 0 and not error and self.sim.now < f.deadline_ms:
            self.parked_fetches.append(f)
            return True
        key = (f.fp.topic, f.fp.partition)
        if f.replica_id >= 0:
            self.sim.send(self.node_id, f.src, "fetch_answer", f.request, key, answer, dst_incarnation=f.src_incarnation)
        else:
            # The simulation's own note for its checker: the log end when the answer was made.
            part = self.rm.partitions.get(key)
            log_end = part.log.log_end_offset if part is not None else -1
            self.sim.send(self.node_id, f.src, "consume_answer", f.request, answer, log_end)
        return False

    def on_produce(self, src: int, producer: int, request: int, key: tuple[str, int], batch: bytes, acks: int,
                   values: tuple[bytes, ...]) -> None:
        if not self.ready or self.rm is None:
            return
        result = self.rm.append(key[0], key[1], batch, min_isr_checked=acks == -1)
        if result["error_code"] == ErrorCode.none:
            self.sim.stats["appends"] += 1
        elif result["error_code"] == ErrorCode.out_of_order_sequence_number:
            # The simulation's own note for its checker: was this leader deposed already?
            part = self.rm.partitions[key]
            current = self.sim.controller.image.partition(*key)
            result["sim_deposed"] = current is None or current.leader_epoch > part.leader_epoch
        if acks == 1 or (acks == -1 and result["error_code"] != ErrorCode.none):
            self.sim.send(self.node_id, src, "produce_answer", request, result)
        elif acks == -1:
            self.acks_waiting.append(_AcksAll(producer, request, key, result["base_offset"],
                                              self.sim.now + self.sim.config.request_timeout_ms, values))
            self.schedule(self.sim.config.request_timeout_ms, self.after_request)
        self.after_request()

    def after_request(self) -> None:
        """Re-check what waits on partitions (acks=all answers, long polls), as the
        replica manager's waiters wake them, then check the invariants."""
        if self.rm is None:
            return
        now = self.sim.now
        waiting, self.acks_waiting = self.acks_waiting, []
        for w in waiting:
            part = self.rm.partitions.get(w.key)
            outcome = part.acks_all_outcome(w.base_offset + 1) if part is not None else ErrorCode.not_leader_or_follower
            if outcome is None and now < w.deadline_ms:
                self.acks_waiting.append(w)
                continue
            code = ErrorCode.request_timed_out if outcome is None else outcome
            if code == ErrorCode.none:
                assert part is not None
                self.sim.check_acks_all(self, part, w)
            self.sim.send(self.node_id, PRODUCERS + w.producer, "produce_answer", w.request_id,
                          {"error_code": code, "base_offset": w.base_offset if code == ErrorCode.none else -1})
        parked, self.parked_fetches = self.parked_fetches, []
        for f in parked:
            self._read(f)
        self.sim.check_node(self)


# ---- clients -----------------------------------------------------------------------------------


@dataclass
class _Inflight:
    request_id: int
    values: tuple[bytes, ...]
    batch: bytes
    sequence: int
    sent_ms: int
    pid: int = -1
    attempts: int = 0
    first_sent_ms: int = 0


class SimProducer:
    """A producer of one or more partitions: one batch in flight per partition, retried
    until acknowledged (idempotent: the same batch with its sequence; otherwise resent
    as is, duplicates allowed). acks=0 batches are never answered."""

    def __init__(self, sim: ReplicationSim, producer_id: int, acks: int, idempotent: bool) -> None:
        self.sim = sim
        self.id = producer_id
        self.acks = acks
        self.idempotent = idempotent
        self.pid = PRODUCERS + producer_id if idempotent else -1
        self.next_sequence: dict[tuple[str, int], int] = {}
        self.inflight: dict[tuple[str, int], _Inflight] = {}
        self.leaders: dict[tuple[str, int], int] = {}
        self.counter = 0
        self.requests = 0
        self.resets = 0
        self.stopped = False  # no new batches after the faults stop (the pending ones finish)

    @property
    def address(self) -> int:
        return PRODUCERS + self.id

    def tick(self) -> None:
        sim = self.sim
        if not self.stopped:
            key = (TOPIC, sim.rng.randrange(sim.config.partitions))
            if key not in self.inflight:
                self._new_batch(key)
        sim.push(sim.now + sim.rng.randint(*sim.config.produce_interval_ms), self.tick, ())

    def _new_batch(self, key: tuple[str, int]) -> None:
        n = self.sim.rng.randint(1, 4)
        values = tuple(f"p{self.id}-{key[1]}-{self.counter + i}".encode() for i in range(n))
        self.counter += n
        seq = self.next_sequence.get(key, 0)
        batch = encode_batch(list(values), producer_id=self.pid, producer_epoch=0 if self.idempotent else -1,
                             base_sequence=seq if self.idempotent else -1)
        self.next_sequence[key] = seq + n
        flight = _Inflight(0, values, batch, seq, self.sim.now, self.pid, first_sent_ms=self.sim.now)
        self.inflight[key] = flight
        self._send(key, flight)

    def _send(self, key: tuple[str, int], flight: _Inflight) -> None:
        sim = self.sim
        self.requests += 1
        flight.request_id = self.requests
        flight.attempts += 1
        flight.sent_ms = sim.now
        leader = self.leaders.get(key)
        if leader is None:
            leader = self.leaders[key] = sim.guess_leader(key)[0]
        if leader > 0:
            sim.send(self.address, leader, "produce", self.address, self.id, flight.request_id, key, flight.batch,
                     self.acks, flight.values)
        if self.acks == 0:
            self.inflight.pop(key, None)
            return
        sim.push(sim.now + sim.config.request_timeout_ms + 20, self._timeout, (key, flight.request_id))

    def _timeout(self, key: tuple[str, int], request_id: int) -> None:
        flight = self.inflight.get(key)
        if flight is not None and flight.request_id == request_id:
            self.leaders.pop(key, None)
            self._send(key, flight)

    def on_answer(self, request_id: int, result: dict[str, Any]) -> None:
        key = next((k for k, f in self.inflight.items() if f.request_id == request_id), None)
        if key is None:
            return
        flight = self.inflight[key]
        code = result["error_code"]
        if code == ErrorCode.none:
            del self.inflight[key]
            self.sim.acknowledged(self, key, result["base_offset"], flight.values, flight.pid)
            return
        if code == ErrorCode.out_of_order_sequence_number and self.idempotent and not result.get("sim_deposed"):
            self._out_of_order(key, flight)
            return
        self.leaders.pop(key, None)  # not leader, timed out, not enough replicas: refresh and retry
        self.sim.push(self.sim.now + 30, self._retry, (key, request_id))

    def _out_of_order(self, key: tuple[str, int], flight: _Inflight) -> None:
        """The leader's producer state does not continue where our acknowledged batches
        end. Allowed only when some of them were destroyed on every in-sync replica; then
        the producer starts over under a new producer id (Kafka's epoch bump, KIP-360) and
        gives up the batch in doubt."""
        sim = self.sim
        lost = [a for a in sim.acked if a.producer == self.id and a.key == key and a.pid == flight.pid
                and any(sim.excused(key, a.base_offset + i, v) for i, v in enumerate(a.values))]
        if not lost:
            raise SafetyViolation(f"seed {sim.seed}: idempotent producer {self.id} got OUT_OF_ORDER_SEQUENCE for "
                                  f"{key} sequence {flight.sequence} at {sim.now} ms, and none of its acknowledged "
                                  f"batches were destroyed (the broker lost acknowledged data or producer state)")
        if self.pid == flight.pid:
            self.resets += 1
            self.pid = PRODUCERS + self.id + 100 * self.resets
            self.next_sequence = {}
        del self.inflight[key]
        sim.stats["resets"] += 1

    def _retry(self, key: tuple[str, int], request_id: int) -> None:
        flight = self.inflight.get(key)
        if flight is not None and flight.request_id == request_id:
            self._send(key, flight)


class SimConsumer:
    """Reads one partition from its leader from offset 0, below the high watermark."""

    def __init__(self, sim: ReplicationSim, consumer_id: int, key: tuple[str, int]) -> None:
        self.sim = sim
        self.id = consumer_id
        self.key = key
        self.position = 0
        self.records: dict[int, tuple[bytes, int]] = {}  # offset → (value, when read)
        self.leader = (-1, -1)  # (leader, leader epoch): only newer metadata replaces it (KIP-320)
        self.fetched_at: dict[int, int] = {}  # request → the position it fetched from
        self.request = 0
        self.answered = 0

    @property
    def address(self) -> int:
        return CONSUMERS + self.id

    def tick(self) -> None:
        sim = self.sim
        view = sim.guess_leader(self.key)
        if view[1] >= self.leader[1]:
            self.leader = view
        leader, epoch = self.leader
        self.request += 1
        self.fetched_at[self.request] = self.position
        if leader > 0:
            fp = FetchPartition(self.key[0], self.key[1], self.position, 2048, epoch)
            sim.send(self.address, leader, "fetch", self.address, -1, self.request, fp, -1)
        sim.push(sim.now + sim.rng.randint(*sim.config.consume_interval_ms), self.tick, ())

    def on_answer(self, token: int, answer: dict[str, Any], log_end: int) -> None:
        if token <= self.answered:
            return  # reordered: an older answer
        self.answered = token
        for old in [r for r in self.fetched_at if r < token]:
            del self.fetched_at[old]
        if self.fetched_at.pop(token, None) != self.position:
            return  # asked from a position this consumer has since left (a reset), as clients drop it
        sim = self.sim
        if answer["error_code"] == ErrorCode.offset_out_of_range:
            self._out_of_range(log_end)
            return
        if answer["error_code"] != ErrorCode.none or not answer["records"]:
            return
        hw = answer["high_watermark"]
        for offset, value in _records(answer["records"]):
            if offset < self.position:
                continue
            if offset != self.position:
                raise SafetyViolation(f"seed {sim.seed}: consumer of {self.key} expected offset {self.position}, "
                                      f"got {offset}")
            if offset >= hw:
                raise SafetyViolation(f"seed {sim.seed}: consumer of {self.key} got offset {offset} at or above "
                                      f"the answer's high watermark {hw}")
            self.records[offset] = (value, sim.now)
            self.position = offset + 1
        sim.stats["consumed"] = sum(len(c.records) for c in sim.consumers)

    def _out_of_range(self, log_end: int) -> None:
        """The leader's log ended (`log_end`) below what this consumer read. Allowed only
        when what it read past that end was destroyed on every in-sync replica: then it
        resets to the log end, as auto.offset.reset=latest would."""
        sim = self.sim
        gone = {o: rv for o, rv in self.records.items() if o >= log_end}
        if not gone or not all(sim.excused(self.key, o, v) for o, (v, _) in gone.items()):
            raise SafetyViolation(f"seed {sim.seed}: consumer of {self.key} at offset {self.position} got "
                                  f"OFFSET_OUT_OF_RANGE at {sim.now} ms (leader log end {log_end}): records it read "
                                  f"are gone")
        for o in gone:
            del self.records[o]
        self.position = log_end
        sim.stats["resets"] += 1


def _log_contents(lg: Log, start: int | None = None, end: int | None = None) -> dict[int, bytes]:
    """offset → value of the records of a log (all, or from the batch holding `start` on,
    in whole batches below `end`)."""
    out: dict[int, bytes] = {}
    offset = lg.log_start_offset if start is None else max(start, lg.log_start_offset)
    end = lg.log_end_offset if end is None else min(end, lg.log_end_offset)
    while offset < end:
        chunk = lg.read(offset, 1 << 20, end, min_one_batch=False)
        headers = [h for _, h in iter_headers(chunk)]
        if not headers:
            break
        out.update(_records(chunk))
        offset = headers[-1].next_offset
    return out


def _records(data: bytes) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    for pos, _ in iter_headers(data):
        _, recs = decode_batch(data, pos)
        out.extend((r.offset, r.value or b"") for r in recs)
    return out


# ---- the simulation ----------------------------------------------------------------------------


@dataclass
class Acked:
    producer: int
    key: tuple[str, int]
    base_offset: int
    values: tuple[bytes, ...]
    acks: int
    at_ms: int
    pid: int = -1


class ReplicationSim:
    def __init__(self, seed: int, *, config: SimConfig | None = None, faults: Faults | None = None,
                 root: Path | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        chosen = scenario(seed)
        self.config = config or chosen[0]
        self.faults = faults or chosen[1]
        self.now = 0
        self.wall0_ms = 1_700_000_000_000
        self._seq = 0
        self._queue: list[_Event] = []
        self.clock = SimClock(self)
        self._own_root = root is None
        base = Path("/dev/shm") if Path("/dev/shm").is_dir() and os.access("/dev/shm", os.W_OK) else None
        self.root = root or Path(tempfile.mkdtemp(prefix="dcmirror-repl-sim-", dir=base))
        c = self.config
        overrides: dict[str, object] = {"num.partitions": c.partitions, "default.replication.factor": c.replication_factor,
                                        "log.segment.bytes": c.segment_bytes}
        self.broker_config = BrokerConfig.from_overrides(overrides)
        self.brokers = {i: SimBroker(self, i) for i in range(1, c.brokers + 1)}
        self.controller = SimController(self)
        self.isolated: set[int] = set()
        self.faults_on = True
        self.pending_at_stop: set[tuple[int, tuple[str, int]]] = set()
        self.producers: list[SimProducer] = []
        self.consumers: list[SimConsumer] = []
        self.acked: list[Acked] = []
        # Records each stopped broker holds (read when it stopped; for a machine crash, after
        # its logs were recovered from what survived): what the "every in-sync copy is gone"
        # rule counts for brokers that are down.
        self.down_holdings: dict[int, dict[tuple[str, int], dict[int, bytes]]] = {}
        # Records machine crashes destroyed on every in-sync replica: (partition, offset) →
        # (value, when). Kafka promises nothing for those; the checkers excuse them (only
        # for what was acknowledged or read before).
        # Keyed by the value too: another record destroyed later at the same offset must not
        # take the excuse away from the first.
        self.destroyed: dict[tuple[tuple[str, int], int, bytes], int] = {}
        # KIP-966 as the checkers see it, from the controller's committed ISRs alone: for each
        # partition, the replicas that must hold every committed record: the ISR, plus whoever
        # was in it while it was below min ISR (when the high watermark stands still), less
        # those back from an unclean shutdown. With ELR on it must equal ISR + ELR; with ELR
        # off it is what Kafka 4 would keep eligible, so the checkers hold the old design to
        # Kafka 4's promise (and the last-replica-standing window fails them).
        self.eligible: dict[tuple[str, int], set[int]] = {}
        # The scripted window (Faults.window_at_ms): brokers held down, paused or cut off.
        self.held_down: set[int] = set()
        self.cut_off: set[int] = set()
        # What machine crashes took from each replica: (broker, partition) → offset → value.
        self.crash_lost: dict[tuple[int, tuple[str, int]], dict[int, bytes]] = {}
        # When each record first came below a leader's high watermark: (partition, offset, value) → when.
        self.committed_at: dict[tuple[tuple[str, int], int, bytes], int] = {}
        # Records first committed by a deposed leader (a newer leader epoch is committed): it
        # counts on what its followers fetched before, which a machine crash since may have
        # taken, so they may be committed after every eligible copy was destroyed.
        self.committed_deposed: set[tuple[tuple[str, int], int, bytes]] = set()
        self.stats = {k: 0 for k in ("events", "messages", "dropped", "process_crashes", "machine_crashes",
                                     "bytes_lost", "partitions", "pauses", "elections", "controller_failovers",
                                     "appends", "fetches", "truncations", "isr_changes_sent", "acked", "acked_all",
                                     "destroyed", "acked_all_destroyed", "consumed", "leader_changes", "resets",
                                     "clean_restarts", "unclean_returns", "windows", "window_losses")}
        self.trace = hashlib.sha256()
        self._leaders_seen: dict[tuple[str, int], tuple[int, int]] = {}

    # ---- plumbing ----------------------------------------------------------------------

    def push(self, at_ms: int, fn: Callable[..., None], args: tuple[Any, ...], node: int = -1,
             incarnation: int = -1) -> None:
        self._seq += 1
        heapq.heappush(self._queue, _Event(at_ms, self._seq, fn, args, node, incarnation))

    def _connected(self, a: int, b: int) -> bool:
        if a in self.brokers and not self.brokers[a].alive or b in self.brokers and not self.brokers[b].alive:
            return False
        if a in self.cut_off or b in self.cut_off:
            return False
        # Clients (ids ≥ 1000) are never cut off; brokers and the controller may be.
        a_cut = a in self.isolated
        b_cut = b in self.isolated
        if a >= 1000 or b >= 1000:
            return not (a_cut or b_cut) or self.rng.random() < 0.5  # clients reach some side
        return a_cut == b_cut

    def send(self, src: int, dst: int, kind: str, *args: Any, dst_incarnation: int = -1) -> None:
        self.stats["messages"] += 1
        if not self._connected(src, dst) or (self.faults_on and self.rng.random() < self.faults.drop):
            self.stats["dropped"] += 1
            return
        inc = self.brokers[dst].incarnation if dst in self.brokers else -1
        if dst_incarnation >= 0 and dst in self.brokers and dst_incarnation != inc:
            return  # the connection belonged to an earlier process
        delay = self.rng.randint(1, self.faults.max_delay_ms if self.faults_on else 3)
        self.push(self.now + delay, self._deliver, (dst, kind, args), dst if dst in self.brokers else -1, inc)

    def _deliver(self, dst: int, kind: str, args: tuple[Any, ...]) -> None:
        if dst == CONTROLLER:
            self._controller_receive(kind, *args)
        elif dst in self.brokers:
            getattr(self.brokers[dst], "on_" + kind)(*args)
        elif dst >= CONSUMERS:
            self.consumers[dst - CONSUMERS].on_answer(*args)
        else:
            request, result = args
            self.producers[dst - PRODUCERS].on_answer(request, result)

    def _controller_receive(self, kind: str, *args: Any) -> None:
        ctrl = self.controller
        if kind == "metadata_fetch":
            broker, inc, offset = args
            ctrl.fetch(broker, inc, offset)
        elif kind == "register":
            broker, inc, incarnation_id, previous_epoch = args
            current = ctrl.controller.image.brokers.get(broker)
            if current is not None and current.incarnation_id != incarnation_id \
                    and current.broker_epoch != previous_epoch:
                self.unclean_return(broker)
            result = ctrl.run("register_broker", {"broker_id": broker, "incarnation_id": incarnation_id,
                                                  "host": "sim", "port": broker, "rack": None,
                                                  "previous_broker_epoch": previous_epoch}, True)
            self.send(CONTROLLER, broker, "registered", result, dst_incarnation=inc)
        elif kind == "heartbeat":
            broker, inc, epoch, caught_up, want_shutdown = args
            result = ctrl.run("broker_heartbeat", {"broker_id": broker, "broker_epoch": epoch, "caught_up": caught_up,
                                                   "want_shutdown": want_shutdown}, True)
            self.send(CONTROLLER, broker, "heartbeat", result, dst_incarnation=inc)
        elif kind == "alter_partition":
            broker, inc, token, request = args
            result = ctrl.run("alter_partition", request, False)
            self.send(CONTROLLER, broker, "alter_isr", token, result, dst_incarnation=inc)

    def guess_leader(self, key: tuple[str, int]) -> tuple[int, int]:
        """What a client's metadata says (leader, leader epoch): some live broker's view
        (maybe stale), or the controller's."""
        views = [b.image for b in self.brokers.values() if b.alive and b.image.topic(TOPIC) is not None]
        image = self.rng.choice(views) if views and self.rng.random() < 0.7 else self.controller.image
        p = image.partition(*key)
        return (p.leader, p.leader_epoch) if p is not None else (-1, -1)

    # ---- running -----------------------------------------------------------------------

    def run(self) -> ReplicationSim:
        c = self.config
        self.controller.bootstrap()
        for b in self.brokers.values():
            b.start()
        self.push(0, self._create_topic, ())
        self.push(50, self._controller_tick, ())
        for i in range(c.producers):
            acks = self.rng.choice((-1, -1, 1, 0)) if i else -1
            idempotent = acks == -1 and self.rng.random() < 0.7
            self.producers.append(SimProducer(self, i, acks, idempotent))
            self.push(300 + self.rng.randint(0, 100), self.producers[-1].tick, ())
        for i in range(c.partitions if c.consumers else 0):
            self.consumers.append(SimConsumer(self, i, (TOPIC, i)))
            self.push(300 + self.rng.randint(0, 100), self.consumers[-1].tick, ())
        f = self.faults
        for every, fn in ((f.crash_every_ms, self._crash), (f.partition_every_ms, self._partition),
                          (f.pause_every_ms, self._pause), (f.elect_every_ms, self._elect),
                          (f.controller_failover_every_ms, self._controller_failover),
                          (f.clean_restart_every_ms, self._clean_restart)):
            self.push(self.rng.randint(200, 200 + 2 * every), self._fault, (fn, every))
        if f.window_at_ms is not None:
            self.push(f.window_at_ms, self._window, (f.window_at_ms,))
        self.push(c.duration_ms, self._stop_faults, ())
        end = c.duration_ms + c.settle_ms
        events_max = 400 * (end // 10)
        try:
            while self._queue and self._queue[0].at_ms <= end:
                event = heapq.heappop(self._queue)
                self.now = event.at_ms
                if event.node >= 0:
                    b = self.brokers[event.node]
                    if not b.alive or b.incarnation != event.incarnation:
                        continue
                    if b.paused_until > self.now:  # looked at again (a pause may end early)
                        self.push(min(b.paused_until, self.now + 100), event.fn, event.args, event.node,
                                  event.incarnation)
                        continue
                self.stats["events"] += 1
                assert self.stats["events"] < events_max, f"seed {self.seed}: the simulation does not settle"
                event.fn(*event.args)
            self.final_checks()
        finally:
            self.close()
        return self

    def close(self) -> None:
        for b in self.brokers.values():
            if b.alive and b.logs is not None:
                for lg in b.logs.logs.values():
                    for seg in lg.segments:
                        seg.close()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def _create_topic(self) -> None:
        c = self.config
        configs = {"min.insync.replicas": str(c.min_insync_replicas), "segment.bytes": str(c.segment_bytes)}
        if c.flush_messages is not None:
            configs["flush.messages"] = str(c.flush_messages)
        if len(self.controller.image.active_brokers()) < c.replication_factor:
            self.push(self.now + 20, self._create_topic, ())
            return
        result = self.controller.run("create_topics", {"topics": [{
            "name": TOPIC, "num_partitions": c.partitions, "replication_factor": c.replication_factor,
            "configs": configs}]}, False)
        assert result["topics"][0]["error_code"] == ErrorCode.none, result

    def _controller_tick(self) -> None:
        self.controller.tick()
        self.push(self.now + 50, self._controller_tick, ())

    def on_metadata_committed(self) -> None:
        self._check_unprotected()
        for t, p in self.controller.image.all_partitions():
            key = (t.name, p.partition)
            eligible = self.eligible.get(key, set())
            if self.config.elr and set(p.isr) | set(p.elr) != eligible:
                # (Checked once the controller's operation committed: within one, a broker back
                # from an unclean shutdown is first fenced into the ELR, then taken out.)
                raise SafetyViolation(f"seed {self.seed}: at {self.now} ms the controller's ISR {p.isr} and ELR "
                                      f"{p.elr} of {key} (partition epoch {p.partition_epoch}) are not the "
                                      f"replicas KIP-966 keeps eligible: {sorted(eligible)}")
            if self._leaders_seen.get(key) != (p.leader, p.leader_epoch):
                self._leaders_seen[key] = (p.leader, p.leader_epoch)
                self.stats["leader_changes"] += 1

    # ---- faults ------------------------------------------------------------------------

    def _fault(self, fn: Callable[[], None], every: int) -> None:
        if not self.faults_on:
            return
        fn()
        self.push(self.now + self.rng.randint(every // 2, 3 * every // 2), self._fault, (fn, every))

    def _crash(self) -> None:
        live = [b for b in self.brokers.values() if b.alive]
        if len(live) <= 1:
            return
        b = self.rng.choice(live)
        machine = self.rng.random() < self.faults.machine_crash
        self._crash_broker(b, machine)
        self.push(self.now + self.rng.randint(*self.faults.down_ms), self.restart, (b.node_id,))

    def _crash_broker(self, b: SimBroker, machine: bool) -> None:
        keys = [(TOPIC, i) for i in range(self.config.partitions)]
        before = {key: self._holdings(b, key) for key in keys}
        b.stop_process()
        if machine:
            self.stats["bytes_lost"] += b.disk.machine_crash(self.rng)
            after = self._recovered_records(b, keys)
            self.down_holdings[b.node_id] = after
            self._excuse_lost(b, before, after)
        else:
            self.down_holdings[b.node_id] = before
        self.stats["machine_crashes" if machine else "process_crashes"] += 1

    def _recovered_records(self, b: SimBroker, keys: list[tuple[str, int]]) -> dict[tuple[str, int], dict[int, bytes]]:
        """What a machine-crashed broker will hold once it has recovered its logs: the real
        recovery (LogManager.load_all) run on what survived, then closed again uncleanly."""
        logs = LogManager(b.dir)
        image = self.controller.image
        marker = b.dir / CLEAN_SHUTDOWN_FILE  # the broker reads it at its start, not this look
        kept_marker = marker.read_bytes() if marker.exists() else None

        def config_for(topic: str) -> Any:
            t = image.topic(topic)
            return self.broker_config.log_config(t.configs if t is not None else {})

        logs.load_all(config_for, self.clock.now_ms())
        out = {}
        for key in keys:
            lg = logs.get(*key)
            out[key] = _log_contents(lg) if lg is not None else {}
        for lg in logs.logs.values():
            for seg in lg.segments:
                seg.close()
        if kept_marker is not None:
            marker.write_bytes(kept_marker)
        return out

    def _excuse_lost(self, crashed: SimBroker, before: dict[tuple[str, int], dict[int, bytes]],
                     after: dict[tuple[str, int], dict[int, bytes]]) -> None:
        """Remember what a machine crash took from `crashed`, then see what no in-sync
        replica holds any more."""
        for key, records in before.items():
            lost = {o: v for o, v in records.items() if after.get(key, {}).get(o) != v}
            if lost:
                self.crash_lost.setdefault((crashed.node_id, key), {}).update(lost)
        self._check_unprotected()

    def _check_unprotected(self) -> None:
        """Kafka 4 promises durability while one replica it keeps eligible holds the data,
        nothing once every such copy is gone. The eligible replicas of a partition: its
        ISR, its ELR and `self.eligible` (the same with ELR on); when all of them were taken
        out after unclean shutdowns, the last known leader, which leads when back. A record is
        destroyed when every eligible replica lacks it *because a machine crash took it* (a
        member lacking it for any other reason is a bug the checkers must still see); a
        replica in the ELR that still holds it is a surviving copy, down or not."""
        if not self.crash_lost:
            return
        for t, p in self.controller.image.all_partitions():
            key = (t.name, p.partition)
            members = sorted(set(p.isr) | set(p.elr) | self.eligible.get(key, set())) or list(p.last_known_elr)
            # (offset, value) pairs: replicas may have lost different records at one offset
            candidates = {(o, v) for r in p.replicas for o, v in self.crash_lost.get((r, key), {}).items()}
            if not candidates or not members:
                continue
            holdings = {r: self._holdings(self.brokers[r], key) for r in members}
            for offset, value in sorted(candidates):
                # Destroyed before: again only if committed since (a producer's retry wrote
                # it again, and a later crash took that copy too: seed 1000828, stretch 4).
                before = self.destroyed.get((key, offset, value))
                if before is not None and self.committed_at.get((key, offset, value), -1) <= before:
                    continue
                if all(holdings[r].get(offset) != value and self.crash_lost.get((r, key), {}).get(offset) == value
                       for r in members):
                    self.destroyed[(key, offset, value)] = self.now
                    self.stats["destroyed"] += 1

    def excused(self, key: tuple[str, int], offset: int, value: bytes) -> bool:
        """Was this record destroyed on every eligible replica after it was committed (or
        committed by a deposed leader at all)?"""
        found = self.destroyed.get((key, offset, value))
        committed_ms = self.committed_at.get((key, offset, value))
        return found is not None and committed_ms is not None and (
            found >= committed_ms or (key, offset, value) in self.committed_deposed)

    def unclean_return(self, broker: int) -> None:
        """`broker` registers with a previous_broker_epoch that is not its last registration's
        (it crashed since): KIP-966 takes it out of every ISR and ELR."""
        self.stats["unclean_returns"] += 1
        for members in self.eligible.values():
            members.discard(broker)

    def track_eligible(self, topic_id: str, partition: int) -> None:
        """A committed partition record: the eligible set after it (see `self.eligible`)."""
        t = self.controller.image.topics.get(topic_id)
        p = t.partitions.get(partition) if t is not None else None
        if t is None or p is None:
            return
        key = (t.name, partition)
        before = self.eligible.get(key, set())
        if len(p.isr) >= max(1, min(self.config.min_insync_replicas, len(p.replicas))):
            now = set(p.isr)
        else:
            now = set(p.isr) | before
        self.eligible[key] = now

    def _holdings(self, b: SimBroker, key: tuple[str, int]) -> dict[int, bytes]:
        """What a broker holds of a partition: its open log, or (down or still loading) its files."""
        if b.alive and b.logs_loaded:
            return self._log_records(b, key)
        return self.down_holdings.get(b.node_id, {}).get(key, {})

    def restart(self, node_id: int) -> None:
        b = self.brokers[node_id]
        if not b.alive and node_id not in self.held_down:
            b.start()

    # ---- the scripted window (Faults.window_at_ms) ---------------------------------------

    def _window(self, first_ms: int) -> None:
        """Start when partition 0 has a leader and every replica in sync (retried for a while)."""
        key = (TOPIC, 0)
        p = self.controller.image.partition(*key)
        ready = p is not None and p.leader > 0 and len(p.replicas) > 1 and sorted(p.isr) == sorted(p.replicas) \
            and all(self.brokers[r].alive and self.brokers[r].logs_loaded and not self.brokers[r].shutting_down
                    and self.brokers[r].paused_until <= self.now for r in p.replicas)
        if not ready or p is None:
            if self.faults_on and self.now < first_ms + 2000:
                self.push(self.now + 50, self._window, (first_ms,))
            return
        followers = [r for r in p.replicas if r != p.leader]
        self.rng.shuffle(followers)
        self._window_drop(p.leader, followers, [])

    def _window_drop(self, leader: int, followers: list[int], dropped: list[tuple[int, str]]) -> None:
        """The next follower drops out: a clean shutdown, a pause or a network partition,
        held until the window's leader is back."""
        if not self.faults_on:
            return
        r = followers[0]
        b = self.brokers[r]
        how = self.rng.choice(("shutdown", "pause", "partition"))
        if how == "shutdown" and b.alive and b.logs_loaded and not b.shutting_down:
            self.held_down.add(r)
            b.begin_shutdown()
        elif how == "pause" or how == "shutdown":
            how = "pause"
            b.paused_until = self.now + 1_000_000
        else:
            self.cut_off.add(r)
        dropped.append((r, how))
        if followers[1:]:
            self.push(self.now + self.rng.randint(50, 400), self._window_drop, (leader, followers[1:], dropped))
        else:
            self.push(self.now + 5, self._window_crash, (leader, dropped, self.now))

    def _window_crash(self, leader: int, dropped: list[tuple[int, str]], since: int) -> None:
        """Once the leader is alone in the controller's ISR: its machine crashes (its unsynced
        tail is lost); it comes back first, the followers some time after."""
        p = self.controller.image.partition(TOPIC, 0)
        b = self.brokers[leader]
        if not self.faults_on:
            return
        if p is None or not b.alive or (p.isr != [leader] and self.now < since + 3000):
            if p is not None and b.alive:
                self.push(self.now + 5, self._window_crash, (leader, dropped, since))
            else:
                self._window_release(dropped)
            return
        self.push(self.now + self.rng.randint(0, 40), self._window_leader_crash, (leader, dropped))

    def _window_leader_crash(self, leader: int, dropped: list[tuple[int, str]]) -> None:
        b = self.brokers[leader]
        if not self.faults_on or not b.alive:
            self._window_release(dropped)
            return
        self.stats["windows"] += 1
        acked = {(a.base_offset + i, v) for a in self.acked if a.key == (TOPIC, 0) and a.acks == -1
                 for i, v in enumerate(a.values)}
        self._crash_broker(b, machine=True)
        lost = self.crash_lost.get((leader, (TOPIC, 0)), {})
        self.stats["window_losses"] += any((o, v) in acked for o, v in lost.items())
        back = self.now + self.rng.randint(50, 300)
        self.push(back, self.restart, (leader,))
        self.push(back + self.rng.randint(600, 1500), self._window_release, (dropped,))

    def _window_release(self, dropped: list[tuple[int, str]]) -> None:
        for r, how in dropped:
            b = self.brokers[r]
            self.held_down.discard(r)
            self.cut_off.discard(r)
            if how == "pause":
                b.paused_until = min(b.paused_until, self.now)
            self.restart(r)

    def _partition(self) -> None:
        nodes = [CONTROLLER, *self.brokers]
        self.rng.shuffle(nodes)
        self.isolated = set(nodes[: self.rng.randint(1, len(nodes) - 1)])
        self.stats["partitions"] += 1
        self.push(self.now + self.rng.randint(*self.faults.partition_ms), self._heal, ())

    def _heal(self) -> None:
        self.isolated = set()

    def _pause(self) -> None:
        live = [b for b in self.brokers.values() if b.alive and b.paused_until <= self.now]
        if live:
            self.rng.choice(live).paused_until = self.now + self.rng.randint(*self.faults.pause_ms)
            self.stats["pauses"] += 1

    def _elect(self) -> None:
        self.controller.run("elect_leaders", {"election_type": 0, "partitions": None}, False)
        self.stats["elections"] += 1

    def _clean_restart(self) -> None:
        live = [b for b in self.brokers.values() if b.alive and b.logs_loaded and not b.shutting_down]
        if len(live) > 1:
            self.rng.choice(live).begin_shutdown()

    def _controller_failover(self) -> None:
        self.controller.failover()

    def _stop_faults(self) -> None:
        self.faults_on = False
        self.isolated = set()
        self.held_down = set()
        self.cut_off = set()
        for p in self.producers:
            p.stopped = True
        self.pending_at_stop = {(p.id, k) for p in self.producers for k in p.inflight}
        for b in self.brokers.values():
            b.paused_until = min(b.paused_until, self.now)
            if not b.alive:
                self.push(self.now + self.rng.randint(1, 50), self.restart, (b.node_id,))

    # ---- what the checkers look at ------------------------------------------------------

    def _log_records(self, b: SimBroker, key: tuple[str, int]) -> dict[int, bytes]:
        """offset → value of every record in a live broker's replica."""
        lg = b.logs.get(*key) if b.logs is not None else None
        return _log_contents(lg) if lg is not None else {}

    def _holds(self, records: dict[int, bytes], a: Acked) -> bool:
        return all(records.get(a.base_offset + i) == v for i, v in enumerate(a.values))

    def acknowledged(self, producer: SimProducer, key: tuple[str, int], base_offset: int,
                     values: tuple[bytes, ...], pid: int) -> None:
        self.acked.append(Acked(producer.id, key, base_offset, values, producer.acks, self.now, pid))
        self.stats["acked"] += 1
        self.stats["acked_all"] += producer.acks == -1
        self.trace.update(f"{self.now}:{producer.id}:{key}:{base_offset}".encode())

    def check_acks_all(self, leader: SimBroker, part: Partition, w: _AcksAll) -> None:
        """At the moment a leader acknowledges acks=all: every live member of the
        controller's ISR holds the batch, and the ISR it acted on met min.insync.replicas."""
        a = Acked(w.producer, w.key, w.base_offset, w.values, -1, self.now)
        if len(part.isr) < part.min_insync_replicas:
            raise SafetyViolation(f"seed {self.seed}: broker {leader.node_id} acknowledged {w.key} offset "
                                  f"{w.base_offset} with ISR {part.isr} below min.insync.replicas")
        p = self.controller.image.partition(*w.key)
        assert p is not None
        for r in p.isr:
            b = self.brokers[r]
            lg = b.logs.get(*w.key) if b.alive and b.logs_loaded and b.logs is not None else None
            if lg is not None and not self._holds(_log_contents(lg, w.base_offset, w.base_offset + len(w.values)), a):
                raise SafetyViolation(
                    f"seed {self.seed}: at {self.now} ms broker {leader.node_id} (leader epoch {part.leader_epoch}, "
                    f"its ISR {part.isr}, maximal {part.maximal_isr}) acknowledged {w.key} offsets "
                    f"{w.base_offset}..{w.base_offset + len(w.values) - 1} with acks=all, but broker {r} of the "
                    f"controller's ISR {p.isr} (partition epoch {p.partition_epoch}) does not hold them")

    def check_node(self, b: SimBroker) -> None:
        """A leader's high watermark never moves backwards within its leader epoch."""
        if b.rm is None:
            return
        for key, part in b.rm.partitions.items():
            if not part.is_leader:
                b.commit_scan.pop(key, None)  # a follower's log may be cut: scan anew when it leads
                continue
            seen_key = (key, part.leader_epoch)
            hw = part.high_watermark
            before = b.hw_seen.get(seen_key, -1)
            if hw < before:
                raise SafetyViolation(f"seed {self.seed}: broker {b.node_id} leading {key} in epoch "
                                      f"{part.leader_epoch}: high watermark moved back from {before} to {hw}")
            if hw > before:
                self.trace.update(f"{self.now}:{b.node_id}:{key}:{part.leader_epoch}:{hw}".encode())
                if self.config.elr and before >= 0:  # (-1: its first look in this epoch, not a move)
                    self._check_strict_min_isr(b, key, part, before, hw)
                self._committed(b, key, part, hw)
            b.hw_seen[seen_key] = hw

    def _check_strict_min_isr(self, b: SimBroker, key: tuple[str, int], part: Partition, before: int,
                              hw: int) -> None:
        """KIP-966 with ELR on: a leader's high watermark stands still while its ISR is below
        min ISR, and every replica of the controller's ELR holds what comes below it (they
        may lead next: an ELR member lacking a committed record would lose it)."""
        if len(part.isr) < min(part.min_insync_replicas, max(1, len(part.replicas))):
            raise SafetyViolation(f"seed {self.seed}: at {self.now} ms broker {b.node_id} leading {key} in epoch "
                                  f"{part.leader_epoch} moved its high watermark from {before} to {hw} with ISR "
                                  f"{part.isr} below min.insync.replicas={part.min_insync_replicas}")
        p = self.controller.image.partition(*key)
        if p is None or not p.elr or p.leader != b.node_id or p.leader_epoch != part.leader_epoch:
            return
        start = max(before, part.log.log_start_offset)
        ours = _log_contents(part.log, start, hw)
        for r in p.elr:
            other = self.brokers[r]
            lg = other.logs.get(*key) if other.alive and other.logs_loaded and other.logs is not None else None
            if lg is None:
                continue
            theirs = _log_contents(lg, start, hw)
            missing = sorted(o for o, v in ours.items() if o >= start and theirs.get(o) != v)
            if missing:
                raise SafetyViolation(f"seed {self.seed}: at {self.now} ms broker {b.node_id} leading {key} in epoch "
                                      f"{part.leader_epoch} moved its high watermark to {hw}, but broker {r} of the "
                                      f"controller's ELR {p.elr} lacks offsets {missing[0]}..{missing[-1]}")

    def _committed(self, b: SimBroker, key: tuple[str, int], part: Partition, hw: int) -> None:
        """Note when each record first came below a leader's high watermark."""
        start = b.commit_scan.get(key, part.log.log_start_offset)
        if start >= hw:
            return
        current = self.controller.image.partition(*key)
        deposed = current is None or current.leader_epoch > part.leader_epoch
        for offset, value in _log_contents(part.log, start, hw).items():
            if (key, offset, value) not in self.committed_at:
                self.committed_at[(key, offset, value)] = self.now
                if deposed:
                    self.committed_deposed.add((key, offset, value))
        b.commit_scan[key] = hw

    def final_checks(self) -> None:
        image = self.controller.image
        for t, p in image.all_partitions():
            key = (t.name, p.partition)
            where = f"seed {self.seed}: after the faults stopped, {key}"
            if p.leader < 0:
                raise SafetyViolation(f"{where} has no leader (replicas {p.replicas}, ISR {p.isr})")
            if sorted(p.isr) != sorted(p.replicas):
                raise SafetyViolation(f"{where}: ISR {p.isr} is short of the replicas {p.replicas}")
            leader = self.brokers[p.leader]
            final = self._log_records(leader, key)
            logs = {r: self._replica_bytes(self.brokers[r], key) for r in p.replicas}
            reference = logs[p.leader]
            for r, data in logs.items():
                if data != reference:
                    raise SafetyViolation(f"{where}: replica on broker {r} differs from the leader {p.leader} "
                                          f"({len(data)} vs {len(reference)} bytes)")
            for a in self.acked:
                if a.key != key or a.acks != -1 or self._holds(final, a):
                    continue
                if all(final.get(a.base_offset + i) == v or self.excused(key, a.base_offset + i, v)
                       for i, v in enumerate(a.values)):
                    self.stats["acked_all_destroyed"] += 1  # lost, every eligible copy destroyed
                    continue
                got = [final.get(a.base_offset + i) for i in range(len(a.values))]
                raise SafetyViolation(f"{where}: acknowledged (acks=all at {a.at_ms} ms) offsets "
                                      f"{a.base_offset}..{a.base_offset + len(a.values) - 1} {list(a.values)} "
                                      f"are now {got}")
            for c in self.consumers:
                if c.key != key:
                    continue
                for offset, (value, _) in c.records.items():
                    if final.get(offset) != value and not self.excused(key, offset, value):
                        raise SafetyViolation(f"{where}: a consumer read offset {offset} = {value!r}, "
                                              f"the log now holds {final.get(offset)!r}")
            seen: dict[bytes, int] = {}
            idempotent = {f"p{p_.id}-".encode() for p_ in self.producers if p_.idempotent}
            for offset, value in final.items():
                if any(value.startswith(prefix) for prefix in idempotent):
                    if value in seen:
                        raise SafetyViolation(f"{where}: idempotent record {value!r} is at offsets {seen[value]} "
                                              f"and {offset}")
                    seen[value] = offset
        for prod in self.producers:
            stuck = [k for k in prod.inflight if (prod.id, k) in self.pending_at_stop]
            if stuck and prod.acks != 0:
                raise SafetyViolation(f"seed {self.seed}: producer {prod.id}'s batches for {stuck} were never "
                                      f"acknowledged after the faults stopped")

    def _replica_bytes(self, b: SimBroker, key: tuple[str, int]) -> bytes:
        if b.rm is None or key not in b.rm.partitions:
            return b""
        lg = b.rm.partitions[key].log
        out = bytearray()
        offset = lg.log_start_offset
        while offset < lg.log_end_offset:
            chunk = lg.read(offset, 1 << 20, lg.log_end_offset, min_one_batch=True)
            if not chunk:
                break
            out += chunk
            headers = [h for _, h in iter_headers(chunk)]
            offset = headers[-1].next_offset
        return bytes(out)

    @property
    def digest(self) -> str:
        """A fingerprint of the run (acknowledgements and high watermarks over time): two runs
        of one seed must match."""
        return self.trace.hexdigest()[:16]
