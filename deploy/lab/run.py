"""`dcmirror lab up|down|cut|heal|latency|status`: the lab's life cycle.

`up` plans the network (deploy/lab/plan.py), writes the lab topology and lab.json into the
work directory, creates the namespaces and links, and then runs the topology as `dcmirror
up` does (deploy/up_cmd.Up: supervised brokers, topics applied, mirror workers, scheduled
load), but each broker inside its own namespace and each mirror worker inside the mirror
host of its flow's target datacenter (`ip netns exec NS dcmirror ...`); with the TUN WAN,
`dcmirror lab wan` runs as one more supervised child. On SIGINT/SIGTERM (which `lab down`
sends) it stops them in `up`'s order and removes everything it made, also when starting
failed. `down` cleans up after a `lab up` that cannot any more (killed, crashed).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import time
from collections.abc import Callable, Sequence
from ipaddress import IPv4Network
from pathlib import Path
from typing import Any

import trio

from deploy.lab import network
from deploy.lab.plan import (
    LINK_NETEM,
    LINK_TUN,
    LabPlan,
    PlanError,
    console_host,
    lab_prefix,
    lab_topology,
    pick_base,
    plan_lab,
)
from deploy.lab.state import (
    LabError,
    me,
    pid_alive,
    read_state,
    read_wan,
    register,
    registered,
    registry_lock,
    running,
    unregister,
    update_state,
    write_state,
)
from deploy.processes import ChildSpec, ProcessSupervisor, dcmirror_argv
from deploy.render.toml_out import dump_topology
from deploy.up_cmd import Up
from topology import Topology, load

WAN_CHILD = "lab wan"
WAN_READY_TIMEOUT_S = 15.0
UP_STOP_TIMEOUT_S = 180.0  # `lab down` waits this long for `lab up` to stop everything, then kills


class Interrupted(Exception):
    """SIGTERM while the network is being made (before trio takes the signals over)."""


def _interrupt(signum: int, frame: Any) -> None:
    raise Interrupted(signal.Signals(signum).name)


# ---- up ------------------------------------------------------------------------------------


def _used_networks() -> list[IPv4Network]:
    """Routes and addresses of this machine and the bases of the labs running (under the registry lock)."""
    return network.used_networks() + [IPv4Network(e["base"]) for e in registered()
                                      if running(e.get("pid"), e.get("pid_start")) and "base" in e]


def free_base_network(preferred: IPv4Network | None = None) -> IPv4Network:
    """The base network `lab up` would pick now (``preferred`` if it is free): for a caller
    that must know the lab's addresses before it starts (certificates naming them)."""
    with registry_lock():
        return pick_base(_used_networks(), preferred)


