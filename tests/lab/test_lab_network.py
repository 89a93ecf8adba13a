"""The lab's network with real brokers and no mirror: what a cut drops and what it leaves
alone, `--reject`, heal, and `lab down` after `lab up` was killed (its brokers and WAN stop
by themselves; its namespaces and links are left for `lab down`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy.lab.state import pid_alive
from tests.lab.lab import LabRun, dcmirror, skip_unless_lab_possible

TOPOLOGY = """
[clusters.east]
datacenter = "east"
brokers = ["127.0.0.1:9092", "127.0.0.1:9093"]

[clusters.west]
datacenter = "west"
brokers = ["127.0.0.1:9094"]
"""

CONNECT = """
import socket, sys, time
start = time.perf_counter()
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    outcome = "ok"
except OSError as exc:
    outcome = type(exc).__name__
print(outcome, (time.perf_counter() - start) * 1000)
"""


def connect(address: str, netns: str | None = None, timeout_s: float = 3.0) -> tuple[str, float]:
    """("ok" or the error's name, milliseconds) of one TCP connect, from `netns` (None: here)."""
    host, port = address.rsplit(":", 1)
    cmd = [sys.executable, "-c", CONNECT, host, port, str(timeout_s)]
    done = subprocess.run((["ip", "netns", "exec", netns] if netns else []) + cmd, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    outcome, ms = done.stdout.split()
    return outcome, float(ms)


@pytest.mark.slow
def test_cut_heal_and_down_after_a_killed_lab_up(tmp_path: Path) -> None:
    skip_unless_lab_possible()
    config = tmp_path / "topology.toml"
    config.write_text(TOPOLOGY)
    lab = LabRun(config, tmp_path / "lab", "--latency-ms", "30")
    children: list[str] = []
    try:
        lab.wait_ready(90)
        status = lab.status()
        assert (status["running"], status["phase"]) == (True, "ready")
        assert [d["name"] for d in status["datacenters"]] == ["east", "west"]
        assert [h["name"] for h in status["hosts"]] == ["east-1", "east-2", "west-1"]  # no flows: no mirror host
        east1 = lab.netns("east-1")
        east2 = [h["address"] for h in status["hosts"] if h["name"] == "east-2"][0] + ":9093"
        west = lab.bootstrap("west")

        outcome, ms = connect(west, east1)
        print(f"\neast-1 -> west: {outcome} in {ms:.1f} ms")
        assert outcome == "ok" and ms >= 60, (outcome, ms)

        lab.cli("cut", "west", "--reject")  # from every other datacenter, refused at once
        assert [(c["a"], c["b"], c["reject"]) for c in lab.state()["cuts"]] == [("west", "east", True)]
        outcome, ms = connect(west, east1)
        print(f"cut --reject: east-1 -> west: {outcome} in {ms:.1f} ms")
        assert outcome != "ok" and ms < 1000, (outcome, ms)
        assert connect(east2, east1)[0] == "ok"  # inside a datacenter nothing changes
        assert connect(west)[0] == "ok"  # nor from the root namespace

        lab.cli("cut", "east", "--from", "west")  # now dropped silently
        assert [(c["a"], c["b"], c["reject"]) for c in lab.state()["cuts"]] == [("east", "west", False)]
        outcome, ms = connect(west, east1, timeout_s=2.0)
        print(f"cut: east-1 -> west: {outcome} after {ms:.0f} ms")
        assert outcome == "TimeoutError", (outcome, ms)

        lab.cli("heal")
        assert lab.state()["cuts"] == []
        outcome, ms = connect(west, east1)
        print(f"healed: east-1 -> west: {outcome} in {ms:.1f} ms")
        assert outcome == "ok", (outcome, ms)

        # `lab up` dies without cleaning up: its brokers (and the WAN) stop by themselves
        # (deploy/lifeline.py), the namespaces and links stay for `lab down`
        prefix = lab.state()["prefix"]
        children = [p for ns in (lab.netns("east-1"), lab.netns("west-1"))
                    for p in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()]
        assert len(children) == 2, children
        os.kill(lab.proc.pid, signal.SIGKILL)
        lab.proc.wait(10)
        deadline = time.monotonic() + 60
        while any(pid_alive(int(p)) for p in children):
            assert time.monotonic() < deadline, f"children of the killed lab still running: {children}"
            time.sleep(0.2)
        done = dcmirror("lab", "status", "--json", "--work-dir", str(lab.work_dir))
        assert done.returncode == 1 and json.loads(done.stdout)["running"] is False, done
        assert lab.leftovers(prefix), "the killed lab left nothing behind?"
    finally:
        lab.down()  # and checks that nothing of it is left
    assert not any(pid_alive(int(p)) for p in children)  # gone, or zombies of a parent that died
