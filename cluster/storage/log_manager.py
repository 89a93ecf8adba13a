"""LogManager: every partition log in one data directory, recovery points, clean shutdown."""

from __future__ import annotations

import functools
import logging
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from cluster.storage.checkpoint import sync_directory, write_atomic
from cluster.storage.config import LogConfig
from cluster.storage.log import Log, parse_partition_dir

log = logging.getLogger(__name__)

RECOVERY_POINT_FILE = "recovery-point-offset-checkpoint"
REPLICATION_OFFSET_FILE = "replication-offset-checkpoint"  # high watermarks, as Kafka names it
LOG_START_OFFSET_FILE = "log-start-offset-checkpoint"  # starts moved by DeleteRecords, as Kafka names it
CLEAN_SHUTDOWN_FILE = ".dcmirror-clean-shutdown"
METADATA_LOG_DIR = "__cluster_metadata-0"  # the quorum's own log (cluster/quorum), not a partition


def read_offset_checkpoint(path: Path, consequence: str) -> dict[str, int]:
    """Kafka's offset checkpoint file: version 0, a count, then `topic partition offset` lines;
    keyed by `topic-partition`. A missing or corrupt file reads as empty (logged)."""
    if not path.exists():
        return {}
    try:
        lines = path.read_text().splitlines()
        if int(lines[0]) != 0:
            raise ValueError("unknown version")
        points = {}
        for line in lines[2 : 2 + int(lines[1])]:
            topic, partition, offset = line.rsplit(" ", 2)
            points[f"{topic}-{int(partition)}"] = int(offset)
        return points
    except (ValueError, IndexError) as exc:
        log.warning("ignoring corrupt %s (%s): %s", path, exc, consequence)
        return {}


def write_offset_checkpoint(path: Path, offsets: dict[tuple[str, int], int]) -> None:
    lines = [f"{topic} {partition} {offset}" for (topic, partition), offset in offsets.items()]
    body = "0\n" + f"{len(lines)}\n" + "".join(line + "\n" for line in lines)
    write_atomic(path, body.encode())


