"""Where a lab keeps what it made, so that `lab cut|heal|latency|status|down` (other
processes, maybe after `lab up` died) can find and undo it.

- ``<work dir>/lab.json``: the plan (namespaces, addresses, links), the pid of `lab up`,
  the phase, the cuts in force. Read-modify-write under ``<work dir>/lab.lock``.
- ``<work dir>/wan.json``: the TUN WAN's pid and counters, rewritten every second.
- ``/run/dcmirror-lab/<prefix>.json``: one entry per running lab (its work dir and base
  network), so the commands find the lab without --work-dir when only one runs, and a new
  lab picks a network no other lab uses. Changed under ``/run/dcmirror-lab/lock``
  (DCMIRROR_LAB_REGISTRY names another directory).
"""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

REGISTRY = Path(os.environ.get("DCMIRROR_LAB_REGISTRY", "/run/dcmirror-lab"))
STATE_FILE = "lab.json"
WAN_FILE = "wan.json"
_PREFIX = re.compile(r"dcm-(\d+)")


class LabError(Exception):
    """Something a user can fix: no lab found, not root, a command of the plan failed."""


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    tmp.replace(path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        doc = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


# ---- the lab's own state ---------------------------------------------------------------------


def read_state(work_dir: Path) -> dict[str, Any]:
    doc = _read_json(work_dir / STATE_FILE)
    if doc is None:
        raise LabError(f"no lab in {work_dir} (no readable {STATE_FILE}); start one with "
                       "`dcmirror lab up --config FILE --work-dir DIR`")
    return doc


def write_state(work_dir: Path, doc: dict[str, Any]) -> None:
    with _locked(work_dir / "lab.lock"):
        _write_json(work_dir / STATE_FILE, doc)


def update_state(work_dir: Path, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Read, ``change(doc)`` in place, write back, all under the lab's lock."""
    with _locked(work_dir / "lab.lock"):
        doc = read_state(work_dir)
        change(doc)
        _write_json(work_dir / STATE_FILE, doc)
        return doc


def read_wan(work_dir: Path) -> dict[str, Any] | None:
    return _read_json(work_dir / WAN_FILE)


def write_wan(work_dir: Path, doc: dict[str, Any]) -> None:
    _write_json(work_dir / WAN_FILE, doc)


# ---- processes ---------------------------------------------------------------------------


def pid_alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has exited
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def start_ticks(pid: int) -> int | None:
    """When the process started (clock ticks after boot): with the pid, names one process
    even after the pid is reused."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def running(pid: object, ticks: object) -> bool:
    """Whether the process ``pid`` that started at ``ticks`` still runs."""
    return pid_alive(pid) and isinstance(pid, int) and ticks is not None and start_ticks(pid) == ticks


def me() -> dict[str, Any]:
    """This process as state files name it."""
    return {"pid": os.getpid(), "pid_start": start_ticks(os.getpid())}


def prefix_pid(prefix: str) -> int | None:
    found = _PREFIX.fullmatch(prefix)
    return int(found.group(1)) if found else None


# ---- the registry of running labs --------------------------------------------------------------


@contextmanager
def registry_lock() -> Iterator[None]:
    with _locked(REGISTRY / "lock"):
        yield


def register(prefix: str, work_dir: Path, base: str) -> None:
    """This process's lab; call with registry_lock() held (with picking the base network)."""
    REGISTRY.mkdir(parents=True, exist_ok=True)
    _write_json(REGISTRY / f"{prefix}.json", {"prefix": prefix, "work_dir": str(work_dir), "base": base, **me()})


def unregister(prefix: str) -> None:
    try:
        (REGISTRY / f"{prefix}.json").unlink()
    except FileNotFoundError:
        pass


def registered() -> list[dict[str, Any]]:
    """Every registry entry (of running labs and of labs that died without `lab down`)."""
    out = []
    for path in sorted(REGISTRY.glob("dcm-*.json")):
        doc = _read_json(path)
        if doc is not None and "work_dir" in doc:
            out.append(doc)
    return out


def find_work_dir(given: str | None) -> Path:
    """--work-dir if given, else the one lab whose `lab up` runs."""
    if given:
        return Path(given).resolve()
    live = [e for e in registered() if running(e.get("pid"), e.get("pid_start"))]
    if len(live) == 1:
        return Path(live[0]["work_dir"])
    if not live:
        raise LabError("no lab is running (start one with `dcmirror lab up --config FILE`), "
                       "or name its directory with --work-dir")
    listed = ", ".join(f"{e['work_dir']} (pid {e['pid']})" for e in live)
    raise LabError(f"{len(live)} labs are running; name one with --work-dir: {listed}")
