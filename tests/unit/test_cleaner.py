"""In-process tests of log compaction (cluster.storage.cleaner) on real Log directories.

Records are appended through Log.append_as_leader (as the broker does), cleaned with
prepare_clean + commit_clean and read back through Log.read, validating every batch the
way recovery does (CRC, structure; a cleaned batch may hold fewer records than its
offset span). A "crash" closes the segment file descriptors without Log.close().
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

from cluster.protocol.record_batch import (
    TRANSACTIONAL_MASK,
    BatchHeader,
    iter_headers,
    validate_batch,
)
from cluster.protocol.records import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    Record,
    decode_batch,
    encode_batch,
)
from cluster.storage.cleaner import (
    CLEANER_CHECKPOINT,
    CleanerConfig,
    CleaningTask,
    cleanable_ratio,
    commit_clean,
    prepare_clean,
    read_checkpoint,
)
from cluster.storage.config import LogConfig
from cluster.storage.log import AppendResult, Log
from cluster.storage.segment import segment_name
from cluster.storage.txn_index import COMMIT, AbortedTxn, marker_type

NOW = 1_700_000_000_000
MINUTE = 60_000
HOUR = 3_600_000
TOPIC = "c"

Item = tuple[bytes | None, bytes | None, int]  # key, value, timestamp


# ---------------------------------------------------------------- helpers


def cfg(**overrides: object) -> LogConfig:
    """A compacted topic's config; keyword names use _ for ."""
    values: dict[str, object] = {"cleanup.policy": "compact", "segment.bytes": 16384}
    values.update({k.replace("_", "."): v for k, v in overrides.items()})
    return LogConfig.build({k: str(v) for k, v in values.items()})


def log_dir(root: Path) -> Path:
    return root / f"{TOPIC}-0"


def new_log(root: Path, config: LogConfig) -> Log:
    return Log.create(log_dir(root), TOPIC, 0, config, NOW)


def reopen(
    root: Path, config: LogConfig, *, recovery_point: int = 0, clean_state: dict[str, int] | None = None
) -> Log:
    return Log.open(log_dir(root), TOPIC, 0, config, recovery_point=recovery_point,
                    clean_state=clean_state, now_ms=NOW)


def crash(lg: Log) -> None:
    """Drop the log like kill -9 would: file contents stay, nothing is finalised."""
    for seg in lg.segments:
        seg.close()


def append(
    lg: Log,
    items: Sequence[Item],
    *,
    compression: int = COMPRESSION_NONE,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> AppendResult:
    recs = [Record(i, ts, k, v, ()) for i, (k, v, ts) in enumerate(items)]
    batch = encode_batch(recs, compression=compression, producer_id=producer_id,
                         producer_epoch=producer_epoch, base_sequence=base_sequence)
    return lg.append_as_leader(batch, leader_epoch=0, now_ms=NOW)


def key(i: int) -> bytes:
    return b"key-%04d" % i


def val(i: int) -> bytes:
    return b"value-%06d" % i


def append_updates(lg: Log, n: int, n_keys: int, per_batch: int, *, first: int = 0, **kw: int) -> None:
    """Update i (first ≤ i < first+n) sets key(i % n_keys) to val(i); per_batch per batch."""
    for start in range(first, first + n, per_batch):
        stop = min(first + n, start + per_batch)
        append(lg, [(key(i % n_keys), val(i), NOW) for i in range(start, stop)], **kw)


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


def check_batch(raw: bytes) -> tuple[BatchHeader, list[Record]]:
    """Validate (CRC, structure, as recovery does) and decode one stored batch."""
    header = validate_batch(raw, from_producer=False)
    _, records = decode_batch(raw)
    assert len(records) == header.records_count
    assert all(header.base_offset <= r.offset <= header.last_offset for r in records)
    return header, records


def read_batches(lg: Log) -> list[tuple[BatchHeader, list[Record], bytes]]:
    """Every batch from the log start to the log end, via Log.read."""
    out = []
    offset = lg.log_start_offset
    while offset < lg.log_end_offset:
        buf = lg.read(offset, 1 << 16, lg.log_end_offset, min_one_batch=True)
        assert buf, f"read at {offset} returned nothing below log end {lg.log_end_offset}"
        for raw in split(buf):
            header, records = check_batch(raw)
            assert header.last_offset >= offset, f"batch {header.base_offset}-{header.last_offset} before {offset}"
            out.append((header, records, raw))
            offset = header.next_offset
    return out


def read_all(lg: Log) -> list[Record]:
    records = [r for _, recs, _ in read_batches(lg) for r in recs]
    offsets = [r.offset for r in records]
    assert offsets == sorted(set(offsets)), "offsets must strictly increase"
    return records


def segment_records(lg: Log, segments: Iterable) -> list[Record]:
    """Records of the given segments, read straight from their files."""
    out = []
    for seg in segments:
        for raw in split(seg.log_path.read_bytes()):
            out += check_batch(raw)[1]
    return out


def latest(records: Iterable[Record]) -> dict[bytes | None, Record]:
    best: dict[bytes | None, Record] = {}
    for r in records:
        if r.key not in best or best[r.key].offset < r.offset:
            best[r.key] = r
    return best


def clean(lg: Log, now_ms: int = NOW, config: CleanerConfig | None = None) -> CleaningTask:
    task = prepare_clean(lg, now_ms, config or CleanerConfig())
    assert task is not None, "expected something to clean"
    assert commit_clean(task, now_ms)
    return task


def files(directory: Path, suffix: str) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(suffix))


