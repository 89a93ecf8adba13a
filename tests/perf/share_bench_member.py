"""One share-group member of tests/perf/test_share_groups_vs_kafka.py: librdkafka's share
consumer (confluent-kafka's ShareConsumer, implicit acknowledgement: each poll accepts the
records of the poll before). It prints `{"subscribed": t}`, `{"first": t}` at its first record
and `{"count": n}` as it goes (time.monotonic(): one clock for every process of the machine);
on "stop" on its stdin it commits what it still holds (commitSync), closes and prints
`{"done": t, "records": [[partition, offset], ...]}`.

    python -m tests.perf.share_bench_member BOOTSTRAP GROUP TOPIC
"""

from __future__ import annotations

import json
import select
import sys
import time

from confluent_kafka import ShareConsumer

REPORT_EVERY_S = 0.1


def say(line: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def main(bootstrap: str, group: str, topic: str) -> None:
    consumer = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 3})
    say({"subscribed": time.monotonic()})
    consumer.subscribe([topic])
    got: list[tuple[int, int]] = []
    reported = 0.0
    while True:
        for m in consumer.poll(0.05):
            if m.error() is None:
                if not got:
                    say({"first": time.monotonic()})
                got.append((m.partition(), m.offset()))
        now = time.monotonic()
        if now - reported >= REPORT_EVERY_S:
            reported = now
            say({"count": len(got)})
            if select.select([sys.stdin], [], [], 0)[0] and sys.stdin.readline().strip() == "stop":
                break
    consumer.commit_sync(30.0)  # the last poll's records, accepted
    done = time.monotonic()
    consumer.close()
    say({"done": done, "records": got})


if __name__ == "__main__":
    main(*sys.argv[1:4])
