"""The lab's plan (deploy/lab/plan.py): addresses, names, commands, the lab topology."""

from __future__ import annotations

import dataclasses
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

import pytest

from deploy.lab.plan import (
    LINK_NETEM,
    LINK_TUN,
    LabPlan,
    PlanError,
    lab_topology,
    pick_base,
    plan_lab,
)
from deploy.lab.run import node_netns
from deploy.processes import ChildSpec
from deploy.render.toml_out import dump_topology
from topology import load_default, loads

BASE = IPv4Network("10.20.0.0/16")


def default_plan(link: str = LINK_TUN, latency_ms: float = 30.0) -> LabPlan:
    return plan_lab(load_default(), prefix="dcm-4194304", base=BASE, link=link, latency_ms=latency_ms)


def test_addresses_of_the_default_topology() -> None:
    plan = default_plan()
    assert [(d.name, d.index, str(d.subnet), str(d.gateway)) for d in plan.datacenters] == [
        ("east", 1, "10.20.1.0/24", "10.20.1.254"),
        ("west", 2, "10.20.2.0/24", "10.20.2.254"),
        ("central", 3, "10.20.3.0/24", "10.20.3.254")]
    hosts = {h.name: (h.datacenter, str(h.address), h.netns, h.router_port) for h in plan.hosts}
    assert hosts == {
        "east-1": ("east", "10.20.1.1", "dcm-4194304-east-1", "h1"),
        "east-2": ("east", "10.20.1.2", "dcm-4194304-east-2", "h2"),
        "east-3": ("east", "10.20.1.3", "dcm-4194304-east-3", "h3"),
        "west-1": ("west", "10.20.2.1", "dcm-4194304-west-1", "h1"),
        "west-2": ("west", "10.20.2.2", "dcm-4194304-west-2", "h2"),
        "west-3": ("west", "10.20.2.3", "dcm-4194304-west-3", "h3"),
        "aggregate-1": ("central", "10.20.3.1", "dcm-4194304-aggregate-1", "h1"),
        "aggregate-2": ("central", "10.20.3.2", "dcm-4194304-aggregate-2", "h2"),
        "aggregate-3": ("central", "10.20.3.3", "dcm-4194304-aggregate-3", "h3"),
        # the flows copy into aggregate only: one mirror host, in its datacenter
        "mirror-central": ("central", "10.20.3.253", "dcm-4194304-central-mirror", "h253"),
    }
    east = plan.datacenter("east")
    assert east.host_link(BASE) == (IPv4Address("10.20.0.5"), IPv4Address("10.20.0.6"))
    assert plan.datacenter("central").host_link(BASE) == (IPv4Address("10.20.0.13"), IPv4Address("10.20.0.14"))
    assert [d.root_link for d in plan.datacenters] == ["dcm4194304h1", "dcm4194304h2", "dcm4194304h3"]
    assert all(len(d.root_link) <= 15 for d in plan.datacenters)  # IFNAMSIZ
    namespaces = plan.namespaces()
    assert len(namespaces) == len(set(namespaces)) == 10 + 3
    assert all(ns.startswith("dcm-4194304-") for ns in namespaces)
    assert plan.node_host("west", 2).address == IPv4Address("10.20.2.2")
    assert plan.mirror_host("central").netns == "dcm-4194304-central-mirror"
    with pytest.raises(PlanError, match="no mirror host in datacenter 'east'"):
        plan.mirror_host("east")
    with pytest.raises(PlanError, match="datacenters: east, west, central"):
        plan.datacenter("north")
    assert plan.pairs() == [("east", "west"), ("east", "central"), ("west", "central")]


