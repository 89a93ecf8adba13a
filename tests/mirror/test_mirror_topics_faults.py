"""Mirror topics byte for byte through faults (issue 31): a 3-broker source (RF 3,
min.insync.replicas 2) and a 3-broker target (RF 3), one worker; librdkafka producers keep
writing during the whole copy: an idempotent one into `orders` (3 partitions, retention by
bytes, so the source's log start moves every few seconds), one into `compacted` (2
partitions, cleanup.policy=compact, small segments and dirty ratio, so the source's
cleaners rewrite it while it is copied), and two transactional ones writing both topics in
each transaction, committing and aborting. Meanwhile (the fault seed picks the partitions):
kill -9 of the worker, of the leader of a source partition, of the leader of a target
partition, each restarted.

What must be equal, once the producers stopped and the copy reached the source's ends:

- `orders` (retention, no compaction): all replicas of a partition hold the same batches,
  so every target replica's batches, from the one holding the source's log start, equal
  the source leader's at the same offsets, byte for byte but bytes 12-15 (the partition
  leader epoch, the target's own); read_committed and read_uncommitted consumers read the
  same records at the same offsets on both sides from the source's log start; the target's
  log start follows the source's, also on an idle partition (the test at the end), and
  reaches it once the source's settled.
- `compacted`: every replica compacts its own log (on the source and on the target, whose
  topic takes the source's cleanup.policy), and the copy was taken from whichever source
  leader served it, compacted or not yet. So: (1) the batches above every replica's cleaner
  checkpoint (source and target: nobody rewrote them) are equal byte for byte but bytes
  12-15, at the same offsets; (2) a record both sides return at an offset is the same
  record; (3) per key, the latest committed record (offset and value) is the same on both
  sides and the one the producers' acknowledgements say.
- On both sides read_committed returns no record of an aborted transaction and every
  committed record at or above the log start.

The target's own retention is not run here (log.retention.check.interval.ms 1 h on its
brokers): its log start follows the source's through MirrorAppend.
"""

from __future__ import annotations

import functools
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from tests.cluster_helpers import NotYet, admin, metadata, partitions_of
from tests.fault_workload import fault_rng, wait_fully_replicated
from tests.interop.common import partition_dir
from tests.mirror.lab import (
    Flow,
    MirrorLab,
    NotReady,
    Rec,
    end_offsets,
    new_topic,
    read_topic,
    wait_for,
)
from tests.mirror.test_mirror_topics import disk_batches, last_offset, low_watermarks

pytestmark = [pytest.mark.timeout(720), pytest.mark.heavy]

FLOW = "east-to-dr"
RF = 3
ORDERS, COMPACTED = "orders", "compacted"
PARTITIONS = {ORDERS: 3, COMPACTED: 2}
KEYS = 150  # the compacted topic's key space
TOPIC_CONFIGS = {
    ORDERS: {"cleanup.policy": "delete", "retention.bytes": str(192 << 10), "segment.bytes": str(48 << 10),
             "retention.ms": "604800000", "min.insync.replicas": "2"},
    COMPACTED: {"cleanup.policy": "compact", "segment.bytes": str(24 << 10), "segment.ms": "3000",
                "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "86400000",
                "min.insync.replicas": "2"},
}
CLUSTER_CONFIG: dict[str, dict[str, object]] = {
    "east": {"log.cleaner.backoff.ms": 500, "log.retention.check.interval.ms": 1000},
    "dr": {"log.cleaner.backoff.ms": 500, "log.retention.check.interval.ms": 3_600_000},
}
CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"


# --------------------------------------------------------------------------- producers


@dataclass
class Written:
    """What a producer's delivery reports say: (topic, partition) -> offset -> (key, value),
    committed and aborted apart."""

    committed: dict[tuple[str, int], dict[int, tuple[bytes, bytes]]] = field(default_factory=dict)
    aborted: dict[tuple[str, int], dict[int, tuple[bytes, bytes]]] = field(default_factory=dict)

    def add(self, into: dict[tuple[str, int], dict[int, tuple[bytes, bytes]]],
            rows: list[tuple[str, int, int, bytes, bytes]]) -> None:
        for topic, p, offset, key, value in rows:
            into.setdefault((topic, p), {})[offset] = (key, value)