def prepare(topology: Topology, config: Path, work_dir: Path, *, latency_ms: float, link: str,
            base: IPv4Network | None, say: Callable[[str], None]) -> tuple[LabPlan, Topology]:
    """Plan the lab, register it and write its topology file and lab.json (nothing is made yet)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    previous: dict[str, Any] | None
    try:
        previous = read_state(work_dir)
    except LabError:
        previous = None
    if previous is not None and running(previous.get("pid"), previous.get("pid_start")):
        raise LabError(f"a lab runs in {work_dir} already (`lab up` pid {previous['pid']}); "
                       "`dcmirror lab down --work-dir DIR` stops it")
    prefix = lab_prefix(os.getpid())
    if link == "auto":
        link = LINK_NETEM if network.netem_supported(prefix) else LINK_TUN
        if link == LINK_TUN and not network.tun_supported():
            raise LabError("the kernel has neither the netem qdisc nor TUN devices (/dev/net/tun): no WAN for the lab")
        say(f"WAN links: {'tc netem' if link == LINK_NETEM else 'user-space over TUN devices (no netem qdisc here)'}")
    with registry_lock():
        used = _used_networks()
        if base is None:
            preferred = IPv4Network(previous["plan"]["base"]) if previous is not None else None
            base = pick_base(used, preferred)
        else:
            clash = [n for n in used if n.prefixlen > 0 and n.overlaps(base)]
            if clash:
                raise LabError(f"the base network {base} overlaps {clash[0]}, a route of this machine or another "
                               "lab's network; leave --base-network out to get a free one")
        try:
            plan = plan_lab(topology, prefix=prefix, base=base, link=link, latency_ms=latency_ms)
        except PlanError as exc:
            raise LabError(str(exc)) from None
        register(prefix, work_dir, str(base))
    try:
        lab = lab_topology(topology, plan, work_dir)
        lab_config = work_dir / "topology.toml"
        lab_config.write_text(dump_topology(lab, header=(
            f"The lab topology of {config}, written by `dcmirror lab up` (namespaces {prefix}-*):\n"
            "every node at its namespace's address, data and warehouse in the lab's work directory.")))
        lab = load(lab_config)  # what the children read, checked as they will check it
        write_state(work_dir, {"prefix": prefix, **me(), "config": str(config), "lab_config": str(lab_config),
                               "work_dir": str(work_dir), "phase": "starting", "started_ms": int(time.time() * 1000),
                               "plan": plan.document(), "cuts": []})
    except BaseException:
        unregister(prefix)
        raise
    return plan, lab


def node_netns(plan: LabPlan, topology: Topology, spec: ChildSpec) -> str | None:
    """The namespace a child of `up` runs in: a node in its host's, a mirror worker in the
    mirror host of its flow's target datacenter, a schema registry in its cluster's first
    broker's host (lab_topology), the console on its host (plan.console_host), anything else
    (the load) in the root's."""
    argv = list(spec.argv)

    def arg(flag: str) -> str | None:
        return argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else None

    if "broker" in argv and arg("--cluster") and arg("--node"):
        return plan.node_host(str(arg("--cluster")), int(str(arg("--node")))).netns
    if "mirror" in argv and arg("--flow"):
        flow = next(f for f in topology.mirrors if f.name == arg("--flow"))
        return plan.mirror_host(topology.cluster(flow.target).datacenter).netns
    if "registry" in argv and arg("--cluster"):
        cluster = topology.cluster(str(arg("--cluster")))
        return plan.node_host(cluster.name, cluster.brokers[0].node_id).netns
    if "console" in argv and topology.console is not None:
        return console_host(plan, topology).netns
    return None


def in_netns(spec: ChildSpec, netns: str | None) -> ChildSpec:
    if netns is None:
        return spec
    return dataclasses.replace(spec, argv=["ip", "netns", "exec", netns, *spec.argv])