def test_clusters_sharing_a_datacenter_share_its_subnet_and_controllers_get_hosts() -> None:
    topology = loads("""
[clusters.a]
datacenter = "dc1"
brokers = ["127.0.0.1:9001", "127.0.0.1:9002"]
controllers = ["127.0.0.1:9101"]
[clusters.b]
datacenter = "dc1"
brokers = ["127.0.0.1:9003"]
[clusters.c]
datacenter = "dc2"
brokers = ["127.0.0.1:9004"]
[[mirrors]]
source = "c"
target = "b"
topics = ".*"
[[mirrors]]
source = "a"
target = "c"
topics = ".*"
""", base_dir=Path("/tmp"))
    plan = plan_lab(topology, prefix="dcm-7", base=BASE)
    assert [(h.name, str(h.address), h.datacenter) for h in plan.hosts] == [
        ("a-1", "10.20.1.1", "dc1"), ("a-2", "10.20.1.2", "dc1"), ("a-3", "10.20.1.3", "dc1"),
        ("b-1", "10.20.1.4", "dc1"), ("mirror-dc1", "10.20.1.253", "dc1"),
        ("c-1", "10.20.2.1", "dc2"), ("mirror-dc2", "10.20.2.253", "dc2")]


def test_the_lab_topology_moves_nodes_and_paths_and_keeps_everything_else(tmp_path: Path) -> None:
    from topology.model import NodeAddress, RegistrySpec

    original = load_default()
    plan = default_plan()
    lab = lab_topology(original, plan, tmp_path)
    assert lab.path == tmp_path / "topology.toml"
    for name, cluster in lab.clusters.items():
        before = original.clusters[name]
        assert cluster.data_dir == tmp_path / "data" / name
        assert [a.port for a in cluster.brokers] == [a.port for a in before.brokers]
        assert [(a.node_id, a.host) for a in cluster.brokers] == [
            (a.node_id, str(plan.node_host(name, a.node_id).address)) for a in before.brokers]
        assert (cluster.datacenter, cluster.config) == (before.datacenter, before.config)
        # the default's registry of each cluster: on the host of its first broker, same port
        assert cluster.registry is not None and before.registry is not None
        assert (cluster.registry.listen.host, cluster.registry.listen.port) == (
            str(plan.node_host(name, 1).address), before.registry.listen.port)
    # A registry per cluster: on the host of the cluster's first broker, same port, and `up`
    # starts it in that host's namespace.
    with_registries = dataclasses.replace(original, clusters={
        name: dataclasses.replace(c, registry=RegistrySpec(NodeAddress(0, "127.0.0.1", 18081 + i * 10000)))
        for i, (name, c) in enumerate(original.clusters.items())})
    lab_r = lab_topology(with_registries, plan, tmp_path / "with-registries")
    for name, cluster in lab_r.clusters.items():
        before_r = with_registries.clusters[name].registry
        assert cluster.registry is not None and before_r is not None
        assert (cluster.registry.listen.host, cluster.registry.listen.port) == (
            str(plan.node_host(name, 1).address), before_r.listen.port)
        registry = ChildSpec(f"registry {name}", ["dcmirror", "registry", "--config", "t.toml", "--cluster", name],
                             tmp_path / "registry.log")
        assert node_netns(plan, lab_r, registry) == plan.node_host(name, 1).netns
    assert lab.topics == original.topics and lab.defaults == original.defaults
    # A web console: in the datacenter the data flows to (the warehouse's), on its mirror host,
    # same port, and `up` starts it in that host's namespace.
    from topology.model import ConsoleSpec

    with_console = dataclasses.replace(original, console=ConsoleSpec(NodeAddress(0, "127.0.0.1", 8480)))
    lab_c = lab_topology(with_console, plan, tmp_path / "with-console")
    assert lab_c.console is not None
    assert (lab_c.console.listen.host, lab_c.console.listen.port) == (str(plan.mirror_host("central").address), 8480)
    console = ChildSpec("console", ["dcmirror", "console", "--config", "t.toml"], tmp_path / "console.log")
    assert node_netns(plan, lab_c, console) == plan.mirror_host("central").netns
    without = lab_topology(dataclasses.replace(original, console=None), plan, tmp_path / "without-console")
    assert node_netns(plan, without, console) is None  # no [console]: nothing to place
    # mirror workers (and their admin HTTP) live on the target datacenter's mirror host
    mirror_host = str(plan.mirror_host("central").address)
    assert [[(a.host, a.port) for a in f.workers_http] for f in lab.mirrors] == [
        [(mirror_host, a.port) for a in f.workers_http] for f in original.mirrors]
    assert [dataclasses.replace(f, workers_http=()) for f in lab.mirrors] == [
        dataclasses.replace(f, workers_http=()) for f in original.mirrors]
    assert lab.warehouse is not None and original.warehouse is not None
    assert lab.warehouse.path == tmp_path / "warehouse" and lab.warehouse.topics == original.warehouse.topics
    # What `lab up` writes is what the children load back.
    again = loads(dump_topology(lab), path=lab.path, check_files=False)
    assert again.clusters == lab.clusters and again.mirrors == lab.mirrors and again.topics == lab.topics
    assert again.cluster("aggregate").bootstrap("BROKER") == "10.20.3.1:39092,10.20.3.2:39093,10.20.3.3:39094"
    # more listeners move with their broker; the plaintext loopback one stays each host's own
    assert again.cluster("aggregate").bootstrap() == "10.20.3.1:39095,10.20.3.2:39096,10.20.3.3:39097"
    assert again.cluster("aggregate").bootstrap("LOCAL") == "127.0.0.1:39098,127.0.0.1:39099,127.0.0.1:39100"


