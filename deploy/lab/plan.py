"""The lab's network, planned without doing anything (sans-IO).

``plan_lab(topology, ...)`` assigns every datacenter of a topology a subnet, a router
namespace and a link to the host, and every broker/controller (and, in each datacenter a
flow copies into, the mirror workers) a namespace with an address in its datacenter's
subnet. The plan turns into ``ip`` / ``tc`` argv lists (``setup_commands``,
``route_commands`` for cuts and heals, ``latency_commands``, ``teardown_commands``) that
the shell (deploy/lab/network.py) runs, and into the lab's topology file
(``lab_topology``): the same clusters, topics and flows with the brokers at their lab
addresses and every path inside the lab's work directory.

Addresses, for base network 10.B.0.0/16 and datacenter i = 1, 2, ... (file order):

    10.B.i.0/24        datacenter i: hosts .1, .2, ... (its clusters' nodes in file
                       order), .253 the mirror host, .254 the router (bridge br0)
    10.B.0.4i/30       the host link: .4i+1 in the router (host0), .4i+2 in the root
                       namespace (veth ``<lab>h<i>``), which routes 10.B.i.0/24 over it
    10.B.255.i/24      netem links only: the router's wan0 on the WAN bridge

Between datacenters every packet crosses the WAN: with ``link = "netem"`` a veth per router
into a bridge namespace, ``tc netem delay`` on each router's wan0 (so one way takes
``latency_ms``); with ``link = "tun"`` a TUN device wan0 per router, all read by the user-
space WAN (deploy/lab/wan.py), which writes each packet into the destination router's
wan0 ``latency_ms`` later. A cut replaces the routes between two routers by ``blackhole``
routes (packets silently dropped, as when a WAN link fails) or ``prohibit`` (refused at
once); a heal puts the ordinary routes back. The root namespace keeps its own links to every
router, so clients there reach every datacenter, cut or not.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any

from topology.model import NodeAddress, Topology

LINK_NETEM = "netem"
LINK_TUN = "tun"
LINKS = (LINK_NETEM, LINK_TUN)
DEFAULT_LATENCY_MS = 30.0
LATENCY_MS_MAX = 10_000.0
DATACENTERS_MAX = 63  # host links are /30s in 10.B.0.0/24
HOSTS_PER_DATACENTER_MAX = 252  # .253 mirror host, .254 router
MIRROR_HOST = 253
GATEWAY_HOST = 254
WAN_SUBNET_OCTET = 255
NETEM_LIMIT_PACKETS = 100_000  # netem's queue holds latency x rate packets; its default 1000 is short
# Candidate base networks, tried in order: the first that overlaps no route and no other lab.
BASE_CANDIDATES = tuple(IPv4Network(f"10.{b}.0.0/16") for b in range(10, 255)) + tuple(
    IPv4Network(f"172.{b}.0.0/16") for b in range(16, 32))
IFNAME_MAX = 15  # Linux IFNAMSIZ - 1
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")

# The names of the interfaces inside the lab's namespaces (namespaced, so fixed).
BRIDGE = "br0"
HOST_LINK = "host0"
WAN_LINK = "wan0"
HOST_ETH = "eth0"


class PlanError(ValueError):
    """The topology does not fit the lab (too many datacenters or hosts, no free network)."""


Command = list[str]


@dataclass(frozen=True)
class Datacenter:
    name: str
    index: int
    subnet: IPv4Network
    router_netns: str
    root_link: str
    """The root namespace's end of the host link."""

    @property
    def gateway(self) -> IPv4Address:
        return self.subnet.network_address + GATEWAY_HOST

    def host_link(self, base: IPv4Network) -> tuple[IPv4Address, IPv4Address]:
        """(the router's, the root namespace's) address on the host link."""
        first = base.network_address + 4 * self.index
        return first + 1, first + 2

    def wan_address(self, base: IPv4Network) -> IPv4Address:
        return base.network_address + (WAN_SUBNET_OCTET << 8) + self.index


@dataclass(frozen=True)
class Host:
    """A namespace with one address in its datacenter's subnet."""

    name: str
    """``<cluster>-<node id>`` for a node, ``mirror-<datacenter>`` for the mirror host."""
    netns: str
    datacenter: str
    address: IPv4Address
    router_port: str
    """Its veth's name in the router namespace (the other end is eth0 in its own)."""
    cluster: str | None = None
    node_id: int | None = None


