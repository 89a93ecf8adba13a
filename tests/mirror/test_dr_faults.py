"""A datacenter-level disaster-recovery fault test (issue 40) on real processes.

Two 1-broker clusters, east (the primary) and dr, one mirror-topics flow east-to-dr (rename
"{topic}", `mirror_groups` naming the application's group), its worker kept running under
`dcmirror mirror` (the supervisor restarts it when it dies), as the README's runbook says.
east's broker has a second listener, WAN, whose advertised address is a cuttable TCP link
(tests/mirror/link.py); the combined topology file gives dcmirror's clients east's WAN
listener (`client_listener`), so the worker and the DR commands reach east through the link
only, while the application's producers and consumer use east's own listener.

Traffic runs on whichever cluster is the primary at the time: an idempotent acks=all
producer, a transactional producer (transactions of 2-4 records over several partitions,
committed, every fifth aborted on purpose, and, by the seed, one left open when the
datacenter dies), and the consumer group `app` reading read_committed and committing. Every
acknowledgement is kept: a delivery report for the idempotent producer, the return of
commit_transaction() for a transaction's records.

Per cycle (the schedule from fault_rng, printed): traffic in east; at a random point the
link is cut (refused or blackholed) while east goes on acknowledging; a few seconds later
east's brokers are killed -9 (the whole datacenter); the runbook, verbatim, through the CLI:
`mirror failover`; producers and group move to dr and write there; east comes back and the
link heals; `mirror failback`; until `topology plan` shows `reverse` and east is copied back;
`mirror promote`; traffic back to east. The worker is also killed -9 at a random point of
some cycles.

The checks (collected, then asserted together; the summary prints what each found):
1. every acknowledged record (either side, any phase) is at the end in the final primary's
   topic read_committed exactly once or in dr's side topic dcmirror.diverged.east.orders
   exactly once: never lost, never twice;
2. no record of an aborted transaction, or of one left open when a datacenter died, is ever
   visible read_committed (topic or side topic); a transaction whose commit was
   acknowledged is visible whole; no transaction is visible in part;
3. the failover's RPO, per partition: the lower bound it reports (rpo_records_at_least)
   never exceeds the truth (east's highest acknowledged offset + 1 at its death minus the
   copy's end), rpo_exact is false and source_reachable false (east is gone), what the
   workers knew of east (source_known_end) is no further than east's end at the cut and
   dated no later than the cut (source_known_at_ms, source_known_age_s);
4. the failback's diverged_records sum (and per partition) equals the records it added to
   the side topic;
5. at the end east's and dr's topic hold the same records at the same offsets, and the copy
   side refuses producers (TOPIC_EXCEPTION, read-only) after a failback and a promotion;
6. the group's committed offsets never exceed the log end of their cluster's partition, and
   after each move the group resumes where it committed: no record skipped.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from tests.fault_workload import fault_rng
from tests.harness import REPO, free_port
from tests.mirror.lab import (
    MirrorLab,
    Rec,
    new_topic,
    read_topic,
    topic_config,
    topics_of,
    wait_for,
)
from tests.mirror.lab import (
    log_ends as lab_log_ends,
)
from tests.mirror.link import Link
from tests.mirror.test_mirror_topic_sync import SyncFlow

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(240)]

FLOW = "east-to-dr"
TOPIC = "orders"
SIDE_TOPIC = f"dcmirror.diverged.east.{TOPIC}"
PARTITIONS = 3
GROUP = "app"
TXN_ID = "orders-txn"  # the application's transactional.id, the same in either datacenter
CYCLES = 2
BROKERS = 1  # per cluster
IDEMPOTENT_RATE = 400  # records/s
WAN_PROTOCOLS = "PLAINTEXT:PLAINTEXT,WAN:PLAINTEXT"
DR_WAIT_S = 120  # --wait of the DR commands
SEEN_SLACK_MS = 500  # a fetch answer read before the cut may be dated when the worker handles it


_T0 = [time.monotonic()]  # when the test started


def say(text: str) -> None:
    """A line of the test's story, with the seconds since it started."""
    print(f"[{time.monotonic() - _T0[0]:6.1f} s] {text}", flush=True)


# --------------------------------------------------------------------------- what was sent


@dataclass
class Sent:
    value: bytes
    kind: str  # "idempotent", "txn" or "probe"
    cluster: str
    phase: str
    txn: str | None = None
    acked: bool = False  # idempotent: delivered; txn: its commit returned
    at: tuple[int, int] | None = None  # (partition, offset) of the delivery report


@dataclass
class Txn:
    name: str
    cluster: str
    phase: str
    values: list[bytes] = field(default_factory=list)
    state: str = "open"  # open, committed, aborted, open at death, unknown


class Ledger:
    """Every record the test's clients sent and what became of it (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent: dict[bytes, Sent] = {}
        self.txns: dict[str, Txn] = {}

    def add(self, s: Sent) -> None:
        with self.lock:
            assert s.value not in self.sent, s.value
            self.sent[s.value] = s
            if s.txn is not None:
                self.txns[s.txn].values.append(s.value)

    def delivered(self, value: bytes, partition: int, offset: int, *, ack: bool) -> None:
        with self.lock:
            s = self.sent[value]
            s.at = (partition, offset)
            s.acked = s.acked or ack

    def new_txn(self, name: str, cluster: str, phase: str) -> Txn:
        with self.lock:
            self.txns[name] = t = Txn(name, cluster, phase)
            return t

    def settle(self, txn: Txn, state: str) -> None:
        with self.lock:
            txn.state = state
            if state == "committed":
                for v in txn.values:
                    self.sent[v].acked = True

    def acked(self) -> list[Sent]:
        with self.lock:
            return [s for s in self.sent.values() if s.acked]

    def acked_end(self, cluster: str, phase: str) -> dict[int, int]:
        """Per partition: the highest acknowledged offset + 1 of the phase's records in `cluster`."""
        out = {p: 0 for p in range(PARTITIONS)}
        with self.lock:
            for s in self.sent.values():
                if s.acked and s.cluster == cluster and s.phase == phase and s.at is not None:
                    out[s.at[0]] = max(out[s.at[0]], s.at[1] + 1)
        return out


