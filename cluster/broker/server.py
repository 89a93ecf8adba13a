"""The trio shell of a broker: TCP connections, request dispatch, background log work."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio

from cluster import admin_http
from cluster.broker import metrics
from cluster.broker.broker import SUPPORTED_APIS, Broker, ClusterMembership, RequestContext
from cluster.broker.clock import now_ms
from cluster.broker.config import BrokerConfig
from cluster.controller.rpc import (
    CONTROLLER_API_KEY,
    INTERNAL_API_KEYS,
    QUORUM_API_KEY,
    rpc_response,
)
from cluster.protocol.errors import ErrorCode, ProtocolError
from cluster.protocol.framing import FrameDecoder
from cluster.protocol.legacy import refuse_legacy_produce
from cluster.protocol.messages import (
    API_NAMES,
    decode_request,
    encode_response,
    is_flexible_request,
    parse_request_header,
    peek_api,
)
from cluster.storage.cleaner import CleanerConfig, commit_clean, prepare_clean

log = logging.getLogger(__name__)

API_VERSIONS_KEY = 18
PRODUCE_KEY = 0
_RECV_BYTES = 256 * 1024


class CloseConnection(Exception):
    """The request cannot be answered in the protocol; close like Kafka does."""


class BrokerServer:
    def __init__(self, broker: Broker, host: str, port: int) -> None:
        self.broker = broker
        self.host = host
        self.port = port
        self.max_frame_bytes = int(broker.config["socket.request.max.bytes"])
        self.idle_timeout_s = int(broker.config["connections.max.idle.ms"]) / 1000
        self.connections = 0
        self.max_connections = int(broker.config["max.connections"])
        self._flush_wanted = trio.Event()
        broker.logs.on_flush_request = self._flush_wanted.set

    # ---- dispatch ------------------------------------------------------------------------

    async def dispatch(self, frame: bytearray, client_host: str = "") -> bytes | None:
        """Answer one request frame; None means no response (acks=0 produce). Its time from
        here to the answer goes into the API's latency histogram."""
        start = time.perf_counter()
        try:
            return await self._dispatch(frame, client_host)
        finally:
            if len(frame) >= 2:
                self.broker.metrics.observe_request((frame[0] << 8) | frame[1], time.perf_counter() - start)

    async def _dispatch(self, frame: bytearray, client_host: str) -> bytes | None:
        api_key, version, correlation_id = peek_api(frame)
        if api_key in INTERNAL_API_KEYS and version != 0:
            raise CloseConnection(f"internal API {api_key} v{version} does not exist")
        if api_key == QUORUM_API_KEY:
            await self.broker.metadata.deliver(frame)
            return None
        if api_key == CONTROLLER_API_KEY:
            return rpc_response(correlation_id, await self.broker.metadata.handle_rpc(frame))
        if not self.broker.ready.is_set() and api_key != API_VERSIONS_KEY:
            # Clients wait while the broker registers and catches up with the metadata log.
            await self.broker.ready.wait()
        if api_key == API_VERSIONS_KEY:
            lo, hi = SUPPORTED_APIS[API_VERSIONS_KEY]
            if not lo <= version <= hi:
                # Answer in v0 so any client can read the error and the supported ranges.
                body = Broker.api_versions_body(ErrorCode.unsupported_version)
                return encode_response(API_VERSIONS_KEY, 0, correlation_id, body)
            header = parse_request_header(frame, flexible=version >= 3)
            decode_request(api_key, version, frame, header.body_offset)
            return encode_response(API_VERSIONS_KEY, version, correlation_id, Broker.api_versions_body())
        supported = SUPPORTED_APIS.get(api_key)
        if supported is None or not supported[0] <= version <= supported[1]:
            raise CloseConnection(f"unsupported API {API_NAMES.get(api_key, api_key)} v{version}")
        if api_key == PRODUCE_KEY and version < 3:
            header = parse_request_header(frame, flexible=False)
            return refuse_legacy_produce(version, correlation_id, frame, header.body_offset)
        header = parse_request_header(frame, flexible=is_flexible_request(api_key, version))
        request = decode_request(api_key, version, frame, header.body_offset)
        ctx = RequestContext(header.client_id or "", client_host)
        answer = await self.broker.handlers[api_key](version, request, ctx)
        if answer is None:
            return None
        return encode_response(api_key, version, correlation_id, answer)

    # ---- connections ---------------------------------------------------------------------

    async def handle_connection(self, stream: trio.SocketStream) -> None:
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
        try:
            await self._serve(stream, peer)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError):
            pass
        except (ProtocolError, CloseConnection) as exc:
            log.warning("closing connection from %s: %s", peer, exc)
        except Exception:
            log.exception("closing connection from %s after an internal error", peer)
        finally:
            self.connections -= 1
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _serve(self, stream: trio.SocketStream, peer: str) -> None:
        decoder = FrameDecoder(self.max_frame_bytes)
        sock = stream.socket
        peer_host = "/" + peer.rsplit(":", 1)[0]
        while True:
            frame = decoder.next_frame()
            if frame is None:
                with trio.move_on_after(self.idle_timeout_s) as idle:
                    target = decoder.frame_buffer
                    if target is not None and len(target) > 0:
                        n = await sock.recv_into(target)
                        if n == 0:
                            return
                        decoder.filled(n)
                    else:
                        data = await sock.recv(_RECV_BYTES)
                        if not data:
                            return
                        try:
                            decoder.receive_data(data)
                        except ProtocolError:
                            # Answer the whole requests that came before the bad one, then close.
                            while (queued := decoder.next_frame()) is not None:
                                response = await self.dispatch(queued, peer_host)
                                if response is not None:
                                    await stream.send_all(response)
                            raise
                if idle.cancelled_caught:
                    log.info("closing idle connection from %s", peer)
                    return
                continue
            response = await self.dispatch(frame, peer_host)
            del frame
            if response is not None:
                await stream.send_all(response)

    # ---- background work -----------------------------------------------------------------

    async def flush_loop(self) -> None:
        """fsync segments that rolled (or hit flush.messages / flush.ms) and advance recovery points."""
        interval_s = int(self.broker.config["log.flush.scheduler.interval.ms"]) / 1000
        logs = self.broker.logs
        while True:
            with trio.move_on_after(interval_s):
                await self._flush_wanted.wait()
            self._flush_wanted = trio.Event()
            logs.on_flush_request = self._flush_wanted.set
            pending = logs.take_pending_flushes() + logs.due_time_flushes(now_ms())
            if not pending:
                continue
            for lg, offset in pending:
                try:
                    await trio.to_thread.run_sync(lg.flush_segments, offset)
                except (OSError, ValueError) as exc:
                    # The recovery point stays where it was; the next flush tries again.
                    log.error("flushing %s below offset %d failed: %s", lg.name, offset, exc)
                    continue
                lg.mark_flushed(offset, now_ms())
            await trio.to_thread.run_sync(logs.checkpoint_recovery_points)

    async def checkpoint_loop(self) -> None:
        interval_s = int(self.broker.config["log.flush.offset.checkpoint.interval.ms"]) / 1000
        while True:
            await trio.sleep(interval_s)
            await trio.to_thread.run_sync(self.broker.logs.checkpoint_recovery_points)

    async def high_watermark_checkpoint_loop(self) -> None:
        interval_s = int(self.broker.config["replica.high.watermark.checkpoint.interval.ms"]) / 1000
        while True:
            await trio.sleep(interval_s)
            if self.broker.ready.is_set():
                try:
                    await trio.to_thread.run_sync(self.broker.checkpoint_high_watermarks())
                except OSError as exc:
                    log.error("writing the high-watermark checkpoint failed: %s", exc)

    async def retention_loop(self) -> None:
        interval_s = int(self.broker.config["log.retention.check.interval.ms"]) / 1000
        while True:
            await trio.sleep(interval_s)
            now = now_ms()
            try:
                self.broker.logs.cleanup(now)
            except OSError as exc:
                log.error("retention pass failed: %s", exc)
            for part in self.broker.partitions.values():
                part.log.producer_state.remove_expired(now)

    async def cleaner_loop(self) -> None:
        """Compact one log at a time; the heavy part runs in a worker thread."""
        cfg = self.broker.config
        if not cfg["log.cleaner.enable"]:
            return
        config = CleanerConfig(
            dedupe_buffer_bytes=int(cfg["log.cleaner.dedupe.buffer.size"]),
            io_max_bytes_per_second=float(cfg["log.cleaner.io.max.bytes.per.second"]),
        )
        backoff_s = int(cfg["log.cleaner.backoff.ms"]) / 1000
        while True:
            await trio.sleep(backoff_s)
            for lg in list(self.broker.logs.logs.values()):
                if "compact" not in str(lg.config["cleanup.policy"]):
                    continue
                try:
                    task = await trio.to_thread.run_sync(prepare_clean, lg, now_ms(), config)
                except OSError as exc:
                    log.warning("compaction of %s skipped: %s", lg.name, exc)
                    continue
                if task is None:
                    continue
                if self.broker.logs.get(lg.topic, lg.partition) is not lg:
                    task.discard()  # the topic was deleted meanwhile
                    continue
                commit_clean(task, now_ms())

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        log.info("broker %d listening on %s:%d", self.broker.node_id, self.host, self.port)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.flush_loop)
            nursery.start_soon(self.checkpoint_loop)
            nursery.start_soon(self.high_watermark_checkpoint_loop)
            nursery.start_soon(self.retention_loop)
            nursery.start_soon(self.broker.groups.timer_loop)
            nursery.start_soon(self.cleaner_loop)
            await nursery.start(trio.serve_listeners, self.handle_connection, listeners)
            task_status.started()