def shape(lg: Log) -> list[tuple[int, int, int]]:
    return [(s.base_offset, s.size_bytes, s.next_offset) for s in lg.segments]


# ---------------------------------------------------------------- 100k updates over 1k keys


def test_100k_updates_over_1k_keys_keep_latest_value_per_key(tmp_path: Path) -> None:
    lg = new_log(tmp_path, cfg(segment_bytes=65536))
    append_updates(lg, 100_000, 1000, 100)
    assert len(lg.segments) >= 30
    before = read_all(lg)
    assert [r.offset for r in before] == list(range(100_000))
    original = {r.offset: r for r in before}
    active_base = lg.active_segment.base_offset
    active_records = [r for r in before if r.offset >= active_base]
    # What the inactive segments must hold: per key the latest record below the active segment.
    expected_inactive = sorted(latest(r for r in before if r.offset < active_base).values(), key=lambda r: r.offset)
    assert len(expected_inactive) == 1000

    task = prepare_clean(lg, NOW, CleanerConfig())
    assert task is not None
    assert task.end_offset == active_base
    assert commit_clean(task, NOW)
    assert task.records_kept == 1000
    assert task.records_removed == active_base - 1000
    assert read_checkpoint(lg) == active_base
    assert files(lg.dir, ".cleaned") == [] and files(lg.dir, ".swap") == []

    # The cleaned (inactive) segments: exactly one record per key, unchanged offsets.
    cleaned = segment_records(lg, lg.segments[:-1])
    assert cleaned == expected_inactive
    assert all(original[r.offset] == r for r in cleaned)
    assert lg.active_segment.base_offset == active_base
    assert segment_records(lg, [lg.active_segment]) == active_records

    # The whole log through Log.read: the latest value of every key, nothing else moved.
    assert (lg.log_start_offset, lg.log_end_offset) == (0, 100_000)
    after = read_all(lg)
    assert len(after) == 1000 + len(active_records)
    assert after == expected_inactive + active_records
    assert {k: r.value for k, r in latest(after).items()} == {key(k): val(99_000 + k) for k in range(1000)}

    # Reads inside gaps start at the next batch holding a kept record.
    kept = [r.offset for r in after]
    kept_set = set(kept)
    probes = [o for o in range(0, active_base, 379) if o not in kept_set]
    assert len(probes) > 100
    for offset in probes:
        buf = lg.read(offset, 4096, lg.log_end_offset, min_one_batch=True)
        header, records = check_batch(split(buf)[0])
        next_kept = min(o for o in kept if o >= offset)
        assert header.base_offset <= next_kept <= header.last_offset
        assert header.last_offset >= offset
        assert min(r.offset for r in records if r.offset >= offset) == next_kept

    # Nothing new: a second pass is a no-op, also with appends that do not roll.
    assert prepare_clean(lg, NOW, CleanerConfig()) is None
    append(lg, [(key(1), b"newer", NOW)])
    assert lg.active_segment.base_offset == active_base
    assert prepare_clean(lg, NOW, CleanerConfig()) is None


# ---------------------------------------------------------------- tombstones


