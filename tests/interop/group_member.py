"""One confluent-kafka group member as a child process, for the member-failure tests.

    python tests/interop/group_member.py BOOTSTRAP TOPIC GROUP NAME [SESSION_MS [PROCESS_MS]]

It subscribes to TOPIC in GROUP with auto commit off and prints, one line each, flushed:

    ASSIGN <t> <p,p,...>      on every assignment (t = time.time())
    REVOKE <t> <p,p,...>      on every revocation
    MSG <p> <o>               every consumed record
    COMMIT <p>:<o> ...        a successful synchronous commit after a batch (o = next offset),
                              PROCESS_MS after the batch's MSG lines ("processing" time)
    COMMITFAIL <p>:<o> ... <error>   (the partitions whose commit failed)
    CLOSED                    after SIGTERM: consumer.close() (LeaveGroup) has returned

A SIGKILL leaves no LeaveGroup behind: the coordinator only notices at session timeout.

With GROUP_PROTOCOL=consumer in the environment the member uses KIP-848's protocol
(`group.protocol=consumer`; the session timeout is then the broker's
group.consumer.session.timeout.ms). Its assignments are incremental, so ASSIGN then lists
every partition owned after each change (a REVOKE or LOST too), REVOKE the partitions given up, and LOST the
partitions lost without revoking (a fenced member).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable


def main(argv: list[str]) -> int:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    bootstrap, topic, group, name = argv[:4]
    session_ms = int(argv[4]) if len(argv) > 4 else 6000
    process_s = int(argv[5]) / 1000 if len(argv) > 5 else 0.0
    stop = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)

    def out(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    kip848 = os.environ.get("GROUP_PROTOCOL") == "consumer"
    conf: dict[str, object] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "client.id": name,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 100,
        "socket.timeout.ms": 10000,
    }
    if kip848:
        conf["group.protocol"] = "consumer"
        if os.environ.get("GROUP_REMOTE_ASSIGNOR"):
            conf["group.remote.assignor"] = os.environ["GROUP_REMOTE_ASSIGNOR"]
    else:
        conf.update({"session.timeout.ms": session_ms, "heartbeat.interval.ms": 500})
    consumer = Consumer(conf)
    owned: set[int] = set()

    def listed(parts: object) -> str:
        return ",".join(str(p) for p in sorted(parts))  # type: ignore[call-overload]

    def on_assign(c: object, parts: list[object]) -> None:
        new = {p.partition for p in parts}  # type: ignore[attr-defined]
        if kip848:
            owned.update(new)
            new = set(owned)
        out(f"ASSIGN {time.time():.3f} " + listed(new))

    def released(kind: str) -> Callable[[object, list[object]], None]:
        """REVOKE (given up) or LOST (taken without a revocation: a fenced member)."""
        def callback(c: object, parts: list[object]) -> None:
            gone = {p.partition for p in parts}  # type: ignore[attr-defined]
            owned.difference_update(gone)
            out(f"{kind} {time.time():.3f} " + listed(gone))
            if kip848:
                out(f"ASSIGN {time.time():.3f} " + listed(owned))
        return callback

    on_revoke, on_lost = released("REVOKE"), released("LOST")

    if kip848:
        consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
    else:  # a lost assignment is reported as a revocation, as before
        consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
    out("READY")
    while not stop:
        msgs = consumer.consume(200, 0.2)
        last: dict[int, int] = {}
        for m in msgs:
            if m.error():
                out(f"ERROR {m.error()}")
                continue
            out(f"MSG {m.partition()} {m.offset()}")
            last[m.partition()] = m.offset()
        if not last:
            continue
        if process_s:
            time.sleep(process_s)
        offsets = [TopicPartition(topic, p, o + 1) for p, o in sorted(last.items())]
        desc = " ".join(f"{tp.partition}:{tp.offset}" for tp in offsets)
        try:
            result = consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            out(f"COMMITFAIL {desc} {exc.args[0].name()}")
            continue
        ok = [tp for tp in result or [] if tp.error is None]
        failed = [tp for tp in result or [] if tp.error is not None]
        if ok:
            out("COMMIT " + " ".join(f"{tp.partition}:{tp.offset}" for tp in ok))
        if failed:
            out("COMMITFAIL " + " ".join(f"{tp.partition}:{tp.offset}" for tp in failed)
                + f" {failed[0].error.name()}")
    consumer.close()
    out("CLOSED")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
