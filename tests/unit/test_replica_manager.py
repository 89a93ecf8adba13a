"""The replica manager's disk work when metadata creates replicas (cluster/replication/replica_manager.py).

Every metadata change is applied in the broker's one event loop, beside the quorum,
heartbeats and requests: nothing there may wait for the disk to sync.
"""

from __future__ import annotations

import os
import random
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from cluster.broker.config import BrokerConfig
from cluster.controller.controller import ControllerConfig, QuorumController
from cluster.controller.image import MetadataImage
from cluster.replication.replica_manager import ReplicaManager, ReplicaSettings, changed_topic_ids
from cluster.storage.log_manager import LogManager
from cluster.storage.meta_properties import read_partition_topic_id

PARTITIONS = 50  # as __consumer_offsets and __transaction_state
NOW_MS = 1_700_000_000_000


class FixedClock:
    def now_ms(self) -> int:
        return NOW_MS


def one_broker_topic(partitions: int) -> tuple[MetadataImage, str]:
    """Broker 1, registered and unfenced, leads every partition of topic `t`."""
    _, image, topic_id = one_broker_controller(partitions)
    return image, topic_id


def one_broker_controller(partitions: int) -> tuple[QuorumController, MetadataImage, str]:
    """one_broker_topic, with the controller (its records go to the image by apply_entry)."""
    ctrl = QuorumController(MetadataImage(), ControllerConfig(), lambda configs: None, random.Random(1), 0)
    image = MetadataImage()

    def commit() -> None:
        image.apply_entry(image.offset, orjson.dumps(ctrl.take_records()))

    result = ctrl.register_broker({"broker_id": 1, "incarnation_id": "a", "host": "127.0.0.1", "port": 9092}, 0)
    commit()
    ctrl.broker_heartbeat({"broker_id": 1, "broker_epoch": result["broker_epoch"], "caught_up": True}, 0)
    commit()
    created = ctrl.create_topics({"topics": [{"name": "t", "num_partitions": partitions, "replication_factor": 1}]})
    commit()
    (topic,) = created["topics"]
    assert topic["error_code"] == 0, topic
    return ctrl, image, topic["topic_id"]


def replica_manager(data_dir: Path, image: MetadataImage) -> ReplicaManager:
    return ReplicaManager(1, data_dir, LogManager(data_dir), ReplicaSettings(), clock=FixedClock(),
                          image=lambda: image, log_config=BrokerConfig.from_overrides({}).log_config,
                          isr_channel=None)  # type: ignore[arg-type]  # no ISR change is sent here