@dataclass(frozen=True)
class LabPlan:
    prefix: str
    base: IPv4Network
    link: str
    latency_ms: float
    datacenters: tuple[Datacenter, ...]
    hosts: tuple[Host, ...]

    def __post_init__(self) -> None:
        assert self.link in LINKS, self.link
        assert 0 <= self.latency_ms <= LATENCY_MS_MAX, self.latency_ms

    # ---- lookups ------------------------------------------------------------------------

    @property
    def wan_netns(self) -> str | None:
        """The netem links' bridge namespace (None for the TUN WAN, which is a process)."""
        return f"{self.prefix}-wan" if self.link == LINK_NETEM else None

    def namespaces(self) -> list[str]:
        """Every namespace of the lab: hosts, routers, the WAN bridge."""
        out = [h.netns for h in self.hosts] + [d.router_netns for d in self.datacenters]
        return out + ([self.wan_netns] if self.wan_netns else [])

    def datacenter(self, name: str) -> Datacenter:
        for dc in self.datacenters:
            if dc.name == name:
                return dc
        raise PlanError(f"no datacenter {name!r} in the lab; datacenters: "
                        + ", ".join(d.name for d in self.datacenters))

    def node_host(self, cluster: str, node_id: int) -> Host:
        for h in self.hosts:
            if h.cluster == cluster and h.node_id == node_id:
                return h
        raise PlanError(f"no node {cluster}-{node_id} in the lab")

    def mirror_host(self, datacenter: str) -> Host:
        for h in self.hosts:
            if h.cluster is None and h.datacenter == datacenter:
                return h
        raise PlanError(f"no mirror host in datacenter {datacenter!r} (no flow copies into it)")

    def pairs(self) -> list[tuple[str, str]]:
        """Every pair of datacenters (in file order), i.e. every WAN route there is."""
        names = [d.name for d in self.datacenters]
        return [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]

    # ---- commands -----------------------------------------------------------------------

    def setup_commands(self) -> list[Command]:
        """Every namespace, bridge, veth, address and route of the lab (and the TUN devices or
        netem qdiscs of the WAN), in an order that works."""
        cmds: list[Command] = []
        wan = self.wan_netns
        if wan is not None:
            cmds += [["ip", "netns", "add", wan], ["ip", "-n", wan, "link", "set", "lo", "up"],
                     ["ip", "-n", wan, "link", "add", BRIDGE, "type", "bridge"],
                     ["ip", "-n", wan, "link", "set", BRIDGE, "up"]]
        for dc in self.datacenters:
            r = dc.router_netns
            router_ip, root_ip = dc.host_link(self.base)
            cmds += [
                ["ip", "netns", "add", r],
                ["ip", "-n", r, "link", "set", "lo", "up"],
                sysctl(r, "net/ipv4/ip_forward", "1"),
                ["ip", "-n", r, "link", "add", BRIDGE, "type", "bridge"],
                ["ip", "-n", r, "addr", "add", f"{dc.gateway}/{dc.subnet.prefixlen}", "dev", BRIDGE],
                ["ip", "-n", r, "link", "set", BRIDGE, "up"],
                ["ip", "link", "add", dc.root_link, "type", "veth", "peer", "name", HOST_LINK, "netns", r],
                ["ip", "-n", r, "addr", "add", f"{router_ip}/30", "dev", HOST_LINK],
                ["ip", "-n", r, "link", "set", HOST_LINK, "up"],
                ["ip", "addr", "add", f"{root_ip}/30", "dev", dc.root_link],
                ["ip", "link", "set", dc.root_link, "up"],
                ["ip", "route", "add", str(dc.subnet), "via", str(router_ip), "dev", dc.root_link],
            ]
            if self.link == LINK_TUN:
                cmds += [["ip", "-n", r, "tuntap", "add", "dev", WAN_LINK, "mode", "tun"],
                         ["ip", "-n", r, "link", "set", WAN_LINK, "up"]]
            else:
                assert wan is not None
                cmds += [["ip", "-n", r, "link", "add", WAN_LINK, "type", "veth", "peer", "name", f"dc{dc.index}",
                          "netns", wan],
                         ["ip", "-n", wan, "link", "set", f"dc{dc.index}", "master", BRIDGE],
                         ["ip", "-n", wan, "link", "set", f"dc{dc.index}", "up"],
                         ["ip", "-n", r, "addr", "add", f"{dc.wan_address(self.base)}/24", "dev", WAN_LINK],
                         ["ip", "-n", r, "link", "set", WAN_LINK, "up"],
                         ["tc", "-n", r, "qdisc", "add", "dev", WAN_LINK, "root", *self._netem_args(self.latency_ms)]]
        for h in self.hosts:
            dc = self.datacenter(h.datacenter)
            r = dc.router_netns
            cmds += [
                ["ip", "netns", "add", h.netns],
                ["ip", "-n", h.netns, "link", "set", "lo", "up"],
                ["ip", "-n", r, "link", "add", h.router_port, "type", "veth", "peer", "name", HOST_ETH,
                 "netns", h.netns],
                ["ip", "-n", r, "link", "set", h.router_port, "master", BRIDGE],
                ["ip", "-n", r, "link", "set", h.router_port, "up"],
                ["ip", "-n", h.netns, "addr", "add", f"{h.address}/{dc.subnet.prefixlen}", "dev", HOST_ETH],
                ["ip", "-n", h.netns, "link", "set", HOST_ETH, "up"],
                ["ip", "-n", h.netns, "route", "add", "default", "via", str(dc.gateway)],
            ]
        for a, b in self.pairs():
            cmds += self.route_commands(a, b, cut=False)
        return cmds

    def _netem_args(self, latency_ms: float) -> list[str]:
        return ["netem", "delay", f"{latency_ms:g}ms", "limit", str(NETEM_LIMIT_PACKETS)]

    def route_commands(self, a: str, b: str, *, cut: bool, reject: bool = False) -> list[Command]:
        """The routes between datacenters a and b, both ways: the WAN ones, or (cut) blackhole
        routes that drop every packet silently (reject: prohibit routes, refused at once)."""
        da, db = self.datacenter(a), self.datacenter(b)
        assert da != db, f"a datacenter is never cut from itself ({a})"
        cmds = []
        for here, there in ((da, db), (db, da)):
            if cut:
                route = ["prohibit" if reject else "blackhole", str(there.subnet)]
            elif self.link == LINK_TUN:
                route = [str(there.subnet), "dev", WAN_LINK]
            else:
                route = [str(there.subnet), "via", str(there.wan_address(self.base)), "dev", WAN_LINK]
            cmds.append(["ip", "-n", here.router_netns, "route", "replace", *route])
        return cmds

    def latency_commands(self, latency_ms: float) -> list[Command]:
        """netem links: change the delay of every router's WAN qdisc (the TUN WAN is told
        with SIGHUP instead; it has no commands)."""
        check_latency(latency_ms)
        if self.link != LINK_NETEM:
            return []
        return [["tc", "-n", d.router_netns, "qdisc", "change", "dev", WAN_LINK, "root",
                 *self._netem_args(latency_ms)] for d in self.datacenters]

    def teardown_commands(self) -> list[Command]:
        """Deleting the namespaces deletes what is in them (veths, bridges, TUN devices, the
        routers' qdiscs and routes); the root ends of the host links and the root routes over
        them go with their peers, deleted here too so that they are gone when this returns."""
        return [["ip", "netns", "del", ns] for ns in self.namespaces()] + [
            ["ip", "link", "del", d.root_link] for d in self.datacenters]

    # ---- state file ---------------------------------------------------------------------

    def document(self) -> dict[str, Any]:
        return {"prefix": self.prefix, "base": str(self.base), "link": self.link, "latency_ms": self.latency_ms,
                "datacenters": [{"name": d.name, "index": d.index, "subnet": str(d.subnet),
                                 "router_netns": d.router_netns, "root_link": d.root_link} for d in self.datacenters],
                "hosts": [{"name": h.name, "netns": h.netns, "datacenter": h.datacenter, "address": str(h.address),
                           "router_port": h.router_port, "cluster": h.cluster, "node_id": h.node_id}
                          for h in self.hosts]}

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> LabPlan:
        return cls(prefix=doc["prefix"], base=IPv4Network(doc["base"]), link=doc["link"],
                   latency_ms=float(doc["latency_ms"]),
                   datacenters=tuple(Datacenter(d["name"], d["index"], IPv4Network(d["subnet"]), d["router_netns"],
                                                d["root_link"]) for d in doc["datacenters"]),
                   hosts=tuple(Host(h["name"], h["netns"], h["datacenter"], IPv4Address(h["address"]),
                                    h["router_port"], h["cluster"], h["node_id"]) for h in doc["hosts"]))


