"""Shared record model and exact-comparison helpers for the interop tests.

Every client test produces a deterministic list of `Rec`s, reads the topic back into a
list of `Got`s and hands both to `assert_exact`, which checks count, per-partition
contiguous offsets from the expected start, and every key, value, header and timestamp
in produce order.
"""

from __future__ import annotations

import random
import struct
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

# Wire ids of the compression codecs (RecordBatch attributes bits 0-2).
CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
CODECS = list(CODEC_IDS)

# Fixed, plainly "old but valid" create times so assertions can be exact.
BASE_TS_MS = 1_700_000_000_000

Headers = tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True)
class Rec:
    """One record as produced. partition None = the client's partitioner chooses."""

    partition: int | None
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp_ms: int


@dataclass(frozen=True)
class Got:
    """One record as consumed, normalised across clients."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp_ms: int
    create_time: bool  # timestamp type is CreateTime (not LogAppendTime / none)


def norm_headers(headers: Iterable[tuple[str, bytes | None]] | None) -> Headers:
    if not headers:
        return ()
    return tuple((str(k), None if v is None else bytes(v)) for k, v in headers)


def make_records(
    n: int,
    partitions: int,
    tag: str,
    *,
    explicit_partition: bool = True,
    null_header_values: bool = True,
    null_values: bool = True,
    null_keys: bool = True,
    base_ts_ms: int = BASE_TS_MS,
) -> list[Rec]:
    """Deterministic records with varied shapes.

    - keys cycle over 31 distinct keys; a key always maps to the same partition
      (key index % partitions), so per-partition order is also per-key order;
    - some keys and values are empty (b"", distinct from null);
    - values have variable length, mixing text and pseudo-random bytes (some compress
      well, some do not); every 1000th value is null (a tombstone) if null_values;
    - headers vary: none at all, several, a repeated key, an empty value and (if allowed)
      a null value;
    - timestamps step 10 ms but every 13th record goes back in time (negative delta
      inside a batch is legal).
    """
    recs: list[Rec] = []
    for i in range(n):
        kidx = i % 31
        key: bytes | None = f"key-{kidx:02d}".encode()
        if null_keys and i % 500 == 250:
            key = None
        elif i % 500 == 100:
            key = b""  # empty, not null
        if explicit_partition:
            part: int | None = kidx % partitions
        else:
            part = None
            if not key:
                # the partitioner needs a key to be predictable (librdkafka treats an
                # empty key like a null one: random partition)
                key = f"key-{kidx:02d}".encode()
        value: bytes | None
        if null_values and i % 1000 == 999:
            value = None
        elif i % 1000 == 500:
            value = b""  # empty, not null
        else:
            rnd = random.Random(i).randbytes(i % 40)
            value = f"{tag}-value-{i:06d}-".encode() + b"x" * (i % 57) + rnd
        headers: list[tuple[str, bytes | None]] = []
        if i % 11 != 0:
            headers.append(("idx", str(i).encode()))
            headers.append(("tag", tag.encode()))
            if i % 3 == 0:
                headers += [("dup", b"first"), ("dup", b"second")]
            if i % 5 == 0:
                headers.append(("empty", b""))
            if null_header_values and i % 7 == 0:
                headers.append(("null", None))
            if i % 17 == 0:
                headers.append(("bin", bytes(range(256))[i % 200 : i % 200 + 40]))
        ts = base_ts_ms + i * 10
        if i % 13 == 0 and i > 0:
            ts -= 25
        recs.append(Rec(part, key, value, tuple(headers), ts))
    return recs


def expected_counts(recs: Sequence[Rec]) -> dict[int, int]:
    counts: dict[int, int] = defaultdict(int)
    for r in recs:
        assert r.partition is not None
        counts[r.partition] += 1
    return dict(counts)


def _describe(x: Rec | Got) -> str:
    return repr(x)[:400]


def assert_exact(
    expected: Sequence[Rec],
    got: Sequence[Got],
    *,
    partitions: int,
    start_offsets: dict[int, int] | None = None,
    delivered: Sequence[tuple[int, int]] | None = None,
) -> None:
    """Assert `got` is exactly `expected`, per partition, in order, with contiguous offsets.

    `expected` must have explicit partitions. `start_offsets` gives the expected first
    offset per partition (default 0). `delivered`, if given, is the (partition, offset)
    the producer reported for each expected record (same index); offsets must match.
    """
    start_offsets = start_offsets or {}
    assert all(g.partition in range(partitions) for g in got), "record from unknown partition"
    exp_by_p: dict[int, list[int]] = defaultdict(list)
    for idx, r in enumerate(expected):
        assert r.partition is not None
        exp_by_p[r.partition].append(idx)
    got_by_p: dict[int, list[Got]] = defaultdict(list)
    for g in got:
        got_by_p[g.partition].append(g)

    problems: list[str] = []
    if len(got) != len(expected):
        problems.append(f"count: got {len(got)} records, expected {len(expected)}")
    for p in range(partitions):
        exp_idx = exp_by_p.get(p, [])
        gots = got_by_p.get(p, [])
        base = start_offsets.get(p, 0)
        offsets = [g.offset for g in gots]
        want_offsets = list(range(base, base + len(exp_idx)))
        if offsets != want_offsets:
            first_bad = next(
                (k for k, (a, b) in enumerate(zip(offsets, want_offsets, strict=False)) if a != b),
                min(len(offsets), len(want_offsets)),
            )
            problems.append(
                f"partition {p}: offsets not contiguous {base}..{base + len(exp_idx) - 1}: "
                f"got {len(offsets)} offsets, first difference at position {first_bad}: "
                f"got {offsets[first_bad:first_bad + 5]} want {want_offsets[first_bad:first_bad + 5]}"
            )
        for pos, (idx, g) in enumerate(zip(exp_idx, gots, strict=False)):
            r = expected[idx]
            mismatch = []
            if g.key != r.key:
                mismatch.append("key")
            if g.value != r.value:
                mismatch.append("value")
            if g.headers != r.headers:
                mismatch.append("headers")
            if g.timestamp_ms != r.timestamp_ms:
                mismatch.append("timestamp")
            if not g.create_time:
                mismatch.append("timestamp_type")
            if delivered is not None and delivered[idx] != (p, g.offset):
                mismatch.append(f"delivery-report offset {delivered[idx]}")
            if mismatch:
                problems.append(
                    f"partition {p} position {pos} (record #{idx}): {', '.join(mismatch)} differ:\n"
                    f"   expected {_describe(r)}\n   got      {_describe(g)}"
                )
                break  # the first mismatch per partition is enough
    assert not problems, "records differ:\n" + "\n".join(problems)


def assert_exact_client_partitioned(
    expected: Sequence[Rec], got: Sequence[Got], *, partitions: int
) -> dict[bytes | None, int]:
    """For records whose partition the client chose: every key lives in exactly one
    partition, per-key order is produce order, offsets are contiguous from 0 in every
    partition, and everything else matches exactly. Returns key -> partition."""
    assert len(got) == len(expected), f"got {len(got)} records, expected {len(expected)}"
    by_p: dict[int, list[Got]] = defaultdict(list)
    for g in got:
        assert 0 <= g.partition < partitions, g
        by_p[g.partition].append(g)
    for p, gs in by_p.items():
        assert [g.offset for g in gs] == list(range(len(gs))), f"partition {p} offsets not 0..n-1"
    key_part: dict[bytes | None, int] = {}
    for g in got:
        assert key_part.setdefault(g.key, g.partition) == g.partition, (
            f"key {g.key!r} found in partitions {key_part[g.key]} and {g.partition}"
        )
    exp_by_key: dict[bytes | None, list[Rec]] = defaultdict(list)
    for r in expected:
        exp_by_key[r.key].append(r)
    got_by_key: dict[bytes | None, list[Got]] = defaultdict(list)
    for g in sorted(got, key=lambda g: (g.partition, g.offset)):
        got_by_key[g.key].append(g)
    assert set(exp_by_key) == set(got_by_key), "different key sets"
    for key, rs in exp_by_key.items():
        gs = got_by_key[key]
        want = [(r.key, r.value, r.headers, r.timestamp_ms) for r in rs]
        have = [(g.key, g.value, g.headers, g.timestamp_ms) for g in gs]
        assert have == want, f"key {key!r}: records differ from produce order"
    return key_part


def wait_until(
    predicate: Callable[[], object], timeout_s: float, interval_s: float = 0.2, what: str = ""
) -> object:
    """Poll `predicate` until it returns a truthy value; fail after timeout_s."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what or predicate}; last={last!r}")
        time.sleep(interval_s)


