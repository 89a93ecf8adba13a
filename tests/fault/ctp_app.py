"""A consume-transform-produce application with librdkafka, exactly once (KIP-98/KIP-447).

Run as `python -m tests.fault.ctp_app BOOTSTRAP IN OUT STOP_FILE`: reads IN in the group
`ctp` (read_committed), writes every record to the same partition of OUT with the key
"partition:offset" of its input and the same value, and commits its input offsets in the
same transaction (send_offsets_to_transaction). Abortable errors abort the transaction and
rewind to the committed offsets; fatal errors (e.g. fenced) exit 3 so the supervisor in
tests/fault/test_transactions_faults.py starts a new instance, which fences the old one. Exits 0
once STOP_FILE exists and nothing is in flight.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

GROUP, TXN_ID = "ctp", "ctp-app"


OFFSETS_TIMEOUT_S = 30
# Liveness: input waiting and no transaction committed for this long means the process is
# stuck (a librdkafka call that never returns, a group it never rejoins): it exits (5) and
# the supervisor starts a new instance, as a deployment's liveness probe would.
STALL_S = 90
CLOSE_TIMEOUT_S = 30


class Progress:
    """What the liveness thread watches: when a transaction last committed (or the
    application last found nothing to do) and whether input was waiting then."""

    def __init__(self) -> None:
        self.last_s = time.monotonic()
        self.lagging = False

    def idle(self) -> None:
        self.last_s, self.lagging = time.monotonic(), False

    def committed(self) -> None:
        self.last_s = time.monotonic()

    def watch(self) -> None:
        def run() -> None:
            while True:
                time.sleep(1)
                stalled_s = time.monotonic() - self.last_s
                if stalled_s > STALL_S:
                    print(f"ctp_app {os.getpid()}: no transaction committed for {stalled_s:.0f} s "
                          f"(input waiting: {self.lagging}): exiting", flush=True)
                    os._exit(5)

        threading.Thread(target=run, name="liveness", daemon=True).start()


@contextmanager
def watchdog(limit_s: float, what: str) -> Iterator[None]:
    """Exit the process (4) if the block takes longer than `limit_s`: the liveness check a
    deployment would run. librdkafka's send_offsets_to_transaction can block past its own
    timeout when the group coordinator's broker goes down at the wrong moment and no later
    broker state change re-triggers its coordinator lookup (confluentinc/librdkafka#5456,
    #5511, open in 2.16); seen here when the broker leading both coordinators is killed.
    A new instance fences this one and aborts its transaction, as after any crash."""
    def expire() -> None:
        print(f"ctp_app {os.getpid()}: {what} still blocked after {limit_s:.0f} s: exiting", flush=True)
        os._exit(4)

    timer = threading.Timer(limit_s, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def rewind(consumer: Consumer) -> None:
    """Back to the group's committed offsets (what the aborted transaction would have moved)."""
    assignment = consumer.assignment()
    if not assignment:
        return
    for tp in consumer.committed(assignment, timeout=30):
        consumer.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else 0))


def commit(producer: Producer) -> None:
    """commit_transaction, retried while librdkafka says the outcome is retriable (e.g. a
    timeout while the coordinator moves); the same call completes the same commit."""
    for _ in range(5):
        try:
            producer.commit_transaction(30)
            return
        except KafkaException as e:
            if not e.args[0].retriable():
                raise
            print(f"ctp_app {os.getpid()}: commit retried after {e.args[0].name()}", flush=True)
    producer.commit_transaction(30)


def main(bootstrap: str, source: str, sink: str, stop_file: str) -> int:
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": GROUP, "isolation.level": "read_committed",
        "enable.auto.commit": False, "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500, "fetch.queue.backoff.ms": 10, "log_level": 2,
        "topic.metadata.refresh.interval.ms": 1000, "reconnect.backoff.max.ms": 500,
    })
    producer = Producer({
        "bootstrap.servers": bootstrap, "transactional.id": TXN_ID, "transaction.timeout.ms": 15_000,
        "linger.ms": 5, "log_level": 2, "topic.metadata.refresh.interval.ms": 1000,
        "reconnect.backoff.max.ms": 500, "socket.connection.setup.timeout.ms": 3000,
    })
    producer.init_transactions(60)
    print(f"ctp_app {os.getpid()}: transactions initialised", flush=True)
    consumer.subscribe([source])
    committed = 0
    progress = Progress()
    progress.watch()
    hold_s = float(os.environ.get("CTP_HOLD_S", "0"))
    while True:
        # Up to 500 records a transaction: a transaction costs about 0.5 s of round trips on a
        # loaded 2-core machine, and the input comes at 250 records/s (100 a transaction fell
        # behind it in CI and could not catch up within the final wait).
        msgs = consumer.consume(num_messages=500, timeout=0.3)
        msgs = [m for m in msgs if m.error() is None]
        if not msgs:
            if os.path.exists(stop_file):
                break
            if caught_up(consumer):
                progress.idle()
            else:
                progress.lagging = True  # input waits but none arrives: still stalled
            continue
        try:
            producer.begin_transaction()
            for m in msgs:
                producer.produce(sink, key=b"%d:%d" % (m.partition(), m.offset()), value=m.value(),
                                 partition=m.partition())
            if hold_s:
                # "processing time": the transaction stays open, its records written, so kills
                # land inside transactions (the test kills the application on this line).
                producer.flush(30)
                print(f"ctp_app {os.getpid()}: in transaction", flush=True)
                time.sleep(hold_s)
            positions = consumer.position(consumer.assignment())
            with watchdog(OFFSETS_TIMEOUT_S + 15, "send_offsets_to_transaction"):
                producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(),
                                                     OFFSETS_TIMEOUT_S)
            commit(producer)
            committed += len(msgs)
            progress.committed()
        except KafkaException as e:
            err: KafkaError = e.args[0]
            print(f"ctp_app {os.getpid()}: {err.name()} {err.str()} "
                  f"(abortable {err.txn_requires_abort()}, fatal {err.fatal()})", flush=True)
            if not err.txn_requires_abort():
                return 3  # fatal, or unknown outcome: a new instance fences this one and aborts
            try:
                producer.abort_transaction(60)
            except KafkaException as again:
                print(f"ctp_app {os.getpid()}: abort failed: {again}", flush=True)
                return 3
            rewind(consumer)
    print(f"ctp_app {os.getpid()}: stopping after {committed} records", flush=True)
    # Everything is committed in transactions; close only leaves the group (and librdkafka's
    # close can wait long on a coordinator that moved), so it is given a bounded time.
    closer = threading.Thread(target=consumer.close, daemon=True)
    closer.start()
    closer.join(CLOSE_TIMEOUT_S)
    if closer.is_alive():
        print(f"ctp_app {os.getpid()}: consumer close still blocked after {CLOSE_TIMEOUT_S} s; leaving", flush=True)
    return 0


def caught_up(consumer: Consumer) -> bool:
    """Every assigned partition's position at its high watermark (as last fetched), or no assignment."""
    try:
        for tp in consumer.position(consumer.assignment()):
            _, high = consumer.get_watermark_offsets(tp, cached=True)
            if high is not None and high >= 0 and 0 <= tp.offset < high:
                return False
    except KafkaException:
        return True  # not known yet: nothing to judge a stall by
    return True


if __name__ == "__main__":
    started = time.monotonic()
    code = main(*sys.argv[1:5])
    print(f"ctp_app {os.getpid()}: exit {code} after {time.monotonic() - started:.1f}s", flush=True)
    os._exit(code)  # not sys.exit: a librdkafka thread still blocked must not hold the exit