class Writer:
    """A librdkafka producer (idempotent, acks=all) in a thread, at most `rate_per_s`:
    record i goes to the topics in turn (partition i // len(topics) % partitions), key
    `k<i>` (or `key-<i % KEYS>` into the compacted topic), value `<name>-<i>`, header i.
    Transactional: `per_txn` records per transaction, every `abort_every`-th aborted (values
    `<name>-aborted-<i>`); a transaction that fails abortably is aborted and its records
    count as aborted."""

    def __init__(self, bootstrap: str, name: str, topics: list[str], rate_per_s: float, *,
                 transactional: bool = False, per_txn: int = 30, abort_every: int = 0) -> None:
        self.name, self.topics, self.rate_per_s = name, topics, rate_per_s
        self.per_txn, self.abort_every, self.transactional = per_txn, abort_every, transactional
        config: dict[str, Any] = {
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
            "message.timeout.ms": 180_000, "request.timeout.ms": 10_000, "socket.connection.setup.timeout.ms": 3000,
            "reconnect.backoff.max.ms": 500, "topic.metadata.refresh.interval.ms": 1000, "log_level": 2}
        if transactional:
            config.update({"transactional.id": f"tx-{name}", "message.timeout.ms": 60_000,
                           "transaction.timeout.ms": 60_000})
        self.producer = Producer(config)
        if transactional:
            self.producer.init_transactions(60)
        self.written = Written()
        self.sent = 0
        self.transactions = {"committed": 0, "aborted": 0, "failed": 0}
        self.errors: dict[str, int] = {}
        self._delivered_rows: list[tuple[str, int, int, bytes, bytes]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"writer-{name}", daemon=True)

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        with self._lock:
            if err is not None:
                self.errors[err.name()] = self.errors.get(err.name(), 0) + 1
                return
            row = (msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value())
            if self.transactional:
                self._delivered_rows.append(row)
            else:
                self.written.add(self.written.committed, [row])

    def _produce(self, i: int, aborted: bool) -> None:
        topic = self.topics[i % len(self.topics)]
        key = f"key-{i % KEYS}" if topic == COMPACTED else f"k{i}"
        value = f"{self.name}-aborted-{i}" if aborted else f"{self.name}-{i}"
        while True:
            try:
                self.producer.produce(topic, value=value.encode(), key=key.encode(), headers=[("i", str(i).encode())],
                                      partition=(i // len(self.topics)) % PARTITIONS[topic],
                                      on_delivery=self._delivered)
                return
            except BufferError:
                self.producer.poll(0.05)

    def _due(self, begin: float, count: int) -> bool:
        return (time.monotonic() - begin) * self.rate_per_s >= self.sent + count

    def _run(self) -> None:
        begin = time.monotonic()
        while not self._stop.is_set():
            if not self.transactional:
                while self._due(begin, 1) and not self._stop.is_set():
                    self._produce(self.sent, False)
                    self.sent += 1
                self.producer.poll(0.005)
                continue
            if not self._due(begin, self.per_txn):
                self.producer.poll(0.005)
                continue
            abort = bool(self.abort_every) and (sum(self.transactions.values()) + 1) % self.abort_every == 0
            try:
                self.producer.begin_transaction()
                for _ in range(self.per_txn):
                    self._produce(self.sent, abort)
                    self.sent += 1
                if abort:
                    self.producer.flush(60)  # written, then aborted (an abort purges what is unsent)
                    self.producer.abort_transaction(60)
                else:
                    self.producer.commit_transaction(60)
                outcome = "aborted" if abort else "committed"
            except KafkaException as exc:
                error = exc.args[0]
                if not error.txn_requires_abort():
                    with self._lock:
                        self.errors[f"transaction: {error}"] = 1
                    return
                self.producer.abort_transaction(60)
                outcome = "failed"
            with self._lock:
                rows, self._delivered_rows = self._delivered_rows, []
                self.written.add(self.written.committed if outcome == "committed" else self.written.aborted, rows)
                self.transactions[outcome] += 1

    def start(self) -> Writer:
        self._thread.start()
        return self

    def finish(self, timeout_s: float = 200.0) -> Written:
        self._stop.set()
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), f"{self.name}: still writing after {timeout_s} s"
        left = self.producer.flush(timeout_s)
        assert left == 0, f"{self.name}: {left} records unacknowledged"
        assert not self.errors, f"{self.name}: errors {self.errors}"
        return self.written


