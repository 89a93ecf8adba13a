"""The user-space WAN between the lab's datacenters, sans-IO: IPv4 packets in, the same
packets out ``latency_ms`` later, towards the datacenter whose subnet holds their
destination.

Where the kernel has no netem qdisc, each datacenter's router namespace has a TUN device
(wan0) with routes to the other datacenters' subnets over it; deploy/lab/tun.py reads every
router's wan0, hands the packets to :class:`Wan` with the time, and writes what
``due(now_ms)`` returns into the destination router's wan0. So TCP between datacenters sees
a real round trip of twice the latency, and a cut (blackhole routes in the routers, see
deploy/lab/plan.py) drops real packets: connections stall and retransmit, exactly as over a
failed WAN link.

A link never reorders: a packet is due no earlier than the one queued before it, also when
the latency is lowered while packets are in flight. The queue is bounded in bytes; a full
queue drops the new packet (tail drop, as a router does), and every drop is counted by
reason.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network

from deploy.lab.plan import LATENCY_MS_MAX

PACKET_BYTES_MAX = 65_535  # an IPv4 datagram's largest total length
QUEUE_BYTES_MAX = 64 << 20
DROP_REASONS = ("not_ipv4", "malformed", "no_route", "same_datacenter", "queue_full")


@dataclass
class LinkCounters:
    packets: int = 0
    bytes: int = 0


@dataclass
class WanCounters:
    links: dict[tuple[str, str], LinkCounters] = field(default_factory=dict)
    """(from, to) datacenter -> what was delivered."""
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))


class Wan:
    def __init__(self, subnets: Mapping[str, IPv4Network], latency_ms: float, *,
                 queue_bytes_max: int = QUEUE_BYTES_MAX) -> None:
        assert queue_bytes_max >= PACKET_BYTES_MAX, queue_bytes_max
        self.subnets = dict(subnets)
        self._by_prefix: dict[bytes, str] = {}  # the /24's first three octets -> datacenter
        for name, net in self.subnets.items():
            assert net.prefixlen == 24, f"datacenter subnets are /24s: {name} {net}"
            self._by_prefix[net.network_address.packed[:3]] = name
        self.latency_ms = 0.0
        self.set_latency(latency_ms)
        self.queue_bytes_max = queue_bytes_max
        self.queued_bytes = 0
        self._queue: deque[tuple[float, str, str, bytes]] = deque()  # (due_ms, from, to, packet)
        self.counters = WanCounters()

    def set_latency(self, latency_ms: float) -> None:
        """The one-way delay of packets received from now on."""
        assert 0 <= latency_ms <= LATENCY_MS_MAX, latency_ms
        self.latency_ms = float(latency_ms)

    def datacenter_of(self, address: IPv4Address) -> str | None:
        return self._by_prefix.get(address.packed[:3])

    def receive(self, from_dc: str, packet: bytes, now_ms: float) -> bool:
        """A packet read from ``from_dc``'s wan0; False if it was dropped."""
        assert from_dc in self.subnets, from_dc
        if not packet or packet[0] >> 4 != 4:
            return self._drop("not_ipv4")
        if len(packet) < 20 or len(packet) > PACKET_BYTES_MAX:
            return self._drop("malformed")
        to_dc = self._by_prefix.get(packet[16:19])
        if to_dc is None or IPv4Address(packet[16:20]) not in self.subnets[to_dc]:
            return self._drop("no_route")
        if to_dc == from_dc:
            return self._drop("same_datacenter")  # its router delivers those itself
        if self.queued_bytes + len(packet) > self.queue_bytes_max:
            return self._drop("queue_full")
        due = now_ms + self.latency_ms
        if self._queue and self._queue[-1][0] > due:
            due = self._queue[-1][0]  # never overtake a packet sent earlier
        self._queue.append((due, from_dc, to_dc, packet))
        self.queued_bytes += len(packet)
        return True

    def _drop(self, reason: str) -> bool:
        self.counters.dropped[reason] += 1
        return False

    def next_due_ms(self) -> float | None:
        """When the next packet is due (None: nothing in flight)."""
        return self._queue[0][0] if self._queue else None

    def due(self, now_ms: float) -> list[tuple[str, bytes]]:
        """The packets due by ``now_ms``, in the order received, with their destination."""
        out = []
        queue = self._queue
        while queue and queue[0][0] <= now_ms:
            _, from_dc, to_dc, packet = queue.popleft()
            self.queued_bytes -= len(packet)
            link = self.counters.links.get((from_dc, to_dc))
            if link is None:
                link = self.counters.links[from_dc, to_dc] = LinkCounters()
            link.packets += 1
            link.bytes += len(packet)
            out.append((to_dc, packet))
        return out

    @property
    def queued_packets(self) -> int:
        return len(self._queue)

    def document(self) -> dict[str, object]:
        """Counters for the WAN's status file."""
        return {"latency_ms": self.latency_ms, "queued_packets": len(self._queue), "queued_bytes": self.queued_bytes,
                "links": {f"{a}>{b}": {"packets": c.packets, "bytes": c.bytes}
                          for (a, b), c in sorted(self.counters.links.items())},
                "dropped": dict(self.counters.dropped)}
