"""Share consumers (KIP-932) against dcmirror and against Apache Kafka 4.3.1 (issue 44): the
same sequences played by librdkafka's share consumer (confluent-kafka's ShareConsumer) and by
Kafka's own KafkaShareConsumer (tests/kafka/java/JavaClients.java, mode share-script: the Java
consumers take their calls one by one from this module, so each sequence is written once),
and what each broker delivered and answered compared.

Each sequence has its own topic (one partition) and share group on each broker; its records
(key "k<n>", value "v<n>") are written by one producer, flushed after each log batch, so both
logs hold the same batches. The group configs are set alike on both: share.auto.offset.reset
earliest, share.delivery.count.limit 3, share.heartbeat.interval.ms 1,000 and, for the lock
step, share.record.lock.duration.ms 1,000; both brokers run with
group.share.min.record.lock.duration.ms=1000 (the lowest minimum Kafka takes; its default is
15,000) and group.share.min.heartbeat.interval.ms=1000 (with Kafka's 5 s heartbeat a member's
first records came ~7 s after it subscribed: the assignment waits for the share partition's
initialization and comes with a later heartbeat). The sequences:

1. explicit: every delivery ACCEPTed, RELEASEd or REJECTed by the record's number (n % 3: 1
   accept, 0 release, 2 reject), commitSync after each poll, until everything is settled: the
   released records come back with delivery counts 2 and 3, then are archived, the accepted
   and rejected ones never come back;
2. lock timeout: member A takes the batch and holds it unacknowledged; member B polls until it
   gets the records, once A's 1 s locks ran out, with delivery count 2, and accepts them; then
   A's late ACCEPT of what it no longer holds, and its commitSync's answer;
3. implicit: polls only, each accepting the previous poll's records, until everything is
   settled; nothing delivered twice;
4. close: A accepts the first record of the batch (commitSync) and closes holding the rest; a
   new member B gets the rest with delivery count 2.

"Settled" is DescribeShareGroupOffsets v1 answering lag 0. Every wait is bounded by progress: a
step polls until its condition holds and fails after PROGRESS_S without a new record or a
change in the described (start offset, lag), or after MAX_POLLS polls that brought records; after it, one more poll
(must deliver nothing).

Compared, per sequence and client: each member's deliveries grouped by delivery count (the
steps), (offset, key, value) sorted; the distinct commitSync answers per member (partition ->
error); acknowledge() errors; the last poll; the final lag. What legitimately differs, and so
is not compared (seen in this test's runs, printed with -s):

- How records are split over polls. It is the clients' fetch timing, and Kafka's throttling:
  a record whose delivery count reached ceil(limit / 2) (at least 2) is acquired in smaller
  batches, on its last delivery one record per ShareFetch (Kafka's SharePartition
  throttleRecordsDeliveryLimit, KAFKA-19903). With the Java client Kafka delivered the four
  third deliveries of sequence 1 in four polls, dcmirror in one (docs/share_groups.md, "Next":
  not built). So neither the polls nor the number of commitSync calls are compared.
- The start offset described once everything settled. dcmirror's is the log's end. Kafka's
  is where the last acknowledgement found it: its share partition writes its state with the
  start offset it had before the acknowledgement and moves it in memory afterwards
  (SharePartition.writeShareGroupState sends the current startOffset), so the described start
  trails by one acknowledgement (sequence 1: 0, 3, 6, 9 after the archiving of offsets 0, 3,
  6, 9, never 12; sequence 3: 0), lag 0 all the same. dcmirror's is asserted to be the log's
  end, Kafka's within the log.
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import pytest
from confluent_kafka import AcknowledgeType, KafkaException, Producer, ShareConsumer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from tests.cluster_helpers import create_topic
from tests.harness import BrokerProcess
from tests.kafka.test_java_clients import DRIVER_JVM, JavaDriver, compile_driver
from tests.kafka.test_share_group_offsets import offsets
from tests.peers.kafka import KafkaCluster

pytestmark = [pytest.mark.timeout(300), pytest.mark.heavy]  # a Kafka JVM and the Java clients'

PROGRESS_S = 30.0  # the longest a step may go without a new record or a change in (start offset, lag)
MAX_POLLS = 60  # the most polls with records a step may take (a broker that never settles ends here)
POLL_S = 0.3
LOCK_MS = 1_000  # the lock step's share.record.lock.duration.ms (the brokers' minimum)
DELIVERY_LIMIT = 3
HEARTBEAT_MS = 1_000  # the groups' share.heartbeat.interval.ms (the module's docstring)
BROKER_CONFIGS: dict[str, Any] = {"group.share.min.record.lock.duration.ms": LOCK_MS,
                                  "group.share.min.heartbeat.interval.ms": HEARTBEAT_MS}

Record = tuple[int, int, str, str, int]  # partition, offset, key, value, delivery count


# --------------------------------------------------------------------------- the brokers


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    cluster = KafkaCluster(tmp_path_factory.mktemp("kafka") / "kafka", size=1, config=BROKER_CONFIGS).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def dcmirror(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("share-diff") / "broker", group_initial_rebalance_delay_ms=0,
                      **BROKER_CONFIGS).start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> JavaDriver:
    return compile_driver(tmp_path_factory.mktemp("java-classes"))


def prepare(bootstrap: str, topic: str, group: str, batches: list[list[int]], lock_ms: int | None = None) -> None:
    """The topic (1 partition), the group's configs, record n as key "k<n>", value "v<n>", one
    log batch per list (a produce request each: flushed in between)."""
    create_topic(bootstrap, topic, 1, 1)
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    configs = {"share.auto.offset.reset": "earliest", "share.delivery.count.limit": str(DELIVERY_LIMIT),
               "share.heartbeat.interval.ms": str(HEARTBEAT_MS)}
    if lock_ms is not None:
        configs["share.record.lock.duration.ms"] = str(lock_ms)
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()])
    admin.incremental_alter_configs([resource])[resource].result(30)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "log_level": 3})
    for batch in batches:
        for n in batch:
            p.produce(topic, key=f"k{n}".encode(), value=f"v{n}".encode(), partition=0)
        assert p.flush(30) == 0


# --------------------------------------------------------------------------- the two clients


class Client(Protocol):
    """Share consumers by name, the calls a sequence makes."""

    def open(self, cid: str, group: str, topic: str, explicit: bool) -> None: ...
    def poll(self, cid: str) -> list[Record]: ...
    def ack(self, cid: str, record: Record, kind: str) -> str | None: ...
    def commit(self, cid: str) -> dict[int, str | None]: ...
    def close(self, cid: str) -> None: ...
    def stop(self) -> None: ...


class Librdkafka:
    """confluent-kafka's ShareConsumer."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.consumers: dict[str, ShareConsumer] = {}
        self.last: dict[str, dict[tuple[int, int], Any]] = {}

    def open(self, cid: str, group: str, topic: str, explicit: bool) -> None:
        conf = {"bootstrap.servers": self.bootstrap, "group.id": group, "log_level": 3,
                "share.acknowledgement.mode": "explicit" if explicit else "implicit"}
        self.consumers[cid] = ShareConsumer(conf)
        self.consumers[cid].subscribe([topic])

    def poll(self, cid: str) -> list[Record]:
        out: list[Record] = []
        last: dict[tuple[int, int], Any] = {}
        for m in self.consumers[cid].poll(POLL_S):
            if m.error() is not None:
                raise AssertionError(f"{cid}: {m.error()}")
            r: Record = (int(m.partition() or 0), int(m.offset() or 0), bytes(m.key() or b"").decode(),
                         bytes(m.value() or b"").decode(), int(m.delivery_count() or 0))
            out.append(r)
            last[(r[0], r[1])] = m
        self.last[cid] = last
        return out

    def ack(self, cid: str, record: Record, kind: str) -> str | None:
        try:
            self.consumers[cid].acknowledge(self.last[cid][(record[0], record[1])], getattr(AcknowledgeType, kind))
        except KafkaException as e:
            return str(e.args[0].name())
        return None

    def commit(self, cid: str) -> dict[int, str | None]:
        return {tp.partition: None if e is None else e.args[0].name()
                for tp, e in self.consumers[cid].commit_sync(30).items()}

    def close(self, cid: str) -> None:
        self.consumers.pop(cid).close()

    def stop(self) -> None:
        for c in self.consumers.values():
            c.close()