def up(topology: Topology, config: Path, work_dir: Path, *, latency_ms: float, link: str = "auto",
       base: IPv4Network | None = None, timeout_s: float = 180.0, say: Callable[[str], None] = print) -> int:
    """Run a lab until SIGINT/SIGTERM; everything it made is gone when this returns."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    plan: LabPlan | None = None
    try:
        plan, lab = prepare(topology, config, work_dir, latency_ms=latency_ms, link=link, base=base, say=say)
        for dc in plan.datacenters:
            say(f"datacenter {dc.name}: {dc.subnet}, router namespace {dc.router_netns}, reached from here over "
                f"{dc.root_link}")
        network.create(plan, say)
        say(f"latency between datacenters: {plan.latency_ms:g} ms each way ({plan.link})")
        return trio.run(functools.partial(run_lab, plan, lab, work_dir, timeout_s=timeout_s, say=say))
    except (Interrupted, KeyboardInterrupt) as exc:
        say(f"{exc or 'SIGINT'}: stopping")
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the clean-up below is not to be interrupted
        try:
            if plan is not None:
                left = network.destroy(plan)
                unregister(plan.prefix)
                update_state(work_dir, lambda doc: doc.update(phase="down", stopped_ms=int(time.time() * 1000)))
                say("network removed" if not left else f"could not remove: {', '.join(left)}")
        finally:
            signal.signal(signal.SIGTERM, previous)


async def run_lab(plan: LabPlan, lab: Topology, work_dir: Path, *, timeout_s: float,
                  say: Callable[[str], None]) -> int:
    result = 0
    assert lab.path is not None
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            sup = ProcessSupervisor(nursery, on_event=lambda name, text: say(f"{name}: {text}"))
            runner = Up(lab, str(lab.path), sup, say, timeout_s)
            runner.nodes = [in_netns(s, node_netns(plan, lab, s)) for s in runner.nodes]
            runner.workers = [in_netns(s, node_netns(plan, lab, s)) for s in runner.workers]
            runner.registries = [in_netns(s, node_netns(plan, lab, s)) for s in runner.registries]
            if runner.console is not None:
                runner.console = in_netns(runner.console, node_netns(plan, lab, runner.console))
            stop = trio.Event()

            async def watch_signals() -> None:
                async for signum in signals:
                    if not stop.is_set():
                        say(f"{signal.Signals(signum).name}: stopping the lab")
                        stop.set()

            async def cancel_when_stopping(scope: trio.CancelScope) -> None:
                await stop.wait()
                scope.cancel()

            nursery.start_soon(watch_signals)
            nursery.start_soon(runner.keep_state)
            with trio.CancelScope() as startup:
                nursery.start_soon(cancel_when_stopping, startup)
                ready = True
                if plan.link == LINK_TUN:
                    sup.start(ChildSpec(WAN_CHILD, dcmirror_argv("lab", "wan", "--work-dir", str(work_dir)),
                                        work_dir / "wan.log"))
                    ready = await wait_wan(sup, work_dir, say)
                ready = ready and await runner.bring_up()
                if ready:
                    update_state(work_dir, lambda doc: doc.update(phase="ready"))
                    say(f"dcmirror lab: ready; topology {lab.path}; `dcmirror lab cut DC` / `heal DC` / `down`")
                else:
                    result = 1
                    stop.set()
            await stop.wait()
            update_state(work_dir, lambda doc: doc.update(phase="stopping"))
            await runner.shut_down()
            if WAN_CHILD in sup.specs:
                await sup.stop([WAN_CHILD], 5.0)
            nursery.cancel_scope.cancel()
    return result


async def wait_wan(sup: ProcessSupervisor, work_dir: Path, say: Callable[[str], None]) -> bool:
    """Until the WAN child reports (it has opened every router's TUN device)."""
    started = time.monotonic()
    with trio.move_on_after(WAN_READY_TIMEOUT_S):
        while True:
            doc = read_wan(work_dir)
            if doc is not None and sup.pid(WAN_CHILD) is not None and doc.get("pid") == sup.pid(WAN_CHILD):
                say(f"WAN running after {time.monotonic() - started:.1f} s (pid {doc['pid']}, log {work_dir / 'wan.log'})")
                return True
            await trio.sleep(0.1)
    say(f"dcmirror lab: the WAN did not start within {WAN_READY_TIMEOUT_S:g} s; its log: {work_dir / 'wan.log'}")
    return False


# ---- cut, heal, latency ------------------------------------------------------------------------


def _plan_and_topology(work_dir: Path) -> tuple[dict[str, Any], LabPlan, Topology]:
    doc = read_state(work_dir)
    if doc.get("phase") in ("down", "stopping"):
        raise LabError(f"the lab in {work_dir} is {doc['phase']}")
    return doc, LabPlan.from_document(doc["plan"]), load(doc["lab_config"])


def datacenter_of(plan: LabPlan, topology: Topology, name: str) -> str:
    """A datacenter named directly or by one of its clusters."""
    if name in topology.clusters:
        return topology.clusters[name].datacenter
    plan.datacenter(name)  # unknown names raise, listing the datacenters
    return name


def _pairs(plan: LabPlan, topology: Topology, dc: str, others: Sequence[str]) -> list[tuple[str, str]]:
    a = datacenter_of(plan, topology, dc)
    bs = [datacenter_of(plan, topology, o) for o in others] or [d.name for d in plan.datacenters if d.name != a]
    if a in bs:
        raise LabError(f"datacenter {a} cannot be cut from itself")
    return [(a, b) for b in dict.fromkeys(bs)]


def cut(work_dir: Path, dc: str, others: Sequence[str] = (), *, reject: bool = False) -> list[tuple[str, str]]:
    """Cut the WAN between ``dc`` and ``others`` (default: every other datacenter)."""
    _, plan, topology = _plan_and_topology(work_dir)
    try:
        pairs = _pairs(plan, topology, dc, others)
        for a, b in pairs:
            network.run_all(plan.route_commands(a, b, cut=True, reject=reject))
    except PlanError as exc:
        raise LabError(str(exc)) from None

    def record(doc: dict[str, Any]) -> None:
        cuts = [c for c in doc.get("cuts", []) if {c["a"], c["b"]} not in [{a, b} for a, b in pairs]]
        doc["cuts"] = cuts + [{"a": a, "b": b, "reject": reject, "since_ms": int(time.time() * 1000)}
                              for a, b in pairs]

    update_state(work_dir, record)
    return pairs


def heal(work_dir: Path, dc: str | None = None, others: Sequence[str] = ()) -> list[tuple[str, str]]:
    """Put the WAN routes back between ``dc`` and ``others`` (default: every cut of ``dc``;
    without ``dc``: every cut)."""
    doc, plan, topology = _plan_and_topology(work_dir)
    try:
        if dc is None:
            pairs = [(d["a"], d["b"]) for d in doc.get("cuts", [])]
        elif others:
            pairs = _pairs(plan, topology, dc, others)
        else:
            a = datacenter_of(plan, topology, dc)
            pairs = [(c["a"], c["b"]) for c in doc.get("cuts", []) if a in (c["a"], c["b"])]
        for a, b in pairs:
            network.run_all(plan.route_commands(a, b, cut=False))
    except PlanError as exc:
        raise LabError(str(exc)) from None
    healed = [{a, b} for a, b in pairs]
    update_state(work_dir, lambda d: d.update(cuts=[c for c in d.get("cuts", []) if {c["a"], c["b"]} not in healed]))
    return pairs


def set_latency(work_dir: Path, latency_ms: float) -> None:
    doc, plan, _ = _plan_and_topology(work_dir)
    try:
        network.run_all(plan.latency_commands(latency_ms))
    except PlanError as exc:
        raise LabError(str(exc)) from None
    update_state(work_dir, lambda d: d["plan"].update(latency_ms=float(latency_ms)))
    if plan.link == LINK_TUN:
        wan = read_wan(work_dir)
        if wan is not None and running(wan.get("pid"), wan.get("pid_start")):
            os.kill(wan["pid"], signal.SIGHUP)


# ---- down ----------------------------------------------------------------------------------------


def down(work_dir: Path, *, say: Callable[[str], None] = print, timeout_s: float = UP_STOP_TIMEOUT_S) -> list[str]:
    """Stop the lab's `lab up` (which stops every process and removes the network), then remove
    whatever is left (after a `lab up` that was killed). Returns what could not be removed."""
    doc = read_state(work_dir)
    plan = LabPlan.from_document(doc["plan"])
    pid = doc.get("pid")
    if running(pid, doc.get("pid_start")):
        assert isinstance(pid, int)
        say(f"stopping `lab up` (pid {pid})")
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if pid_alive(pid):
            say(f"`lab up` still runs after {timeout_s:g} s: SIGKILL")
            os.kill(pid, signal.SIGKILL)
    wan = read_wan(work_dir)
    if wan is not None and running(wan.get("pid"), wan.get("pid_start")):
        os.kill(wan["pid"], signal.SIGKILL)
    killed = network.kill_in(plan.namespaces())
    if killed:
        say(f"killed {len(killed)} process(es) left in the lab's namespaces: {killed}")
    left = network.destroy(plan)
    unregister(plan.prefix)
    update_state(work_dir, lambda d: d.update(phase="down"))
    return left


def down_stale(say: Callable[[str], None] = print) -> list[str]:
    """Every lab whose `lab up` is gone: through its work dir if registered, else by name."""
    left: list[str] = []
    for entry in registered():
        if not running(entry.get("pid"), entry.get("pid_start")):
            say(f"lab {entry['prefix']} in {entry['work_dir']}: `lab up` is gone; removing what is left")
            try:
                left += down(Path(entry["work_dir"]), say=say)
            except LabError as exc:
                say(f"  {exc}")
                unregister(entry["prefix"])
    namespaces, links = network.stale_leftovers()
    if namespaces or links:
        say(f"removing namespaces {', '.join(namespaces) or '-'} and links {', '.join(links) or '-'} of labs "
            "no longer running")
        left += network.destroy_stale(namespaces, links)
    return left


# ---- status ----------------------------------------------------------------------------------------


def status(work_dir: Path) -> dict[str, Any]:
    doc = read_state(work_dir)
    plan = LabPlan.from_document(doc["plan"])
    up_running = running(doc.get("pid"), doc.get("pid_start"))
    wan = read_wan(work_dir) if plan.link == LINK_TUN else None
    if wan is not None:
        wan["running"] = running(wan.get("pid"), wan.get("pid_start"))
    return {"work_dir": str(work_dir), "config": doc.get("config"), "lab_config": doc.get("lab_config"),
            "pid": doc.get("pid"), "running": up_running, "phase": doc.get("phase") if up_running else "down",
            "link": plan.link, "latency_ms": plan.latency_ms, "base": str(plan.base),
            "datacenters": [{"name": d.name, "subnet": str(d.subnet), "router_netns": d.router_netns,
                             "root_link": d.root_link} for d in plan.datacenters],
            "hosts": [{"name": h.name, "datacenter": h.datacenter, "netns": h.netns, "address": str(h.address)}
                      for h in plan.hosts],
            "cuts": doc.get("cuts", []), "wan": wan}


def format_status(doc: dict[str, Any]) -> str:
    lines = [f"lab {doc['work_dir']}: {doc['phase']}" + (f" (pid {doc['pid']})" if doc["running"] else ""),
             f"topology {doc['lab_config']} (from {doc['config']}); base network {doc['base']}; "
             f"WAN {doc['link']}, {doc['latency_ms']:g} ms each way", ""]
    for dc in doc["datacenters"]:
        lines.append(f"datacenter {dc['name']}: {dc['subnet']} (router {dc['router_netns']})")
        for h in doc["hosts"]:
            if h["datacenter"] == dc["name"]:
                lines.append(f"  {h['name']:<24} {h['address']:<15} netns {h['netns']}")
    lines.append("")
    if doc["cuts"]:
        for c in doc["cuts"]:
            since = (time.time() * 1000 - c["since_ms"]) / 1000
            lines.append(f"CUT {c['a']} <-> {c['b']} ({'refused' if c['reject'] else 'dropped'}) for {since:.0f} s")
    else:
        lines.append("no cuts")
    wan = doc.get("wan")
    if wan is not None:
        lines.append(f"WAN pid {wan.get('pid')} ({'running' if wan.get('running') else 'not running'}): "
                     f"{wan.get('queued_packets', 0)} packets in flight; dropped {wan.get('dropped')}")
        for link, c in sorted(wan.get("links", {}).items()):
            lines.append(f"  {link:<24} {c['packets']:>10} packets {c['bytes']:>14} bytes")
    return "\n".join(lines)
