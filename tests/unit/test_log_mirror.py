"""Log.append_mirrored: a mirror topic's leader takes another cluster's batches at their own
offsets. Every batch must come out byte for byte as the source holds it, but for the
partition leader epoch (bytes 12-15), which becomes the mirror's own; transactions must read
the same (last stable offset, aborted-transaction index)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from cluster.protocol.record_batch import InvalidRecordBatch, iter_headers
from cluster.protocol.records import Record, encode_batch
from cluster.storage.log import Log, UnexpectedAppendOffset
from tests.batches import values_batch
from tests.unit.test_log import NOW, append, cfg, crash, new_log, reopen
from tests.unit.test_txn_log import marker, txn_batch

MIRROR_EPOCH = 7


def batches_of(buf: bytes) -> list[tuple[int, bytes]]:
    """(base offset, bytes) of every whole batch in `buf`."""
    return [(h.base_offset, bytes(buf[p : p + h.size_bytes])) for p, h in iter_headers(buf)]


def disk(lg: Log) -> list[tuple[int, bytes]]:
    """Every batch of the log, as its segment files hold them."""
    return [b for seg in lg.segments for b in batches_of(seg.log_path.read_bytes())]


def without_epoch(batch: bytes) -> bytes:
    return batch[:12] + batch[16:]


def epoch_of(batch: bytes) -> int:
    return int(struct.unpack_from(">i", batch, 12)[0])


def assert_mirrors(mirror: Log, source_batches: list[tuple[int, bytes]]) -> None:
    """The mirror's disk holds exactly these batches, at their offsets, byte for byte but
    bytes 12-15, which carry the mirror's epoch."""
    got = disk(mirror)
    assert [o for o, _ in got] == [o for o, _ in source_batches]
    assert [without_epoch(b) for _, b in got] == [without_epoch(b) for _, b in source_batches]
    assert {epoch_of(b) for _, b in got} == {MIRROR_EPOCH}


def source_log(tmp_path: Path) -> Log:
    """Plain, committed, aborted and open transactions, with markers, under epoch 0."""
    lg = new_log(tmp_path / "source", cfg())
    append(lg, values_batch([b"plain-0", b"plain-1"]))  # 0-1
    append(lg, txn_batch(7, 0, b"committed-a", b"committed-b"))  # 2-3
    append(lg, txn_batch(8, 0, b"aborted"))  # 4
    marker(lg, 7, commit=True)  # 5
    append(lg, values_batch([b"idempotent"], producer_id=9, producer_epoch=0, base_sequence=0))  # 6
    marker(lg, 8, commit=False)  # 7
    append(lg, txn_batch(7, 2, b"open"))  # 8, left open
    return lg


def read_whole(lg: Log, start: int = 0) -> bytes:
    return lg.read(max(start, lg.log_start_offset), 1 << 20, lg.log_end_offset, min_one_batch=True)


def test_a_mirror_holds_the_sources_batches_and_transactions(tmp_path: Path) -> None:
    source = source_log(tmp_path)
    mirror = new_log(tmp_path / "mirror", cfg())
    result = mirror.append_mirrored(read_whole(source), leader_epoch=MIRROR_EPOCH, now_ms=NOW)
    assert (result.first_offset, result.last_offset, result.offsets_appended, result.log_end_offset) == (0, 8, 9, 9)
    assert_mirrors(mirror, disk(source))
    for hw in range(0, 10):
        assert mirror.last_stable_offset(hw) == source.last_stable_offset(hw), hw
    assert mirror.collect_aborted(0, 9) == source.collect_aborted(0, 9) != []
    assert mirror.first_open_transaction_offset() == source.first_open_transaction_offset() == 8
    assert {p: (e.epoch, e.last_seq) for p, e in mirror.producer_state.producers.items()} == \
        {p: (e.epoch, e.last_seq) for p, e in source.producer_state.producers.items()}
    assert mirror.leader_epochs.entries == [(MIRROR_EPOCH, 0)]
    # The same after a crash: the aborted index and producer state are rebuilt from the copy.
    crash(mirror)
    mirror = reopen(tmp_path / "mirror", cfg(), recovery_point=0)
    assert mirror.collect_aborted(0, 9) == source.collect_aborted(0, 9)
    assert mirror.last_stable_offset(9) == source.last_stable_offset(9) == 8


def test_gaps_stay_gaps_and_an_empty_mirror_starts_at_the_first_batch(tmp_path: Path) -> None:
    source = source_log(tmp_path)
    every = batches_of(read_whole(source))
    # Compaction left whole batches out and one batch with fewer records than its span;
    # retention took the first one: the mirror's log starts at the second batch.
    compacted = encode_batch([Record(11, NOW, b"k", b"kept", ())], base_offset=10, last_offset_delta=4)
    kept = [every[1], every[3], every[5], every[6], (10, compacted)]
    mirror = new_log(tmp_path / "mirror", cfg())
    payload = b"".join(b for _, b in kept)
    result = mirror.append_mirrored(payload, leader_epoch=MIRROR_EPOCH, now_ms=NOW)
    assert (result.first_offset, result.log_end_offset) == (2, 15)
    assert mirror.log_start_offset == 2
    assert_mirrors(mirror, kept)
    # Reads in a gap answer from the next batch, as on the source.
    assert batches_of(mirror.read(4, 1 << 20, 15, min_one_batch=True))[0][0] == 5


