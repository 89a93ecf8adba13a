"""A share-group member process for the share-group fault test (tests/fault/test_share_group_faults.py):
librdkafka's share consumer (confluent-kafka's ShareConsumer) in explicit mode that accepts every
record it gets and writes down, one JSON line each (flushed, so a kill -9 loses at most the line
being written), what happened and when (time.monotonic(): CLOCK_MONOTONIC, the same clock in every
process of the machine):

    {"start": t}
    {"poll": call, "ret": return, "recs": [[partition, offset, delivery count, value], ...], "errs": [...]}
    {"committing": t}
    {"commit": call, "ret": return, "parts": {"partition": null | "ERROR_NAME"}, "raised": null | "..."}

Every non-empty poll is followed by a "committing" line, written before the member acknowledges
anything, and its commit line before the next poll: a commit settles exactly the records of the
poll before it. A partition missing from "parts" (or "raised" set) means the broker's answer is
unknown, and so does a member killed after its "committing" line and before its commit line
(the acceptances may have reached the broker).

    python -m tests.fault.share_member BOOTSTRAP GROUP TOPIC LOG_FILE MAX_POLL_RECORDS WORK_MS

WORK_MS is how long the member works on each poll's records before it accepts them (records
held, locked, while a kill can land).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from confluent_kafka import KafkaException, ShareConsumer

POLL_S = 0.5
COMMIT_TIMEOUT_S = 10.0  # a cycle holds its records well under the 30 s lock


def main(bootstrap: str, group: str, topic: str, log_file: str, max_poll_records: str, work_ms: str) -> None:
    out = open(log_file, "a")  # noqa: SIM115 (open for the life of the process)

    def emit(line: dict[str, Any]) -> None:
        out.write(json.dumps(line) + "\n")
        out.flush()

    emit({"start": time.monotonic()})
    consumer = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 3,
                              "share.acknowledgement.mode": "explicit", "max.poll.records": int(max_poll_records)})
    consumer.subscribe([topic])
    while True:
        called = time.monotonic()
        messages = consumer.poll(POLL_S)
        returned = time.monotonic()
        good = [m for m in messages if m.error() is None]
        emit({"poll": called, "ret": returned,
              "recs": [[m.partition(), m.offset(), m.delivery_count(), (m.value() or b"").decode()] for m in good],
              "errs": [str(m.error()) for m in messages if m.error() is not None]})
        if not good:
            continue
        time.sleep(int(work_ms) / 1000)  # the work the records stand for
        # from here on the broker may hear the acceptances: a kill before the commit line leaves
        # their answer unknown (the test counts them accepted or not, whichever comes)
        emit({"committing": time.monotonic()})
        refused: list[str] = []
        for m in good:
            try:
                consumer.acknowledge(m)  # ACCEPT
            except Exception as exc:  # no longer in flight for the client: the broker never hears it
                refused.append(f"{m.partition()}:{m.offset()}: {exc}")
        called = time.monotonic()
        parts: dict[str, str | None] = {}
        raised = None
        try:
            for tp, err in consumer.commit_sync(COMMIT_TIMEOUT_S).items():
                parts[str(tp.partition)] = None if err is None else _name(err)
        except KafkaException as exc:
            raised = _name(exc)
        emit({"commit": called, "ret": time.monotonic(), "parts": parts, "raised": raised, "refused": refused})


def _name(exc: Any) -> str:
    error = exc.args[0] if getattr(exc, "args", None) else exc
    name = getattr(error, "name", None)
    return str(name() if callable(name) else exc)


if __name__ == "__main__":
    main(*sys.argv[1:7])
