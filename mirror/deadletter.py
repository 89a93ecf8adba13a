"""Dead letters: source records a flow cannot write into its target.

A flow sizes its target topics and its producer from the source topic's limit plus the
headers it adds (worker.py `_size_target`), so whatever the source accepted normally fits.
When a record still cannot be written (the target refuses it: MESSAGE_TOO_LARGE or
RECORD_LIST_TOO_LARGE, or it is larger than any request even compressed), the worker does
not loop on it: it says so once (an ERROR naming the record's coordinates, the counter
`dcmirror_mirror_dead_letter_records_total`, the alert DcmirrorMirrorDeadLetter, an event in
`mirror status`) and writes an entry into the target's `dcmirror.deadletter` topic, then the
partition goes on behind it.

An entry holds the record's coordinates and why it was refused, never its data (the data
stays in the source, where it can be read by its coordinates while retention keeps it):
key `flow/topic/partition/topic id/offset`, JSON value. The topic is compacted on that key,
so a record refused again (after a worker restart) is one entry.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import orjson

DEAD_LETTER_TOPIC = "dcmirror.deadletter"
DEAD_LETTER_CONFIGS = {"cleanup.policy": "compact", "retention.ms": str(30 * 24 * 3600 * 1000)}


@dataclass(frozen=True)
class DeadLetter:
    flow: str
    source_cluster: str
    topic: str  # source topic
    partition: int
    offset: int  # source offset
    topic_id: str | None  # the source topic's id (which incarnation)
    leader_epoch: int
    timestamp_ms: int  # the record's timestamp
    size_bytes: int  # key and value
    reason: str
    target_topic: str
    worker: str
    at_ms: int

    @property
    def key(self) -> bytes:
        return f"{self.flow}/{self.topic}/{self.partition}/{self.topic_id or '-'}/{self.offset}".encode()

    def value(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def parse(cls, value: bytes) -> DeadLetter:
        doc: dict[str, Any] = orjson.loads(value)
        return cls(**doc)