def sysctl(netns: str, key: str, value: str) -> Command:
    """Set a sysctl inside a namespace (/proc/sys/net is the namespace's own): with sh, which
    every system has, rather than procps' sysctl."""
    assert re.fullmatch(r"[a-z0-9_/]+", key) and re.fullmatch(r"[0-9]+", value), (key, value)
    return ["ip", "netns", "exec", netns, "sh", "-c", f"echo {value} > /proc/sys/{key}"]


def check_latency(latency_ms: float) -> None:
    if not 0 <= latency_ms <= LATENCY_MS_MAX:
        raise PlanError(f"latency must be 0 to {LATENCY_MS_MAX:g} ms, not {latency_ms:g}")


def lab_prefix(pid: int) -> str:
    return f"dcm-{pid}"


def safe_name(name: str) -> str:
    """A topology name as part of a namespace name (they allow what topology names allow,
    but keep to the safe set should that ever widen)."""
    return _SAFE.sub("_", name)


def pick_base(used: Iterable[IPv4Network], preferred: IPv4Network | None = None) -> IPv4Network:
    """The first candidate /16 (``preferred`` first) that overlaps none of ``used`` (the root
    namespace's routes and addresses, other labs' bases)."""
    used = [n for n in used if n.prefixlen > 0]  # a default route overlaps everything
    for candidate in ([preferred] if preferred is not None else []) + list(BASE_CANDIDATES):
        if not any(candidate.overlaps(n) for n in used):
            return candidate
    raise PlanError("no free /16 for the lab: every one of 10.10-254.0.0 and 172.16-31.0.0 overlaps a route "
                    "of this machine or another lab; pass --base-network")