def test_a_retry_is_skipped_and_a_straddling_batch_refused(tmp_path: Path) -> None:
    source = source_log(tmp_path)
    every = batches_of(read_whole(source))
    mirror = new_log(tmp_path / "mirror", cfg())
    first_half = b"".join(b for _, b in every[:3])
    mirror.append_mirrored(first_half, leader_epoch=MIRROR_EPOCH, now_ms=NOW)
    end = mirror.log_end_offset
    # The same request again (its answer was lost): nothing is written, nothing refused.
    again = mirror.append_mirrored(first_half, leader_epoch=MIRROR_EPOCH, now_ms=NOW)
    assert (again.offsets_appended, again.batches_skipped, again.log_end_offset) == (0, 3, end)
    # A retry overlapping what follows: the old batches are skipped, the new appended.
    more = mirror.append_mirrored(b"".join(b for _, b in every[1:]), leader_epoch=MIRROR_EPOCH, now_ms=NOW)
    assert (more.batches_skipped, more.first_offset, more.log_end_offset) == (2, end, 9)
    assert_mirrors(mirror, every)
    # A batch straddling the log end: the logs diverged; nothing is written.
    other = encode_batch([Record(8, NOW, None, b"x", ()), Record(9, NOW, None, b"y", ())])
    with pytest.raises(UnexpectedAppendOffset, match="straddles the log end offset 9"):
        mirror.append_mirrored(other, leader_epoch=MIRROR_EPOCH, now_ms=NOW)
    assert mirror.log_end_offset == 9
    assert_mirrors(mirror, every)


def test_corrupt_or_unordered_batches_are_refused_whole(tmp_path: Path) -> None:
    source = source_log(tmp_path)
    every = batches_of(read_whole(source))
    mirror = new_log(tmp_path / "mirror", cfg())
    corrupt = bytearray(every[1][1])
    corrupt[-1] ^= 0xFF
    with pytest.raises(InvalidRecordBatch, match="CRC"):
        mirror.append_mirrored(every[0][1] + bytes(corrupt), leader_epoch=MIRROR_EPOCH, now_ms=NOW)
    with pytest.raises(InvalidRecordBatch, match="below the end"):
        mirror.append_mirrored(every[1][1] + every[0][1], leader_epoch=MIRROR_EPOCH, now_ms=NOW)
    assert mirror.log_end_offset == 0 and mirror.active_segment.size_bytes == 0


def test_followers_of_a_mirror_copy_it_with_its_gaps(tmp_path: Path) -> None:
    source = source_log(tmp_path)
    every = batches_of(read_whole(source))
    kept = [every[0], every[2], every[3], every[5]]  # gaps at 2-3 and 6
    mirror = new_log(tmp_path / "mirror", cfg())
    mirror.append_mirrored(b"".join(b for _, b in kept), leader_epoch=MIRROR_EPOCH, now_ms=NOW)
    follower = new_log(tmp_path / "follower", cfg())
    follower.append_as_follower(read_whole(mirror), now_ms=NOW)
    assert disk(follower) == disk(mirror)
    assert follower.leader_epochs.entries == mirror.leader_epochs.entries
    assert follower.collect_aborted(0, 9) == mirror.collect_aborted(0, 9) == source.collect_aborted(0, 9)


def test_promotion_forgets_the_sources_producers_and_carries_open_transactions_to_their_marker(
        tmp_path: Path) -> None:
    source = source_log(tmp_path)
    mirror = new_log(tmp_path / "mirror", cfg())
    mirror.append_mirrored(read_whole(source), leader_epoch=MIRROR_EPOCH, now_ms=NOW)
    assert sorted(mirror.producer_state.producers) == [7, 8, 9]
    assert mirror.promote_producers() == (2, [7])
    assert sorted(mirror.producer_state.producers) == [7]  # its transaction is open
    # A producer of this cluster that drew id 9 starts at sequence 0 as any new producer.
    assert append(mirror, values_batch([b"new"], producer_id=9, producer_epoch=0, base_sequence=0)).base_offset == 9
    # The snapshot taken at promotion keeps it so after a restart, and what is carried.
    state = mirror.close()
    mirror = reopen(tmp_path / "mirror", cfg(), recovery_point=state["log_end_offset"], clean_state=state)
    assert mirror.producer_state.producers[9].last_seq == 0
    assert mirror.producer_state.carried == {7}
    # The marker that ends the carried transaction forgets the source's producer 7: a
    # producer of this cluster given id 7 at epoch 0 is new, never a duplicate of the source's
    # batch at sequence 0 (issue 40: acknowledged at the offset of the aborted record).
    assert [e.producer_id for e in mirror.producer_state.carried_open()] == [7]
    marker(mirror, 7, commit=False)
    assert 7 not in mirror.producer_state.producers and not mirror.producer_state.carried
    assert mirror.last_stable_offset(mirror.log_end_offset) == mirror.log_end_offset
    mine = append(mirror, values_batch([b"mine"], producer_id=7, producer_epoch=0, base_sequence=0))
    assert mine.base_offset == 11 and not mine.duplicate