class Java:
    """Kafka 4.3.1's KafkaShareConsumer in one JVM (JavaClients share-script), a call per line."""

    def __init__(self, driver: JavaDriver, bootstrap: str) -> None:
        self.proc = subprocess.Popen(driver.command("JavaClients", "share-script", DRIVER_JVM, bootstrap=bootstrap),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._drain, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for text in self.proc.stdout:
            if text.startswith("{"):
                self.lines.put(text)
        self.lines.put(None)

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for text in self.proc.stderr:
            self.stderr = [*self.stderr[-200:], text]

    def call(self, op: str, **args: object) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        try:
            text = self.lines.get(timeout=60)
        except queue.Empty:
            text = None
        assert text is not None, f"JavaClients share-script: no answer to {op}:\n{''.join(self.stderr[-40:])}"
        answer: dict[str, Any] = json.loads(text)
        assert "error" not in answer or op in ("commit", "ack"), (op, args, answer)
        return answer

    def open(self, cid: str, group: str, topic: str, explicit: bool) -> None:
        self.call("open", id=cid, group=group, topic=topic, explicit=explicit)

    def poll(self, cid: str) -> list[Record]:
        return [tuple(r) for r in self.call("poll", id=cid, ms=int(POLL_S * 1000))["records"]]  # type: ignore[misc]

    def ack(self, cid: str, record: Record, kind: str) -> str | None:
        error: str | None = self.call("ack", id=cid, partition=record[0], offset=record[1], type=kind).get("error")
        return error

    def commit(self, cid: str) -> dict[int, str | None]:
        answer = self.call("commit", id=cid)
        if "error" in answer:  # commitSync threw: compared like an answer
            return {-1: answer["error"]}
        return {int(p): e for p, e in answer["result"].items()}

    def close(self, cid: str) -> None:
        self.call("close", id=cid)

    def stop(self) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write('{"op": "exit"}\n')
            self.proc.stdin.close()
            self.proc.wait(30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(10)


# --------------------------------------------------------------------------- the sequences


class Run:
    """One sequence on one broker with one client: what it saw."""

    def __init__(self, client: Client, bootstrap: str, topic: str, group: str) -> None:
        self.client, self.bootstrap, self.topic, self.group = client, bootstrap, topic, group
        self.delivered: dict[str, list[Record]] = {}  # member -> every record delivered to it
        self.polls: dict[str, list[list[tuple[int, int]]]] = {}  # member -> (offset, delivery count) per poll
        self.commits: dict[str, list[dict[int, str | None]]] = {}  # member -> distinct commitSync answers
        self.ack_errors: list[tuple[str, int, str, str]] = []  # member, offset, type, error of acknowledge()

    def position(self) -> tuple[int, int]:
        """The share partition's start offset and lag (DescribeShareGroupOffsets v1)."""
        (_t, _p, start, lag, _error) = offsets(self.bootstrap, self.group, {self.topic: [0]})[0]
        return int(start), int(lag)

    def settled(self, _got: list[Record] | None = None) -> bool:
        """Every record acknowledged or archived: started, lag 0 (the start offset itself may
        lag behind on Kafka, see the module's docstring)."""
        start, lag = self.position()
        return start >= 0 and lag == 0

    def poll(self, cid: str) -> list[Record]:
        got = self.client.poll(cid)
        if got:
            self.delivered.setdefault(cid, []).extend(got)
            self.polls.setdefault(cid, []).append([(r[1], r[4]) for r in got])
        return got

    def ack(self, cid: str, record: Record, kind: str) -> None:
        error = self.client.ack(cid, record, kind)
        if error is not None:
            self.ack_errors.append((cid, record[1], kind, error))

    def commit(self, cid: str) -> None:
        answer = self.client.commit(cid)
        seen = self.commits.setdefault(cid, [])
        if answer not in seen:
            seen.append(answer)

    def until(self, cid: str, done: Callable[[list[Record]], bool], what: str,
              ack: Callable[[Record], str | None] | None = None, timeout_s: float = PROGRESS_S) -> None:
        """Polls `cid` until done(records of this poll) holds; each record acknowledged as
        ack(record) says (then commitSync after the poll). Fails after `timeout_s` without a new
        record or a moved start offset, or after MAX_POLLS polls that brought records."""
        last, mark, position = time.monotonic(), len(self.delivered.get(cid, [])), self.position()
        fruitful = 0  # polls that brought records: a broker that never settles ends at MAX_POLLS
        while fruitful < MAX_POLLS:  # empty polls are bounded by progress (timeout_s), not counted
            got = self.poll(cid)
            fruitful += bool(got)
            if ack is not None and got:
                for r in got:
                    kind = ack(r)
                    if kind is not None:
                        self.ack(cid, r, kind)
                self.commit(cid)
            if got:
                last = time.monotonic()
            if done(got):
                return
            moved = self.position()
            if moved != position:
                last, position = time.monotonic(), moved
            assert time.monotonic() - last < timeout_s, \
                f"{what}: {timeout_s:.0f} s without progress; {cid} got {self.delivered.get(cid, [])[mark:]}"
        raise AssertionError(f"{what}: not in {MAX_POLLS} polls with records; {cid} got "
                             f"{self.delivered.get(cid, [])[mark:]}")

    def observed(self, end: int) -> dict[str, Any]:
        """What is compared: each member's deliveries by delivery count, (offset, key, value)
        sorted; the distinct commitSync answers; acknowledge() errors; the lag at the end (and
        the start offset, compared apart)."""
        start, lag = self.position()
        return {
            "delivered": {cid: {count: sorted((r[1], r[2], r[3]) for r in rs if r[4] == count)
                                for count in sorted({r[4] for r in rs})} for cid, rs in self.delivered.items()},
            "commits": self.commits,
            "ack errors": self.ack_errors,
            "lag": lag,
            "start offset": start,  # not compared (the module's docstring)
            "log end": end,
        }


def value_of(r: Record) -> int:
    return int(r[3][1:])


def explicit_ack_rule(r: Record) -> str:
    """n % 3 == 1 accepted, == 0 released (on every delivery), == 2 rejected."""
    return {0: "RELEASE", 1: "ACCEPT", 2: "REJECT"}[value_of(r) % 3]


def explicit_sequence(run: Run) -> dict[str, Any]:
    """1. ACCEPT / RELEASE / REJECT by a rule on every delivery until settled."""
    c = run.client
    c.open("a", run.group, run.topic, explicit=True)
    run.until("a", bool, "the first records", ack=explicit_ack_rule)
    run.until("a", run.settled, "every record settled", ack=explicit_ack_rule)
    after = run.poll("a")
    c.close("a")
    return {**run.observed(12), "after": after}


def lock_timeout_sequence(run: Run) -> dict[str, Any]:
    """2. A holds a batch past its lock; B gets it again; A's late acceptance."""
    c = run.client
    c.open("a", run.group, run.topic, explicit=True)
    run.until("a", bool, "A's records")
    held = list(run.delivered["a"])
    taken = time.monotonic()
    c.open("b", run.group, run.topic, explicit=True)
    run.until("b", run.settled, "B given A's records once their locks ran out",
              ack=lambda r: "ACCEPT", timeout_s=LOCK_MS / 1000 + PROGRESS_S)
    waited = time.monotonic() - taken
    for r in held:
        run.ack("a", r, "ACCEPT")
    run.commit("a")
    after = run.poll("b")
    c.close("b")
    c.close("a")
    return {**run.observed(3), "after": after, "waited a lock": waited >= LOCK_MS / 1000 * 0.5}


def implicit_sequence(run: Run) -> dict[str, Any]:
    """3. implicit acknowledgement: each poll accepts the previous poll's records."""
    c = run.client
    c.open("a", run.group, run.topic, explicit=False)
    run.until("a", bool, "the first records")
    run.until("a", run.settled, "every record accepted by the next poll")
    after = run.poll("a")
    run.commit("a")  # nothing pending
    c.close("a")
    return {**run.observed(6), "after": after}


def close_sequence(run: Run) -> dict[str, Any]:
    """4. A accepts the first record of its batch, closes holding the rest; B gets them."""
    c = run.client
    c.open("a", run.group, run.topic, explicit=True)
    run.until("a", bool, "A's records", ack=lambda r: "ACCEPT" if r[1] == 0 else None)
    c.close("a")
    c.open("b", run.group, run.topic, explicit=True)
    run.until("b", run.settled, "B given what A held when it closed", ack=lambda r: "ACCEPT")
    after = run.poll("b")
    c.close("b")
    return {**run.observed(4), "after": after}


SEQUENCES: dict[str, tuple[Callable[[Run], dict[str, Any]], list[list[int]], int | None]] = {
    # name: (sequence, log batches of record numbers, the group's lock duration)
    "explicit": (explicit_sequence, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]], None),
    "lock-timeout": (lock_timeout_sequence, [[0, 1, 2]], LOCK_MS),
    "implicit": (implicit_sequence, [[0, 1, 2], [3, 4, 5]], None),
    "close": (close_sequence, [[0, 1, 2, 3]], None),
}