def test_new_replicas_get_their_small_files_written_outside_the_event_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 50-partition topic appears: `reconcile` opens the 50 replicas with no fsync and no
    small file in the event loop's thread beyond each directory and its segment (it did two
    fsyncs per replica: on a busy disk the loop stood still for seconds, the quorum lost its
    leader and the controller fenced the broker; and at 10,000 partitions, writing each
    leader-epoch-checkpoint and creating each index file there held it up for ~20 s). A
    worker thread then makes the empty index files, writes each partition.metadata and
    leader-epoch-checkpoint, and syncs the batch once."""
    import cluster.replication.replica_manager as replica_manager_module

    image, topic_id = one_broker_topic(PARTITIONS)
    loop_thread = threading.get_ident()
    synced_in: list[int] = []
    batch_synced_in: list[int] = []
    real_fsync, real_sync_filesystem = os.fsync, replica_manager_module.sync_filesystem

    def fsync(fd: Any) -> None:
        synced_in.append(threading.get_ident())
        real_fsync(fd)

    def sync_filesystem(path: Path) -> None:
        batch_synced_in.append(threading.get_ident())
        real_sync_filesystem(path)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(replica_manager_module, "sync_filesystem", sync_filesystem)
    rm = replica_manager(tmp_path, image)
    dirs = [tmp_path / f"t-{i}" for i in range(PARTITIONS)]
    small_files = ("partition.metadata", "leader-epoch-checkpoint", f"{0:020d}.index", f"{0:020d}.timeindex")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            rm._nursery = nursery  # as ReplicaManager.run sets it; the nursery's end awaits the writer
            rm.reconcile()
            assert sorted(rm.partitions) == [("t", i) for i in range(PARTITIONS)]
            assert all(rm.partitions[("t", i)].is_leader for i in range(PARTITIONS))
            assert synced_in == []
            assert sorted({f.name for d in dirs for f in d.iterdir()}) == [f"{0:020d}.log"]

    trio.run(main)
    assert [read_partition_topic_id(d) for d in dirs] == [topic_id] * PARTITIONS
    assert all((d / name).exists() for d in dirs for name in small_files)
    assert {(d / "leader-epoch-checkpoint").read_text() for d in dirs} == {"0\n1\n0 0\n"}
    assert synced_in == [] and len(batch_synced_in) == 1, "one sync for the batch"
    assert loop_thread not in batch_synced_in


def test_partition_metadata_not_yet_written_is_written_at_close(tmp_path: Path) -> None:
    image, topic_id = one_broker_topic(3)
    rm = replica_manager(tmp_path, image)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            rm._nursery = nursery
            rm.reconcile()
            rm.close()  # a shutdown before the writer ran

    trio.run(main)
    assert [read_partition_topic_id(tmp_path / f"t-{i}") for i in range(3)] == [topic_id] * 3


def test_a_metadata_change_reconciles_only_the_topics_it_names(tmp_path: Path) -> None:
    """At 10,000 partitions a broker reconciled every one of them after every metadata change
    (a topic created, one leader moved): the cost grew with partitions × changes. A change that
    names topics only now touches those topics' replicas; any other record (brokers, broker
    configs, features) still reconciles them all."""
    ctrl, image, topic_id = one_broker_controller(PARTITIONS)
    rm = replica_manager(tmp_path, image)
    rm.reconcile()
    before = dict(rm.partitions)
    roles: list[tuple[str, int]] = []
    apply_role = rm._apply_role

    def counted(part: Any, p: Any, now_ms: int) -> bool:
        roles.append(part.key)
        return apply_role(part, p, now_ms)

    rm._apply_role = counted  # type: ignore[method-assign]
    created = ctrl.create_topics({"topics": [{"name": "u", "num_partitions": 3, "replication_factor": 1}]})
    records = ctrl.take_records()
    image.apply_entry(image.offset, orjson.dumps(records))
    assert changed_topic_ids(records) == {created["topics"][0]["topic_id"]}
    rm.reconcile(changed_topic_ids(records))
    assert sorted(roles) == [("u", i) for i in range(3)], "only the new topic's replicas"
    assert {k: v for k, v in rm.partitions.items() if k[0] == "t"} == before
    assert sorted(k for k in rm.partitions if k[0] == "u") == [("u", i) for i in range(3)]
    # The topic removed: its replicas (and logs) go, the others stay.
    removal = [{"type": "RemoveTopic", "v": 1, "topic_id": topic_id}]
    image.apply_entry(image.offset, orjson.dumps(removal))
    rm.reconcile(changed_topic_ids(removal))
    assert sorted(rm.partitions) == [("u", i) for i in range(3)]
    assert not (tmp_path / "t-0").exists() or not any((tmp_path / "t-0").iterdir())
    assert changed_topic_ids([{"type": "Acl", "v": 1}, {"type": "ProducerIds", "v": 1}]) == set()
    assert changed_topic_ids([*removal, {"type": "BrokerConfig", "v": 1}]) is None
    assert changed_topic_ids([{"type": "FenceBroker", "v": 1}]) is None


def test_many_new_leaderships_are_logged_in_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A broker taking 10,000 partitions wrote 10,000 INFO lines per change: a few are each
    logged, many summarized (each stays at DEBUG)."""
    import logging

    many = 150
    image, _ = one_broker_topic(many)
    rm = replica_manager(tmp_path, image)
    with caplog.at_level(logging.INFO, logger="cluster.replication.replica_manager"):
        rm.reconcile()
    lines = [r.getMessage() for r in caplog.records if r.name == "cluster.replication.replica_manager"]
    assert lines == [f"broker 1 leads {many} more partition(s) or in new leader epochs "
                     f"({', '.join(f't-{i}' for i in range(10))}, ...; each at DEBUG)"]
    small, _ = one_broker_topic(3)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cluster.replication.replica_manager"):
        replica_manager(tmp_path / "small", small).reconcile()
    assert [r.getMessage() for r in caplog.records] == [f"broker 1 leads t-{i} (leader epoch 0)" for i in range(3)]


