"""The MirrorAppend frame (cluster/protocol/internal.py) and the `mirror.source` topic config."""

from __future__ import annotations

import struct

import orjson
import pytest

from cluster.common.config_def import InvalidConfig
from cluster.protocol.errors import ProtocolError
from cluster.protocol.internal import (
    MAX_MIRROR_PARTITIONS,
    mirror_append_payload,
    parse_mirror_append,
)
from cluster.storage.config import LogConfig


def test_a_payload_reads_back_with_its_raw_bytes() -> None:
    payload = mirror_append_payload("t", "id-1", 5000, [(0, b"abc", 7), (3, b"", -1), (1, b"de", -1)])
    header, parts = parse_mirror_append(memoryview(payload))
    assert header == {"topic": "t", "topic_id": "id-1", "timeout_ms": 5000}
    assert [(p, bytes(b), s) for p, b, s in parts] == [(0, b"abc", 7), (3, b"", -1), (1, b"de", -1)]


def raw(header: object, body: bytes = b"") -> memoryview:
    data = orjson.dumps(header)
    return memoryview(struct.pack(">i", len(data)) + data + body)


@pytest.mark.parametrize("payload, why", [
    (memoryview(b"\x00\x00"), "shorter than its header length"),
    (memoryview(struct.pack(">i", 100) + b"{}"), "header of 100 bytes"),
    (memoryview(struct.pack(">i", 2 << 20) + b"x" * 10), "header of 2097152 bytes"),
    (raw({"topic": "t"}), "malformed"),
    (raw({"topic": "t", "topic_id": "i", "timeout_ms": 1, "partitions": [{"partition": 0, "bytes": 5}]}, b"abc"),
     "declare 5 bytes, 3 follow"),
    (raw({"topic": "t", "topic_id": "i", "timeout_ms": 1, "partitions": [{"partition": 0, "bytes": -1}]}, b""),
     "declare"),
    (raw({"topic": "t", "topic_id": "i", "timeout_ms": 1,
          "partitions": [{"partition": 0, "bytes": 0}, {"partition": 0, "bytes": 0}]}), "twice"),
    (raw({"topic": "t", "topic_id": "i", "timeout_ms": 1,
          "partitions": [{"partition": i, "bytes": 0} for i in range(MAX_MIRROR_PARTITIONS + 1)]}), "more than"),
])
def test_malformed_payloads_are_refused_before_anything_is_copied(payload: memoryview, why: str) -> None:
    with pytest.raises(ProtocolError, match=why):
        parse_mirror_append(payload)


def test_mirror_source_is_an_extra_config_described_only_when_set() -> None:
    assert LogConfig.build({}).mirror_source == ""
    assert LogConfig.build({"mirror.source": "east:orders"}).mirror_source == "east:orders"
    with pytest.raises(InvalidConfig, match="mirror.source is <cluster>:<topic>"):
        LogConfig.build({"mirror.source": "orders"})