def test_setup_commands_tun() -> None:
    plan = default_plan()
    cmds = [" ".join(c) for c in plan.setup_commands()]
    for ns in plan.namespaces():
        assert cmds.count(f"ip netns add {ns}") == 1
    r = "dcm-4194304-east-router"
    assert f"ip -n {r} tuntap add dev wan0 mode tun" in cmds
    assert f"ip netns exec {r} sh -c echo 1 > /proc/sys/net/ipv4/ip_forward" in cmds
    assert "ip link add dcm4194304h1 type veth peer name host0 netns dcm-4194304-east-router" in cmds
    assert "ip route add 10.20.1.0/24 via 10.20.0.5 dev dcm4194304h1" in cmds
    assert "ip -n dcm-4194304-east-1 route add default via 10.20.1.254" in cmds
    assert "ip -n dcm-4194304-east-1 addr add 10.20.1.1/24 dev eth0" in cmds
    # every router routes every other datacenter over its wan0
    assert f"ip -n {r} route replace 10.20.3.0/24 dev wan0" in cmds
    assert "ip -n dcm-4194304-central-router route replace 10.20.1.0/24 dev wan0" in cmds
    assert not any(c.startswith("tc ") for c in cmds)
    # a namespace is made before anything goes into it
    for i, c in enumerate(cmds):
        for ns in plan.namespaces():
            if f"-n {ns} " in c or c.endswith(f"netns {ns}"):
                assert cmds.index(f"ip netns add {ns}") < i, c


def test_setup_commands_netem() -> None:
    plan = default_plan(LINK_NETEM, latency_ms=12.5)
    cmds = [" ".join(c) for c in plan.setup_commands()]
    assert plan.wan_netns == "dcm-4194304-wan"
    assert "ip netns add dcm-4194304-wan" in cmds
    r = "dcm-4194304-west-router"
    assert f"ip -n {r} link add wan0 type veth peer name dc2 netns dcm-4194304-wan" in cmds
    assert f"ip -n {r} addr add 10.20.255.2/24 dev wan0" in cmds
    assert f"tc -n {r} qdisc add dev wan0 root netem delay 12.5ms limit 100000" in cmds
    assert f"ip -n {r} route replace 10.20.3.0/24 via 10.20.255.3 dev wan0" in cmds
    assert not any("tuntap" in c for c in cmds)


@pytest.mark.parametrize("link", [LINK_TUN, LINK_NETEM])
def test_cut_and_heal_routes(link: str) -> None:
    plan = default_plan(link)
    east, central = "dcm-4194304-east-router", "dcm-4194304-central-router"
    assert plan.route_commands("east", "central", cut=True) == [
        ["ip", "-n", east, "route", "replace", "blackhole", "10.20.3.0/24"],
        ["ip", "-n", central, "route", "replace", "blackhole", "10.20.1.0/24"]]
    assert plan.route_commands("central", "east", cut=True, reject=True) == [
        ["ip", "-n", central, "route", "replace", "prohibit", "10.20.1.0/24"],
        ["ip", "-n", east, "route", "replace", "prohibit", "10.20.3.0/24"]]
    via = {LINK_TUN: [], LINK_NETEM: ["via", "10.20.255.3"]}[link]
    assert plan.route_commands("east", "central", cut=False)[0] == [
        "ip", "-n", east, "route", "replace", "10.20.3.0/24", *via, "dev", "wan0"]
    # a cut touches only the two routers: west's routes stay
    assert not any("west" in " ".join(c) for c in plan.route_commands("east", "central", cut=True))