def play(name: str, client_name: str, broker: str, bootstrap: str, driver: JavaDriver) -> dict[str, Any]:
    sequence, batches, lock_ms = SEQUENCES[name]
    topic = group = f"sdiff-{name}-{client_name}"
    prepare(bootstrap, topic, group, batches, lock_ms)
    client: Client = Librdkafka(bootstrap) if client_name == "librdkafka" else Java(driver, bootstrap)
    run = Run(client, bootstrap, topic, group)
    try:
        seen = sequence(run)
    except AssertionError as e:
        raise AssertionError(f"{name} with {client_name} on {broker}: {e}") from None
    finally:
        client.stop()
    print(f"{name} / {client_name} on {broker}: polls {run.polls}, commits {run.commits}")
    return seen


# --------------------------------------------------------------------------- the tests


def expected(name: str) -> dict[str, Any]:
    """What Kafka is expected to show (that the sequence ran as meant; the test's claim is that
    dcmirror shows the same): member -> delivery count -> record numbers, and more."""
    ok: list[dict[int, str | None]] = [{0: None}]
    released = [n for n in range(12) if n % 3 == 0]
    return {
        "explicit": {"delivered": {"a": {1: list(range(12)), **{d: released for d in range(2, DELIVERY_LIMIT + 1)}}},
                     "commits": {"a": ok}},
        "lock-timeout": {"delivered": {"a": {1: [0, 1, 2]}, "b": {2: [0, 1, 2]}}, "waited a lock": True},
        "implicit": {"delivered": {"a": {1: list(range(6))}}, "commits": {"a": [{}]}},
        "close": {"delivered": {"a": {1: [0, 1, 2, 3]}, "b": {2: [1, 2, 3]}}, "commits": {"a": ok, "b": ok}},
    }[name] | {"lag": 0, "after": [], "ack errors": []}