def plan_lab(topology: Topology, *, prefix: str, base: IPv4Network, link: str = LINK_TUN,
             latency_ms: float = DEFAULT_LATENCY_MS) -> LabPlan:
    """Datacenters in the order their first cluster appears in the file; a datacenter's hosts
    are its clusters' nodes (brokers, then dedicated controllers; file order) and, if a flow
    copies into one of its clusters, the mirror host."""
    check_latency(latency_ms)
    if link not in LINKS:
        raise PlanError(f"link must be one of {', '.join(LINKS)}, not {link!r}")
    if base.prefixlen > 16:
        raise PlanError(f"the base network must be a /16 or larger, not {base}")
    by_dc: dict[str, list[tuple[str, NodeAddress]]] = {}
    for cluster in topology.clusters.values():
        by_dc.setdefault(cluster.datacenter, []).extend((cluster.name, a) for a in cluster.nodes)
    if len(by_dc) > DATACENTERS_MAX:
        raise PlanError(f"the lab holds at most {DATACENTERS_MAX} datacenters, the topology has {len(by_dc)}")
    targets = {topology.cluster(f.target).datacenter for f in topology.mirrors}
    root_link_base = prefix.replace("-", "")
    datacenters, hosts, netns_names = [], [], set()

    def netns(name: str) -> str:
        ns = f"{prefix}-{safe_name(name)}"
        while ns in netns_names:  # two names that differ only in unsafe characters
            ns += "_"
        netns_names.add(ns)
        return ns

    for index, (dc_name, nodes) in enumerate(by_dc.items(), start=1):
        if len(nodes) > HOSTS_PER_DATACENTER_MAX:
            raise PlanError(f"datacenter {dc_name!r} has {len(nodes)} nodes; the lab holds at most "
                            f"{HOSTS_PER_DATACENTER_MAX} per datacenter")
        subnet = IPv4Network(f"{base.network_address + (index << 8)}/24")
        root_link = f"{root_link_base}h{index}"
        if len(root_link) > IFNAME_MAX:
            raise PlanError(f"lab prefix {prefix!r} is too long for interface names ({root_link!r})")
        datacenters.append(Datacenter(dc_name, index, subnet, netns(f"{dc_name}-router"), root_link))
        for k, (cluster_name, node) in enumerate(nodes, start=1):
            hosts.append(Host(f"{cluster_name}-{node.node_id}", netns(f"{cluster_name}-{node.node_id}"), dc_name,
                              subnet.network_address + k, f"h{k}", cluster_name, node.node_id))
        if dc_name in targets:
            hosts.append(Host(f"mirror-{dc_name}", netns(f"{dc_name}-mirror"), dc_name,
                              subnet.network_address + MIRROR_HOST, f"h{MIRROR_HOST}"))
    return LabPlan(prefix, base, link, latency_ms, tuple(datacenters), tuple(hosts))


