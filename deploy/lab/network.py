"""Carrying out a lab plan on this machine: ``ip``/``tc`` commands, entering namespaces,
finding what runs in them, and taking it all down again."""

from __future__ import annotations

import ctypes
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from ipaddress import IPv4Network
from pathlib import Path

import orjson

from deploy.lab.plan import Command, LabPlan
from deploy.lab.state import LabError, pid_alive

log = logging.getLogger("dcmirror.lab")

NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
COMMAND_TIMEOUT_S = 30.0
GONE_TIMEOUT_S = 10.0  # namespaces are destroyed asynchronously by the kernel
_STALE_NETNS = re.compile(r"dcm-(\d+)-.+")
_STALE_LINK = re.compile(r"dcm(\d+)h\d+")


def missing_requirements() -> str | None:
    """Why this machine cannot run a lab (None: it can)."""
    if os.geteuid() != 0:
        return "the lab creates network namespaces and links: run it as root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the lab needs the `{tool}` command (Debian package iproute2)"
    return None


def run(cmd: Command, *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """One command of a plan; a failure raises LabError with the command and what it said."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LabError(f"`{' '.join(cmd)}` failed: {exc}") from None
    if check and done.returncode != 0:
        raise LabError(f"`{' '.join(cmd)}` failed (exit {done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    return done


def run_all(cmds: Sequence[Command]) -> None:
    for cmd in cmds:
        run(cmd)


# ---- namespaces ------------------------------------------------------------------------------


def netns_exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()


def netns_pids(name: str) -> list[int]:
    done = run(["ip", "netns", "pids", name], check=False)
    return [int(x) for x in done.stdout.split() if x.isdigit()] if done.returncode == 0 else []


def _setns(fd: int) -> None:
    setns = getattr(os, "setns", None)  # Python 3.12+
    if setns is not None:
        setns(fd, CLONE_NEWNET)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


@contextmanager
def entered(netns: str) -> Iterator[None]:
    """This thread in network namespace ``netns`` (sockets and devices opened meanwhile stay in
    it), back in its own afterwards."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        target = os.open(NETNS_DIR / netns, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        os.close(own)
        raise LabError(f"no network namespace {netns}") from None
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(target)
        os.close(own)


# ---- what this machine offers ------------------------------------------------------------


def netem_supported(prefix: str) -> bool:
    """Whether the kernel has the netem qdisc (tried on the loopback of a scratch namespace)."""
    probe = f"{prefix}-probe"
    run(["ip", "netns", "add", probe])
    try:
        return run(["tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
                   check=False).returncode == 0
    finally:
        run(["ip", "netns", "del", probe], check=False)


def tun_supported() -> bool:
    return Path("/dev/net/tun").exists()


def used_networks() -> list[IPv4Network]:
    """The root namespace's IPv4 routes (every table) and addresses, as networks."""
    out: list[IPv4Network] = []
    for cmd in (["ip", "-j", "-4", "route", "show", "table", "all"], ["ip", "-j", "-4", "addr", "show"]):
        try:
            doc = orjson.loads(run(cmd).stdout or "[]")
        except orjson.JSONDecodeError:
            continue
        for entry in doc:
            nets = [entry.get("dst")] + [f"{a.get('local')}/{a.get('prefixlen')}" for a in entry.get("addr_info", [])]
            for net in nets:
                if not net or net == "default":
                    continue
                try:
                    out.append(IPv4Network(net, strict=False))
                except ValueError:
                    continue
    return out


# ---- up and down -------------------------------------------------------------------------------


def create(plan: LabPlan, say: Callable[[str], None]) -> None:
    """Every namespace, link, address and route of the plan; on a failure what was made is
    removed again before the error is raised."""
    clashes = [ns for ns in plan.namespaces() if netns_exists(ns)]
    if clashes:
        raise LabError(f"network namespaces {', '.join(clashes)} exist already (left over from an earlier lab "
                       "with this pid?); `dcmirror lab down --stale` removes those of labs no longer running")
    started = time.monotonic()
    cmds = plan.setup_commands()
    try:
        run_all(cmds)
    except BaseException:
        destroy(plan)
        raise
    say(f"network: {len(plan.namespaces())} namespaces, {len(cmds)} commands in {time.monotonic() - started:.1f} s")


def kill_in(namespaces: Sequence[str], sig: int = signal.SIGKILL) -> list[int]:
    """Signal every process running in the namespaces (the lab's own: nothing else enters them)."""
    pids = sorted({pid for ns in namespaces if netns_exists(ns) for pid in netns_pids(ns)} - {os.getpid()})
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    return pids


def _wait_gone(pids: Sequence[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    left = [p for p in pids if pid_alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if pid_alive(p)]
    return left


def _link_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def destroy(plan: LabPlan) -> list[str]:
    """Kill what still runs in the lab's namespaces, delete them and the root's links; returns
    what could not be removed (empty: all gone)."""
    namespaces = plan.namespaces()
    pids = kill_in(namespaces)
    stuck = _wait_gone(pids, GONE_TIMEOUT_S)
    for cmd in plan.teardown_commands():
        target = cmd[-1]
        if (cmd[1] == "netns" and netns_exists(target)) or (cmd[1] == "link" and _link_exists(target)):
            done = run(cmd, check=False)
            if done.returncode != 0:
                log.warning("%s: %s", " ".join(cmd), done.stderr.strip())
    deadline = time.monotonic() + GONE_TIMEOUT_S
    left = [ns for ns in namespaces if netns_exists(ns)] + [d.root_link for d in plan.datacenters
                                                              if _link_exists(d.root_link)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [x for x in left if (netns_exists(x) if x in namespaces else _link_exists(x))]
    return left + [f"pid {p}" for p in stuck]


def stale_leftovers() -> tuple[list[str], list[str]]:
    """(namespaces, root links) named like a lab's whose `lab up` no longer runs."""
    namespaces = sorted(p.name for p in NETNS_DIR.glob("dcm-*")
                        if (m := _STALE_NETNS.fullmatch(p.name)) and not pid_alive(int(m.group(1))))
    links = sorted(p.name for p in Path("/sys/class/net").glob("dcm*")
                   if (m := _STALE_LINK.fullmatch(p.name)) and not pid_alive(int(m.group(1))))
    return namespaces, links


def destroy_stale(namespaces: Sequence[str], links: Sequence[str]) -> list[str]:
    pids = kill_in(namespaces)
    _wait_gone(pids, GONE_TIMEOUT_S)
    failed = []
    for ns in namespaces:
        if run(["ip", "netns", "del", ns], check=False).returncode != 0 and netns_exists(ns):
            failed.append(ns)
    for link in links:
        if _link_exists(link) and run(["ip", "link", "del", link], check=False).returncode != 0 \
                and _link_exists(link):
            failed.append(link)
    return failed