def test_latency_commands() -> None:
    assert default_plan(LINK_TUN).latency_commands(0) == []  # the TUN WAN is told by SIGHUP
    assert default_plan(LINK_NETEM).latency_commands(45) == [
        ["tc", "-n", f"dcm-4194304-{dc}-router", "qdisc", "change", "dev", "wan0", "root", "netem", "delay", "45ms",
         "limit", "100000"] for dc in ("east", "west", "central")]
    with pytest.raises(PlanError, match="latency must be 0 to 10000 ms, not -1"):
        default_plan(LINK_NETEM).latency_commands(-1)
    with pytest.raises(PlanError, match="not 20000"):
        default_plan(latency_ms=20_000)


def test_teardown_removes_every_namespace_and_root_link() -> None:
    plan = default_plan(LINK_NETEM)
    cmds = plan.teardown_commands()
    assert sorted(c[-1] for c in cmds if c[:3] == ["ip", "netns", "del"]) == sorted(plan.namespaces())
    assert [c for c in cmds if c[:3] == ["ip", "link", "del"]] == [
        ["ip", "link", "del", f"dcm4194304h{i}"] for i in (1, 2, 3)]


def test_document_round_trip() -> None:
    for link in (LINK_TUN, LINK_NETEM):
        plan = default_plan(link, latency_ms=7.5)
        assert LabPlan.from_document(plan.document()) == plan


def test_pick_base() -> None:
    assert pick_base([]) == IPv4Network("10.10.0.0/16")
    # a default route overlaps everything and is no reason to skip a network
    assert pick_base([IPv4Network("0.0.0.0/0"), IPv4Network("10.10.4.0/24"), IPv4Network("10.11.0.0/16")]) == \
        IPv4Network("10.12.0.0/16")
    assert pick_base([IPv4Network("10.10.0.0/16")], preferred=IPv4Network("10.77.0.0/16")) == \
        IPv4Network("10.77.0.0/16")
    assert pick_base([IPv4Network("10.77.1.1/32")], preferred=IPv4Network("10.77.0.0/16")) == \
        IPv4Network("10.10.0.0/16")
    # a VPN's 10/8 leaves 172.16/12
    assert pick_base([IPv4Network("10.0.0.0/8")]) == IPv4Network("172.16.0.0/16")
    with pytest.raises(PlanError, match="no free /16"):
        pick_base([IPv4Network("10.0.0.0/8"), IPv4Network("172.16.0.0/12")])


def test_limits() -> None:
    many_dcs = "\n".join(f'[clusters.c{i}]\ndatacenter = "dc{i}"\nbrokers = ["127.0.0.1:{10000 + i}"]'
                         for i in range(64))
    with pytest.raises(PlanError, match="at most 63 datacenters, the topology has 64"):
        plan_lab(loads(many_dcs, base_dir=Path("/tmp")), prefix="dcm-1", base=BASE)
    big = "\n".join(f'[clusters.c{i}]\ndatacenter = "dc"\nbrokers = ['
                    + ", ".join(f'"127.0.0.1:{20000 + 100 * i + n}"' for n in range(100)) + "]" for i in range(3))
    with pytest.raises(PlanError, match="datacenter 'dc' has 300 nodes; the lab holds at most 252"):
        plan_lab(loads(big, base_dir=Path("/tmp")), prefix="dcm-1", base=BASE)
    with pytest.raises(PlanError, match="must be a /16 or larger"):
        plan_lab(load_default(), prefix="dcm-1", base=IPv4Network("10.1.1.0/24"))
    with pytest.raises(PlanError, match="too long for interface names"):
        plan_lab(load_default(), prefix="dcm-123456789012", base=BASE)
    with pytest.raises(PlanError, match="link must be one of netem, tun"):
        plan_lab(load_default(), prefix="dcm-1", base=BASE, link="vxlan")
