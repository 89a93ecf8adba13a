"""A cuttable TCP link: a proxy process in front of one or more broker listeners that a test
cuts and heals (a datacenter's WAN link to the mirror worker).

    python -m tests.mirror.link --control PORT --pair LISTEN_PORT=HOST:PORT [--pair ...]

Each pair accepts on 127.0.0.1:LISTEN_PORT and joins every connection to its upstream. Over a
line protocol on 127.0.0.1:PORT (control connection, one command a line, answered once in
effect) the test says:

- `cut refuse`: every connection is reset (RST) and the listening sockets are closed, so a
  connect is refused until the link heals (a firewall's reject, a dead router's ICMP);
- `cut blackhole`: every connection is reset, new ones are accepted and held open with no
  byte passed either way (a partition: clients find out by their own timeouts only);
- `heal`: the listeners accept and forward again; connections held by a blackhole are reset
  (so clients connect afresh, as after a WAN partition their sessions would have timed out);
- `state`: the state, connections accepted and bytes forwarded so far.

Each answer is one line: `ok <state> accepted=<n> forwarded=<bytes> open=<n>`. Runs in its own
process (never competing for the test's GIL); `Link` is the test's handle on it.
"""

from __future__ import annotations

import argparse
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import trio

from tests.harness import REPO

READ_BYTES = 1 << 16


def _reset(stream: trio.SocketStream) -> None:
    """Close with an RST (SO_LINGER 0): the peer sees the connection die at once."""
    try:
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    stream.socket.close()


@dataclass
class _Link:
    pairs: list[tuple[int, tuple[str, int]]]
    state: str = "up"
    accepted: int = 0
    forwarded: int = 0
    conns: set[tuple[trio.CancelScope, trio.SocketStream, trio.SocketStream | None]] = field(default_factory=set)
    serving: list[tuple[trio.CancelScope, trio.Event]] = field(default_factory=list)
    nursery: trio.Nursery | None = None

    async def start_listening(self) -> None:
        assert self.nursery is not None
        for port, upstream in self.pairs:
            listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
            scope, closed = trio.CancelScope(), trio.Event()
            self.serving.append((scope, closed))
            self.nursery.start_soon(self._serve, scope, closed, listeners, upstream)

    async def stop_listening(self) -> None:
        """Close the listening sockets (a connect is refused from then on) and wait until closed."""
        for scope, _ in self.serving:
            scope.cancel()
        for _, closed in self.serving:
            await closed.wait()
        self.serving.clear()

    async def _serve(self, scope: trio.CancelScope, closed: trio.Event, listeners: list[trio.SocketListener],
                     upstream: tuple[str, int]) -> None:
        async def handler(stream: trio.SocketStream) -> None:
            await self._connection(stream, upstream)

        try:
            with scope:
                await trio.serve_listeners(handler, listeners)
        finally:
            for listener in listeners:
                listener.socket.close()
            closed.set()

    async def _connection(self, client: trio.SocketStream, upstream: tuple[str, int]) -> None:
        self.accepted += 1
        scope = trio.CancelScope()
        entry: tuple[trio.CancelScope, trio.SocketStream, trio.SocketStream | None]
        if self.state == "blackhole":
            entry = (scope, client, None)
            self.conns.add(entry)
            try:
                with scope:
                    while await client.receive_some(READ_BYTES):
                        pass  # swallowed
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
            finally:
                self.conns.discard(entry)
                _reset(client)
            return
        try:
            server = await trio.open_tcp_stream(*upstream)
        except OSError:
            _reset(client)
            return
        if self.state != "up":  # cut while connecting
            _reset(client)
            _reset(server)
            return
        entry = (scope, client, server)
        self.conns.add(entry)
        try:
            with scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._pump, client, server)
                    nursery.start_soon(self._pump, server, client)
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            self.conns.discard(entry)
            _reset(client)
            _reset(server)

    async def _pump(self, src: trio.SocketStream, dst: trio.SocketStream) -> None:
        while data := await src.receive_some(READ_BYTES):
            await dst.send_all(data)
            self.forwarded += len(data)
        raise trio.BrokenResourceError  # one side closed: so does the connection

    def _drop_all(self) -> None:
        for scope, client, server in list(self.conns):
            scope.cancel()
            _reset(client)
            if server is not None:
                _reset(server)
        self.conns.clear()

    async def command(self, line: str) -> str:
        words = line.split()
        if words[:1] == ["cut"] and len(words) == 2 and words[1] in ("refuse", "blackhole"):
            self.state = words[1]
            if self.state == "refuse":
                await self.stop_listening()
            elif not self.serving:
                await self.start_listening()
            self._drop_all()
        elif words == ["heal"]:
            self._drop_all()  # held by a blackhole: the clients connect afresh
            self.state = "up"
            if not self.serving:
                await self.start_listening()
        elif words != ["state"]:
            return f"error unknown command {line!r}"
        return f"ok {self.state} accepted={self.accepted} forwarded={self.forwarded} open={len(self.conns)}"