# --------------------------------------------------------------------------- the lab


def total(ends: dict[str, dict[int, int]]) -> int:
    return sum(sum(parts.values()) for parts in ends.values())


def ends_of(bootstrap: str) -> dict[str, dict[int, int]]:
    return {t: end_offsets(bootstrap, t) for t in PARTITIONS}


def copied(bootstrap: str) -> int:
    """Offsets the mirror topics hold in all (0 for one not created yet)."""
    out = 0
    for t in PARTITIONS:
        try:
            out += sum(end_offsets(bootstrap, t).values())
        except NotReady:
            pass
    return out


def copy_advances(lab: MirrorLab, by: int, what: str, timeout_s: float = 120.0) -> None:
    """Wait until the target's end offsets moved on by `by` records in all (progress, not time)."""
    dr = lab.bootstrap("dr")
    start = copied(dr)
    wait_for(lambda: copied(dr) >= start + by, timeout_s, f"the copy {by} records on: {what}",
             interval_s=0.5, on_timeout=lab.mirror_log_tail)


def kill_leader(lab: MirrorLab, cluster: str, topic: str, partition: int) -> None:
    victim = partitions_of(metadata(lab.bootstrap(cluster), topic), topic)[partition].leader
    lab[cluster][victim].kill9()
    lab[cluster][victim].start(timeout_s=120)
    for t, count in PARTITIONS.items():
        wait_fully_replicated(lab[cluster], t, count, RF, timeout_s=120)
    leader = partitions_of(metadata(lab.bootstrap(cluster), topic), topic)[partition].leader
    print(f"{cluster}/{topic}-{partition}: leader {victim} killed -9 and restarted, now led by {leader}", flush=True)


def leader_broker(lab: MirrorLab, cluster: str, topic: str, partition: int) -> Path:
    leader = partitions_of(metadata(lab.bootstrap(cluster), topic), topic)[partition].leader
    return lab[cluster][leader].data_dir


def cleaned_partitions(lab: MirrorLab, cluster: str) -> set[int]:
    """Partitions of the compacted topic some broker of `cluster` has compacted (its log line)."""
    return {p for b in lab[cluster].brokers.values() for p in range(PARTITIONS[COMPACTED])
            if f"cleaned {COMPACTED}-{p} up to offset" in b.log_text()}


def cleaner_checkpoint(data_dir: Path, topic: str, partition: int) -> int:
    try:
        return int((partition_dir(data_dir, topic, partition) / CLEANER_CHECKPOINT).read_text().strip())
    except (FileNotFoundError, ValueError):
        return 0


# --------------------------------------------------------------------------- the checks


def assert_same_batches_from_log_start(lab: MirrorLab, log_starts: dict[int, int]) -> int:
    """`orders`: every target replica's batches holding offsets at or above the source's log
    start are the source leader's, byte for byte but bytes 12-15."""
    compared = 0
    for p in range(PARTITIONS[ORDERS]):
        source = disk_batches(leader_broker(lab, "east", ORDERS, p), ORDERS, p)
        expected = {base: raw for base, raw in source.items() if last_offset(raw) >= log_starts[p]}
        assert expected, f"east {ORDERS}-{p}: no batches at or above the log start {log_starts[p]}"
        for node, broker in lab["dr"].brokers.items():
            copy = {base: raw for base, raw in disk_batches(broker.data_dir, ORDERS, p).items()
                    if last_offset(raw) >= log_starts[p]}
            assert sorted(copy) == sorted(expected), \
                (f"dr node {node} {ORDERS}-{p}: batches at {sorted(set(copy) ^ set(expected))[:8]} are on one side "
                 f"only ({len(copy)} on dr, {len(expected)} on east)")
            different = [base for base in expected if copy[base] != expected[base]]
            assert not different, f"dr node {node} {ORDERS}-{p}: batches at {different[:5]} differ from the source's"
            compared += len(copy)
    return compared