# --------------------------------------------------------------------------- the application


def _producer_config(bootstrap: str, **more: Any) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
            "message.timeout.ms": 30_000, "request.timeout.ms": 10_000,
            "socket.connection.setup.timeout.ms": 3000, "reconnect.backoff.max.ms": 500,
            "topic.metadata.refresh.interval.ms": 1000, "log_level": 0, **more}


class IdempotentWriter:
    """An idempotent acks=all producer writing `<phase>-i-<n>` (key k<n>, partition n % 3)
    at IDEMPOTENT_RATE from a thread."""

    def __init__(self, ledger: Ledger, cluster: str, bootstrap: str, phase: str) -> None:
        self.ledger, self.cluster, self.phase = ledger, cluster, phase
        self.producer = Producer(_producer_config(bootstrap))
        self.acks = 0
        self.errors: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"idempotent-{phase}", daemon=True)
        self._thread.start()

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.errors[err.name()] += 1
            return
        self.ledger.delivered(msg.value(), msg.partition(), msg.offset(), ack=True)
        self.acks += 1

    def _run(self) -> None:
        start, n = time.monotonic(), 0
        while not self._stop.is_set():
            while n < (time.monotonic() - start) * IDEMPOTENT_RATE and not self._stop.is_set():
                value = f"{self.phase}-i-{n}".encode()
                self.ledger.add(Sent(value, "idempotent", self.cluster, self.phase))
                while True:
                    try:
                        self.producer.produce(TOPIC, value=value, key=f"k{n}".encode(), partition=n % PARTITIONS,
                                              on_delivery=self._delivered)
                        break
                    except BufferError:
                        self.producer.poll(0.05)
                n += 1
            self.producer.poll(0.01)

    def stop(self) -> str:
        """Stop writing; what went wrong ("": every record sent was acknowledged; the cluster is up)."""
        self._stop.set()
        self._thread.join(30)
        left = self.producer.flush(60)
        return f"{left} unacknowledged, errors {dict(self.errors)}" if left or self.errors else ""

    def abandon(self) -> None:
        """The cluster died: what is not acknowledged by now never will be."""
        self._stop.set()
        self._thread.join(30)
        self.producer.purge()
        self.producer.flush(5)
        del self.producer
        gc.collect()


class TxnWriter:
    """A transactional producer (TXN_ID) in a thread: transactions `<phase>-t<n>` of 2-4
    records over several partitions, each written (every record in the log) 50 ms before it
    is committed, so that most of the time one is open in the log; every fifth aborted on
    purpose. `hold()`: the next transaction is written and left open."""

    def __init__(self, ledger: Ledger, cluster: str, bootstrap: str, phase: str) -> None:
        self.ledger, self.cluster, self.phase = ledger, cluster, phase
        self.producer: Producer | None = Producer(_producer_config(
            bootstrap, **{"transactional.id": TXN_ID, "transaction.timeout.ms": 30_000}))
        self.producer.init_transactions(60)
        self.committed = 0
        self.error: str | None = None
        self.held: Txn | None = None
        self._hold = threading.Event()
        self.holding = threading.Event()
        self._stop = threading.Event()
        self._current: Txn | None = None
        self._thread = threading.Thread(target=self._run, name=f"txn-{phase}", daemon=True)
        self._thread.start()

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        if err is None:
            self.ledger.delivered(msg.value(), msg.partition(), msg.offset(), ack=False)

    def _write(self, producer: Producer, txn: Txn, n: int, count: int) -> None:
        producer.begin_transaction()
        for j in range(count):
            value = f"{txn.name}-{j}".encode()
            self.ledger.add(Sent(value, "txn", self.cluster, self.phase, txn=txn.name))
            producer.produce(TOPIC, value=value, key=f"t{n}-{j}".encode(), partition=(n + j) % PARTITIONS,
                             on_delivery=self._delivered)

    def _run(self) -> None:
        producer = self.producer
        assert producer is not None
        n = 0
        while not self._stop.is_set():
            n += 1
            txn = self._current = self.ledger.new_txn(f"{self.phase}-t{n}", self.cluster, self.phase)
            count = 2 + n % 3
            try:
                if self._hold.is_set():
                    self._write(producer, txn, n, count)
                    producer.flush(30)
                    self.held = txn
                    self.holding.set()
                    self._stop.wait()
                    return
                self._write(producer, txn, n, count)
                producer.flush(8)  # every record in the log (and soon in the copy) before it ends
                time.sleep(0.05)
                if n % 5 == 0:
                    producer.abort_transaction(10)
                    self.ledger.settle(txn, "aborted")
                else:
                    self._commit(producer, txn)
            except KafkaException as exc:
                err = exc.args[0]
                if self._stop.is_set():
                    return  # the datacenter died under it: its outcome is unknown
                if err.txn_requires_abort():
                    try:
                        producer.abort_transaction(10)
                        self.ledger.settle(txn, "aborted")
                        continue
                    except KafkaException as again:
                        err = again.args[0]
                self.error = f"{txn.name}: {err}"
                self.ledger.settle(txn, "unknown")
                return
            self._current = None
            time.sleep(0.01)

    def _commit(self, producer: Producer, txn: Txn) -> None:
        while True:
            try:
                producer.commit_transaction(8)
                self.ledger.settle(txn, "committed")
                self.committed += 1
                return
            except KafkaException as exc:
                if not exc.args[0].retriable() or self._stop.is_set():
                    raise

    def hold(self) -> None:
        self._hold.set()

    def stop(self) -> str:
        """Stop after the transaction under way, nothing left open (the cluster is up); what
        went wrong ("": nothing)."""
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive(), f"{self.phase}: the transactional producer did not stop"
        self._close()
        return self.error or ""

    def abandon(self) -> None:
        """The cluster died: a held transaction stays open for good, the one under way has an
        unknown outcome; the producer is gone before the cluster comes back."""
        self._stop.set()
        if self.held is not None:
            self.ledger.settle(self.held, "open at death")

    def join_abandoned(self) -> None:
        self._thread.join(30)
        assert not self._thread.is_alive(), f"{self.phase}: the transactional producer is stuck"
        if self._current is not None and self._current.state == "open" and self._current is not self.held:
            self.ledger.settle(self._current, "unknown")
        self._close()

    def _close(self) -> None:
        self.producer = None
        gc.collect()


