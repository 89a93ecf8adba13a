"""`dcmirror lab wan`: the user-space WAN (deploy/lab/wan.py) over the routers' TUN devices.

`lab up` runs it as a supervised child in the root namespace when the kernel has no netem.
It opens every router's wan0 from inside that router's namespace (the device belongs to the
namespace its file was opened in), then, in one trio loop, reads packets from every wan0 and
writes each into its destination router's wan0 when it is due. It writes its counters to
<work dir>/wan.json every second; SIGHUP makes it read the latency from lab.json again
(`dcmirror lab latency MS`); SIGTERM stops it.
"""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import time
from pathlib import Path

import trio

from deploy.lab.network import entered
from deploy.lab.plan import WAN_LINK, LabPlan
from deploy.lab.state import me, read_state, write_wan
from deploy.lab.wan import PACKET_BYTES_MAX, Wan

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
READS_PER_WAKEUP_MAX = 512  # then the other devices and the delivery get a turn
REPORT_INTERVAL_S = 1.0


def open_tun(netns: str, name: str = WAN_LINK) -> int:
    """A non-blocking file of the (persistent, `ip tuntap add`) TUN device ``name`` in ``netns``."""
    with entered(netns):
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
        except OSError:
            os.close(fd)
            raise
    return fd


class TunWan:
    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        plan = LabPlan.from_document(read_state(work_dir)["plan"])
        self.wan = Wan({d.name: d.subnet for d in plan.datacenters}, plan.latency_ms)
        self.fds = {d.name: open_tun(d.router_netns) for d in plan.datacenters}
        self.write_errors = 0
        self._wake = trio.Event()

    @staticmethod
    def now_ms() -> float:
        return trio.current_time() * 1000

    async def read_loop(self, dc: str, fd: int) -> None:
        wan = self.wan
        while True:
            await trio.lowlevel.wait_readable(fd)
            now = self.now_ms()
            for _ in range(READS_PER_WAKEUP_MAX):
                try:
                    packet = os.read(fd, PACKET_BYTES_MAX)
                except BlockingIOError:
                    break
                wan.receive(dc, packet, now)
            self._wake.set()
            await trio.lowlevel.checkpoint()

    async def deliver_loop(self) -> None:
        wan = self.wan
        while True:
            due = wan.next_due_ms()
            if due is None:
                await self._wake.wait()
                self._wake = trio.Event()
                continue
            if due > self.now_ms():
                # Packets received meanwhile are due later (never before the head of the queue).
                await trio.sleep_until(due / 1000)
            for to_dc, packet in wan.due(self.now_ms()):
                try:
                    os.write(self.fds[to_dc], packet)
                except OSError:  # e.g. the device went down; the sender retransmits
                    self.write_errors += 1

    def report(self) -> None:
        write_wan(self.work_dir, {**me(), "written_ms": int(time.time() * 1000),
                                  "write_errors": self.write_errors, **self.wan.document()})

    async def report_loop(self) -> None:
        while True:
            self.report()
            await trio.sleep(REPORT_INTERVAL_S)

    async def handle_signals(self, nursery: trio.Nursery) -> None:
        """SIGHUP: read the latency again; SIGTERM/SIGINT: stop."""
        with trio.open_signal_receiver(signal.SIGHUP, signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                if signum != signal.SIGHUP:
                    nursery.cancel_scope.cancel()
                    return
                plan = LabPlan.from_document(read_state(self.work_dir)["plan"])
                self.wan.set_latency(plan.latency_ms)
                self.report()

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.handle_signals, nursery)
            for dc, fd in self.fds.items():
                nursery.start_soon(self.read_loop, dc, fd)
            nursery.start_soon(self.deliver_loop)
            nursery.start_soon(self.report_loop)


def serve(work_dir: Path) -> int:
    wan = TunWan(work_dir)  # the devices are opened before trio starts: entering namespaces is per thread
    try:
        trio.run(wan.run)
    finally:
        for fd in wan.fds.values():
            os.close(fd)
    return 0
