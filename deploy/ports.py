"""Every address `dcmirror up` will listen on, and which of them another process holds.

`up` asks before it starts anything: a port in use (another `dcmirror up` of the same or
another file, a Kafka on 9092, a process left from a killed run) is named with what of the
topology wanted it, instead of a broker exiting half-way through the start. The addresses
are the topology's own rules: every node's listeners, a broker's admin HTTP (its rule in
cluster/broker/config.py), each registry, each mirror worker's admin HTTP and the console.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass

from topology.model import Topology


@dataclass(frozen=True)
class Listen:
    host: str
    port: int
    what: str  # "cluster east node 1, listener BROKER"

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def listen_addresses(topology: Topology) -> list[Listen]:
    """Every host:port the topology's processes bind, in start order."""
    from deploy.render.monitoring import broker_admin_http

    out: list[Listen] = []
    for name, spec in topology.clusters.items():
        for node in spec.nodes:
            for entry in spec.node_listeners(node.node_id).split(","):
                listener, _, address = entry.partition("://")
                host, _, port = address.rpartition(":")
                out.append(Listen(host.strip("[]"), int(port), f"cluster {name} node {node.node_id}, listener {listener}"))
            if node in spec.brokers:
                admin = broker_admin_http(spec, node)
                if admin is not None:
                    out.append(Listen(admin[0], admin[1], f"cluster {name} node {node.node_id}, admin HTTP"))
        if spec.registry is not None:
            out.append(Listen(spec.registry.listen.host, spec.registry.listen.port, f"the schema registry of {name}"))
    for flow in topology.mirrors:
        for index in range(flow.workers):
            http = flow.http_address(index)
            if http is not None:
                out.append(Listen(http[0], http[1], f"flow {flow.name} worker {index}, admin HTTP"))
    if topology.console is not None:
        out.append(Listen(topology.console.listen.host, topology.console.listen.port, "the web console"))
    return out


def in_use(addresses: list[Listen]) -> list[Listen]:
    """Those another process listens on (bound and refused with EADDRINUSE). An address this
    host does not have is not ours to judge here: the process that binds it says so."""
    taken = []
    for address in addresses:
        family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
            try:
                sock.bind((address.host, address.port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    taken.append(address)
    return taken


def clashes(addresses: list[Listen]) -> list[tuple[Listen, Listen]]:
    """Pairs of the topology's own addresses that are one (the second would fail to bind)."""
    seen: dict[tuple[str, int], Listen] = {}
    out = []
    for address in addresses:
        key = (address.host, address.port)
        if key in seen:
            out.append((seen[key], address))
        else:
            seen[key] = address
    return out