# ---------------------------------------------------------------- on-disk segments

@dataclass(frozen=True)
class DiskBatch:
    base_offset: int
    last_offset_delta: int
    attributes: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def codec(self) -> int:
        return self.attributes & 0x07


_DISK_HEADER = struct.Struct(">qiibIhiqqqhii")


def partition_dir(data_dir: Path, topic: str, partition: int) -> Path:
    return Path(data_dir) / f"{topic}-{partition}"


def segment_files(data_dir: Path, topic: str, partition: int, suffix: str = ".log") -> list[Path]:
    d = partition_dir(data_dir, topic, partition)
    return sorted(p for p in d.iterdir() if p.name.endswith(suffix) and p.name[:20].isdigit())


def read_disk_batches(data_dir: Path, topic: str, partition: int) -> list[DiskBatch]:
    """Walk every RecordBatch in the partition's .log segment files."""
    out: list[DiskBatch] = []
    for seg in segment_files(data_dir, topic, partition):
        data = seg.read_bytes()
        pos = 0
        while pos + 61 <= len(data):
            (base, length, _epoch, magic, _crc, attrs, lod, _bts, _mts, pid, pepoch, bseq, count) = (
                _DISK_HEADER.unpack_from(data, pos)
            )
            if length <= 0:
                break  # preallocated tail
            assert magic == 2, f"{seg}: batch at byte {pos} has magic {magic}"
            out.append(DiskBatch(base, lod, attrs, pid, pepoch, bseq, count))
            pos += 12 + length
    return out


def assert_disk_codec(data_dir: Path, topic: str, partitions: int, codec: str) -> None:
    """Every on-disk batch of the topic is either compressed with `codec` or uncompressed
    (clients send a batch uncompressed when compressing would not make it smaller), and
    most records sit in compressed batches: the broker kept the producer's batches as
    they were, and the client really compressed (old librdkafka silently stops
    compressing when the broker's advertised Produce versions look wrong)."""
    want = CODEC_IDS[codec]
    for p in range(partitions):
        batches = read_disk_batches(data_dir, topic, p)
        assert batches, f"no batches on disk for {topic}-{p}"
        codecs = {b.codec for b in batches}
        if want == 0:
            assert codecs == {0}, f"{topic}-{p}: on-disk codecs {sorted(codecs)}, expected none"
            continue
        assert codecs <= {0, want}, f"{topic}-{p}: on-disk codecs {sorted(codecs)}, expected {want} ({codec})"
        total = sum(b.records_count for b in batches)
        compressed = sum(b.records_count for b in batches if b.codec == want)
        assert compressed * 2 > total, (
            f"{topic}-{p}: only {compressed} of {total} records are in {codec} batches"
        )