def parse_listen(listen: str, what: str = "--listen") -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{what} {listen!r} must be HOST:PORT, e.g. 127.0.0.1:9092")
    return host.strip("[]") or "0.0.0.0", int(port)


def admin_http_address(config: BrokerConfig, host: str, port: int) -> tuple[str, int] | None:
    """Where the admin HTTP server listens: admin.http.listener, or the Kafka listener's host
    at its port + admin.http.port.offset (one setting for every broker of a cluster); None: off."""
    listener = str(config["admin.http.listener"])
    offset = int(config["admin.http.port.offset"])
    if listener and offset:
        raise ValueError("set admin.http.listener or admin.http.port.offset, not both")
    if listener:
        return parse_listen(listener, "admin.http.listener")
    if offset:
        if port + offset > 65535:
            raise ValueError(f"admin.http.port.offset={offset}: Kafka port {port} + {offset} is above 65535")
        return host, port + offset
    return None


async def serve_until_signalled(data_dir: Path, listen: str, config: BrokerConfig,
                                membership: ClusterMembership | None = None) -> None:
    host, port = parse_listen(listen)
    http = admin_http_address(config, host, port)
    advertised = host if host not in ("0.0.0.0", "::") else "127.0.0.1"
    broker = Broker(data_dir, config, advertised, port, membership)
    start = time.monotonic()
    server = BrokerServer(broker, host, port)
    try:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                await _start_listener(nursery, "Kafka listener", host, port, server.run)
                if http is not None:
                    await _start_listener(nursery, "admin HTTP listener", http[0], http[1], admin_http.serve,
                                          http[0], http[1], metrics.routes(broker))
                await nursery.start(broker.start)

                async def report_ready() -> None:
                    await broker.ready.wait()
                    log.info("startup took %.3f s", time.monotonic() - start)

                async def wait_for_signal() -> None:
                    async for signum in signals:
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
