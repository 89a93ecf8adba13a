"""Index files keep at most INDEX_DESCRIPTORS_MAX descriptors open (cluster/storage/index.py):
a broker of 10,000 partitions with index entries ran out of descriptors (EMFILE at 20,000)
holding three per partition. Entries written through evicted descriptors are all on disk,
and a flush syncs a file whose descriptor was closed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cluster.storage import index
from cluster.storage.index import OffsetIndex, TimeIndex


def open_descriptors_to(directory: Path) -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(str(directory)):
                count += 1
        except OSError:
            continue
    return count


def test_index_files_share_a_bounded_number_of_descriptors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index, "INDEX_DESCRIPTORS_MAX", 4)
    files = []
    for i in range(10):
        offsets = OffsetIndex(tmp_path / f"{i:020d}.index", 100 * i, 1000)
        times = TimeIndex(tmp_path / f"{i:020d}.timeindex", 100 * i)
        offsets.open()
        times.open()
        files.append((offsets, times))
    for round_ in range(3):                       # round robin: every write may evict another file's
        for i, (offsets, times) in enumerate(files):
            offsets.append(100 * i + 10 * round_ + 5, 1000 * round_ + 7)
            times.maybe_append(1_000_000 + 10 * round_, 100 * i + 10 * round_ + 5)
            assert open_descriptors_to(tmp_path) <= 4
    for offsets, times in files:
        offsets.flush()                           # reopened for its fsync if its descriptor is gone
        times.flush()
    for i, (offsets, _) in enumerate(files):
        data = offsets.path.read_bytes()
        assert len(data) == 3 * OffsetIndex.entry_size, i
        again = OffsetIndex(offsets.path, 100 * i, 1000)
        again.load(10_000)
        assert again.entries == 3 and again.lookup(100 * i + 25) == 2007
    for offsets, times in files:
        offsets.close()
        times.close()
    assert open_descriptors_to(tmp_path) == 0 and not any(id(f) in index._open_files for pair in files for f in pair)


def test_a_flush_syncs_its_own_file_when_its_descriptor_number_is_reused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The flush thread read a file's descriptor, the event loop evicted it and opened another
    index file, which got the same number: the fsync must still reach the first file."""
    monkeypatch.setattr(index, "INDEX_DESCRIPTORS_MAX", 1)
    first = OffsetIndex(tmp_path / "a.index", 0, 1000)
    second = OffsetIndex(tmp_path / "b.index", 0, 1000)
    first.open()
    second.open()
    first.append(5, 7)
    synced: list[str] = []
    real_fsync = os.fsync

    def evicting_fsync(fd: int) -> None:          # the eviction lands between lookup and fsync
        second.append(6, 8)
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(index.os, "fsync", evicting_fsync)
    first.flush()
    assert synced == [str(tmp_path / "a.index")]
    first.close()
    second.close()