def log_ends(bootstrap: str) -> dict[int, int]:
    """TOPIC's log end offset (high watermark) per partition, open transactions included."""
    return lab_log_ends(bootstrap, TOPIC)


def committed_offsets(bootstrap: str) -> dict[int, int]:
    """GROUP's committed offsets of TOPIC (-1001: none)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "log_level": 0})
    try:
        return {tp.partition: tp.offset for tp in c.committed(
            [TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=10)}
    finally:
        c.close()


class GroupMember:
    """The application's consumer: a member of GROUP reading TOPIC read_committed from its
    committed offsets, committing every 0.3 s; what it read, in order."""

    def __init__(self, cluster: str, bootstrap: str, phase: str) -> None:
        self.cluster, self.phase = cluster, phase
        self.start_offsets = committed_offsets(bootstrap)
        self.read: list[tuple[int, int, bytes]] = []  # (partition, offset, value)
        self.first: dict[int, int] = {}
        self.error: str | None = None
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP,
                                  "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                                  "enable.auto.commit": False, "session.timeout.ms": 6000,
                                  "heartbeat.interval.ms": 1000, "log_level": 0})
        self._stop = threading.Event()
        self._dead = False
        self._thread = threading.Thread(target=self._run, name=f"group-{phase}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.consumer.subscribe([TOPIC])
        last_commit = time.monotonic()
        while not self._stop.is_set():
            msg = self.consumer.poll(0.2)
            if msg is not None:
                err = msg.error()
                if err is not None:
                    # A connection that broke is librdkafka's news only; anything else (an
                    # offset reset among them) is the application's problem.
                    if not self._dead and err.code() not in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN):
                        self.error = str(err)
                else:
                    partition, offset, value = msg.partition(), msg.offset(), msg.value()
                    assert partition is not None and offset is not None and value is not None
                    self.read.append((partition, offset, value))
                    self.first.setdefault(partition, offset)
            if time.monotonic() - last_commit > 0.3 and not self._dead:
                try:
                    self.consumer.commit(asynchronous=False)
                except KafkaException as exc:
                    if exc.args[0].code() != KafkaError._NO_OFFSET:
                        self.error = str(exc)
                last_commit = time.monotonic()
        if not self._dead:
            try:
                self.consumer.commit(asynchronous=False)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError._NO_OFFSET:
                    self.error = str(exc)
        self.consumer.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive(), f"{self.phase}: the group member did not leave"

    def abandon(self) -> None:
        """The cluster died: no more commits; the member closes in the background."""
        self._dead = True
        self._stop.set()

    def join_abandoned(self) -> None:
        """Its cluster is back: the close finishes (no client is left to the interpreter's exit)."""
        self._thread.join(60)
        if self._thread.is_alive():
            say(f"NOTE: [{self.phase}] the abandoned group member has not closed after 60 s")


class Traffic:
    """The application on one cluster: both producers and the group member."""

    def __init__(self, ledger: Ledger, cluster: str, bootstrap: str, phase: str) -> None:
        self.cluster, self.phase = cluster, phase
        self.member = GroupMember(cluster, bootstrap, phase)
        self.idempotent = IdempotentWriter(ledger, cluster, bootstrap, phase)
        self.txn = TxnWriter(ledger, cluster, bootstrap, phase)
        say(f"[{phase}] traffic in {cluster}; the group starts at {self.member.start_offsets}")

    def wait_acks(self, more: int, what: str) -> None:
        target = self.idempotent.acks + more
        wait_for(lambda: self.idempotent.acks >= target, 60,
                 f"[{self.phase}] {what}: {more} more acknowledgements in {self.cluster} "
                 f"(errors {dict(self.idempotent.errors)})", interval_s=0.05)

    def stop(self, findings: Findings) -> None:
        """Stop the application (its cluster is up): every write acknowledged, no error."""
        for who, error in (("idempotent producer", self.idempotent.stop()), ("transactional producer", self.txn.stop())):
            findings.check(not error, f"[{self.phase}] the {who} in {self.cluster}: {error}")
        self.member.stop()
        findings.check(self.member.error is None, f"[{self.phase}] the group member in {self.cluster}: "
                                                  f"{self.member.error}")


# --------------------------------------------------------------------------- the lab


def _start_lab(root: Path) -> tuple[MirrorLab, Link]:
    """east and dr; east's brokers with a WAN listener advertised as the link in front of it."""
    lab = MirrorLab(root, {"east": BROKERS, "dr": BROKERS},
                    cluster_config={"east": {"listener.security.protocol.map": WAN_PROTOCOLS}})
    east = lab["east"]
    wan = {i: free_port() for i in east.brokers}
    link_ports = {i: free_port() for i in east.brokers}
    with open(east.topology_path, "a") as f:  # the cluster's table is the last of its file
        f.write("listeners = { WAN = [" + ", ".join(f'"127.0.0.1:{wan[i]}"' for i in east.brokers) + "] }\n")
    for i, broker in east.brokers.items():  # a client that came in over WAN is sent back through the link
        broker.overrides["advertised.listeners"] = f"WAN://127.0.0.1:{link_ports[i]}"
    link = Link({link_ports[i]: f"127.0.0.1:{wan[i]}" for i in east.brokers}, free_port(),
                log_path=root / "link.log")
    try:
        lab.start()
    except BaseException:
        link.stop()
        lab.teardown()
        raise
    return lab, link


def _write_topology(lab: MirrorLab, link: Link) -> None:
    """The flow; dcmirror's clients (worker, DR commands, plan) reach east over WAN: the link
    (its listen ports in the order of east's brokers)."""
    path = lab.write_topology([SyncFlow("east", "dr", TOPIC, rename="{topic}", mirror_topics=True, mirror_groups=GROUP,
                                        config={"topic.refresh.ms": "1000", "group.offset.sync.ms": "1000"})],
                              replication_factor=BROKERS)
    text = path.read_text()
    header = "[clusters.east]\n"
    assert text.count(header) == 1, text
    lines = ["listeners = { WAN = [" + ", ".join(f'"127.0.0.1:{port}"' for port in link.ports) + "] }",
             'client_listener = "WAN"', f'config = {{ "listener.security.protocol.map" = "{WAN_PROTOCOLS}" }}']
    path.write_text(text.replace(header, header + "\n".join(lines) + "\n"))
    check = subprocess.run([sys.executable, "-m", "deploy.cli", "topology", "check", str(path)], cwd=REPO,
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, f"topology check failed:\n{check.stdout}\n{check.stderr}"


# --------------------------------------------------------------------------- commands and reads


class Findings:
    """The checks' failures, kept until the end (one run says everything it found)."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def check(self, ok: bool, what: str) -> bool:
        if not ok:
            self.items.append(what)
            say(f"FINDING: {what}")
        return ok


def dr_command(lab: MirrorLab, action: str) -> dict[str, Any]:
    """`dcmirror mirror ACTION --config F --flow NAME --json --wait 120`, as the runbook runs it."""
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "deploy.cli", "mirror", action, "--config", str(lab.topology_path),
                           "--flow", FLOW, "--json", "--wait", str(DR_WAIT_S)], cwd=REPO, capture_output=True,
                          text=True, timeout=DR_WAIT_S * 3)
    took = time.monotonic() - started
    assert proc.returncode == 0, f"mirror {action}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}\n" \
                                 f"{lab.mirror_log_tail()}"
    doc: dict[str, Any] = json.loads(proc.stdout)
    say(f"mirror {action} ({took:.1f} s): {json.dumps(doc)}")
    return doc


_PLAN_FORMS: list[list[str]] = []


def directions(lab: MirrorLab, findings: Findings) -> dict[str, str]:
    """`topology plan --config F --json` (the runbook's form; today's CLI takes the file as an
    argument only, which is then used): per flow topic of dr, its direction."""
    forms = _PLAN_FORMS or [["--config", str(lab.topology_path)], [str(lab.topology_path)]]
    for form in forms:
        proc = subprocess.run([sys.executable, "-m", "deploy.cli", "topology", "plan", *form, "--json",
                               "--timeout", "5"], cwd=REPO, capture_output=True, text=True, timeout=120)
        try:
            doc = json.loads(proc.stdout)
        except ValueError:
            if form[0] == "--config" and "usage:" in proc.stderr:
                findings.check(False, f"`topology plan --config F --json` refused: {proc.stderr.strip()[-200:]}")
                continue
            raise AssertionError(f"topology plan: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}") from None
        if not _PLAN_FORMS:
            _PLAN_FORMS.append(form)
        return {r["target_topic"]: r["direction"] for r in doc["mirror_topics"] if r.get("target_topic")}
    raise AssertionError("topology plan: no form of the command answered")


def refused(bootstrap: str, ledger: Ledger, cluster: str, phase: str) -> str:
    """A plain producer's write into TOPIC: the error's name ("" if it was taken)."""
    value = f"{phase}-probe-{cluster}".encode()
    ledger.add(Sent(value, "probe", cluster, phase))
    errors: list[Any] = []
    p = Producer({"bootstrap.servers": bootstrap, "log_level": 0, "message.send.max.retries": 0,
                  "message.timeout.ms": 20_000})
    p.produce(TOPIC, value, partition=0, on_delivery=lambda err, _m: errors.append(err))
    p.flush(30)
    if errors and errors[0] is None:
        return ""
    return errors[0].name() if errors else "no answer"


def visible(bootstrap: str, topic: str, isolation: str = "read_committed") -> dict[int, list[Rec]]:
    return read_topic(bootstrap, topic, timeout_s=60, isolation=isolation)


def count_records(bootstrap: str, topic: str) -> dict[int, int]:
    if topic not in topics_of(bootstrap):
        return {}
    return {p: len(rows) for p, rows in visible(bootstrap, topic, "read_uncommitted").items()}


def kill_worker(lab: MirrorLab, label: str) -> None:
    pid = wait_for(lambda: lab.worker_pids(FLOW).get(0), 60, "a running worker", on_timeout=lab.mirror_log_tail)
    lab.kill_worker(FLOW, 0)
    say(f"{label}: kill -9 worker {FLOW}-w0 (pid {pid})")
    wait_for(lambda: lab.worker_pids(FLOW).get(0) not in (None, pid), 60, "the supervisor restarts the worker",
             on_timeout=lab.mirror_log_tail)


def check_group(findings: Findings, lab: MirrorLab, cluster: str, when: str) -> None:
    """6: the group's committed offsets within the cluster's log."""
    bootstrap = lab.bootstrap(cluster)
    ends = log_ends(bootstrap)
    committed = committed_offsets(bootstrap)
    beyond = {p: (o, ends[p]) for p, o in committed.items() if o > ends[p]}
    findings.check(not beyond, f"{when}: group {GROUP}'s committed offsets in {cluster} beyond the log end "
                               f"(committed, end): {beyond}")


@dataclass
class CyclePlan:
    cut_after: int  # idempotent acknowledgements in east before the link is cut
    die_after: int  # ... after the cut, before the datacenter dies
    cut_mode: str  # refuse | blackhole
    open_txn: str  # none | before cut | after cut
    worker_kill: str  # none | before cut | after cut | after failover | during copy back


def draw(rng: Any) -> CyclePlan:
    return CyclePlan(rng.randint(300, 1500), rng.randint(250, 1200), rng.choice(["refuse", "blackhole"]),
                     rng.choice(["none", "before cut", "after cut", "after cut"]),
                     rng.choice(["none", "none", "before cut", "after cut", "after failover", "during copy back"]))


# --------------------------------------------------------------------------- the test


@pytest.fixture
def dr_lab(tmp_path: Path) -> Iterator[tuple[MirrorLab, Link]]:
    lab, link = _start_lab(tmp_path / "lab")
    try:
        yield lab, link
    finally:
        link.stop()
        lab.teardown()


class Run:
    """One run of the schedule: the lab, the application's traffic, what the checks found."""

    def __init__(self, lab: MirrorLab, link: Link, rng: Any) -> None:
        self.lab, self.link, self.rng = lab, link, rng
        self.findings = Findings()
        self.ledger = Ledger()
        self.members: list[GroupMember] = []
        self.rpo_rows: list[str] = []
        self.east = lab.bootstrap("east")  # the application's way in: east's own listener
        self.dr = lab.bootstrap("dr")
        self.traffic: Traffic | None = None
        self.abandoned: Traffic | None = None  # the application in the datacenter that died
        self.started = time.monotonic()

    def move_traffic(self, cluster: str, phase: str) -> Traffic:
        self.traffic = Traffic(self.ledger, cluster, self.east if cluster == "east" else self.dr, phase)
        self.members.append(self.traffic.member)
        return self.traffic

    def dr_ends(self) -> dict[int, int]:
        return log_ends(self.dr)

    # ---- one cycle ----------------------------------------------------------------------

    def east_dies(self, c: int, plan: CyclePlan) -> tuple[dict[int, int], dict[int, int], dict[int, int], float]:
        """Traffic in east; the link is cut, east goes on acknowledging; every east broker is
        killed -9. (east's highest acknowledged offset + 1, the copy's ends, east's ends at
        the cut, the cut's time)."""
        traffic = self.traffic
        assert traffic is not None and traffic.cluster == "east"
        traffic.wait_acks(plan.cut_after, "before the cut")
        if plan.worker_kill == "before cut":
            kill_worker(self.lab, f"cycle {c}")
        if plan.open_txn == "before cut":
            held = self.hold_transaction(traffic)
            want = {p: o + 1 for p, o in (self.ledger.sent[v].at or (0, -1) for v in held.values)}
            try:  # the open transaction copied (not required: the cut may come first)
                wait_for(lambda: all(self.dr_ends()[p] >= o for p, o in want.items()), 10,
                         "the open transaction copied into dr", interval_s=0.2)
            except AssertionError as exc:
                say(f"cycle {c}: {exc}")
        say(f"cycle {c}: {self.link.cut(plan.cut_mode)}")
        cut_ms = time.time() * 1000
        at_cut = log_ends(self.east)
        say(f"cycle {c}: link cut ({plan.cut_mode}); east's ends {at_cut}")
        if plan.open_txn == "after cut":
            self.hold_transaction(traffic)
        if plan.worker_kill == "after cut":
            kill_worker(self.lab, f"cycle {c}")
        traffic.wait_acks(plan.die_after, "after the cut")
        for broker in self.lab["east"].brokers.values():
            broker.kill9()
        traffic.idempotent.abandon()
        traffic.txn.abandon()
        traffic.member.abandon()
        acked_end = self.ledger.acked_end("east", traffic.phase)
        copy_ends = self.dr_ends()
        say(f"cycle {c}: east killed -9; its highest acknowledged offset + 1 {acked_end}, dr's copy ends "
            f"{copy_ends}; transaction left open: {traffic.txn.held.name if traffic.txn.held else None}")
        # The harness: the worker reaches east through the link only.
        assert all(copy_ends[p] <= at_cut[p] for p in copy_ends), \
            f"dr copied beyond east's ends at the cut {at_cut}: {copy_ends}; the link is not the only way"
        known = {p["partition"]: p["high_watermark"] for w in self.lab.worker_status(FLOW).values()
                 for p in w.get("source_known_ends") or []}
        say(f"cycle {c}: the worker's status knew east's ends {known}")
        return acked_end, copy_ends, at_cut, cut_ms

    def hold_transaction(self, traffic: Traffic) -> Txn:
        traffic.txn.hold()
        wait_for(traffic.txn.holding.is_set, 30, "a transaction written and left open")
        assert traffic.txn.held is not None
        return traffic.txn.held

    def failover(self, c: int, plan: CyclePlan, acked_end: dict[int, int], copy_ends: dict[int, int],
                 at_cut: dict[int, int], cut_ms: float) -> dict[int, dict[str, Any]]:
        """`mirror failover`; checks 3 (RPO); the application moves to dr."""
        check = self.findings.check
        at_ms = time.time() * 1000
        report = dr_command(self.lab, "failover")
        check(report.get("primary") == "dr", f"cycle {c}: failover's primary {report.get('primary')!r}")
        parts = {p["partition"]: p for p in report["topics"].get(TOPIC, [])}
        ends = {p: r["end_offset"] for p, r in parts.items()}
        # The copy's end as the failover read it: what was copied when east died or later
        # (an append fetched before the cut may land after), never beyond the cut.
        check(set(ends) == set(copy_ends) and all(copy_ends[p] <= ends[p] for p in copy_ends),
              f"cycle {c}: failover's copy ends {ends}, dr's ends before it {copy_ends}")
        truth = {p: max(0, acked_end[p] - ends.get(p, copy_ends[p])) for p in range(PARTITIONS)}
        _check_rpo(self.findings, c, report, parts, truth, at_cut, cut_ms, at_ms, self.rpo_rows)
        check("mirror.source" not in topic_config(self.dr, TOPIC), f"cycle {c}: dr's topic still a mirror")
        check_group(self.findings, self.lab, "dr", f"cycle {c} after the failover")
        self.abandoned = self.traffic
        traffic = self.move_traffic("dr", f"c{c}-dr")
        traffic.wait_acks(self.rng.randint(300, 800), "in dr")
        wait_for(lambda: traffic.txn.committed >= 2, 30, "two transactions committed in dr",
                 on_timeout=lambda: str(traffic.txn.error))
        if plan.worker_kill == "after failover":
            kill_worker(self.lab, f"cycle {c}")
        return parts

    def failback(self, c: int, plan: CyclePlan, acked_end: dict[int, int], parts: dict[int, dict[str, Any]]) -> None:
        """east comes back, the link heals; `mirror failback`; checks 4 and 5 (east refuses)."""
        check = self.findings.check
        assert self.abandoned is not None
        self.abandoned.txn.join_abandoned()  # east's producer is gone before east is back
        for broker in self.lab["east"].brokers.values():
            broker.start()
        answered = log_ends(self.east)
        self.abandoned.member.join_abandoned()
        short = {p: (answered[p], acked_end[p]) for p in answered if answered[p] < acked_end[p]}
        note = f" (NOTE: below what it acknowledged, (answer, acknowledged + 1): {short}; the runbook goes on)"
        say(f"cycle {c}: east back; it answers ends {answered}{note if short else ''}")
        check_group(self.findings, self.lab, "east", f"cycle {c} east back")
        say(f"cycle {c}: {self.link.heal()}")
        side_before = count_records(self.dr, SIDE_TOPIC)
        report = dr_command(self.lab, "failback")
        side_after = count_records(self.dr, SIDE_TOPIC)
        added = {p: side_after.get(p, 0) - side_before.get(p, 0) for p in range(PARTITIONS)}
        counted = {p: 0 for p in range(PARTITIONS)} | {r["partition"]: r.get("diverged_records", 0)
                                                       for r in report["topics"].get(TOPIC, [])}
        check(sum(counted.values()) == sum(added.values()) and counted == added,
              f"cycle {c}: failback's diverged_records {counted} (sum {sum(counted.values())}) != records it added "
              f"to {SIDE_TOPIC} {added} (sum {sum(added.values())})")
        ends = {p: r["end_offset"] for p, r in parts.items()}
        say(f"cycle {c}: east acknowledged up to {acked_end}, the copy ended at {ends}: "
            f"{sum(acked_end.values()) - sum(ends.values())} offsets beyond; {sum(added.values())} records set aside")
        if plan.worker_kill == "during copy back":
            kill_worker(self.lab, f"cycle {c}")
        wait_for(lambda: directions(self.lab, self.findings) == {f"dr:{TOPIC}": "reverse"}, 60,
                 "topology plan: reverse", interval_s=0.5)
        check(refused(self.east, self.ledger, "east", f"c{c}-failback") == "TOPIC_EXCEPTION",
              f"cycle {c}: east's copy took (or did not refuse with TOPIC_EXCEPTION) a producer's write")

    def promote(self, c: int) -> None:
        """The application stops in dr; east is copied back and the group's offsets follow;
        `mirror promote`; check 5 (dr refuses); the application moves back to east."""
        check = self.findings.check
        assert self.traffic is not None
        self.traffic.stop(self.findings)
        dr_ends = self.dr_ends()
        say(f"cycle {c}: the application stopped in dr at ends {dr_ends}")
        wait_for(lambda: log_ends(self.east) == dr_ends, 120, f"east copied back to dr's ends {dr_ends}",
                 interval_s=0.3, on_timeout=self.lab.mirror_log_tail)
        dr_committed = committed_offsets(self.dr)
        try:
            wait_for(lambda: committed_offsets(self.east) == dr_committed, 30,
                     f"group {GROUP}'s offsets {dr_committed} back in east", interval_s=0.3)
        except AssertionError as exc:
            check(False, f"cycle {c}: {exc}")
        say(f"cycle {c}: east copied back; the group's offsets there {committed_offsets(self.east)}")
        check_group(self.findings, self.lab, "east", f"cycle {c} before the promotion")
        check_group(self.findings, self.lab, "dr", f"cycle {c} before the promotion")
        report = dr_command(self.lab, "promote")
        check(report.get("primary") == "east", f"cycle {c}: promote's primary {report.get('primary')!r}")
        check(directions(self.lab, self.findings) == {f"dr:{TOPIC}": "forward"},
              f"cycle {c}: topology plan after the promotion is not forward")
        check(refused(self.dr, self.ledger, "dr", f"c{c}-promote") == "TOPIC_EXCEPTION",
              f"cycle {c}: dr's copy took (or did not refuse with TOPIC_EXCEPTION) a producer's write")
        self.move_traffic("east", f"c{c + 1}-east")


def test_dr_datacenter_faults_lose_no_acknowledged_record(dr_lab: tuple[MirrorLab, Link]) -> None:
    _T0[0] = time.monotonic()
    rng = fault_rng("test_dr_datacenter_faults")
    plans = [draw(rng) for _ in range(CYCLES)]
    for c, plan in enumerate(plans, 1):
        say(f"cycle {c}: {plan}")
    lab, link = dr_lab
    run = Run(lab, link, rng)
    new_topic(run.east, TOPIC, PARTITIONS)
    _write_topology(lab, link)
    lab.start_mirror()
    run.move_traffic("east", "c1-east")
    wait_for(lambda: sum(run.dr_ends().values()) > 0, 90, "dr copies east's topic", interval_s=0.3,
             on_timeout=lab.mirror_log_tail)
    assert link.forwarded() > 0, "the worker does not reach east through the link"

    for c, plan in enumerate(plans, 1):
        acked_end, copy_ends, at_cut, cut_ms = run.east_dies(c, plan)
        parts = run.failover(c, plan, acked_end, copy_ends, at_cut, cut_ms)
        run.failback(c, plan, acked_end, parts)
        run.promote(c)
        say(f"cycle {c} done after {time.monotonic() - run.started:.0f} s")

    # The end: east the primary, dr its copy, caught up.
    assert run.traffic is not None
    run.traffic.wait_acks(300, "at the end")
    run.traffic.stop(run.findings)
    final_ends = log_ends(run.east)
    wait_for(lambda: run.dr_ends() == final_ends, 120, f"dr at east's ends {final_ends}", interval_s=0.3,
             on_timeout=lab.mirror_log_tail)
    say(f"the end: east's ends {final_ends}, dr caught up; the checks")
    _final_checks(run.findings, lab, run.ledger, run.members)
    print("\nRPO (per failover, per partition):\n" + "\n".join(run.rpo_rows), flush=True)
    print(f"\n{len(run.findings.items)} finding(s) in {time.monotonic() - run.started:.0f} s", flush=True)
    assert not run.findings.items, "\n".join(run.findings.items)


def _check_rpo(findings: Findings, c: int, report: dict[str, Any], parts: dict[int, dict[str, Any]],
               truth: dict[int, int], at_cut: dict[int, int], cut_ms: float, failover_ms: float,
               rows: list[str]) -> None:
    """3: the lower bound never above the truth; inexact and the source unreachable; what the
    workers knew no later than the cut."""
    findings.check(report.get("source_reachable") is False,
                   f"cycle {c}: failover's source_reachable {report.get('source_reachable', '(absent)')!r}, "
                   "want false (east is dead and the link cut)")
    for p in range(PARTITIONS):
        r = parts.get(p, {})
        today = {k: r.get(k) for k in ("end_offset", "source_known_end", "rpo_records") if k in r}
        rows.append(f"  cycle {c} {TOPIC}-{p}: truth {truth[p]} record(s) east acknowledged beyond the copy; "
                    f"report {json.dumps({k: v for k, v in r.items() if k != 'topic'})}")
        if "rpo_records_at_least" not in r:
            findings.check(False, f"cycle {c}: {TOPIC}-{p}: the failover report has no rpo_records_at_least; it "
                                  f"says {today} (a firm RPO) where east acknowledged {truth[p]} record(s) beyond "
                                  "the copy")
        else:
            bound = r["rpo_records_at_least"]
            findings.check(bound is None or (isinstance(bound, int) and 0 <= bound <= truth[p]),
                           f"cycle {c}: {TOPIC}-{p}: rpo_records_at_least {bound} above the truth {truth[p]}")
        findings.check(r.get("rpo_exact", "(absent)") is False,
                       f"cycle {c}: {TOPIC}-{p}: rpo_exact {r.get('rpo_exact', '(absent)')!r}, want false (east "
                       "unreachable)")
        known_at = r.get("source_known_at_ms", "(absent)")
        age = r.get("source_known_age_s", "(absent)")
        known = r.get("source_known_end")
        if known is None or known < 0:
            continue  # nothing known of east: nothing to date
        findings.check(known <= at_cut[p], f"cycle {c}: {TOPIC}-{p}: source_known_end {known} beyond east's end "
                                           f"{at_cut[p]} when the link was cut (nothing crossed it after)")
        findings.check(isinstance(known_at, int | float) and 0 <= known_at <= cut_ms + SEEN_SLACK_MS,
                       f"cycle {c}: {TOPIC}-{p}: source_known_at_ms {known_at}, want a time no later than the "
                       f"cut ({cut_ms:.0f})")
        findings.check(isinstance(age, int | float) and age >= (failover_ms - cut_ms - SEEN_SLACK_MS) / 1000,
                       f"cycle {c}: {TOPIC}-{p}: source_known_age_s {age}, want at least "
                       f"{(failover_ms - cut_ms) / 1000:.1f} s (the link was cut that long before the failover)")


def _final_checks(findings: Findings, lab: MirrorLab, ledger: Ledger, members: list[GroupMember]) -> None:
    east, dr = lab.bootstrap("east"), lab.bootstrap("dr")
    topic = visible(east, TOPIC)
    side = visible(dr, SIDE_TOPIC) if SIDE_TOPIC in topics_of(dr) else {}
    in_topic: Counter[bytes] = Counter(r.value for rows in topic.values() for r in rows if r.value is not None)
    in_side: Counter[bytes] = Counter(r.value for rows in side.values() for r in rows if r.value is not None)

    # 1. every acknowledged record once, in the topic or aside.
    acked = ledger.acked()
    lost = [s for s in acked if in_topic[s.value] + in_side[s.value] == 0]
    twice = [s for s in acked if in_topic[s.value] + in_side[s.value] > 1]
    by_phase = Counter(s.phase for s in lost)
    findings.check(not lost, f"1: {len(lost)} acknowledged record(s) lost (per phase {dict(by_phase)}), e.g. "
                             + ", ".join(f"{s.value.decode()} at {s.at}" for s in lost[:6]))
    findings.check(not twice, f"1: {len(twice)} acknowledged record(s) more than once, e.g. "
                              + ", ".join(f"{s.value.decode()} (topic {in_topic[s.value]}, side "
                                          f"{in_side[s.value]})" for s in twice[:6]))
    unacked_twice = [v for v in set(in_topic) | set(in_side) if in_topic[v] + in_side[v] > 1
                     and v in ledger.sent and not ledger.sent[v].acked]
    findings.check(not unacked_twice, f"1: {len(unacked_twice)} unacknowledged record(s) more than once, e.g. "
                                      f"{unacked_twice[:5]}")
    strangers = [v for v in set(in_topic) | set(in_side) if v not in ledger.sent]
    findings.check(not strangers, f"{len(strangers)} record(s) no client of the test sent, e.g. {strangers[:5]}")
    probes = [v for v in set(in_topic) | set(in_side) if v in ledger.sent and ledger.sent[v].kind == "probe"]
    findings.check(not probes, f"5: a copy side took a producer's write: {probes}")

    # 2. transactions: aborted and left-open never visible; none in part; committed whole.
    states: Counter[str] = Counter()
    for txn in ledger.txns.values():
        states[txn.state] += 1
        shown = sum(1 for v in txn.values if in_topic[v] + in_side[v] > 0)
        where = {v.decode(): (in_topic[v], in_side[v], ledger.sent[v].at) for v in txn.values}
        if txn.state in ("aborted", "open at death"):
            findings.check(shown == 0, f"2: transaction {txn.name} ({txn.state}): {shown} of {len(txn.values)} "
                                       f"record(s) visible read_committed (topic, side, at): {where}")
        elif txn.state == "committed":
            findings.check(shown == len(txn.values), f"2: committed transaction {txn.name}: {shown} of "
                                                     f"{len(txn.values)} record(s) visible (topic, side, at): {where}")
        else:
            findings.check(shown in (0, len(txn.values)), f"2: transaction {txn.name} ({txn.state}) visible in "
                                                          f"part: {shown} of {len(txn.values)}: {where}")
    consumed = {v for m in members for _, _, v in m.read}
    invisible = [v for v in consumed if v in ledger.sent and ledger.sent[v].txn is not None
                 and ledger.txns[ledger.sent[v].txn or ""].state in ("aborted", "open at death")]
    findings.check(not invisible, f"2: the group read {len(invisible)} record(s) of aborted or left-open "
                                  f"transactions, e.g. {invisible[:5]}")

    # 5. the same records at the same offsets on both sides; the copy refuses producers.
    for isolation in ("read_uncommitted", "read_committed"):
        a = {p: [(r.offset, r.key, r.value) for r in rows] for p, rows in visible(east, TOPIC, isolation).items()}
        b = {p: [(r.offset, r.key, r.value) for r in rows] for p, rows in visible(dr, TOPIC, isolation).items()}
        differ = {p: (len(a.get(p, [])), len(b.get(p, [])),
                      next((x, y) for x, y in zip(a.get(p, []) + [None], b.get(p, []) + [None], strict=False)
                           if x != y)) for p in set(a) | set(b) if a.get(p) != b.get(p)}
        findings.check(not differ, f"5: east's and dr's {TOPIC} differ {isolation} (records east, dr, first "
                                   f"difference): {differ}")
    findings.check(refused(dr, ledger, "dr", "end") == "TOPIC_EXCEPTION",
                   "5: dr's copy took (or did not refuse with TOPIC_EXCEPTION) a producer's write at the end")

    # 6. committed offsets within the log; every move resumed where the group committed.
    check_group(findings, lab, "east", "the end")
    check_group(findings, lab, "dr", "the end")
    final_committed = committed_offsets(east)
    skipped_at_resume = []
    for m in members:
        for p, first in m.first.items():
            start = max(0, m.start_offsets.get(p, 0))
            gap = [r for r in topic.get(p, []) if start <= r.offset < first]
            if first < start or gap:
                skipped_at_resume.append(f"{m.phase} {TOPIC}-{p}: committed {start}, first read {first}, "
                                         f"{len(gap)} record(s) between")
    findings.check(not skipped_at_resume, f"6: the group did not resume where it committed: {skipped_at_resume}")
    never_read = {p: [r.offset for r in rows if r.offset < final_committed.get(p, 0) and r.value not in consumed]
                  for p, rows in topic.items()}
    never_read = {p: offs for p, offs in never_read.items() if offs}
    findings.check(not never_read, f"6: records below the group's committed offsets {final_committed} it never "
                                   f"read: " + ", ".join(f"{TOPIC}-{p}: {len(o)} (e.g. offsets {o[:5]})"
                                                         for p, o in never_read.items()))

    sent_by_kind = Counter(s.kind for s in ledger.sent.values())
    print(f"\nSUMMARY: sent {dict(sent_by_kind)}; acknowledged {len(acked)} (lost {len(lost)}, twice {len(twice)}); "
          f"transactions {dict(states)}; final topic {sum(in_topic.values())} visible records, side topic "
          f"{sum(in_side.values())}; the group read {sum(len(m.read) for m in members)} records in "
          f"{len(members)} phases, committed at the end {final_committed}", flush=True)