class LogManager:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.logs: dict[tuple[str, int], Log] = {}
        # Logs whose segments below an offset await fsync: (log, offset).
        self.pending_flushes: list[tuple[Log, int]] = []
        self.on_flush_request: Callable[[], None] | None = None
        # Directories renamed `*-delete`, their files still to remove: by LogTasks' deletion
        # loop in a worker thread when one runs (`on_delete_request` set), else at once.
        # Removing them in the event loop took ~4 ms a partition: deleting 10,000 held it
        # up for ~40 s.
        self.doomed: list[Path] = []
        self.on_delete_request: Callable[[], None] | None = None

    def _request_flush(self, lg: Log, offset: int) -> None:
        self.pending_flushes.append((lg, offset))
        if self.on_flush_request:
            self.on_flush_request()

    # ---- startup -----------------------------------------------------------------------

    def _read_marker(self) -> dict[str, Any] | None:
        try:
            doc = orjson.loads((self.data_dir / CLEAN_SHUTDOWN_FILE).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        return doc if isinstance(doc, dict) else None

    def clean_shutdown_epoch(self) -> int:
        """The broker epoch the last clean shutdown recorded (Kafka's .kafka_cleanshutdown),
        -1 when the broker did not stop cleanly (or never ran): read before registering, so
        the controller can tell a broker that may have lost its unsynced tail (KIP-966)."""
        doc = self._read_marker() if (self.data_dir / CLEAN_SHUTDOWN_FILE).exists() else None
        return int(doc.get("broker_epoch", -1)) if doc is not None and "v" in doc else -1

    def load_all(self, config_for: Callable[[str], LogConfig], now_ms: int) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        marker = self.data_dir / CLEAN_SHUTDOWN_FILE
        clean: dict[str, dict[str, int]] | None = None
        if marker.exists():
            doc = self._read_marker()
            if doc is None:
                log.warning("clean shutdown marker is unreadable; recovering every log")
            else:
                clean = doc.get("logs", {}) if "v" in doc else doc  # v0: the logs' states alone
            marker.unlink()
            # Durably gone before anything is written: a marker that a machine crash brought
            # back would have the next start trust logs this run changed and never flushed
            # (replication simulation seed 1000916: a follower's truncated tail came back
            # beside the leader epoch that replaced it, and no recovery looked).
            sync_directory(self.data_dir)
        recovery_points = self.read_recovery_points()
        log_starts = read_offset_checkpoint(self.data_dir / LOG_START_OFFSET_FILE,
                                            "log start offsets fall back to the first segments' base offsets")
        for child in sorted(self.data_dir.iterdir()):
            if not child.is_dir():
                continue
            if child.name.endswith("-delete"):
                shutil.rmtree(child, ignore_errors=True)
                continue
            parsed = parse_partition_dir(child.name)
            if parsed is None or child.name == METADATA_LOG_DIR:
                continue
            topic, partition = parsed
            lg = Log.open(
                child,
                topic,
                partition,
                config_for(topic),
                recovery_point=recovery_points.get(child.name, 0),
                clean_state=clean.get(child.name) if clean is not None else None,
                now_ms=now_ms,
                log_start_offset=log_starts.get(child.name, 0),
            )
            lg.flush_requests = self._request_flush
            self.logs[(topic, partition)] = lg
        if clean is None and self.logs:
            scanned = sum(lg.recovery_report.bytes_scanned for lg in self.logs.values() if lg.recovery_report)
            log.info("recovery after unclean shutdown: scanned %d bytes across %d log(s)", scanned, len(self.logs))
        self.checkpoint_recovery_points()

    def read_recovery_points(self) -> dict[str, int]:
        return read_offset_checkpoint(self.data_dir / RECOVERY_POINT_FILE, "every log is recovered from its start")

    def checkpoint_recovery_points(self) -> None:
        write_offset_checkpoint(self.data_dir / RECOVERY_POINT_FILE,
                                {(lg.topic, lg.partition): lg.recovery_point for lg in self.logs.values()})

    def checkpoint_log_start_offsets(self) -> Callable[[], None]:
        """What writes where each log starts now (a DeleteRecords survives a restart); the
        file write may run in a thread."""
        offsets = {(lg.topic, lg.partition): lg.log_start_offset for lg in self.logs.values()}
        return functools.partial(write_offset_checkpoint, self.data_dir / LOG_START_OFFSET_FILE, offsets)

    # ---- topics ------------------------------------------------------------------------

    def get(self, topic: str, partition: int) -> Log | None:
        return self.logs.get((topic, partition))

    def create_log(self, topic: str, partition: int, config: LogConfig, now_ms: int, *,
                   index_files: bool = True) -> Log:
        key = (topic, partition)
        if key in self.logs:
            return self.logs[key]
        lg = Log.create(self.data_dir / f"{topic}-{partition}", topic, partition, config, now_ms,
                        index_files=index_files)
        lg.flush_requests = self._request_flush
        self.logs[key] = lg
        return lg

    def delete_log(self, topic: str, partition: int, *, keep_as_stray: bool = False) -> None:
        """Remove a partition log; with keep_as_stray, set it aside as `<dir>.<id>-stray` instead
        (a log found at startup that the metadata does not know: an operator decides)."""
        lg = self.logs.pop((topic, partition), None)
        if lg is None:
            return
        self.pending_flushes = [(x, o) for x, o in self.pending_flushes if x is not lg]
        for seg in lg.segments:
            seg.close()
        if keep_as_stray:
            stray = lg.dir.with_name(f"{lg.dir.name}.{uuid.uuid4().hex}-stray")
            lg.dir.rename(stray)
            log.warning("%s is not in the cluster metadata: kept as %s", lg.dir.name, stray.name)
            return
        # Rename first so a crash mid-delete does not resurrect the partition.
        doomed = lg.dir.with_name(f"{lg.dir.name}.{uuid.uuid4().hex}-delete")
        lg.dir.rename(doomed)
        if self.on_delete_request is None:
            shutil.rmtree(doomed, ignore_errors=True)
        else:
            self.doomed.append(doomed)
            self.on_delete_request()

    def remove_doomed(self, doomed: list[Path]) -> None:
        """Remove directories `delete_log` renamed (runs in a worker thread; a start removes
        any a crash left)."""
        for directory in doomed:
            shutil.rmtree(directory, ignore_errors=True)

    # ---- periodic work -----------------------------------------------------------------

    def take_pending_flushes(self) -> list[tuple[Log, int]]:
        pending, self.pending_flushes = self.pending_flushes, []
        return pending

    def cleanup(self, now_ms: int) -> int:
        return sum(lg.delete_old_segments(now_ms) for lg in list(self.logs.values()))

    def due_time_flushes(self, now_ms: int) -> list[tuple[Log, int]]:
        return [
            (lg, lg.log_end_offset)
            for lg in self.logs.values()
            if lg.unflushed_messages and now_ms - lg.last_flush_ms >= lg.config.flush_ms
        ]

    # ---- shutdown ----------------------------------------------------------------------

    def close(self, broker_epoch: int = -1) -> None:
        """Flush every log, then write the recovery points and the clean-shutdown marker
        (with the broker epoch the broker stops in)."""
        state = {lg.name: lg.close() for lg in self.logs.values()}
        self.checkpoint_recovery_points()
        self.checkpoint_log_start_offsets()()
        write_atomic(self.data_dir / CLEAN_SHUTDOWN_FILE,
                     orjson.dumps({"v": 1, "broker_epoch": broker_epoch, "logs": state}))
        log.info("logs closed cleanly: %d partition(s)", len(state))