def lab_topology(topology: Topology, plan: LabPlan, work_dir: Path) -> Topology:
    """``topology`` as the lab runs it: every node at its host's address (same port: each has
    its own namespace), its more listeners too (a secured cluster's plaintext loopback
    listener stays on loopback: the host's own), every cluster's data under
    ``work_dir/data/<cluster>``, the warehouse under ``work_dir/warehouse``, mirror workers'
    admin HTTP on their mirror host's address, a schema registry on its cluster's first
    broker's host, the web console on console_host's."""
    clusters = {}
    for name, c in topology.clusters.items():
        def moved(addresses: Sequence[NodeAddress], cluster: str = name) -> tuple[NodeAddress, ...]:
            return tuple(NodeAddress(a.node_id, str(plan.node_host(cluster, a.node_id).address), a.port)
                         for a in addresses)

        listeners = {listener: addresses if c.is_host_local(listener) else moved(addresses)
                     for listener, addresses in c.listeners.items()}
        # The schema registry runs on the host of the cluster's first broker (deploy/lab/run.py,
        # node_netns), on its port: mirror workers and the root namespace reach it there.
        registry = c.registry and dataclasses.replace(c.registry, listen=NodeAddress(
            0, str(plan.node_host(name, c.brokers[0].node_id).address), c.registry.listen.port))
        clusters[name] = dataclasses.replace(c, brokers=moved(c.brokers), controllers=moved(c.controllers),
                                             listeners=listeners, data_dir=work_dir / "data" / name,
                                             registry=registry)
    # Mirror workers run on their target datacenter's mirror host: their admin HTTP too, so
    # `dcmirror status` from the root namespace asks them across the lab's network.
    mirrors = []
    for f in topology.mirrors:
        host = str(plan.mirror_host(topology.cluster(f.target).datacenter).address)
        if f.workers_http:
            f = dataclasses.replace(f, workers_http=tuple(NodeAddress(a.node_id, host, a.port)
                                                          for a in f.workers_http))
        elif f.config.get("http.port.base") and f.config.get("http.host", "127.0.0.1") in ("127.0.0.1", "localhost"):
            f = dataclasses.replace(f, config={**f.config, "http.host": host})
        mirrors.append(f)
    warehouse = topology.warehouse
    if warehouse is not None:
        warehouse = dataclasses.replace(warehouse, path=work_dir / "warehouse")
    console = topology.console
    if console is not None:  # on its host (console_host), on its port
        console = dataclasses.replace(console, listen=NodeAddress(
            0, str(console_host(plan, topology).address), console.listen.port))
    return dataclasses.replace(topology, path=work_dir / "topology.toml", clusters=clusters, warehouse=warehouse,
                               mirrors=tuple(mirrors), console=console)


def console_host(plan: LabPlan, topology: Topology) -> Host:
    """Where the web console runs in the lab: in the datacenter the data flows to (the
    warehouse's cluster's, else the first flow's target's, else the first cluster's), on its
    mirror host when it has one, else on its first cluster's first broker's host. From there
    it sees a datacenter cut off as an operator there would."""
    if topology.warehouse is not None:
        cluster = topology.cluster(topology.warehouse.source)
    elif topology.mirrors:
        cluster = topology.cluster(topology.mirrors[0].target)
    else:
        cluster = next(iter(topology.clusters.values()))
    try:
        return plan.mirror_host(cluster.datacenter)
    except PlanError:
        return plan.node_host(cluster.name, cluster.brokers[0].node_id)
