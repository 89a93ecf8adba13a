"""The lab's state files and registry (deploy/lab/state.py): finding the running lab, telling
a live `lab up` from a dead one or a reused pid."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.lab import state
from deploy.lab.state import LabError


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "registry"
    monkeypatch.setattr(state, "REGISTRY", path)
    return path


def _entry(registry: Path, prefix: str, work_dir: Path, pid: int, pid_start: int | None) -> None:
    registry.mkdir(exist_ok=True)
    state._write_json(registry / f"{prefix}.json", {"prefix": prefix, "work_dir": str(work_dir), "base": "10.10.0.0/16",
                                                     "pid": pid, "pid_start": pid_start})


def test_running_names_one_process_even_when_its_pid_is_reused() -> None:
    me = state.me()
    assert state.running(me["pid"], me["pid_start"])
    assert not state.running(me["pid"], me["pid_start"] + 1)  # another process with this pid
    assert not state.running(me["pid"], None)
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert not state.running(int(done.stdout), 0)  # exited
    assert not state.pid_alive("12") and not state.pid_alive(-1)


def test_find_work_dir(registry: Path, tmp_path: Path) -> None:
    assert state.find_work_dir("relative/dir") == Path("relative/dir").resolve()
    with pytest.raises(LabError, match="no lab is running"):
        state.find_work_dir(None)
    me = state.me()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    _entry(registry, "dcm-1", tmp_path / "old", int(dead.stdout), 123)  # died without `lab down`
    with pytest.raises(LabError, match="no lab is running"):
        state.find_work_dir(None)
    _entry(registry, f"dcm-{os.getpid()}", tmp_path / "mine", me["pid"], me["pid_start"])
    assert state.find_work_dir(None) == tmp_path / "mine"
    _entry(registry, "dcm-2", tmp_path / "other", me["pid"], me["pid_start"])
    with pytest.raises(LabError, match=r"2 labs are running; name one with --work-dir: .*/(mine|other) \(pid"):
        state.find_work_dir(None)
    assert sorted(e["prefix"] for e in state.registered()) == sorted(["dcm-1", "dcm-2", f"dcm-{os.getpid()}"])
    state.unregister("dcm-2")
    state.unregister("dcm-2")  # twice is fine
    assert state.find_work_dir(None) == tmp_path / "mine"


def test_state_file(tmp_path: Path) -> None:
    with pytest.raises(LabError, match="no lab in .*start one with `dcmirror lab up"):
        state.read_state(tmp_path)
    state.write_state(tmp_path, {"phase": "starting", "cuts": []})
    doc = state.update_state(tmp_path, lambda d: d["cuts"].append({"a": "east", "b": "central"}))
    assert doc == state.read_state(tmp_path) == {"phase": "starting", "cuts": [{"a": "east", "b": "central"}]}
    (tmp_path / state.STATE_FILE).write_text("{not json")
    with pytest.raises(LabError):
        state.read_state(tmp_path)
