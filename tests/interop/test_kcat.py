"""kcat (librdkafka 2.0.x) against a standalone broker: -P with keys, headers, codecs and
explicit partitions; -C -e -f read back compared byte for byte; -L metadata; -Q
offsets by timestamp."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from tests.interop.clients import ck_consume, ck_create_topic, ck_produce, ck_watermarks
from tests.interop.common import BASE_TS_MS, CODECS, Rec, assert_disk_codec

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat not installed (make sysdeps)"),
]

PARTITIONS = 3


def kcat(*args: str, stdin: bytes | None = None, timeout_s: float = 30.0) -> bytes:
    proc = subprocess.run(
        ["kcat", *args], input=stdin, capture_output=True, timeout=timeout_s, check=False
    )
    assert proc.returncode == 0, (
        f"kcat {' '.join(args)} exited {proc.returncode}\nstderr: {proc.stderr.decode(errors='replace')[-3000:]}"
    )
    return proc.stdout


def kcat_produce(bootstrap: str, topic: str, partition: int, lines: list[str], *extra: str) -> None:
    data = ("\n".join(lines) + "\n").encode()
    kcat("-b", bootstrap, "-P", "-t", topic, "-p", str(partition), "-K", ":",
         "-X", "message.timeout.ms=20000", *extra, stdin=data)


def kcat_consume(bootstrap: str, topic: str, partition: int | None, fmt: str, *extra: str) -> list[str]:
    args = ["-b", bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-q", "-f", fmt, *extra]
    if partition is not None:
        args += ["-p", str(partition)]
    out = kcat(*args).decode()
    return out.splitlines()


@pytest.mark.parametrize("codec", CODECS)
def test_kcat_produce_consume_exact(broker, codec):
    topic = f"kcat-{codec}"
    ck_create_topic(broker.bootstrap, topic, PARTITIONS)
    expected: dict[int, list[str]] = {}
    for p in range(PARTITIONS):
        lines = [f"k{p}-{i}:v{p}-{i}-" + "x" * (i % 23) for i in range(500)]
        lines.append(f"tomb{p}:")  # empty value + -Z => NULL value
        extra = ["-Z", "-H", "h1=v1", "-H", f"codec={codec}", "-H", "eq=a=b"]
        if codec != "none":
            extra += ["-z", codec]
        kcat_produce(broker.bootstrap, topic, p, lines, *extra)
        want = []
        for i in range(500):
            value = f"v{p}-{i}-" + "x" * (i % 23)
            want.append(f"{p}|{i}|k{p}-{i}|{value}|{len(value)}|h1=v1,codec={codec},eq=a=b")
        want.append(f"{p}|500|tomb{p}|NULL|-1|h1=v1,codec={codec},eq=a=b")
        expected[p] = want

    for p in range(PARTITIONS):
        got = kcat_consume(broker.bootstrap, topic, p, "%p|%o|%k|%s|%S|%h\n", "-Z")
        assert got == expected[p], _first_diff(got, expected[p])

    # The whole topic (all partitions) through one kcat -C: same set of lines.
    got_all = kcat_consume(broker.bootstrap, topic, None, "%p|%o|%k|%s|%S|%h\n", "-Z")
    assert sorted(got_all) == sorted(line for lines in expected.values() for line in lines)

    # librdkafka really compressed (kcat's librdkafka is old; it silently drops
    # compression when the broker's Produce versions look wrong).
    assert_disk_codec(broker.data_dir, topic, PARTITIONS, codec)


def _first_diff(got: list[str], want: list[str]) -> str:
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return f"line {i}: got {a!r}, want {b!r} (got {len(got)} lines, want {len(want)})"
    return f"got {len(got)} lines, want {len(want)}; tail got {got[-2:]!r} want {want[-2:]!r}"


def test_kcat_reads_confluent_records_with_timestamps(broker):
    topic = "kcat-from-ck"
    ck_create_topic(broker.bootstrap, topic, PARTITIONS)
    recs = [
        Rec(i % PARTITIONS, f"key{i}".encode(), f"val{i}".encode(),
            (("a", f"{i}".encode()), ("b", b"bee")) if i % 4 else (), BASE_TS_MS + 7 * i)
        for i in range(900)
    ]
    ck_produce(broker.bootstrap, topic, recs, {"compression.type": "zstd"})
    for p in range(PARTITIONS):
        mine = [r for r in recs if r.partition == p]
        want = [
            f"{p}|{off}|{r.timestamp_ms}|{r.key.decode()}|{r.value.decode()}|"
            + ",".join(f"{k}={v.decode()}" for k, v in r.headers)
            for off, r in enumerate(mine)
        ]
        got = kcat_consume(broker.bootstrap, topic, p, "%p|%o|%T|%k|%s|%h\n")
        assert got == want, _first_diff(got, want)

    # JSON envelope of the first record of partition 1.
    out = kcat("-b", broker.bootstrap, "-C", "-t", topic, "-p", "1", "-o", "beginning", "-c", "1",
               "-e", "-q", "-J").decode()
    env = json.loads(out.splitlines()[0])
    assert env["topic"] == topic and env["partition"] == 1 and env["offset"] == 0
    assert env["tstype"] == "create" and env["ts"] == BASE_TS_MS + 7
    assert env["key"] == "key1" and env["payload"] == "val1"
    assert env["headers"] == ["a", "1", "b", "bee"]


def test_kcat_produce_read_by_confluent(broker):
    topic = "kcat-to-ck"
    ck_create_topic(broker.bootstrap, topic, PARTITIONS)
    for p in range(PARTITIONS):
        kcat_produce(broker.bootstrap, topic, p, [f"key{p}x{i}:value{p}x{i}" for i in range(300)],
                     "-H", "src=kcat", "-z", "gzip")
    got = ck_consume(broker.bootstrap, topic, {p: 300 for p in range(PARTITIONS)})
    assert len(got) == 900
    for p in range(PARTITIONS):
        mine = [g for g in got if g.partition == p]
        assert [g.offset for g in mine] == list(range(300))
        assert [(g.key, g.value, g.headers) for g in mine] == [
            (f"key{p}x{i}".encode(), f"value{p}x{i}".encode(), (("src", b"kcat"),)) for i in range(300)
        ]
        assert all(g.create_time for g in mine)


def test_kcat_metadata_listing(broker):
    topic = "kcat-meta"
    ck_create_topic(broker.bootstrap, topic, 4)
    md = json.loads(kcat("-b", broker.bootstrap, "-L", "-J", "-t", topic))
    assert md["brokers"] == [{"id": 1, "name": broker.bootstrap}]
    assert [t["topic"] for t in md["topics"]] == [topic]
    (t,) = md["topics"]
    assert "error" not in t or not t["error"], t
    parts = sorted(t["partitions"], key=lambda x: x["partition"])
    assert [x["partition"] for x in parts] == [0, 1, 2, 3]
    for x in parts:
        assert x["leader"] == 1
        assert x["replicas"] == [{"id": 1}]
        assert x["isrs"] == [{"id": 1}]

    # Plain text listing of every topic.
    text = kcat("-b", broker.bootstrap, "-L").decode()
    assert f'topic "{topic}" with 4 partitions:' in text
    for p in range(4):
        assert f"partition {p}, leader 1, replicas: 1, isrs: 1" in text
    assert f"broker 1 at {broker.bootstrap}" in text


def test_kcat_query_offsets_by_timestamp(broker):
    topic = "kcat-query"
    ck_create_topic(broker.bootstrap, topic, 1)
    recs = [Rec(0, b"k", f"v{i}".encode(), (), BASE_TS_MS + 100 * i) for i in range(50)]
    ck_produce(broker.bootstrap, topic, recs)
    assert ck_watermarks(broker.bootstrap, topic, 1) == {0: (0, 50)}
    for ts, want in [(BASE_TS_MS, 0), (BASE_TS_MS + 1, 1), (BASE_TS_MS + 1000, 10),
                     (BASE_TS_MS + 4900, 49), (BASE_TS_MS - 5000, 0)]:
        out = kcat("-b", broker.bootstrap, "-Q", "-t", f"{topic}:0:{ts}").decode()
        found = re.findall(r"offset (-?\d+)", out)
        assert found == [str(want)], (ts, out)
