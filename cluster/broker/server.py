"""The trio shell of a broker process: its TCP listener and connections, the admin HTTP
listener, signals. Each request frame goes to the broker's request router (apis.py) and
the answers go back in order."""

from __future__ import annotations

import gc
import logging
import signal
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import trio

from cluster.broker.apis import CloseConnection
from cluster.broker.broker import Broker, ClusterMembership
from cluster.broker.config import BrokerConfig, admin_http_address, parse_listen
from cluster.broker.context import PLAINTEXT_SESSION, Session
from cluster.broker.security import ListenerRuntime
from cluster.common import admin_http
from cluster.common.secrets import secret
from cluster.protocol.errors import ProtocolError
from cluster.protocol.framing import FrameDecoder
from cluster.security.tls import https_context

log = logging.getLogger(__name__)

_RECV_BYTES = 256 * 1024
CERTIFICATE_CHECK_INTERVAL_S = 30.0  # keystores changed on disk are loaded again (or at once on SIGHUP)


class BrokerServer:
    """Every listener of the broker (listeners= / --listen): TCP, TLS where the listener's
    protocol says so, then frames to the request router with the connection's session."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.security = broker.security
        self.max_frame_bytes = int(broker.config["socket.request.max.bytes"])
        # Before a SASL login completes, frames are small (Kafka's sasl.server.max.receive.size):
        # an anonymous peer cannot make the broker reserve socket.request.max.bytes.
        self.max_login_frame_bytes = min(self.max_frame_bytes, int(broker.config["sasl.server.max.receive.size"]))
        self.idle_timeout_s = int(broker.config["connections.max.idle.ms"]) / 1000
        self.connections = 0
        self.tls_handshake_timeout_s = 10.0

    @property
    def max_connections(self) -> int:
        """max.connections in force (a dynamic broker config: a change applies to the next connection)."""
        return int(self.broker.dynamic_config.current["max.connections"])

    async def dispatch(self, frame: bytearray, session: Session = PLAINTEXT_SESSION) -> bytes | None:
        """Answer one request frame; None means no response (acks=0 produce)."""
        return await self.broker.router.handle(frame, session)

    # ---- connections ---------------------------------------------------------------------

    async def handle_connection(self, stream: trio.SocketStream, listener: ListenerRuntime | None = None) -> None:
        listener = listener or self.security.listeners[0]
        peer = "?"
        try:
            peer = "{}:{}".format(*stream.socket.getpeername()[:2])
        except OSError:
            pass
        if self.connections >= self.max_connections:
            log.warning("refusing connection from %s: max.connections=%d reached", peer, self.max_connections)
            await stream.aclose()
            return
        self.connections += 1
        transport: trio.abc.Stream = stream
        session = None
        try:
            accepted = await self.security.accept_tls(stream, listener, peer, self.tls_handshake_timeout_s)
            if accepted is None:
                return
            transport, subject = accepted
            try:
                session = self.security.new_session(listener, peer.rsplit(":", 1)[0], subject)
            except ValueError as exc:
                log.warning("refusing %s on listener %s: %s", peer, listener.name, exc)
                return
            await self._serve(transport, peer, session)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError):
            pass
        except (ProtocolError, CloseConnection) as exc:
            log.warning("closing connection from %s: %s", peer, exc)
        except Exception:
            log.exception("closing connection from %s after an internal error", peer)
        finally:
            self.connections -= 1
            shares = getattr(self.broker, "shares", None)
            if session is not None and shares is not None:
                shares.connection_closed(session)  # share sessions end with it: their records go back
            with trio.CancelScope(shield=True):
                with trio.move_on_after(1):
                    await transport.aclose()

    async def _serve(self, stream: trio.abc.Stream, peer: str, session: Session) -> None:
        decoder = FrameDecoder(self.max_frame_bytes)
        if session.sasl is not None:
            decoder = FrameDecoder(self.max_login_frame_bytes, "sasl.server.max.receive.size")
        # Plain TCP reads straight into the frame's buffer; TLS goes through TlsServerStream.
        sock = stream.socket if isinstance(stream, trio.SocketStream) else None

        async def answer(frame: bytearray) -> None:
            answered = await self.broker.router.handle_answer(frame, session)
            response = answered.response
            if answered.throttle_ms > 0 and not answered.client_throttles:
                await trio.sleep(answered.throttle_ms / 1000)  # a pre-KIP-219 client: the answer waits
            if session.close_after_s is not None:
                # A failed login: wait before answering (no fast guessing), answer, close.
                await trio.sleep(session.close_after_s)
                if response is not None:
                    await stream.send_all(response)
                raise CloseConnection(f"closed after a failed login by {session.client_ip}")
            if response is not None:
                await stream.send_all(response)
            if answered.throttle_ms > 0 and answered.client_throttles:
                # KIP-219: muted (nothing read from the client) for the throttle time.
                await trio.sleep(answered.throttle_ms / 1000)
            if decoder.limit_name != "socket.request.max.bytes" and session.authenticated:
                decoder.max_frame_bytes, decoder.limit_name = self.max_frame_bytes, "socket.request.max.bytes"

        while True:
            frame = decoder.next_frame()
            if frame is None:
                with trio.move_on_after(self.idle_timeout_s) as idle:
                    target = decoder.frame_buffer
                    if sock is not None and target is not None and len(target) > 0:
                        n = await sock.recv_into(target)
                        if n == 0:
                            return
                        decoder.filled(n)
                    else:
                        data = await (sock.recv(_RECV_BYTES) if sock is not None else stream.receive_some(_RECV_BYTES))
                        if not data:
                            return
                        try:
                            decoder.receive_data(data)
                        except ProtocolError:
                            # Answer the whole requests that came before the bad one, then close.
                            while (queued := decoder.next_frame()) is not None:
                                await answer(queued)
                            raise
                if idle.cancelled_caught:
                    log.info("closing idle connection from %s", peer)
                    return
                continue
            await answer(frame)
            del frame

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            for listener in self.security.listeners:
                a = listener.address
                host = a.host or "0.0.0.0"
                try:
                    sockets = await trio.open_tcp_listeners(a.port, host=host)
                except OSError as exc:
                    raise OSError(exc.errno, f"listener {a}: {exc.strerror or exc}") from None
                log.info("broker %d listening on %s (%s)", self.broker.node_id, a, listener.protocol)
                await nursery.start(trio.serve_listeners, partial(self.handle_connection, listener=listener), sockets)
            await nursery.start(self.broker.run_background)
            nursery.start_soon(self._reload_certificates)
            task_status.started()

    async def _reload_certificates(self) -> None:
        while True:
            await trio.sleep(CERTIFICATE_CHECK_INTERVAL_S)
            self.security.reload_certificates()


def admin_http_security(config: BrokerConfig) -> admin_http.HttpSecurity:
    """admin.http.auth.token and admin.http.ssl.keystore.location (errors name the setting)."""
    token, keystore = str(config["admin.http.auth.token"]), str(config["admin.http.ssl.keystore.location"])
    return admin_http.HttpSecurity(
        secret(token, "admin.http.auth.token") if token else None,
        https_context(Path(keystore), "admin.http.ssl.keystore.location") if keystore else None)


# CPython collects its youngest generation every 700 net allocations. A Fetch of 10,000
# partitions lives across dozens of such collections, so its objects were promoted, and a
# broker with 10,000 partitions ran a full collection (115-280 ms with every request stalled)
# about every second while a consumer polled. Collecting the young generation every 50,000
# lets a request's objects die young: 19 collections instead of 3,749 in the same run, one
# of them full. Cyclic garbage still goes; reference counting frees the rest at once.
GC_YOUNG_THRESHOLD_ALLOCATIONS = 50_000
GC_MIDDLE_THRESHOLD_COLLECTIONS = 20
GC_OLD_THRESHOLD_COLLECTIONS = 10


def tune_garbage_collector() -> None:
    """For a broker or controller process (a process-wide setting: its entry point calls it)."""
    gc.set_threshold(GC_YOUNG_THRESHOLD_ALLOCATIONS, GC_MIDDLE_THRESHOLD_COLLECTIONS, GC_OLD_THRESHOLD_COLLECTIONS)


async def serve_until_signalled(data_dir: Path, listen: str, config: BrokerConfig,
                                membership: ClusterMembership | None = None) -> None:
    start_s = trio.current_time()
    host, port = parse_listen(listen)
    http = admin_http_address(config, host, port)
    http_security = admin_http_security(config)  # bad settings fail the start, naming the setting
    advertised = host if host not in ("0.0.0.0", "::") else "127.0.0.1"
    broker = Broker(data_dir, config, advertised, port, membership, listen_host=host)
    server = BrokerServer(broker)
    try:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async with trio.open_nursery() as nursery:
                await nursery.start(server.run)
                if http is not None:
                    await _start_listener(nursery, "admin HTTP listener", http[0], http[1],
                                          partial(admin_http.serve, security=http_security),
                                          http[0], http[1], broker.metrics.routes())
                await nursery.start(broker.start)

                async def report_ready() -> None:
                    await broker.ready.wait()
                    log.info("startup took %.3f s", trio.current_time() - start_s)

                async def wait_for_signal() -> None:
                    async for signum in signals:
                        if signum == signal.SIGHUP:
                            # As nginx or HAProxy: renewed certificates now, not at the next check.
                            log.info("received SIGHUP: reloading certificates")
                            server.security.reload_certificates()
                            continue
                        log.info("received %s: shutting down", signal.Signals(signum).name)
                        if config["controlled.shutdown.enable"]:
                            with trio.move_on_after(int(config["controlled.shutdown.timeout.ms"]) / 1000):
                                await broker.controlled_shutdown(int(config["controlled.shutdown.timeout.ms"]) / 1000)
                        nursery.cancel_scope.cancel()
                        return

                nursery.start_soon(report_ready)
                nursery.start_soon(wait_for_signal)
    except ExceptionGroup as group:
        # trio wraps what the nursery's tasks raise; a taken port is one plain error for the CLI.
        leaves = list(_leaves(group))
        if len(leaves) == 1 and isinstance(leaves[0], OSError):
            raise leaves[0] from None
        raise
    finally:
        broker.close()
        log.info("broker %d stopped cleanly", broker.node_id)


async def _start_listener(nursery: trio.Nursery, what: str, host: str, port: int, fn: Any, *args: Any) -> None:
    try:
        await nursery.start(fn, *args)
    except OSError as exc:
        raise OSError(exc.errno, f"{what} {host}:{port}: {exc.strerror or exc}") from None


def _leaves(group: BaseExceptionGroup[Any]) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc
