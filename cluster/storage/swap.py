"""Segment swaps of the log cleaner, and finishing one a crash interrupted.

The cleaner writes a compacted copy as `<base>.log.cleaned`, renames it `.swap`, deletes
the segments it replaces and renames the `.swap` to `<base>.log`. A crash between the
renames leaves a `.swap` beside (some of) the old segments; `Log` calls `complete_swaps`
when it loads the partition, before anything reads the files.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from cluster.protocol.record_batch import iter_headers
from cluster.storage.segment import segment_name

log = logging.getLogger(__name__)


def complete_swaps(directory: Path) -> None:
    """Finish a swap a crash interrupted: the `.swap` file replaces the segments it covers."""
    for swap in sorted(directory.glob("*.log.swap")):
        parts = swap.name.split(".")
        base = int(parts[0])
        if len(parts) == 4 and parts[1].isdigit():
            end = int(parts[1])
        else:
            end = base
            for _, header in iter_headers(swap.read_bytes()):
                end = header.next_offset
        for old in directory.glob("*.log"):
            if old.stem.isdigit() and base <= int(old.stem) < end:
                for suffix in (".log", ".index", ".timeindex"):
                    (directory / (old.stem + suffix)).unlink(missing_ok=True)
        os.replace(swap, directory / (segment_name(base) + ".log"))
        log.warning("completed an interrupted compaction swap of %s", swap)
