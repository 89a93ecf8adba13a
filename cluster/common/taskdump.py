"""Where every trio task of a process waits, as text: a Java thread dump for trio.

`kill -USR1 <pid>` of a broker or mirror worker logs it (see `dump_on_signal`): for each
task its name and the chain of coroutine frames it is suspended in, innermost last.
"""

from __future__ import annotations

import logging
import signal
import types
from collections.abc import Iterator
from typing import Any

import trio

log = logging.getLogger("dcmirror.taskdump")

MAX_TASKS = 2000  # a dump names at most this many tasks
MAX_DEPTH = 40  # frames per task


def _frames(coro: Any) -> Iterator[str]:
    depth = 0
    while coro is not None and depth < MAX_DEPTH:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None) or getattr(coro, "ag_frame", None)
        if isinstance(frame, types.FrameType):
            code = frame.f_code
            yield f"{code.co_filename}:{frame.f_lineno} {code.co_name}"
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None) or getattr(coro, "ag_await", None)
        depth += 1


def task_dump() -> str:
    """Every task under the root task, indented by nursery, with its frames."""
    lines: list[str] = []
    count = 0

    def walk(task: Any, indent: int) -> None:
        nonlocal count
        count += 1
        if count > MAX_TASKS:
            return
        pad = "  " * indent
        lines.append(f"{pad}task {task.name}")
        lines.extend(f"{pad}  at {f}" for f in _frames(task.coro))
        for nursery in task.child_nurseries:
            for child in nursery.child_tasks:
                walk(child, indent + 1)

    walk(trio.lowlevel.current_root_task(), 0)
    if count > MAX_TASKS:
        lines.append(f"... {count - MAX_TASKS} more tasks")
    return "\n".join(lines)


async def dump_on_signal(signum: int = signal.SIGUSR1) -> None:
    """Log the task dump at WARNING each time the process receives `signum`."""
    with trio.open_signal_receiver(signum) as signals:
        async for _ in signals:
            log.warning("trio tasks of this process:\n%s", task_dump())