@pytest.mark.parametrize("client", ["librdkafka", "java"])
@pytest.mark.parametrize("sequence", list(SEQUENCES))
def test_share_consumer_sequence_as_kafka(sequence: str, client: str, kafka: KafkaCluster, dcmirror: BrokerProcess,
                                          driver: JavaDriver) -> None:
    theirs = play(sequence, client, "Kafka 4.3.1", kafka.bootstrap, driver)
    ours = play(sequence, client, "dcmirror", dcmirror.bootstrap, driver)
    their_start, our_start = theirs.pop("start offset"), ours.pop("start offset")
    assert ours == theirs, f"dcmirror and Kafka 4.3.1 differ:\n  dcmirror: {ours}\n  Kafka:    {theirs}"
    want = expected(sequence)
    numbers = {cid: {count: [int(v[1:]) for _o, _k, v in rs] for count, rs in by_count.items()}
               for cid, by_count in theirs["delivered"].items()}
    assert {**{k: theirs[k] for k in want}, "delivered": numbers} == want
    # Both settled (lag 0); the start offset described once everything settled: dcmirror's is
    # the log's end, Kafka's may still be where the last acknowledgement found it.
    assert our_start == theirs["log end"] and 0 <= their_start <= theirs["log end"], (our_start, their_start)
