"""The log manager's background work as trio tasks: fsync, recovery points, retention,
compaction (Kafka's LogManager schedules the same). The file work runs in worker threads
where it can take long; the logs themselves stay synchronous (log.py)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from cluster.common.clock import Clock
from cluster.storage.cleaner import CleanerConfig, commit_clean, prepare_clean
from cluster.storage.log_manager import LogManager

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LogTaskSettings:
    """Broker configs of the background work (Kafka's names in the comments)."""

    flush_scheduler_interval_ms: int = 1000  # log.flush.scheduler.interval.ms
    flush_offset_checkpoint_interval_ms: int = 60_000  # log.flush.offset.checkpoint.interval.ms
    retention_check_interval_ms: int = 300_000  # log.retention.check.interval.ms
    cleaner_enable: bool = True  # log.cleaner.enable
    cleaner_backoff_ms: int = 15_000  # log.cleaner.backoff.ms
    cleaner: CleanerConfig = field(default_factory=CleanerConfig)


class LogTasks:
    def __init__(self, logs: LogManager, settings: LogTaskSettings, clock: Clock, *,
                 current: Callable[[], LogTaskSettings] | None = None) -> None:
        self.logs = logs
        self.settings = settings
        # The settings in force now (the cleaner's may change without a restart: dynamic
        # broker configs); the others are read once, at start.
        self.current = current or (lambda: self.settings)
        self.clock = clock
        self._flush_wanted = trio.Event()
        logs.on_flush_request = self._flush_wanted.set

    def start(self, nursery: trio.Nursery) -> None:
        nursery.start_soon(self.flush_loop)
        nursery.start_soon(self.checkpoint_loop)
        nursery.start_soon(self.retention_loop)
        nursery.start_soon(self.cleaner_loop)
        nursery.start_soon(self.deletion_loop)

    async def deletion_loop(self) -> None:
        """Remove the directories of deleted partitions in a worker thread (Kafka deletes them
        later too, file.delete.delay.ms): renamed `*-delete` at once, gone soon after; one a
        stop leaves is removed at the next start."""
        wanted = trio.Event()
        self.logs.on_delete_request = wanted.set
        try:
            while True:
                await wanted.wait()
                wanted = trio.Event()
                self.logs.on_delete_request = wanted.set
                doomed, self.logs.doomed = self.logs.doomed, []
                await trio.to_thread.run_sync(self.logs.remove_doomed, doomed)
        finally:
            self.logs.on_delete_request = None

    async def flush_loop(self) -> None:
        """fsync segments that rolled (or hit flush.messages / flush.ms) and advance recovery points."""
        interval_s = self.settings.flush_scheduler_interval_ms / 1000
        logs = self.logs
        while True:
            with trio.move_on_after(interval_s):
                await self._flush_wanted.wait()
            self._flush_wanted = trio.Event()
            logs.on_flush_request = self._flush_wanted.set
            pending = logs.take_pending_flushes() + logs.due_time_flushes(self.clock.now_ms())
            if not pending:
                continue
            for lg, offset in pending:
                try:
                    await trio.to_thread.run_sync(lg.flush_segments, offset)
                except (OSError, ValueError) as exc:
                    # The recovery point stays where it was; the next flush tries again.
                    log.error("flushing %s below offset %d failed: %s", lg.name, offset, exc)
                    continue
                lg.mark_flushed(offset, self.clock.now_ms())
            await trio.to_thread.run_sync(logs.checkpoint_recovery_points)

    async def checkpoint_loop(self) -> None:
        interval_s = self.settings.flush_offset_checkpoint_interval_ms / 1000
        while True:
            await trio.sleep(interval_s)
            await trio.to_thread.run_sync(self.logs.checkpoint_recovery_points)

    async def retention_loop(self) -> None:
        interval_s = self.settings.retention_check_interval_ms / 1000
        while True:
            await trio.sleep(interval_s)
            now = self.clock.now_ms()
            try:
                self.logs.cleanup(now)
            except OSError as exc:
                log.error("retention pass failed: %s", exc)
            for lg in list(self.logs.logs.values()):
                lg.producer_state.remove_expired(now)

    async def cleaner_loop(self) -> None:
        """Compact one log at a time; the heavy part runs in a worker thread."""
        if not self.settings.cleaner_enable:
            return
        while True:
            settings = self.current()
            await trio.sleep(settings.cleaner_backoff_ms / 1000)
            for lg in list(self.logs.logs.values()):
                if not lg.config.compact_enabled:
                    continue
                try:
                    unstable = lg.first_open_transaction_offset()
                    task = await trio.to_thread.run_sync(
                        functools.partial(prepare_clean, lg, self.clock.now_ms(), self.current().cleaner,
                                          first_unstable_offset=unstable))
                except OSError as exc:
                    log.warning("compaction of %s skipped: %s", lg.name, exc)
                    continue
                if task is None:
                    continue
                if self.logs.get(lg.topic, lg.partition) is not lg:
                    task.discard()  # the topic was deleted meanwhile
                    continue
                commit_clean(task, self.clock.now_ms())
