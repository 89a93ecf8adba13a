"""Children die with their supervisor, however the supervisor dies (kill -9 included).

A supervising process (``dcmirror up``, ``dcmirror mirror`` running several workers) holds
the write end of one pipe for as long as it lives and hands the read end to every child it
starts (``DCMIRROR_LIFELINE_FD``). Nobody ever writes to it: when the supervisor is gone the
kernel closes the write end, and each child's read returns end-of-file. The child then
stops as if it had been sent SIGTERM (brokers shut down in a controlled way, mirror workers
hand their partitions over) and, should that take longer than ``GRACE_S``, exits anyway.

Why not ``PR_SET_PDEATHSIG``: it follows the parent *thread*, and trio starts processes
from its worker threads, which exit when idle: children would be killed at random. A pipe
follows the process, works across exec and needs no polling.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

log = logging.getLogger("dcmirror.lifeline")

ENV = "DCMIRROR_LIFELINE_FD"
GRACE_S = 45.0

_lock = threading.Lock()
_read_fd: int | None = None


def child_fd() -> int:
    """The read end to pass to a child (pass_fds, and ENV in its environment). One pipe per
    process; its write end stays open until this process exits."""
    global _read_fd
    with _lock:
        if _read_fd is None:
            _read_fd, _write_fd = os.pipe()  # both close-on-exec: only pass_fds hands one on
        return _read_fd


def child_env() -> dict[str, str]:
    return {ENV: str(child_fd())}


def watch_supervisor(grace_s: float = GRACE_S) -> bool:
    """In a child: stop when the supervisor that started it is gone. Returns whether a
    lifeline was handed to this process. The variable is taken out of the environment so
    this process's own children do not inherit a descriptor number that means nothing to them."""
    raw = os.environ.pop(ENV, None)
    if raw is None:
        return False
    try:
        fd = int(raw)
        os.set_inheritable(fd, False)
    except (ValueError, OSError) as exc:
        log.warning("%s=%r is not an open descriptor (%s): not watching the supervisor", ENV, raw, exc)
        return False

    def watch() -> None:
        while True:
            try:
                if os.read(fd, 1) == b"":
                    break
            except InterruptedError:
                continue
            except OSError:
                break
        log.warning("the supervising process is gone: stopping (SIGTERM to self, exit after %.0f s)", grace_s)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        log.error("still running %.0f s after the supervisor died: exiting", grace_s)
        os._exit(1)

    threading.Thread(target=watch, name="lifeline", daemon=True).start()
    return True
