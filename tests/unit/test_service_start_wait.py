"""A `dcmirror load` or `warehouse sql` run while `dcmirror warehouse serve` is still starting
(it holds the warehouse lock, its socket is not there yet) waits for the service instead of
failing with "the warehouse is in use" (issue 41: the default topology runs the service, and
the README's next step after `dcmirror up` is a load)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from spark_aggregate.service_client import socket_path, wait_for_starting_service
from spark_aggregate.session import LOCK_FILE, lock_holder


def _settings(tmp_path: Path) -> Any:
    return SimpleNamespace(path=tmp_path)


def _hold(tmp_path: Path, what: str, pid: int) -> None:
    (tmp_path / LOCK_FILE).write_text(f"{what} (pid {pid}, since 2026-12-02 04:00:00)\n")


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_waits_for_a_starting_service_until_its_socket_is_there(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    _hold(tmp_path, "dcmirror warehouse serve", os.getpid())
    sock = socket_path(settings)

    def start_later() -> None:
        time.sleep(0.5)
        sock.write_text("")  # only its existence is looked at here

    thread = threading.Thread(target=start_later)
    thread.start()
    err = io.StringIO()
    started = time.monotonic()
    assert wait_for_starting_service(settings, err) is True
    thread.join()
    assert time.monotonic() - started >= 0.4
    assert "waiting for the warehouse service to start (dcmirror warehouse serve (pid" in err.getvalue()


def test_no_wait_without_a_live_service_holding_the_lock(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    assert lock_holder(settings) is None and wait_for_starting_service(settings, io.StringIO()) is False
    _hold(tmp_path, "dcmirror warehouse serve", _dead_pid())  # what a service that died left
    assert lock_holder(settings) is None and wait_for_starting_service(settings, io.StringIO()) is False
    _hold(tmp_path, "dcmirror load", os.getpid())  # another load: the command's own lock error says so
    assert lock_holder(settings) is not None and wait_for_starting_service(settings, io.StringIO()) is False


def test_a_service_that_stops_before_answering_ends_the_wait(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    reaper = threading.Thread(target=proc.wait)  # not left a zombie (which still has its pid)
    reaper.start()
    _hold(tmp_path, "dcmirror warehouse serve", proc.pid)
    err = io.StringIO()
    assert wait_for_starting_service(settings, err, limit_s=60) is False
    reaper.join()
    assert proc.returncode == 0 and "waiting" in err.getvalue()


def test_the_wait_is_bounded(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    _hold(tmp_path, "dcmirror warehouse serve", os.getpid())
    err = io.StringIO()
    assert wait_for_starting_service(settings, err, limit_s=0.3) is False
    assert "has held the warehouse for 0.3 s without answering" in err.getvalue()