async def _main(pairs: list[tuple[int, tuple[str, int]]], control_port: int) -> None:
    link = _Link(pairs)
    async with trio.open_nursery() as nursery:
        link.nursery = nursery
        await link.start_listening()

        async def control(stream: trio.SocketStream) -> None:
            buffer = b""
            try:
                while data := await stream.receive_some(1024):
                    buffer += data
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        answer = await link.command(line.decode().strip())
                        await stream.send_all(answer.encode() + b"\n")
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

        await trio.serve_tcp(control, control_port, host="127.0.0.1")


def _pair(text: str) -> tuple[int, tuple[str, int]]:
    listen, _, upstream = text.partition("=")
    host, _, port = upstream.rpartition(":")
    return int(listen), (host, int(port))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--control", required=True, type=int, help="control port on 127.0.0.1")
    parser.add_argument("--pair", required=True, action="append", type=_pair,
                        help="LISTEN_PORT=HOST:PORT (repeatable)")
    args = parser.parse_args(argv)
    try:
        trio.run(_main, args.pair, args.control)
    except KeyboardInterrupt:
        pass
    return 0


# --------------------------------------------------------------------------- the test's handle


class Link:
    """The link process: `ports` (listen port -> upstream "host:port"), controlled over
    `control_port`. `cut()` / `heal()` return once in effect; `stop()` ends the process."""

    def __init__(self, ports: dict[int, str], control_port: int, log_path: Path) -> None:
        self.ports = dict(ports)
        self.control_port = control_port
        args = [sys.executable, "-m", "tests.mirror.link", "--control", str(control_port)]
        for listen, upstream in self.ports.items():
            args += ["--pair", f"{listen}={upstream}"]
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                self._sock: socket.socket | None = socket.create_connection(("127.0.0.1", control_port), timeout=30)
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.proc.kill()
                    raise RuntimeError(f"link process did not listen on {control_port} (exit {self.proc.poll()}):\n"
                                       f"{log_path.read_text(errors='replace')[-2000:]}") from None
                time.sleep(0.05)
        self._file = self._sock.makefile("rb")

    def _ask(self, command: str) -> str:
        assert self._sock is not None
        self._sock.sendall(command.encode() + b"\n")
        answer = self._file.readline().decode().strip()
        assert answer.startswith("ok "), f"link {command!r}: {answer!r}"
        return answer

    def cut(self, mode: str = "refuse") -> str:
        assert mode in ("refuse", "blackhole"), mode
        return self._ask(f"cut {mode}")

    def heal(self) -> str:
        return self._ask("heal")

    def state(self) -> str:
        return self._ask("state")

    def forwarded(self) -> int:
        return int(self.state().split("forwarded=")[1].split()[0])

    def stop(self) -> None:
        if self._sock is not None:
            self._file.close()
            self._sock.close()
            self._sock = None
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


if __name__ == "__main__":
    sys.exit(main())