def test_a_deleted_partition_is_renamed_at_once_and_removed_by_a_worker(tmp_path: Path) -> None:
    """Removing a partition's files in the event loop took ~4 ms each (10,000 deleted held
    it up for ~40 s): delete_log renames the directory (a crash then removes it at the next
    start) and the log tasks' deletion loop removes it in a worker thread."""
    from cluster.storage.log_tasks import LogTasks, LogTaskSettings

    logs = LogManager(tmp_path)
    config = BrokerConfig.from_overrides({}).log_config({})
    for i in range(3):
        logs.create_log("t", i, config, NOW_MS)
    removed_in: list[int] = []
    remove = logs.remove_doomed

    def counted(doomed: list[Path]) -> None:
        removed_in.append(threading.get_ident())
        remove(doomed)

    logs.remove_doomed = counted  # type: ignore[method-assign]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(LogTasks(logs, LogTaskSettings(), FixedClock()).deletion_loop)
            while logs.on_delete_request is None:  # the loop has started
                await trio.sleep(0)
            for i in range(3):
                logs.delete_log("t", i)
            assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in logs.doomed)
            assert all(p.name.endswith("-delete") for p in logs.doomed) and removed_in == []
            while list(tmp_path.iterdir()):
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert removed_in and threading.get_ident() not in removed_in and logs.on_delete_request is None
    logs.delete_log("t", 9)  # no deletion loop: nothing to delete, and nothing waits
    assert list(tmp_path.iterdir()) == []


def test_a_consumer_s_idle_partition_is_answered_as_read_partition_answers_it(tmp_path: Path) -> None:
    """A consumer's "nothing new" answers kept by the leader (Partition.idle_answer, given
    by read_all) are the ones read_partition works out, over a seeded walk of plain and
    transactional appends, commits, aborts and deleted records, at every interesting fetch
    offset, isolation level and leader epoch; and they are really kept (the same object
    again while nothing moves, a new one once the high watermark moves)."""
    from cluster.protocol.answer_writers import KeptPartitionAnswer
    from cluster.protocol.record_batch import TRANSACTIONAL_MASK
    from cluster.protocol.records import Record, encode_batch
    from cluster.replication.replica_manager import FetchPartition

    seed = 20261203
    rng = random.Random(seed)
    image, _ = one_broker_topic(1)
    rm = replica_manager(tmp_path, image)
    kept = 0

    async def main() -> None:
        nonlocal kept
        async with trio.open_nursery() as nursery:
            rm._nursery = nursery
            rm.reconcile()
            part = rm.partitions[("t", 0)]
            sequence = 0
            producer_id = 4000
            open_txn = False
            for step in range(200):
                action = rng.choice(("plain", "plain", "txn", "end", "delete", "none"))
                if action == "plain":
                    batch = encode_batch([Record(i, NOW_MS, None, b"v", ()) for i in range(rng.randint(1, 3))])
                    assert rm.append("t", 0, batch)["error_code"] == 0
                elif action == "txn":
                    batch = encode_batch([Record(0, NOW_MS, None, b"t", ())], producer_id=producer_id,
                                         producer_epoch=0, base_sequence=sequence,
                                         attributes_extra=TRANSACTIONAL_MASK)
                    sequence += 1
                    assert rm.append("t", 0, batch)["error_code"] == 0, step
                    open_txn = True
                elif action == "end" and open_txn:
                    answer = rm.write_marker("t", 0, producer_id=producer_id, producer_epoch=0,
                                             commit=rng.random() < 0.5, coordinator_epoch=0)
                    assert answer["error_code"] == 0, answer
                    open_txn = False
                elif action == "delete" and part.high_watermark > part.log.log_start_offset:
                    assert part.delete_records_before(rng.randint(part.log.log_start_offset,
                                                                  part.high_watermark)) == 0
                hw = part.high_watermark
                offsets = {0, part.log.log_start_offset, hw, hw + 1, part.log.last_stable_offset(hw),
                           part.log.log_end_offset}
                for offset in sorted(offsets):
                    for committed in (False, True):
                        for epoch in (-1, part.leader_epoch, part.leader_epoch + 1, part.leader_epoch - 1):
                            fp = FetchPartition("t", 0, offset, 1 << 20, epoch, -1)
                            slow, _, _ = rm.read_partition(fp, -1, 1 << 20, True, committed)
                            ((topic, fast),), _, _ = rm.read_all([fp], -1, 1 << 20, committed)
                            assert topic == "t" and fast == slow, (seed, step, offset, committed, epoch)
                            if isinstance(fast, KeptPartitionAnswer):
                                kept += 1
                                ((_, again),), _, _ = rm.read_all([fp], -1, 1 << 20, committed)
                                assert again is fast, "kept while nothing moves"
            before = rm.read_all([FetchPartition("t", 0, part.high_watermark, 1 << 20, -1, -1)], -1, 1 << 20)[0]
            assert rm.append("t", 0, encode_batch([Record(0, NOW_MS, None, b"v", ())]))["error_code"] == 0
            after = rm.read_all([FetchPartition("t", 0, part.high_watermark, 1 << 20, -1, -1)], -1, 1 << 20)[0]
            assert after[0][1] is not before[0][1] and after[0][1]["high_watermark"] == before[0][1]["high_watermark"] + 1
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert kept > 200, f"only {kept} idle answers were checked"