def compacted_tail(lab: MirrorLab, p: int) -> tuple[int, dict[int, bytes], dict[int, dict[int, bytes]]]:
    """(the highest cleaner checkpoint of all six replicas, the source leader's batches from
    it, each target replica's batches from it), read while no cleaner moved on."""
    dirs = [b.data_dir for c in ("east", "dr") for b in lab[c].brokers.values()]
    before = max(cleaner_checkpoint(d, COMPACTED, p) for d in dirs)
    source = {b: raw for b, raw in disk_batches(leader_broker(lab, "east", COMPACTED, p), COMPACTED, p).items()
              if b >= before}
    copies = {node: {b: raw for b, raw in disk_batches(broker.data_dir, COMPACTED, p).items() if b >= before}
              for node, broker in lab["dr"].brokers.items()}
    after = max(cleaner_checkpoint(d, COMPACTED, p) for d in dirs)
    if after != before:
        raise NotReady(f"{COMPACTED}-{p}: a cleaner moved from {before} to {after} while reading")
    return before, source, copies


def latest_per_key(rows: list[Rec]) -> dict[bytes | None, tuple[int, bytes | None]]:
    out: dict[bytes | None, tuple[int, bytes | None]] = {}
    for r in rows:
        out[r.key] = (r.offset, r.value)
    return out


def check_compacted(lab: MirrorLab, written: Written) -> dict[str, int]:
    east, dr = lab.bootstrap("east"), lab.bootstrap("dr")
    counts = {"tail_batches": 0, "common_records": 0, "keys": 0}
    for p in range(PARTITIONS[COMPACTED]):
        checkpoint, source, copies = wait_for(functools.partial(compacted_tail, lab, p), 60, "cleaners quiet")
        assert source, f"east {COMPACTED}-{p}: no batch above the cleaner checkpoints {checkpoint}"
        for node, copy in copies.items():
            assert sorted(copy) == sorted(source), \
                (f"dr node {node} {COMPACTED}-{p} above the cleaner checkpoints ({checkpoint}): batches at "
                 f"{sorted(set(copy) ^ set(source))[:8]} are on one side only")
            different = [b for b in source if copy[b] != source[b]]
            assert not different, f"dr node {node} {COMPACTED}-{p}: batches at {different[:5]} differ from the source's"
            counts["tail_batches"] += len(copy)
        print(f"{COMPACTED}-{p}: {len(source)} batches above the highest cleaner checkpoint {checkpoint} "
              f"equal on every dr replica", flush=True)
    uncommitted = {side: read_topic(b, COMPACTED) for side, b in (("east", east), ("dr", dr))}
    committed = {side: read_topic(b, COMPACTED, isolation="read_committed") for side, b in (("east", east), ("dr", dr))}
    for p in range(PARTITIONS[COMPACTED]):
        src = {r.offset: r for r in uncommitted["east"][p]}
        dst = {r.offset: r for r in uncommitted["dr"][p]}
        common = set(src) & set(dst)
        differ = [o for o in sorted(common) if src[o] != dst[o]]
        assert not differ, f"{COMPACTED}-{p}: records at {differ[:5]} differ: {[(src[o], dst[o]) for o in differ[:2]]}"
        counts["common_records"] += len(common)
        want: dict[bytes | None, tuple[int, bytes | None]] = {}
        for offset, (key, value) in sorted(written.committed.get((COMPACTED, p), {}).items()):
            want[key] = (offset, value)
        for side in ("east", "dr"):
            got = latest_per_key(committed[side][p])
            assert got == want, (f"{side} {COMPACTED}-{p}: the latest committed record per key differs from the "
                                 f"acknowledged one for keys {[k for k in set(got) | set(want) if got.get(k) != want.get(k)][:5]}")
        counts["keys"] += len(want)
    check_committed(committed, written, COMPACTED, {p: 0 for p in range(PARTITIONS[COMPACTED])}, every=False)
    return counts