def test_tombstones_hide_older_values_and_go_after_delete_retention(tmp_path: Path) -> None:
    # Dirty ratio 0.01: the second pass below must run although little is dirty.
    lg = new_log(tmp_path, cfg(delete_retention_ms=HOUR, min_cleanable_dirty_ratio="0.01"))
    A, B, C, D, E, Z = b"A", b"B", b"C", b"D", b"E", b"Z"
    append(lg, [(A, b"a1", NOW - 3 * HOUR), (B, b"b1", NOW - 3 * HOUR), (C, b"c1", NOW - 3 * HOUR),
                (D, b"d1", NOW - 3 * HOUR), (E, b"e1", NOW - 3 * HOUR)])  # offsets 0-4
    lg.roll(NOW)
    append(lg, [(A, None, NOW - 2 * HOUR),  # 5: older than the horizon: removed with the key
                (B, None, NOW - 10 * MINUTE),  # 6: recent: kept, hides b1
                (C, b"c2", NOW - 5 * MINUTE),  # 7
                (E, None, NOW - HOUR)])  # 8: exactly at the horizon: not older, kept
    lg.roll(NOW)
    append(lg, [(Z, b"z1", NOW)])  # 9, active
    clean(lg, NOW)
    got = [(r.offset, r.key, r.value) for r in read_all(lg)]
    assert got == [(3, D, b"d1"), (6, B, None), (7, C, b"c2"), (8, E, None), (9, Z, b"z1")]

    # Later, once B's and E's tombstones are old too, the next pass (with new dirty data) drops them.
    append(lg, [(Z, b"z2", NOW)])  # 10
    lg.roll(NOW)
    append(lg, [(Z, b"z3", NOW)])  # 11, active
    clean(lg, NOW + HOUR)
    got = [(r.offset, r.key, r.value) for r in read_all(lg)]
    assert got == [(3, D, b"d1"), (7, C, b"c2"), (10, Z, b"z2"), (11, Z, b"z3")]
    assert (lg.log_start_offset, lg.log_end_offset) == (0, 12)


def test_tombstone_in_a_later_segment_hides_the_value_in_an_earlier_one(tmp_path: Path) -> None:
    lg = new_log(tmp_path, cfg(delete_retention_ms=HOUR))
    for i, (k, v) in enumerate([(b"k", b"old"), (b"other", b"x" * 150), (b"k", None), (b"tail", b"t")]):
        if i:
            lg.roll(NOW)
        append(lg, [(k, v, NOW)])
    assert [s.base_offset for s in lg.segments] == [0, 1, 2, 3]
    clean(lg, NOW)
    assert [(r.offset, r.key, r.value) for r in read_all(lg)] == [
        (1, b"other", b"x" * 150), (2, b"k", None), (3, b"tail", b"t")]


# ---------------------------------------------------------------- batch formats


