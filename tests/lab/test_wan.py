"""The user-space WAN's delay line (deploy/lab/wan.py): routing by destination, the delay,
order, bounds and drop counters."""

from __future__ import annotations

import struct
from ipaddress import IPv4Address, IPv4Network

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deploy.lab.wan import PACKET_BYTES_MAX, Wan

SUBNETS = {"east": IPv4Network("10.20.1.0/24"), "west": IPv4Network("10.20.2.0/24"),
           "central": IPv4Network("10.20.3.0/24")}


def packet(dst: str, payload: bytes = b"", src: str = "10.20.1.1") -> bytes:
    """A minimal IPv4 header (no checksum: the WAN does not look at it) and the payload."""
    header = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 0, 0, 64, 6, 0,
                         IPv4Address(src).packed, IPv4Address(dst).packed)
    return header + payload


def test_a_packet_arrives_in_its_destination_datacenter_after_the_latency() -> None:
    wan = Wan(SUBNETS, 30)
    p = packet("10.20.3.7", b"hello")
    assert wan.receive("east", p, now_ms=1000.0)
    assert wan.next_due_ms() == 1030.0
    assert wan.due(1029.999) == []
    assert wan.due(1030.0) == [("central", p)]
    assert wan.next_due_ms() is None and wan.queued_bytes == 0
    assert wan.document()["links"] == {"east>central": {"packets": 1, "bytes": len(p)}}


def test_zero_latency_still_goes_through_the_queue_in_order() -> None:
    wan = Wan(SUBNETS, 0)
    ps = [packet("10.20.2.1", bytes([i])) for i in range(5)]
    for p in ps:
        wan.receive("central", p, 5.0)
    assert wan.due(5.0) == [("west", p) for p in ps]


def test_drops_are_counted_by_reason() -> None:
    wan = Wan(SUBNETS, 10, queue_bytes_max=PACKET_BYTES_MAX)
    assert not wan.receive("east", b"", 0)
    assert not wan.receive("east", b"\x60" + bytes(39), 0)  # IPv6 (router solicitations and the like)
    assert not wan.receive("east", packet("10.20.3.1")[:19], 0)
    assert not wan.receive("east", packet("10.30.3.1"), 0)  # no datacenter has it
    assert not wan.receive("east", packet("10.20.1.9"), 0)  # its own router delivers those
    assert wan.receive("east", packet("10.20.3.1", bytes(PACKET_BYTES_MAX - 100)), 0)
    assert not wan.receive("east", packet("10.20.2.1", bytes(200)), 0)  # the queue is full
    assert wan.document()["dropped"] == {"not_ipv4": 2, "malformed": 1, "no_route": 1, "same_datacenter": 1,
                                         "queue_full": 1}
    assert wan.queued_packets == 1
    assert len(wan.due(10)) == 1 and wan.queued_bytes == 0
    assert wan.receive("east", packet("10.20.2.1", bytes(200)), 10)  # room again


def test_lowering_the_latency_never_reorders() -> None:
    wan = Wan(SUBNETS, 100)
    first = packet("10.20.3.1", b"1")
    wan.receive("east", first, 0)
    wan.set_latency(0)
    second = packet("10.20.3.1", b"2")
    wan.receive("west", second, 50)  # would be due at 50, before the first (100)
    assert wan.due(99) == []
    assert wan.due(100) == [("central", first), ("central", second)]
    third = packet("10.20.1.1", b"3")
    wan.receive("central", third, 200)
    assert wan.due(200) == [("east", third)]  # and new packets get the new latency
    wan.set_latency(40)
    wan.receive("central", third, 300)
    assert wan.next_due_ms() == 340


def test_bad_latency_is_a_programming_error() -> None:
    with pytest.raises(AssertionError):
        Wan(SUBNETS, -1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(SUBNETS)), st.sampled_from(sorted(SUBNETS)),
                          st.integers(0, 1500), st.floats(0, 50), st.sampled_from([0.0, 5.0, 30.0])),
                max_size=60))
def test_every_packet_is_delivered_once_in_order_never_early(
        events: list[tuple[str, str, int, float, float]]) -> None:
    """Any sequence of packets (increasing receive times, latency changes between them):
    each packet to another datacenter comes out once, in the order received, to its
    destination, no earlier than received + the latency of the moment."""
    wan = Wan(SUBNETS, 30)
    now = 0.0
    sent: list[tuple[str, bytes, float]] = []
    out: list[tuple[float, str, bytes]] = []
    for i, (src, dst, size, gap_ms, latency) in enumerate(events):
        now += gap_ms
        for to, p in wan.due(now):
            out.append((now, to, p))
        wan.set_latency(latency)
        p = packet(str(SUBNETS[dst].network_address + 1), i.to_bytes(2, "big") + bytes(size))
        if wan.receive(src, p, now):
            assert src != dst
            sent.append((dst, p, now + latency))
        else:
            assert src == dst
    while wan.next_due_ms() is not None:
        now = max(now, wan.next_due_ms() or now)
        out += [(now, to, p) for to, p in wan.due(now)]
    assert [(to, p) for _, to, p in out] == [(dst, p) for dst, p, _ in sent]
    assert all(at >= earliest for (at, _, _), (_, _, earliest) in zip(out, sent, strict=True))
    assert wan.queued_bytes == 0 and wan.queued_packets == 0
    assert sum(c["packets"] for c in wan.document()["links"].values()) == len(sent)  # type: ignore[attr-defined]