def check_committed(committed: dict[str, dict[int, list[Rec]]], written: Written, topic: str,
                    log_starts: dict[int, int], *, every: bool) -> None:
    """read_committed on both sides: no record of an aborted transaction; with `every`, every
    committed record at or above the log start at its acknowledged offset."""
    for side, parts in committed.items():
        for p, rows in parts.items():
            aborted = written.aborted.get((topic, p), {})
            leaked = [r for r in rows if r.offset in aborted or (r.value or b"").find(b"-aborted-") >= 0]
            assert not leaked, f"{side} {topic}-{p}: read_committed returns aborted records, e.g. {leaked[:3]}"
            if not every:
                continue
            have = {r.offset: (r.key, r.value) for r in rows}
            want = {o: kv for o, kv in written.committed.get((topic, p), {}).items() if o >= log_starts[p]}
            missing = [o for o, kv in sorted(want.items()) if have.get(o) != kv]
            assert not missing, f"{side} {topic}-{p}: committed records missing or different at {missing[:5]}"


# --------------------------------------------------------------------------- the test


def test_mirror_topics_byte_for_byte_through_leader_kills_retention_and_compaction(
        mirror_lab: Callable[..., MirrorLab]) -> None:
    rng: random.Random = fault_rng("mirror topics through faults")
    lab = mirror_lab({"east": 3, "dr": 3}, cluster_config=CLUSTER_CONFIG, min_insync_replicas=2)
    east, dr = lab.bootstrap("east"), lab.bootstrap("dr")
    for topic, count in PARTITIONS.items():
        new_topic(east, topic, count, RF, config=TOPIC_CONFIGS[topic])
        wait_fully_replicated(lab["east"], topic, count, RF)
    writers = [Writer(east, "orders", [ORDERS], 1500).start(),
               Writer(east, "compacted", [COMPACTED], 500).start(),
               Writer(east, "txa", [ORDERS, COMPACTED], 150, transactional=True, per_txn=30, abort_every=3).start(),
               Writer(east, "txb", [COMPACTED, ORDERS], 100, transactional=True, per_txn=20, abort_every=2).start()]
    try:
        wait_for(lambda: total(ends_of(east)) >= 4000, 120, "the producers under way", interval_s=0.5)
        lab.write_topology([Flow("east", "dr", f"{ORDERS}|{COMPACTED}", rename="{topic}", mirror_topics=True,
                                 config={"topic.refresh.ms": "1000"})], replication_factor=RF)
        lab.start_worker(FLOW, 0)
        copy_advances(lab, 3000, "the copy under way")

        lab.kill_worker(FLOW, 0)
        lab.workers[FLOW, 0].wait(30)
        lab.start_worker(FLOW, 0)
        copy_advances(lab, 3000, "after the worker's kill -9")

        source_partition = rng.randrange(PARTITIONS[ORDERS])
        kill_leader(lab, "east", ORDERS, source_partition)
        copy_advances(lab, 3000, "after the source leader's kill -9")

        target_topic = rng.choice(sorted(PARTITIONS))
        kill_leader(lab, "dr", target_topic, rng.randrange(PARTITIONS[target_topic]))
        copy_advances(lab, 3000, "after the target leader's kill -9")

        # Retention and compaction happened on the source while it was copied.
        wait_for(lambda: all(s > 0 for s in low_watermarks(east, ORDERS, PARTITIONS[ORDERS]).values()), 120,
                 f"retention moving every {ORDERS} partition's log start on east", interval_s=1.0)
        wait_for(lambda: cleaned_partitions(lab, "east") == set(range(PARTITIONS[COMPACTED])), 120,
                 f"east's cleaners compacting every {COMPACTED} partition", interval_s=1.0)
    finally:
        results = [w.finish() for w in writers]
    written = Written()
    for r in results:
        for kind in ("committed", "aborted"):
            for tp, rows in getattr(r, kind).items():
                getattr(written, kind).setdefault(tp, {}).update(rows)
    print("transactions: " + ", ".join(f"{w.name} {w.transactions}" for w in writers if w.transactional), flush=True)
    assert all(w.transactions["committed"] and w.transactions["aborted"] for w in writers if w.transactional)

    source_ends = ends_of(east)
    wait_for(lambda: ends_of(dr) == source_ends, 240, f"dr at the source's ends {source_ends}",
             interval_s=1.0, on_timeout=lab.mirror_log_tail)
    for topic, count in PARTITIONS.items():
        wait_fully_replicated(lab["dr"], topic, count, RF)

    # The log starts: east's settle (retention runs every second), dr's follow.
    previous: list[dict[int, int]] = []

    def settled() -> dict[int, int]:
        now = low_watermarks(east, ORDERS, PARTITIONS[ORDERS])
        previous.append(now)
        return now if len(previous) >= 4 and all(x == now for x in previous[-4:]) else {}

    log_starts = wait_for(settled, 60, f"east's {ORDERS} log starts unchanged for 3 s", interval_s=1.0)
    # dr's log start follows east's: with the next copied batch, or on an idle partition with
    # an append that carries only the start (test_an_idle_mirror_follows_its_source_log_start).
    dr_starts = wait_for(lambda: (got := low_watermarks(dr, ORDERS, PARTITIONS[ORDERS])) == log_starts and got, 30,
                         f"dr's log starts at east's {log_starts}", interval_s=0.5)
    print(f"{ORDERS} log starts: east {log_starts}, dr {dr_starts}", flush=True)

    def replicas_at_ends() -> bool:
        for broker in lab["dr"].brokers.values():
            for topic, ends in source_ends.items():
                for p, end in ends.items():
                    batches = disk_batches(broker.data_dir, topic, p)
                    if not batches or last_offset(batches[max(batches)]) + 1 < end:
                        raise NotYet(f"dr node {broker.node_id} {topic}-{p}: not at {end}")
        return True

    wait_for(replicas_at_ends, 60, "every dr replica at the source's ends", interval_s=0.5)
    compared = assert_same_batches_from_log_start(lab, log_starts)
    print(f"{ORDERS}: {compared} batches equal on 3 dr replicas from the log starts {log_starts}; "
          f"ends {source_ends}", flush=True)
    for isolation in ("read_committed", "read_uncommitted"):
        source, copy = ({p: [r for r in rows if r.offset >= log_starts[p]]
                         for p, rows in read_topic(b, ORDERS, isolation=isolation).items()} for b in (east, dr))
        assert copy == source, f"{ORDERS} {isolation}: the copy answers differently"
        if isolation == "read_committed":
            check_committed({"east": source, "dr": copy}, written, ORDERS, log_starts, every=True)

    counts = check_compacted(lab, written)
    print(f"{COMPACTED}: {counts}", flush=True)
    assert counts["tail_batches"] > 0 and counts["keys"] > 0
    status = lab.worker_status(FLOW)
    print(f"worker: {[(s.get('claims'), s.get('data_loss_records')) for s in status.values()]}", flush=True)