@pytest.mark.parametrize("codec", [COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD],
                         ids=["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_are_compacted_and_stay_compressed(tmp_path: Path, codec: int) -> None:
    lg = new_log(tmp_path, cfg(segment_bytes=2048))
    for b in range(40):
        # 25 records a batch over 30 keys; batch 20 has unique keys that are never updated.
        items = [(key(1000 + j) if b == 20 else key((b * 25 + j) % 30), val(b * 25 + j) * 3, NOW + b)
                 for j in range(25)]
        append(lg, items, compression=codec)
    assert len(lg.segments) >= 4
    before = read_all(lg)
    original_raw = {h.base_offset: raw for h, _, raw in read_batches(lg)}
    active_base = lg.active_segment.base_offset
    clean(lg, NOW)

    want = sorted(latest(r for r in before if r.offset < active_base).values(), key=lambda r: r.offset)
    want += [r for r in before if r.offset >= active_base]
    assert read_all(lg) == want
    whole = partial = 0
    for header, records, raw in read_batches(lg):
        assert header.compression == codec
        if header.base_offset >= active_base:
            continue
        if len(records) == header.last_offset_delta + 1:
            whole += 1
            assert raw == original_raw[header.base_offset]  # untouched batches are copied verbatim
        else:
            partial += 1
    assert whole >= 1  # batch 20 (unique keys)
    assert partial >= 1


def test_idempotent_producer_fields_survive_and_sequences_continue(tmp_path: Path) -> None:
    lg = new_log(tmp_path, cfg(segment_bytes=1024))
    pid, epoch = 77, 3
    seq = 0
    for b in range(30):
        items = [(key((b * 10 + j) % 15), val(b * 10 + j), NOW) for j in range(10)]
        append(lg, items, producer_id=pid, producer_epoch=epoch, base_sequence=seq)
        seq += 10
    headers_before = {h.base_offset: h for h, _, _ in read_batches(lg)}
    active_base = lg.active_segment.base_offset
    clean(lg, NOW)
    batches = read_batches(lg)
    assert any(len(recs) < h.last_offset_delta + 1 for h, recs, _ in batches)
    for h, _, _ in batches:
        orig = headers_before[h.base_offset]
        assert (h.producer_id, h.producer_epoch, h.base_sequence, h.last_offset_delta,
                h.partition_leader_epoch, h.last_sequence) == (
                orig.producer_id, orig.producer_epoch, orig.base_sequence, orig.last_offset_delta,
                orig.partition_leader_epoch, orig.last_sequence)
    assert {h.base_offset for h, _, _ in batches if h.base_offset >= active_base} == {
        o for o in headers_before if o >= active_base}

    def next_batch() -> list[Item]:
        return [(key(99), b"after-%d" % seq, NOW)]

    # The producer's next sequence still appends; a retry of it is a duplicate.
    r = append(lg, next_batch(), producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    assert not r.duplicate and r.base_offset == 300
    dup = append(lg, next_batch(), producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    assert dup.duplicate and dup.base_offset == 300
    seq += 1
    # Also after an unclean reopen (producer state rebuilt from snapshots and cleaned headers).
    crash(lg)
    lg2 = reopen(tmp_path, lg.config)
    assert lg2.log_end_offset == 301
    dup = append(lg2, [(key(99), b"after-%d" % (seq - 1), NOW)], producer_id=pid, producer_epoch=epoch,
                 base_sequence=seq - 1)
    assert dup.duplicate and dup.base_offset == 300
    r = append(lg2, next_batch(), producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    assert not r.duplicate and r.base_offset == 301


# ---------------------------------------------------------------- reopening


def build_cleaned(root: Path, config: LogConfig, n: int = 6000, n_keys: int = 200) -> Log:
    lg = new_log(root, config)
    append_updates(lg, n, n_keys, 50)
    clean(lg, NOW)
    return lg


def test_cleaned_log_reopens_cleanly_and_after_a_crash_with_identical_contents(tmp_path: Path) -> None:
    config = cfg(segment_bytes=8192)
    lg = build_cleaned(tmp_path, config)
    expected = read_all(lg)
    expected_shape = shape(lg)
    assert len(expected) < 6000
    assert any(size == 0 for _, size, _ in expected_shape[:-1])  # fully cleaned-out segments

    state = lg.close()
    lg2 = reopen(tmp_path, config, recovery_point=lg.log_end_offset, clean_state=state)
    assert lg2.recovery_report is not None and lg2.recovery_report.clean
    assert read_all(lg2) == expected
    assert [(b, s) for b, s, _ in shape(lg2)] == [(b, s) for b, s, _ in expected_shape]
    assert (lg2.log_start_offset, lg2.log_end_offset) == (0, 6000)

    crash(lg2)
    lg3 = reopen(tmp_path, config, recovery_point=0, clean_state=None)
    report = lg3.recovery_report
    assert report is not None and not report.clean
    assert report.bytes_truncated == 0 and report.segments_deleted == 0, report
    assert report.bytes_scanned == sum(s for _, s, _ in expected_shape)
    assert read_all(lg3) == expected
    assert [(b, s) for b, s, _ in shape(lg3)] == [(b, s) for b, s, _ in expected_shape]
    assert append(lg3, [(b"k", b"v", NOW)]).base_offset == 6000
    # The checkpoint survived: nothing to do until new data rolls.
    assert read_checkpoint(lg3) == expected_shape[-1][0]
    assert prepare_clean(lg3, NOW, CleanerConfig()) is None


def copy_log(src: Path, dst_root: Path) -> Path:
    shutil.copytree(log_dir(src), log_dir(dst_root))
    return dst_root


def test_interrupted_swap_is_completed_at_open(tmp_path: Path) -> None:
    config = cfg(segment_bytes=8192)
    lg = new_log(tmp_path / "a", config)
    append_updates(lg, 6000, 200, 50)
    task = prepare_clean(lg, NOW, CleanerConfig())
    assert task is not None and task.groups
    crashed = copy_log(tmp_path / "a", tmp_path / "b")  # with the .cleaned files
    assert commit_clean(task, NOW)
    expected = read_all(lg)
    expected_logs = files(lg.dir, ".log")

    # The crash: every .cleaned renamed to .swap, no old segment deleted yet.
    d = log_dir(crashed)
    for cleaned in d.glob("*.log.cleaned"):
        cleaned.rename(cleaned.with_name(cleaned.name.replace(".log.cleaned", ".log.swap")))
    assert files(d, ".swap")
    lg2 = reopen(crashed, config)
    assert files(d, ".swap") == [] and files(d, ".cleaned") == []
    assert read_all(lg2) == expected
    assert files(d, ".log") == expected_logs


def test_interrupted_swap_of_a_multi_segment_group_is_completed_at_open(tmp_path: Path) -> None:
    """A group of several small segments whose last input is cleaned out entirely."""
    config = cfg(segment_bytes=8192)
    lg = new_log(tmp_path / "a", config)
    append_updates(lg, 6000, 200, 50)
    clean(lg, NOW)  # small cleaned segments now, then every key updated again
    append_updates(lg, 6000, 200, 50, first=6000)
    task = prepare_clean(lg, NOW, CleanerConfig())
    assert task is not None
    multi = [g for g in task.groups if len(g.inputs) > 1]
    assert multi, [len(g.inputs) for g in task.groups]
    crashed = copy_log(tmp_path / "a", tmp_path / "b")
    assert commit_clean(task, NOW)
    expected = read_all(lg)

    d = log_dir(crashed)
    for cleaned in d.glob("*.log.cleaned"):
        cleaned.rename(cleaned.with_name(cleaned.name.replace(".log.cleaned", ".log.swap")))
    lg2 = reopen(crashed, config)
    got = read_all(lg2)
    stale = [(r.offset, r.key) for r in got if r not in expected]
    assert not stale, f"{len(stale)} superseded record(s) came back after the swap, first {stale[:3]}"
    assert got == expected
    assert files(d, ".log") == files(lg.dir, ".log")


def test_crash_between_groups_keeps_a_consistent_log_and_the_next_pass_finishes(tmp_path: Path) -> None:
    config = cfg(segment_bytes=8192)
    lg = new_log(tmp_path / "a", config)
    append_updates(lg, 6000, 200, 50)
    original = {r.offset: r for r in read_all(lg)}
    task = prepare_clean(lg, NOW, CleanerConfig())
    assert task is not None and len(task.groups) >= 3
    crashed = copy_log(tmp_path / "a", tmp_path / "b")
    assert commit_clean(task, NOW)
    expected = read_all(lg)

    # First group fully swapped in, second mid-swap, the rest still .cleaned.
    d = log_dir(crashed)
    g0, g1 = task.groups[0], task.groups[1]
    for seg in g0.inputs:
        for suffix in (".log", ".index", ".timeindex"):
            (d / (seg.log_path.stem + suffix)).unlink(missing_ok=True)
    (d / g0.path.name).rename(d / (segment_name(g0.inputs[0].base_offset) + ".log"))
    (d / g1.path.name).rename(d / g1.path.name.replace(".log.cleaned", ".log.swap"))
    lg2 = reopen(crashed, config)
    assert files(d, ".swap") == [] and files(d, ".cleaned") == []
    assert all(p.stem.isdigit() for p in d.glob("*.log")), files(d, ".log")
    got = read_all(lg2)
    assert all(original[r.offset] == r for r in got)
    assert latest(got) == latest(expected)
    assert read_checkpoint(lg2) == 0  # the pass never committed
    clean(lg2, NOW)
    assert read_all(lg2) == expected


def test_leftover_cleaned_files_are_deleted_at_open(tmp_path: Path) -> None:
    config = cfg(segment_bytes=8192)
    lg = new_log(tmp_path, config)
    append_updates(lg, 3000, 100, 50)
    before = read_all(lg)
    before_logs = files(lg.dir, ".log")
    task = prepare_clean(lg, NOW, CleanerConfig())
    assert task is not None
    assert len(files(lg.dir, ".log.cleaned")) == len(task.groups) > 0
    crash(lg)
    lg2 = reopen(tmp_path, config)
    assert files(lg2.dir, ".cleaned") == []
    assert files(lg2.dir, ".log") == before_logs
    assert read_all(lg2) == before
    assert not (lg2.dir / CLEANER_CHECKPOINT).exists()


# ---------------------------------------------------------------- races and policy


def test_commit_is_refused_when_retention_deleted_a_cleaned_segment(tmp_path: Path) -> None:
    config = cfg(segment_bytes=8192, cleanup_policy="compact,delete")
    lg = new_log(tmp_path, config)
    append_updates(lg, 3000, 100, 50)
    task = prepare_clean(lg, NOW, CleanerConfig())
    assert task is not None
    first = lg.segments[0]
    assert any(first in g.inputs for g in task.groups)

    # Retention (by size) removes exactly the first segment while the clean was prepared.
    lg.config = cfg(segment_bytes=8192, cleanup_policy="compact,delete",
                    retention_bytes=lg.size_bytes - first.size_bytes)
    assert lg.delete_old_segments(NOW) == 1
    new_start = lg.log_start_offset
    assert new_start == first.next_offset
    before = read_all(lg)
    before_shape = shape(lg)
    segments_before = list(lg.segments)

    assert commit_clean(task, NOW) is False
    assert lg.segments == segments_before and shape(lg) == before_shape
    assert files(lg.dir, ".cleaned") == [] and files(lg.dir, ".swap") == []
    assert not (lg.dir / CLEANER_CHECKPOINT).exists()
    assert read_all(lg) == before
    assert before[0].offset >= new_start

    # The next pass works on what is left.
    lg.config = config
    clean(lg, NOW)
    assert latest(read_all(lg)) == latest(before)


def test_min_cleanable_dirty_ratio(tmp_path: Path) -> None:
    lg = new_log(tmp_path, cfg(segment_bytes=8192, min_cleanable_dirty_ratio="0.5"))
    append_updates(lg, 3000, 100, 50)
    clean(lg, NOW)
    checkpoint = read_checkpoint(lg)
    # New updates: one more inactive segment's worth is dirty.
    first = lg.log_end_offset
    while len([s for s in lg.segments[:-1] if s.base_offset >= checkpoint]) < 1:
        append_updates(lg, 50, 100, 50, first=first)
        first += 50
    inactive = lg.segments[:-1]
    dirty = sum(s.size_bytes for s in inactive if s.base_offset >= checkpoint)
    ratio = dirty / sum(s.size_bytes for s in inactive)
    assert cleanable_ratio(lg, checkpoint) == ratio
    assert 0 < ratio < 1

    lg.config = cfg(segment_bytes=8192, min_cleanable_dirty_ratio=repr(min(1.0, ratio + 0.01)))
    assert prepare_clean(lg, NOW, CleanerConfig()) is None
    assert not files(lg.dir, ".cleaned")
    lg.config = cfg(segment_bytes=8192, min_cleanable_dirty_ratio=repr(ratio))
    task = prepare_clean(lg, NOW, CleanerConfig())
    assert task is not None
    assert commit_clean(task, NOW)
    assert read_checkpoint(lg) == lg.active_segment.base_offset


def test_max_compaction_lag_cleans_a_log_below_its_dirty_ratio(tmp_path: Path) -> None:
    """A dirty segment whose first record is older than max.compaction.lag.ms is cleaned
    even though the log's dirty ratio is below min.cleanable.dirty.ratio."""
    settings = {"segment_bytes": 8192, "min_cleanable_dirty_ratio": "0.99"}
    lg = new_log(tmp_path, cfg(**settings))
    append_updates(lg, 3000, 100, 50)
    clean(lg, NOW)  # all dirty: ratio 1
    checkpoint = read_checkpoint(lg)
    first = lg.log_end_offset
    while len([s for s in lg.segments[:-1] if s.base_offset >= checkpoint]) < 1:
        append_updates(lg, 50, 100, 50, first=first)
        first += 50
    assert 0 < cleanable_ratio(lg, checkpoint) < 0.99
    assert prepare_clean(lg, NOW + 2 * HOUR, CleanerConfig()) is None  # default: Long.MAX_VALUE
    lg.config = cfg(**settings, max_compaction_lag_ms=HOUR)
    assert prepare_clean(lg, NOW + HOUR, CleanerConfig()) is None  # exactly max.compaction.lag.ms old: not yet
    before = read_all(lg)
    task = clean(lg, NOW + HOUR + 1)
    assert task.end_offset == lg.active_segment.base_offset == read_checkpoint(lg)
    assert latest(read_all(lg)) == latest(before)


def test_min_compaction_lag_keeps_recent_segments_dirty(tmp_path: Path) -> None:
    """Segments from the first one holding a record newer than min.compaction.lag.ms on are
    not cleaned; older ones are."""
    lg = new_log(tmp_path, cfg(segment_bytes=4096, min_compaction_lag_ms=HOUR))
    for b in range(20):  # old updates of 100 keys, then recent ones
        append(lg, [(key(j), val(b * 100 + j), NOW - 2 * HOUR) for j in range(0, 100, 5)])
    lg.roll(NOW)
    recent_base = lg.log_end_offset
    for b in range(20):
        append(lg, [(key(j), val(10_000 + b * 100 + j), NOW) for j in range(0, 100, 5)])
    assert lg.active_segment.base_offset > recent_base
    before = read_all(lg)
    task = clean(lg, NOW)
    assert task.end_offset == recent_base == read_checkpoint(lg)
    after = read_all(lg)
    assert [r for r in after if r.offset >= recent_base] == [r for r in before if r.offset >= recent_base]
    assert [r.offset for r in after if r.offset < recent_base] == sorted(
        r.offset for r in latest(r for r in before if r.offset < recent_base).values())
    assert prepare_clean(lg, NOW + HOUR - 1, CleanerConfig()) is None  # the recent records are still too new
    clean(lg, NOW + HOUR)
    assert read_checkpoint(lg) == lg.active_segment.base_offset


def test_a_full_dedupe_buffer_cleans_part_of_the_dirty_section_per_pass(tmp_path: Path) -> None:
    # Ratio 0: a pass may stop inside a segment, which the ratio then counts as clean.
    lg = new_log(tmp_path, cfg(segment_bytes=4096, min_cleanable_dirty_ratio="0"))
    # 40 batches of 10 fresh keys each, then every key once more.
    for b in range(40):
        append(lg, [(key(b * 10 + j), val(b * 10 + j), NOW) for j in range(10)])
    for b in range(40):
        append(lg, [(key(b * 10 + j), val(1000 + b * 10 + j), NOW) for j in range(10)])
    before = read_all(lg)
    active_base = lg.active_segment.base_offset
    small = CleanerConfig(dedupe_buffer_bytes=24 * 100)  # room for 100 keys
    task = clean(lg, NOW, small)
    assert task.end_offset == 100  # the map filled after 10 batches of new keys
    assert read_checkpoint(lg) == 100
    assert [r.offset for r in read_all(lg)] == [r.offset for r in before]  # nothing below 100 was superseded
    passes = 1
    while read_checkpoint(lg) < active_base:
        clean(lg, NOW, small)
        passes += 1
        assert passes < 20
    assert passes >= 4
    after = read_all(lg)
    want = sorted(latest(r for r in before if r.offset < active_base).values(), key=lambda r: r.offset)
    assert [r for r in after if r.offset < active_base] == want
    assert latest(after) == latest(before)


def test_io_rate_limit_paces_the_reads(tmp_path: Path) -> None:
    lg = new_log(tmp_path, cfg(segment_bytes=8192))
    append_updates(lg, 3000, 100, 50)
    slept: list[float] = []
    rate = 1_000_000.0
    task = prepare_clean(lg, NOW, CleanerConfig(io_max_bytes_per_second=rate), sleep=slept.append)
    assert task is not None
    inactive_bytes = sum(s.size_bytes for s in lg.segments[:-1])
    assert task.bytes_read >= 2 * inactive_bytes  # key map pass + rewrite pass
    # Each pause brings the reader back to `rate`; the fake sleep does not advance the clock.
    assert slept
    assert max(slept) <= task.bytes_read / rate + 0.01
    assert commit_clean(task, NOW)


def test_a_flush_racing_with_a_commit_survives_the_replaced_segments(tmp_path: Path) -> None:
    """The broker's flush_loop runs Log.flush_segments in a worker thread over a snapshot of
    the segment list while commit_clean (trio thread) may replace and close those segments.
    The flush must skip them, as it skips segments retention deleted, not fail."""
    lg = new_log(tmp_path, cfg(segment_bytes=8192))
    append_updates(lg, 3000, 100, 50)
    task = prepare_clean(lg, NOW, CleanerConfig())
    assert task is not None
    snapshot = list(lg.segments)  # what flush_segments' list(self.segments) took
    assert commit_clean(task, NOW)
    current = lg.segments
    lg.segments = snapshot
    try:
        lg.flush_segments(lg.log_end_offset)
    finally:
        lg.segments = current


# ---------------------------------------------------------------- transactions


def txn_append(lg: Log, pid: int, seq: int, items: Sequence[Item]) -> AppendResult:
    recs = [Record(i, ts, k, v, ()) for i, (k, v, ts) in enumerate(items)]
    batch = encode_batch(recs, producer_id=pid, producer_epoch=0, base_sequence=seq,
                         attributes_extra=TRANSACTIONAL_MASK)
    return lg.append_as_leader(batch, leader_epoch=0, now_ms=NOW)


def end_txn(lg: Log, pid: int, *, commit: bool) -> int:
    return lg.append_marker(producer_id=pid, producer_epoch=0, commit=commit, coordinator_epoch=0,
                            leader_epoch=0, now_ms=NOW).base_offset


def stored(lg: Log) -> list[tuple[int, bytes | None, bytes | None] | tuple[int, str]]:
    """(offset, key, value) of data records and (offset, "COMMIT"/"ABORT") of markers."""
    out: list[tuple[int, bytes | None, bytes | None] | tuple[int, str]] = []
    for header, records, raw in read_batches(lg):
        if header.is_control:
            out.append((header.base_offset, "COMMIT" if marker_type(raw) == COMMIT else "ABORT"))
        else:
            out += [(r.offset, r.key, r.value) for r in records]
    return out


def test_compaction_drops_aborted_data_then_its_marker_and_stops_at_an_open_transaction(tmp_path: Path) -> None:
    """Kafka's rules: an aborted transaction's records never supersede a committed value and
    are removed; its ABORT marker goes on a later pass, once older than delete.retention.ms;
    a COMMIT marker stays while its transaction's records do; nothing at or above the first
    offset of an open transaction is cleaned."""
    lg = new_log(tmp_path, cfg(delete_retention_ms=HOUR, min_cleanable_dirty_ratio="0.01"))
    txn_append(lg, 1, 0, [(b"k1", b"committed-1", NOW), (b"k2", b"committed-2", NOW)])  # 0-1
    assert end_txn(lg, 1, commit=True) == 2
    txn_append(lg, 2, 0, [(b"k1", b"aborted-1", NOW)])  # 3
    assert end_txn(lg, 2, commit=False) == 4
    append(lg, [(b"k2", b"plain-2", NOW)])  # 5
    lg.roll(NOW)
    txn_append(lg, 3, 0, [(b"k3", b"open-3", NOW)])  # 6: stays open through the first pass
    append(lg, [(b"k2", b"late-2", NOW)])  # 7
    lg.roll(NOW)
    append(lg, [(b"k9", b"active", NOW)])  # 8, the active segment
    assert lg.collect_aborted(0, 9) == [AbortedTxn(2, 3, 4, 5)]

    task = prepare_clean(lg, NOW, CleanerConfig(), first_unstable_offset=lg.first_open_transaction_offset())
    assert task is not None and task.end_offset == 6, "cleaned past the open transaction at offset 6"
    assert commit_clean(task, NOW)
    assert stored(lg) == [(0, b"k1", b"committed-1"), (2, "COMMIT"), (4, "ABORT"), (5, b"k2", b"plain-2"),
                          (6, b"k3", b"open-3"), (7, b"k2", b"late-2"), (8, b"k9", b"active")]
    assert lg.collect_aborted(0, 9) == [], "no aborted batch is left, so no index entry"
    assert task.records_removed == 2 and task.markers_removed == 0

    assert end_txn(lg, 3, commit=True) == 9
    lg.roll(NOW)
    append(lg, [(b"k9", b"active-2", NOW)])  # 10
    later = NOW + 2 * HOUR
    task = prepare_clean(lg, later, CleanerConfig(), first_unstable_offset=lg.first_open_transaction_offset())
    assert task is not None and commit_clean(task, later)
    # The ABORT marker had no batch left: gone. The COMMIT markers keep their records company.
    assert stored(lg) == [(0, b"k1", b"committed-1"), (2, "COMMIT"), (6, b"k3", b"open-3"),
                          (7, b"k2", b"late-2"), (8, b"k9", b"active"), (9, "COMMIT"), (10, b"k9", b"active-2")]
    assert task.markers_removed == 1
    crash(lg)
    lg = reopen(tmp_path, cfg(delete_retention_ms=HOUR, min_cleanable_dirty_ratio="0.01"))
    assert lg.collect_aborted(0, 11) == [] and lg.first_open_transaction_offset() is None
