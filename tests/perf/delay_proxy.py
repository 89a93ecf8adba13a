"""A TCP proxy that delays every byte by a fixed one-way latency: a WAN for the benchmarks
on a kernel without netem (this one has none; `dcmirror lab`'s own WAN is a user-space
packet delay line too, per packet instead of per read).

    python -m tests.perf.delay_proxy --listen 127.0.0.1:9000 --upstream 127.0.0.1:9092 --delay-ms 50

Every connection accepted is joined to one upstream; in each direction a reader takes what
the socket has (up to READ_BYTES) and a writer hands it on `delay` after it was read, so a
request and its answer take 2 x delay more than over loopback. Bytes in flight per
direction are bounded (IN_FLIGHT_BYTES_MAX, the WAN's window): far above what 100 ms at the
rates measured here needs, so the window is never what limits a benchmark (TCP over a real
WAN grows its window up to net.ipv4.tcp_rmem's maximum, 6 MiB by default). Runs in its own
process so that it never competes with the code measured for a GIL.
"""

from __future__ import annotations

import argparse
import math
import sys

import trio

READ_BYTES = 1 << 20
IN_FLIGHT_BYTES_MAX = 256 << 20


class _Window:
    """Bytes read but not yet written in one direction, bounded."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.bytes = 0
        self._changed = trio.Condition()

    async def take(self, n: int) -> None:
        async with self._changed:
            while self.bytes and self.bytes + n > self.limit:
                await self._changed.wait()
            self.bytes += n

    async def give(self, n: int) -> None:
        async with self._changed:
            self.bytes -= n
            self._changed.notify_all()


async def _pump(src: trio.SocketStream, dst: trio.SocketStream, delay_s: float) -> None:
    send, receive = trio.open_memory_channel[tuple[float, bytes]](math.inf)
    window = _Window(IN_FLIGHT_BYTES_MAX)

    async def reader() -> None:
        async with send:
            while data := await src.receive_some(READ_BYTES):
                await window.take(len(data))
                send.send_nowait((trio.current_time() + delay_s, data))

    async def writer() -> None:
        async with receive:
            async for due, data in receive:
                now = trio.current_time()
                if due > now:
                    await trio.sleep(due - now)
                await dst.send_all(data)
                await window.give(len(data))
        await dst.send_eof()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        nursery.start_soon(writer)


async def _serve_one(client: trio.SocketStream, upstream: tuple[str, int], delay_s: float) -> None:
    try:
        server = await trio.open_tcp_stream(*upstream)
    except OSError:
        await client.aclose()
        return
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_pump, client, server, delay_s)
            nursery.start_soon(_pump, server, client, delay_s)
    except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass  # one side went away: so does the connection
    finally:
        await client.aclose()
        await server.aclose()


async def serve(listen: tuple[str, int], upstream: tuple[str, int], delay_s: float) -> None:
    async def handler(stream: trio.SocketStream) -> None:
        await _serve_one(stream, upstream, delay_s)

    await trio.serve_tcp(handler, listen[1], host=listen[0])


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", required=True, type=_address, help="HOST:PORT to accept on")
    parser.add_argument("--upstream", required=True, type=_address, help="HOST:PORT to connect to")
    parser.add_argument("--delay-ms", type=float, default=50.0, help="one-way delay (default 50)")
    args = parser.parse_args(argv)
    try:
        trio.run(serve, args.listen, args.upstream, args.delay_ms / 1000)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