def test_an_idle_mirror_follows_its_source_log_start(mirror_lab: Callable[..., MirrorLab]) -> None:
    """Retention or DeleteRecords on a source partition that takes no more writes: its mirror's
    log start follows (a follower's does, from its leader's fetch answers), so a consumer of the
    copy does not read records the source no longer holds."""
    lab = mirror_lab({"east": 1, "dr": 1})
    east, dr = lab.bootstrap("east"), lab.bootstrap("dr")
    new_topic(east, "idle", 1)
    p = Producer({"bootstrap.servers": east, "enable.idempotence": True, "linger.ms": 5, "log_level": 2})
    for i in range(1000):
        p.produce("idle", value=f"v{i}".encode(), partition=0)
    assert p.flush(60) == 0
    lab.write_topology([Flow("east", "dr", "idle", rename="{topic}", mirror_topics=True,
                             config={"topic.refresh.ms": "1000"})], replication_factor=1)
    lab.start_worker(FLOW, 0)
    wait_for(lambda: end_offsets(dr, "idle") == {0: 1000}, 60, "the copy at the source's end",
             interval_s=0.5, on_timeout=lab.mirror_log_tail)
    client = admin(east)  # referenced until answered: a collected client cancels its requests
    for future in client.delete_records([TopicPartition("idle", 0, 600)]).values():
        future.result(timeout=30)
    assert low_watermarks(east, "idle", 1) == {0: 600}
    wait_for(lambda: low_watermarks(dr, "idle", 1) == {0: 600}, 30, "dr's log start at east's 600", interval_s=0.5)
