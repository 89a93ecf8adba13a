"""In-process tests of cluster.storage.log.Log with hand-built record batches.

A "crash" is simulated by closing the segment file descriptors without Log.close(): the
files keep exactly what was written (as after kill -9, the page cache survives), no
producer snapshot or final time-index entry is written and no clean state exists.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from cluster.protocol.record_batch import BatchHeader, iter_headers, validate_batch
from cluster.protocol.records import decode_batch
from cluster.storage.config import LogConfig
from cluster.storage.log import Log, OffsetOutOfRange, OutOfOrderSequence, ProducerFenced
from tests.batches import Rec, encode_batch, values_batch

NOW = 1_700_000_000_000
HOUR = 3_600_000
TOPIC = "t"


# ---------------------------------------------------------------- helpers


def cfg(**overrides: object) -> LogConfig:
    return LogConfig.build({k.replace("_", "."): str(v) for k, v in overrides.items()})


def new_log(tmp_path: Path, config: LogConfig) -> Log:
    return Log.create(tmp_path / f"{TOPIC}-0", TOPIC, 0, config, NOW)


def reopen(
    tmp_path: Path,
    config: LogConfig,
    *,
    recovery_point: int,
    clean_state: dict[str, int] | None = None,
    now_ms: int = NOW,
) -> Log:
    return Log.open(
        tmp_path / f"{TOPIC}-0",
        TOPIC,
        0,
        config,
        recovery_point=recovery_point,
        clean_state=clean_state,
        now_ms=now_ms,
    )


def append(lg: Log, batch: bytes, now_ms: int = NOW):
    return lg.append_as_leader(batch, leader_epoch=0, now_ms=now_ms)


def crash(lg: Log) -> None:
    """Drop the log like kill -9 would: file contents stay, nothing is finalised."""
    for seg in lg.segments:
        seg.close()


def split(buf: bytes) -> list[bytes]:
    """Whole batches in a buffer; the buffer must contain nothing else."""
    out = []
    pos = 0
    for p, h in iter_headers(buf):
        assert p == pos
        out.append(buf[p : p + h.size_bytes])
        pos = p + h.size_bytes
    assert pos == len(buf), f"{len(buf) - pos} trailing bytes are not a whole batch"
    return out


def read_all(lg: Log) -> list[tuple[int, int, bytes | None]]:
    """(offset, timestamp, value) of every record from the log start, via Log.read."""
    out: list[tuple[int, int, bytes | None]] = []
    offset = lg.log_start_offset
    while offset < lg.log_end_offset:
        buf = lg.read(offset, 1 << 20, lg.log_end_offset, min_one_batch=True)
        assert buf, f"read at {offset} returned nothing below log end {lg.log_end_offset}"
        for batch in split(buf):
            validate_batch(batch)
            header, records = decode_batch(batch)
            assert header.base_offset == offset, f"batch at {header.base_offset}, expected {offset}"
            out += [(r.offset, r.timestamp, r.value) for r in records]
            offset = header.next_offset
    return out


def disk_batches(path: Path) -> list[tuple[int, BatchHeader]]:
    """(position, header) of every whole batch in a .log file."""
    return list(iter_headers(path.read_bytes()))


def seg_files(lg_dir: Path, suffix: str) -> list[str]:
    return sorted(p.name for p in lg_dir.iterdir() if p.name.endswith(suffix))


def value(i: int, size: int = 40) -> bytes:
    return f"v{i:06d}-".encode().ljust(size, b"x")


def fill(lg: Log, batches: int, per_batch: int = 3, size: int = 40, ts: int = NOW) -> list[bytes]:
    """Append `batches` batches of `per_batch` values; returns every value in order."""
    values = []
    for _ in range(batches):
        vs = [value(lg.log_end_offset + j, size) for j in range(per_batch)]
        append(lg, values_batch(vs, ts=ts))
        values += vs
    return values


def state_of(lg: Log) -> dict[str, object]:
    return {
        "start": lg.log_start_offset,
        "end": lg.log_end_offset,
        "bases": [s.base_offset for s in lg.segments],
        "sizes": [s.size_bytes for s in lg.segments],
        "next": [s.next_offset for s in lg.segments],
        "max_ts": [s.max_timestamp for s in lg.segments],
        "index_entries": [s.offset_index.entries for s in lg.segments],
    }


# ---------------------------------------------------------------- the batch helper


def test_batch_helper_round_trips_through_decode_batch() -> None:
    recs = [
        Rec(b"v0", key=b"k0", headers=(("h1", b"a"), ("h2", None)), timestamp=NOW + 5),
        Rec(None, key=None, timestamp=NOW - 3),
        Rec(b"", key=b"", headers=(("dup", b"1"), ("dup", b"")), timestamp=NOW + 500),
        Rec(b"\x00\xff" * 300, key=b"k3"),
    ]
    batch = encode_batch(
        recs, base_timestamp=NOW, producer_id=77, producer_epoch=3, base_sequence=41, base_offset=9
    )
    header = validate_batch(batch)  # length and CRC32C
    assert header.magic == 2
    assert header.size_bytes == len(batch)
    assert (header.base_offset, header.last_offset_delta, header.records_count) == (9, 3, 4)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (77, 3, 41)
    assert header.base_timestamp == NOW + 5  # the first record's timestamp
    assert header.max_timestamp == NOW + 500
    h2, decoded = decode_batch(batch)
    assert h2 == header
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in decoded] == [
        (9, NOW + 5, b"k0", b"v0", (("h1", b"a"), ("h2", None))),
        (10, NOW - 3, None, None, ()),
        (11, NOW + 500, b"", b"", (("dup", b"1"), ("dup", b""))),
        (12, NOW, b"k3", b"\x00\xff" * 300, ()),
    ]
    # A single flipped bit anywhere in the CRC-covered part is detected.
    bad = bytearray(batch)
    bad[-1] ^= 0x01
    with pytest.raises(ValueError, match="CRC"):
        validate_batch(bytes(bad))


# ---------------------------------------------------------------- append and read


def test_offsets_are_assigned_contiguously(tmp_path: Path) -> None:
    lg = new_log(tmp_path, cfg())
    expected = []
    for n in (1, 3, 5, 2, 1, 7):
        first = lg.log_end_offset
        vs = [value(first + j) for j in range(n)]
        res = append(lg, values_batch(vs, base_offset=12345))  # client base offset is ignored
        assert (res.base_offset, res.last_offset, res.record_count) == (first, first + n - 1, n)
        assert not res.duplicate
        assert lg.log_end_offset == first + n
        expected += vs
    assert lg.log_end_offset == 19
    assert read_all(lg) == [(i, NOW, v) for i, v in enumerate(expected)]
    # Every stored batch carries its assigned base offset and the leader epoch.
    bases = [(h.base_offset, h.last_offset, h.partition_leader_epoch) for _, h in disk_batches(lg.active_segment.log_path)]
    assert bases == [(0, 0, 0), (1, 3, 0), (4, 8, 0), (9, 10, 0), (11, 11, 0), (12, 18, 0)]


def test_several_batches_in_one_append(tmp_path: Path) -> None:
    lg = new_log(tmp_path, cfg())
    payload = values_batch([b"a", b"b"]) + values_batch([b"c"]) + values_batch([b"d", b"e", b"f"])
    res = append(lg, payload)
    assert (res.base_offset, res.last_offset, res.record_count) == (0, 5, 6)
    assert [v for _, _, v in read_all(lg)] == [b"a", b"b", b"c", b"d", b"e", b"f"]
    assert [h.base_offset for _, h in disk_batches(lg.active_segment.log_path)] == [0, 2, 3]


def test_more_batches_in_one_append_than_one_writev_takes(tmp_path: Path) -> None:
    """A mirror topic's leader appending thousands of one-record batches at once (each batch
    its own buffer: the leader epoch is patched): more buffers than IOV_MAX, which one writev
    refuses (EINVAL: a storage error before)."""
    count = 2 * max(1024, os.sysconf("SC_IOV_MAX")) + 7
    payload = b"".join(values_batch([value(i)], base_offset=i) for i in range(count))
    lg = new_log(tmp_path, cfg())
    lg.append_mirrored(payload, leader_epoch=3, now_ms=NOW)
    assert lg.log_end_offset == count
    assert read_all(lg) == [(i, NOW, value(i)) for i in range(count)]
    assert [h.base_offset for _, h in disk_batches(lg.active_segment.log_path)] == list(range(count))


def test_read_returns_whole_batches_below_max_offset(tmp_path: Path) -> None:
    lg = new_log(tmp_path, cfg())
    fill(lg, 4, per_batch=3)  # batches at 0-2, 3-5, 6-8, 9-11
    raw = lg.active_segment.log_path.read_bytes()
    batches = split(raw)
    assert len(batches) == 4
    end = lg.log_end_offset
    assert end == 12

    assert lg.read(0, 1 << 20, end, min_one_batch=False) == raw
    # max_offset cuts before the batch that contains it: 6-8 has offset 7.
    assert lg.read(0, 1 << 20, 7, min_one_batch=False) == batches[0] + batches[1]
    assert lg.read(0, 1 << 20, 6, min_one_batch=False) == batches[0] + batches[1]
    assert lg.read(0, 1 << 20, 5, min_one_batch=False) == batches[0]
    # A fetch offset inside a batch returns that whole batch.
    assert lg.read(4, 1 << 20, end, min_one_batch=False) == b"".join(batches[1:])
    assert lg.read(11, 1 << 20, end, min_one_batch=False) == batches[3]
    # Nothing whole fits below max_offset.
    assert lg.read(4, 1 << 20, 5, min_one_batch=False) == b""
    assert lg.read(4, 1 << 20, 5, min_one_batch=True) == b""
    assert lg.read(6, 1 << 20, 6, min_one_batch=True) == b""
    # max_bytes: only whole batches that fit.
    two = len(batches[0]) + len(batches[1])
    assert lg.read(0, two, end, min_one_batch=False) == batches[0] + batches[1]
    assert lg.read(0, two - 1, end, min_one_batch=False) == batches[0]
    # The log end offset itself is a valid, empty read.
    assert lg.read(end, 1 << 20, end, min_one_batch=True) == b""


def test_min_one_batch_returns_a_batch_larger_than_max_bytes(tmp_path: Path) -> None:
    lg = new_log(tmp_path, cfg())
    big = values_batch([value(i, 1000) for i in range(10)])
    append(lg, big)
    append(lg, values_batch([b"small"]))
    raw = split(lg.active_segment.log_path.read_bytes())
    assert len(raw[0]) > 10_000
    assert lg.read(0, 100, lg.log_end_offset, min_one_batch=False) == b""
    got = lg.read(0, 100, lg.log_end_offset, min_one_batch=True)
    assert got == raw[0]  # exactly the first batch, not more
    assert lg.read(5, 100, lg.log_end_offset, min_one_batch=True) == raw[0]
    assert lg.read(10, 100, lg.log_end_offset, min_one_batch=True) == raw[1]


def test_offset_out_of_range(tmp_path: Path) -> None:
    lg = new_log(tmp_path, cfg(segment_bytes=600, retention_bytes=0))
    fill(lg, 6, per_batch=3, size=60)
    end = lg.log_end_offset
    with pytest.raises(OffsetOutOfRange) as exc:
        lg.read(end + 1, 1 << 20, end + 1, min_one_batch=True)
    assert exc.value.offset == end + 1
    with pytest.raises(OffsetOutOfRange):
        lg.read(-1, 1 << 20, end, min_one_batch=True)
    assert lg.read(end, 1 << 20, end, min_one_batch=True) == b""
    # Move the log start up with retention; everything below it is out of range.
    assert lg.delete_old_segments(NOW) > 0
    start = lg.log_start_offset
    assert 0 < start <= end
    with pytest.raises(OffsetOutOfRange) as exc:
        lg.read(start - 1, 1 << 20, end, min_one_batch=True)
    assert exc.value.offset == start - 1
    with pytest.raises(OffsetOutOfRange):
        lg.read(0, 1 << 20, end, min_one_batch=True)
    lg.read(start, 1 << 20, end, min_one_batch=True)  # does not raise


# ---------------------------------------------------------------- segments and indexes


def test_roll_on_segment_bytes_creates_20_digit_files(tmp_path: Path) -> None:
    seg_bytes = 1000
    lg = new_log(tmp_path, cfg(segment_bytes=seg_bytes))
    d = lg.dir
    expected_bases = [0]
    active_size = 0
    for i in range(40):
        batch = values_batch([value(i * 2, 100), value(i * 2 + 1, 100)])
        if active_size and active_size + len(batch) > seg_bytes:
            expected_bases.append(lg.log_end_offset)
            active_size = 0
        append(lg, batch)
        active_size += len(batch)
    assert len(expected_bases) > 5
    names = [f"{b:020d}" for b in expected_bases]
    assert seg_files(d, ".log") == [n + ".log" for n in names]
    assert seg_files(d, ".index") == [n + ".index" for n in names]
    assert seg_files(d, ".timeindex") == [n + ".timeindex" for n in names]
    assert names[1] == f"{expected_bases[1]:020d}" and len(names[1]) == 20
    assert [s.base_offset for s in lg.segments] == expected_bases
    for seg in lg.segments:
        assert seg.log_path.stat().st_size == seg.size_bytes <= seg_bytes
    # Every roll wrote a producer-state snapshot named after the new segment (two are kept).
    assert seg_files(d, ".snapshot") == [n + ".snapshot" for n in names[-2:]]
    # An explicit roll starts a segment at the log end offset; rolling an empty one is a no-op.
    end = lg.log_end_offset
    lg.roll(NOW)
    lg.roll(NOW)
    assert lg.active_segment.base_offset == end
    assert seg_files(d, ".log")[-1] == f"{end:020d}.log"
    assert len(seg_files(d, ".log")) == len(expected_bases) + 1
    assert [v for _, _, v in read_all(lg)] == [value(i, 100) for i in range(80)]


def test_index_lookups_after_many_small_batches_find_every_offset(tmp_path: Path) -> None:
    config = cfg(index_interval_bytes=1, segment_bytes=20_000)
    lg = new_log(tmp_path, config)
    sizes = [1 + (i % 3) for i in range(600)]
    for n in sizes:
        append(lg, values_batch([value(lg.log_end_offset + j, 10) for j in range(n)]))
    end = lg.log_end_offset
    assert end == sum(sizes)
    assert len(lg.segments) >= 3
    # Nearly every batch is indexed (all but the first of each segment).
    total_batches = sum(len(disk_batches(s.log_path)) for s in lg.segments)
    assert sum(s.offset_index.entries for s in lg.segments) == total_batches - len(lg.segments)

    def check_every_offset(log: Log) -> None:
        for o in range(end):
            buf = log.read(o, 1, end, min_one_batch=True)
            (batch,) = split(buf)
            header, records = decode_batch(batch)
            assert header.base_offset <= o <= header.last_offset, (o, header)
            assert value(o, 10) in [r.value for r in records]
            seg = log.segments[max(i for i, s in enumerate(log.segments) if s.base_offset <= o)]
            pos, h = seg.find_position(o)
            assert h.base_offset <= o <= h.last_offset
            assert seg.log_path.read_bytes()[pos : pos + h.size_bytes] == batch

    check_every_offset(lg)
    before = state_of(lg)
    state = lg.close()
    clean = reopen(tmp_path, config, recovery_point=end, clean_state=state)
    assert state_of(clean) == before
    check_every_offset(clean)
    crash(clean)
    unclean = reopen(tmp_path, config, recovery_point=0)
    assert state_of(unclean) == before
    check_every_offset(unclean)


# ---------------------------------------------------------------- retention


def test_retention_ms_deletes_whole_oldest_segments(tmp_path: Path) -> None:
    lg = new_log(tmp_path, cfg(segment_bytes=700, retention_ms=HOUR))
    old_ts = NOW - 2 * HOUR
    for i in range(12):  # old records, two batches per segment
        append(lg, values_batch([value(i * 3 + j, 60) for j in range(3)], ts=old_ts + i))
    old_end = lg.log_end_offset
    lg.roll(NOW)
    for i in range(6):  # recent records
        append(lg, values_batch([value(old_end + i * 3 + j, 60) for j in range(3)], ts=NOW - 1000 + i))
    old_segments = [s for s in lg.segments if s.base_offset < old_end]
    old_files = [s.log_path for s in old_segments]
    assert len(old_segments) >= 4
    kept_bases = [s.base_offset for s in lg.segments if s.base_offset >= old_end]
    assert lg.delete_old_segments(NOW) == len(old_segments)
    assert lg.log_start_offset == old_end
    assert [s.base_offset for s in lg.segments] == kept_bases
    assert not any(p.exists() for p in old_files)
    assert seg_files(lg.dir, ".log") == [f"{b:020d}.log" for b in kept_bases]
    assert seg_files(lg.dir, ".index") == [f"{b:020d}.index" for b in kept_bases]
    assert [o for o, _, _ in read_all(lg)] == list(range(old_end, lg.log_end_offset))
    # Nothing more expires now; everything does two hours later.
    assert lg.delete_old_segments(NOW) == 0
    end = lg.log_end_offset
    assert lg.delete_old_segments(NOW + 2 * HOUR) == len(kept_bases)
    assert lg.log_start_offset == lg.log_end_offset == end
    assert [s.base_offset for s in lg.segments] == [end]
    assert seg_files(lg.dir, ".log") == [f"{end:020d}.log"]
    # The log goes on from where it was.
    res = append(lg, values_batch([b"after"]))
    assert res.base_offset == end
    assert read_all(lg) == [(end, NOW, b"after")]


def test_retention_bytes_deletes_oldest_segments_down_to_the_limit(tmp_path: Path) -> None:
    config = cfg(segment_bytes=1000)
    lg = new_log(tmp_path, config)
    fill(lg, 40, per_batch=2, size=100)
    sizes = [s.size_bytes for s in lg.segments]
    assert len(sizes) >= 8
    limit = sum(sizes[-3:])  # exactly the newest three segments
    # Kafka's rule: delete the oldest segment while (total - its size) >= retention.bytes.
    expect_deleted = 0
    total = sum(sizes)
    while total - sizes[expect_deleted] >= limit:
        total -= sizes[expect_deleted]
        expect_deleted += 1
    assert expect_deleted == len(sizes) - 3
    expected_start = lg.segments[expect_deleted].base_offset
    files = [s.log_path for s in lg.segments]

    lg.config = cfg(segment_bytes=1000, retention_bytes=limit)
    assert lg.delete_old_segments(NOW) == expect_deleted
    assert lg.log_start_offset == expected_start
    assert lg.size_bytes == limit
    assert [p.exists() for p in files] == [False] * expect_deleted + [True] * 3
    assert lg.delete_old_segments(NOW) == 0
    # Deletion never goes below the limit: one byte less changes nothing ...
    lg.config = cfg(segment_bytes=1000, retention_bytes=limit - 1)
    assert lg.delete_old_segments(NOW) == 0
    # ... while a limit of exactly the newest two segments deletes the oldest of the three.
    lg.config = cfg(segment_bytes=1000, retention_bytes=sum(sizes[-2:]))
    assert lg.delete_old_segments(NOW) == 1
    assert lg.size_bytes == sum(sizes[-2:])
    assert [o for o, _, _ in read_all(lg)] == list(range(lg.log_start_offset, lg.log_end_offset))


# ---------------------------------------------------------------- idempotent producers


def pid_batch(n: int, seq: int, *, pid: int = 1000, epoch: int = 0, tag: str = "p") -> bytes:
    return values_batch(
        [f"{tag}-{seq + j}".encode() for j in range(n)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
    )


def test_idempotent_producer_duplicates_and_sequence_errors(tmp_path: Path) -> None:
    lg = new_log(tmp_path, cfg())
    r1 = append(lg, pid_batch(3, 0))
    r2 = append(lg, pid_batch(2, 3))
    assert (r1.base_offset, r1.last_offset, r2.base_offset, r2.last_offset) == (0, 2, 3, 4)
    size = lg.active_segment.size_bytes

    dup = append(lg, pid_batch(3, 0))
    assert dup.duplicate
    assert (dup.base_offset, dup.last_offset, dup.record_count) == (0, 2, 3)
    dup2 = append(lg, pid_batch(2, 3))
    assert dup2.duplicate and (dup2.base_offset, dup2.last_offset) == (3, 4)
    assert lg.log_end_offset == 5
    assert lg.active_segment.size_bytes == size
    assert lg.active_segment.log_path.stat().st_size == size

    with pytest.raises(OutOfOrderSequence):
        append(lg, pid_batch(1, 7))  # expected 5
    with pytest.raises(OutOfOrderSequence):
        append(lg, pid_batch(2, 2))  # overlaps, not a duplicate
    assert lg.log_end_offset == 5 and lg.active_segment.size_bytes == size

    # Another producer is independent.
    r3 = append(lg, pid_batch(1, 0, pid=2000))
    assert r3.base_offset == 5 and not r3.duplicate

    # A new epoch must start at sequence 0; then the old epoch is fenced.
    with pytest.raises(OutOfOrderSequence):
        append(lg, pid_batch(1, 5, epoch=1))
    r4 = append(lg, pid_batch(2, 0, epoch=1, tag="e1"))
    assert (r4.base_offset, r4.last_offset) == (6, 7)
    with pytest.raises(ProducerFenced):
        append(lg, pid_batch(1, 5, epoch=0))
    with pytest.raises(ProducerFenced):
        append(lg, pid_batch(3, 0, epoch=0))  # even a former duplicate
    assert lg.log_end_offset == 8
    assert [v for _, _, v in read_all(lg)] == [
        b"p-0", b"p-1", b"p-2", b"p-3", b"p-4", b"p-0", b"e1-0", b"e1-1",
    ]


# ---------------------------------------------------------------- clean reopen


def test_clean_reopen_restores_identical_state_without_scanning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = cfg(segment_bytes=2000, index_interval_bytes=100)
    lg = new_log(tmp_path, config)
    for i in range(30):
        append(lg, pid_batch(2, i * 2, tag="c"))
        append(lg, values_batch([value(i, 50)], ts=NOW + i))
    assert len(lg.segments) > 3
    before = state_of(lg)
    records = read_all(lg)
    files_before = {p.name: p.read_bytes() for p in lg.dir.iterdir() if p.suffix in (".log", ".index")}
    state = lg.close()
    assert lg.recovery_point == lg.log_end_offset
    assert state["log_end_offset"] == before["end"]

    with caplog.at_level(logging.INFO, logger="cluster.storage.log"):
        lg2 = reopen(tmp_path, config, recovery_point=lg.recovery_point, clean_state=state)
    report = lg2.recovery_report
    assert report is not None and report.clean
    assert report.bytes_scanned == 0 and report.segments_scanned == 0 and report.bytes_truncated == 0
    assert not any("recovered" in r.getMessage() for r in caplog.records)
    assert state_of(lg2) == before
    assert lg2.recovery_point == lg2.log_end_offset
    assert read_all(lg2) == records
    assert {p.name: p.read_bytes() for p in lg2.dir.iterdir() if p.suffix in (".log", ".index")} == files_before
    # Appends go on at the same place, and producer state came back.
    assert append(lg2, pid_batch(2, 58, tag="c")).duplicate
    res = append(lg2, pid_batch(1, 60, tag="c"))
    assert res.base_offset == before["end"] and not res.duplicate


def test_clean_state_with_changed_active_segment_recovers_it(tmp_path: Path) -> None:
    config = cfg(segment_bytes=1000)
    lg = new_log(tmp_path, config)
    fill(lg, 20, per_batch=2, size=60)
    active = lg.active_segment
    batches = disk_batches(active.log_path)
    assert len(batches) >= 2
    last_pos, last = batches[-1]
    state = lg.close()
    with open(active.log_path, "r+b") as f:
        f.truncate(last_pos + last.size_bytes - 7)
    lg2 = reopen(tmp_path, config, recovery_point=state["log_end_offset"], clean_state=state)
    report = lg2.recovery_report
    assert report is not None and not report.clean
    assert any("active segment changed" in r for r in report.reasons)
    assert report.segments_scanned == 1
    assert report.bytes_scanned == last_pos
    assert report.bytes_truncated == last.size_bytes - 7
    assert lg2.log_end_offset == last.base_offset
    assert active.log_path.stat().st_size == last_pos


# ---------------------------------------------------------------- unclean reopen


def build_segments(tmp_path: Path, config: LogConfig, n_batches: int = 40) -> Log:
    lg = new_log(tmp_path, config)
    for i in range(n_batches):
        append(lg, values_batch([value(lg.log_end_offset + j, 80) for j in range(3)], ts=NOW + i))
    return lg


@pytest.mark.parametrize("point_segment", [0, 2, 4, "end"])
def test_unclean_reopen_scans_exactly_the_segments_from_the_recovery_point(
    tmp_path: Path, point_segment: int | str, caplog: pytest.LogCaptureFixture
) -> None:
    config = cfg(segment_bytes=1500)
    lg = build_segments(tmp_path, config)
    assert len(lg.segments) >= 6
    before = state_of(lg)
    records = read_all(lg)
    bases = [s.base_offset for s in lg.segments]
    paths = [s.log_path for s in lg.segments]
    crash(lg)
    if point_segment == "end":
        recovery_point = before["end"]
        first_scanned = len(bases) - 1  # the active segment is always validated
    else:
        recovery_point = bases[point_segment]
        first_scanned = point_segment
    scanned_paths = paths[first_scanned:]
    expect_bytes = sum(p.stat().st_size for p in scanned_paths)
    expect_batches = sum(len(disk_batches(p)) for p in scanned_paths)

    with caplog.at_level(logging.INFO, logger="cluster.storage.log"):
        lg2 = reopen(tmp_path, config, recovery_point=recovery_point)
    r = lg2.recovery_report
    assert r is not None and not r.clean
    assert r.bytes_scanned == expect_bytes
    assert r.segments_scanned == len(scanned_paths)
    assert r.batches == expect_batches
    assert (r.bytes_truncated, r.segments_deleted) == (0, 0)
    assert state_of(lg2) == before
    assert read_all(lg2) == records
    assert lg2.recovery_point == recovery_point
    msg = (
        f"recovered {TOPIC}-0 from recovery point {recovery_point}: scanned {expect_bytes} bytes in "
        f"{len(scanned_paths)} segment(s), {expect_batches} batches; truncated 0 bytes, deleted 0 "
        f"segment(s); log end offset {before['end']}"
    )
    assert [r.getMessage() for r in caplog.records if "recovered" in r.getMessage()] == [msg]


def _active_tail(lg: Log) -> tuple[Path, int, BatchHeader, int]:
    path = lg.active_segment.log_path
    batches = disk_batches(path)
    pos, header = batches[-1]
    return path, pos, header, path.stat().st_size


@pytest.mark.parametrize("damage", ["cut_3", "cut_into_header", "flip_value_byte", "flip_crc_byte"])
def test_torn_last_batch_is_truncated_on_unclean_reopen(tmp_path: Path, damage: str) -> None:
    config = cfg(segment_bytes=1500)
    lg = build_segments(tmp_path, config)
    records = read_all(lg)
    path, last_pos, last, size = _active_tail(lg)
    bases = [s.base_offset for s in lg.segments]
    crash(lg)
    data = bytearray(path.read_bytes())
    if damage == "cut_3":
        del data[-3:]
    elif damage == "cut_into_header":
        del data[last_pos + 30 :]
    elif damage == "flip_value_byte":
        data[last_pos + last.size_bytes - 20] ^= 0x40
    else:
        data[last_pos + 17] ^= 0x01
    path.write_bytes(bytes(data))

    lg2 = reopen(tmp_path, config, recovery_point=bases[-1])
    r = lg2.recovery_report
    assert r is not None
    assert lg2.log_end_offset == last.base_offset
    assert path.stat().st_size == last_pos
    assert r.bytes_truncated == len(data) - last_pos
    assert r.bytes_scanned == last_pos
    assert r.segments_scanned == 1 and r.segments_deleted == 0
    assert len(r.reasons) == 1 and r.reasons[0].startswith(f"segment {bases[-1]}:")
    assert [s.base_offset for s in lg2.segments] == bases
    assert read_all(lg2) == [x for x in records if x[0] < last.base_offset]
    # The log continues right after the last intact batch.
    res = append(lg2, values_batch([b"next"]))
    assert res.base_offset == last.base_offset
    assert read_all(lg2)[-1] == (last.base_offset, NOW, b"next")


@pytest.mark.parametrize("garbage", [b"\x00" * 4096, b"\x07" * 5, bytes(range(200)) * 3])
def test_garbage_after_the_last_batch_is_truncated(tmp_path: Path, garbage: bytes) -> None:
    config = cfg(segment_bytes=1500)
    lg = build_segments(tmp_path, config)
    records = read_all(lg)
    path, _, _, size = _active_tail(lg)
    end = lg.log_end_offset
    crash(lg)
    with open(path, "ab") as f:
        f.write(garbage)
    lg2 = reopen(tmp_path, config, recovery_point=0)
    r = lg2.recovery_report
    assert r is not None
    assert lg2.log_end_offset == end
    assert path.stat().st_size == size
    assert r.bytes_truncated == len(garbage)
    assert read_all(lg2) == records


def test_corrupt_batch_in_an_older_segment_drops_everything_after_it(tmp_path: Path) -> None:
    config = cfg(segment_bytes=1500)
    lg = build_segments(tmp_path, config)
    records = read_all(lg)
    segs = list(lg.segments)
    victim = segs[2]
    batches = disk_batches(victim.log_path)
    pos, header = batches[1]
    crash(lg)
    data = bytearray(victim.log_path.read_bytes())
    data[pos + 70] ^= 0xFF
    victim.log_path.write_bytes(bytes(data))
    lg2 = reopen(tmp_path, config, recovery_point=segs[1].base_offset)
    r = lg2.recovery_report
    assert r is not None
    assert lg2.log_end_offset == header.base_offset
    assert [s.base_offset for s in lg2.segments] == [s.base_offset for s in segs[:3]]
    assert r.segments_deleted == len(segs) - 3
    assert not any(s.log_path.exists() for s in segs[3:])
    assert victim.log_path.stat().st_size == pos
    assert r.bytes_truncated == len(data) - pos
    assert read_all(lg2) == [x for x in records if x[0] < header.base_offset]
    assert append(lg2, values_batch([b"x"])).base_offset == header.base_offset


# ---------------------------------------------------------------- damaged indexes


def _index_damage(path: Path, how: str) -> None:
    if how == "deleted":
        path.unlink()
    elif how == "odd_size":
        path.write_bytes(path.read_bytes() + b"\x01\x02\x03")
    elif how == "past_the_log":
        path.write_bytes(path.read_bytes() + (2**31).to_bytes(4, "big") + (2**31 - 1).to_bytes(4, "big"))
    elif how == "zeroed":
        path.write_bytes(b"\x00" * len(path.read_bytes()))
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("clean", [True, False], ids=["clean", "unclean"])
@pytest.mark.parametrize("how", ["deleted", "odd_size", "past_the_log", "zeroed"])
def test_damaged_offset_index_is_rebuilt(tmp_path: Path, how: str, clean: bool) -> None:
    config = cfg(segment_bytes=3000, index_interval_bytes=200)
    lg = build_segments(tmp_path, config, n_batches=60)
    records = read_all(lg)
    victim = lg.segments[1]  # an older segment below the recovery point: loaded as trusted
    original = victim.offset_index.path.read_bytes()
    assert len(original) >= 3 * 8
    before = state_of(lg)
    if clean:
        state = lg.close()
    else:
        crash(lg)
        state = None
    _index_damage(victim.offset_index.path, how)
    lg2 = reopen(tmp_path, config, recovery_point=before["end"], clean_state=state)
    assert read_all(lg2) == records
    end = before["end"]
    for o in range(end):
        (batch,) = split(lg2.read(o, 1, end, min_one_batch=True))
        h, _ = decode_batch(batch)
        assert h.base_offset <= o <= h.last_offset
    assert lg2.log_end_offset == end
    seg = lg2.segments[1]
    assert seg.offset_index.path.read_bytes() == original, "index was not rebuilt to its original entries"
    assert seg.offset_index.entries == len(original) // 8


@pytest.mark.parametrize("clean", [True, False], ids=["clean", "unclean"])
def test_deleted_time_index_is_rebuilt(tmp_path: Path, clean: bool) -> None:
    config = cfg(segment_bytes=3000, index_interval_bytes=200, retention_ms=HOUR)
    lg = build_segments(tmp_path, config, n_batches=60)
    victim_base = lg.segments[1].base_offset
    victim_max_ts = lg.segments[1].max_timestamp
    original = lg.segments[1].time_index.path.read_bytes()
    before = state_of(lg)
    ts_target = victim_max_ts  # the last record of segment 1 carries it
    expected = lg.offset_for_timestamp(ts_target)
    assert expected is not None and expected[0] >= victim_base
    state = lg.close() if clean else None
    if not clean:
        crash(lg)
    lg.segments[1].time_index.path.unlink()
    lg2 = reopen(tmp_path, config, recovery_point=before["end"], clean_state=state)
    assert lg2.segments[1].max_timestamp == victim_max_ts
    assert lg2.offset_for_timestamp(ts_target) == expected
    assert lg2.segments[1].time_index.path.read_bytes() == original


# ---------------------------------------------------------------- producer state across reopen


@pytest.mark.parametrize(
    "mode", ["clean", "unclean_from_0", "unclean_from_last_segment", "unclean_no_snapshot"]
)
def test_producer_state_survives_reopen(tmp_path: Path, mode: str) -> None:
    config = cfg(segment_bytes=1200)
    lg = new_log(tmp_path, config)
    results = {}
    for i in range(25):
        results[i] = append(lg, pid_batch(2, i * 2, pid=5, tag="a"))
        append(lg, pid_batch(1, i, pid=6, tag="b"))
    assert len(lg.segments) >= 3
    end = lg.log_end_offset
    if mode == "clean":
        state = lg.close()
        lg2 = reopen(tmp_path, config, recovery_point=end, clean_state=state)
    else:
        crash(lg)
        if mode == "unclean_no_snapshot":
            for p in lg.dir.glob("*.snapshot"):
                p.unlink()
        rp = lg.segments[-1].base_offset if mode == "unclean_from_last_segment" else 0
        lg2 = reopen(tmp_path, config, recovery_point=rp)
    assert lg2.log_end_offset == end
    # The last five batches of each producer are remembered: resent ones are duplicates.
    for i in range(20, 25):
        dup = append(lg2, pid_batch(2, i * 2, pid=5, tag="a"))
        assert dup.duplicate, f"batch seq {i * 2} of producer 5 not recognised as a duplicate"
        assert (dup.base_offset, dup.last_offset) == (results[i].base_offset, results[i].last_offset)
    dup_b = append(lg2, pid_batch(1, 24, pid=6, tag="b"))
    assert dup_b.duplicate and dup_b.base_offset == end - 1
    assert lg2.log_end_offset == end
    with pytest.raises(OutOfOrderSequence):
        append(lg2, pid_batch(1, 51, pid=5))
    # Producer 6 moves to epoch 1, which fences epoch 0.
    assert not append(lg2, pid_batch(1, 0, pid=6, epoch=1)).duplicate
    with pytest.raises(ProducerFenced):
        append(lg2, pid_batch(1, 25, pid=6, epoch=0))
    assert append(lg2, pid_batch(1, 50, pid=5)).base_offset == end + 1  # after pid 6's batch
    # And once more after a second (unclean) reopen with the new batches.
    end2 = lg2.log_end_offset
    crash(lg2)
    lg3 = reopen(tmp_path, config, recovery_point=0)
    assert lg3.log_end_offset == end2
    assert append(lg3, pid_batch(1, 50, pid=5)).duplicate
    with pytest.raises(ProducerFenced):
        append(lg3, pid_batch(1, 25, pid=6, epoch=0))


# ---------------------------------------------------------------- timestamps


def test_offset_for_timestamp_finds_first_record_at_or_after_target(tmp_path: Path) -> None:
    config = cfg(segment_bytes=1500, index_interval_bytes=150)
    lg = new_log(tmp_path, config)
    stamps: list[int] = []
    for b in range(60):
        n = 1 + b % 4
        base = 10_000 + b * 100
        # Within a batch timestamps may go back (CreateTime is the producer's).
        ts = [base + (j * 37 if j % 3 != 2 else -45) for j in range(n)]
        recs = [Rec(value(len(stamps) + j, 30), timestamp=t) for j, t in enumerate(ts)]
        append(lg, encode_batch(recs))
        stamps += ts
    assert len(lg.segments) >= 4

    def brute(target: int) -> tuple[int, int] | None:
        for off, t in enumerate(stamps):
            if t >= target:
                return off, t
        return None

    targets = sorted({t + d for t in stamps for d in (-1, 0, 1)} | {0, 10_000, max(stamps) + 1})

    def check(log: Log) -> None:
        for target in targets:
            assert log.offset_for_timestamp(target) == brute(target), target

    check(lg)
    assert lg.offset_for_timestamp(max(stamps) + 1) is None
    assert lg.offset_for_timestamp(0) == (0, stamps[0])
    state = lg.close()
    lg2 = reopen(tmp_path, config, recovery_point=lg.log_end_offset, clean_state=state)
    check(lg2)
    crash(lg2)
    check(reopen(tmp_path, config, recovery_point=0))


def test_recovery_point_after_reopen_and_file_sizes(tmp_path: Path) -> None:
    """mark_flushed advances the recovery point; an unclean reopen scans from there."""
    config = cfg(segment_bytes=1500)
    lg = build_segments(tmp_path, config)
    bases = [s.base_offset for s in lg.segments]
    lg.flush_segments(bases[-2])
    lg.mark_flushed(bases[-2], NOW)
    assert lg.recovery_point == bases[-2]
    paths = [s.log_path for s in lg.segments[-2:]]
    crash(lg)
    lg2 = reopen(tmp_path, config, recovery_point=lg.recovery_point)
    assert lg2.recovery_report is not None
    assert lg2.recovery_report.bytes_scanned == sum(os.path.getsize(p) for p in paths)


@pytest.mark.parametrize("appended_after_cut", [1, 12])
def test_a_segment_a_truncation_deleted_and_a_crash_brought_back_is_dropped(tmp_path: Path,
                                                                              appended_after_cut: int) -> None:
    """A follower cut its log at 20 (the leader's history diverged there), deleting the later
    segments, and appended the leader's epoch-5 batches; the crash came before the deletions
    reached the disk, so the old segments are back. They hold epoch-4 batches after epoch-5
    ones (or offsets the segment before already holds): an older history, dropped at
    recovery, and the leader-epoch cache agrees with what stays (replication simulation
    seed 1000576 at stretch 4: the follower looped on UnexpectedAppendOffset for ever)."""
    config = cfg(segment_bytes=400)
    lg = new_log(tmp_path, config)
    for i in range(40):
        lg.append_as_leader(values_batch([f"old-{i}".encode()]), leader_epoch=4, now_ms=NOW)
    lg.flush_segments(lg.log_end_offset)
    d = tmp_path / f"{TOPIC}-0"
    later = {p.name: p.read_bytes() for p in d.glob("*.log") if int(p.stem) > 20}
    assert later, "the test needs segments past the cut"
    assert lg.truncate_to(20, NOW) <= 20
    cut_end = lg.log_end_offset
    for i in range(appended_after_cut):
        lg.append_as_leader(values_batch([f"new-{i}".encode()]), leader_epoch=5, now_ms=NOW)
    end = lg.log_end_offset
    crash(lg)
    for name, content in later.items():
        if not (d / name).exists():
            (d / name).write_bytes(content)  # the deletion never reached the disk
    back = reopen(tmp_path, config, recovery_point=0)
    assert back.log_end_offset == end
    assert [v for _, _, v in read_all(back)][cut_end:] == [f"new-{i}".encode() for i in range(appended_after_cut)]
    assert back.leader_epochs.entries[-1] == (5, cut_end)
    assert all(int(p.stem) < end for p in d.glob("*.log")), sorted(p.name for p in d.glob("*.log"))
    assert any("dropped" in r for r in back.recovery_report.reasons), back.recovery_report


def test_a_producer_snapshot_of_a_truncated_history_brought_back_by_a_crash_is_not_used(tmp_path: Path) -> None:
    """A leader of epoch 3 wrote an idempotent producer's batch at offset 4 and snapshotted
    its producers; as a follower it cut its log back to 4 (the snapshot went with it) and took
    the new leader's batches, none of them that producer's. The crash came before the
    snapshot's deletion reached the disk. Loading that snapshot would answer the producer's
    retry of its batch as a duplicate at offset 4, which holds another record: acknowledged,
    never stored (replication simulation seed 1002326, stretch 4). The snapshot records the
    batch the log ended with; one whose batch is not in the log is not used."""
    config = cfg()
    lg = new_log(tmp_path, config)
    for i in range(4):
        lg.append_as_leader(values_batch([f"a-{i}".encode()]), leader_epoch=2, now_ms=NOW)
    retried = encode_batch([b"retried-0", b"retried-1"], producer_id=1001, producer_epoch=0, base_sequence=0)
    assert lg.append_as_leader(retried, leader_epoch=3, now_ms=NOW).base_offset == 4
    for _ in range(11):
        lg.append_as_leader(values_batch([b"old-history"]), leader_epoch=3, now_ms=NOW)
    lg.take_producer_snapshot()  # at 17, as a roll takes it
    d = tmp_path / f"{TOPIC}-0"
    stale = {p.name: p.read_bytes() for p in d.glob("*.snapshot")}
    assert list(stale) == ["00000000000000000017.snapshot"], list(stale)
    assert lg.truncate_to(4, NOW) == 4
    assert not list(d.glob("*.snapshot"))
    while lg.log_end_offset < 20:
        lg.append_as_leader(values_batch([b"new-history"]), leader_epoch=4, now_ms=NOW)
    crash(lg)
    for name, content in stale.items():
        (d / name).write_bytes(content)  # its deletion never reached the disk
    back = reopen(tmp_path, config, recovery_point=0)
    assert 1001 not in back.producer_state.producers
    assert not (d / "00000000000000000017.snapshot").exists()
    again = back.append_as_leader(retried, leader_epoch=5, now_ms=NOW)
    assert (again.base_offset, again.duplicate) == (20, False), again  # written, not a duplicate at 4
    assert [v for o, _, v in read_all(back) if o >= 20] == [b"retried-0", b"retried-1"]
    # A snapshot of this history is used as before: the retry is now a duplicate.
    back.take_producer_snapshot()
    crash(back)
    kept = reopen(tmp_path, config, recovery_point=0)
    assert 1001 in kept.producer_state.producers
    assert kept.append_as_leader(retried, leader_epoch=5, now_ms=NOW).duplicate
