"""write_atomic: the small durable files beside the logs (cluster/storage/checkpoint.py)."""

from __future__ import annotations

import threading
from pathlib import Path

from cluster.storage.checkpoint import write_atomic


def test_concurrent_writers_of_one_file_never_fail(tmp_path: Path) -> None:
    """The broker writes recovery-point-offset-checkpoint from two worker threads (the flush
    loop after segments roll, the periodic checkpoint): both used one temp file, so one's
    rename took the other's and the other's rename failed (ENOENT), which stopped the broker."""
    path = tmp_path / "recovery-point-offset-checkpoint"
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(300):
                write_atomic(path, f"{n} {i}\n".encode(), fsync=False)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert path.read_text().endswith(" 299\n")
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
