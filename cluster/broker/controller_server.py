"""A dedicated controller node: a metadata quorum voter that hosts no partitions.

It listens on its topology address for the cluster's internal frames only (quorum
messages and controller calls); Kafka clients are told to use the brokers. Its listener is
the cluster's inter-broker one: PLAINTEXT or SSL (mutual TLS, the peer's certificate its
principal, which needs CLUSTER_ACTION: brokers are super users). SASL is refused there, as
KRaft does for SCRAM on the controller listener: the quorum must form before any credential
exists.
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import Any

import trio

from cluster.broker.config import BrokerConfig
from cluster.broker.metadata_quorum import build_metadata_service
from cluster.broker.security import BrokerSecurity
from cluster.controller.service import MetadataService
from cluster.protocol.errors import ProtocolError
from cluster.protocol.framing import FrameDecoder
from cluster.protocol.internal import CONTROLLER_API_KEY, QUORUM_API_KEY, rpc_response
from cluster.protocol.messages import peek_api
from cluster.security.errors import SecurityConfigError
from cluster.storage.log_manager import METADATA_LOG_DIR
from cluster.storage.meta_properties import write_meta_properties

log = logging.getLogger(__name__)

TLS_HANDSHAKE_TIMEOUT_S = 10.0


class ControllerNode:
    def __init__(self, node_id: int, voters: dict[int, tuple[str, int]], brokers: dict[int, tuple[str, int]],
                 data_dir: Path, config: BrokerConfig, cluster_id: str,
                 bootstrap_records: tuple[dict[str, Any], ...] = ()) -> None:
        self.node_id = node_id
        self.data_dir = data_dir
        self.cluster_id = cluster_id
        self.config = config
        host, port = voters[node_id]
        self.security = BrokerSecurity(config, host, port, host, lambda: self.metadata.image)
        self.listener = self.security.listener(self.security.inter_broker)
        if self.listener.sasl_mechanisms:
            raise SecurityConfigError(f"a dedicated controller's listener {self.listener.name} is "
                                      f"{self.listener.protocol}: use PLAINTEXT or SSL (mutual TLS) there")
        self.metadata: MetadataService = build_metadata_service(
            node_id, voters, data_dir / METADATA_LOG_DIR, config, bootstrap_records=bootstrap_records,
            observers={b: a for b, a in brokers.items() if b not in voters}, link=self.security.link)
        self.max_frame_bytes = int(config["socket.request.max.bytes"])

    async def handle_connection(self, socket_stream: trio.SocketStream) -> None:
        decoder = FrameDecoder(self.max_frame_bytes)
        try:
            peer = "{}:{}".format(*socket_stream.socket.getpeername()[:2])
        except OSError:
            peer = "?"
        accepted = await self.security.accept_tls(socket_stream, self.listener, peer, TLS_HANDSHAKE_TIMEOUT_S)
        if accepted is None:
            await socket_stream.aclose()
            return
        stream, subject = accepted
        try:
            session = self.security.new_session(self.listener, peer.rsplit(":", 1)[0], subject)
        except ValueError as exc:
            log.warning("refusing %s: %s", peer, exc)
            await stream.aclose()
            return
        try:
            async with stream:
                while True:
                    data = await stream.receive_some(256 * 1024)
                    if not data:
                        return
                    decoder.receive_data(data)
                    while (frame := decoder.next_frame()) is not None:
                        api_key, _, correlation_id = peek_api(frame)
                        if api_key in (QUORUM_API_KEY, CONTROLLER_API_KEY) and not self.security.may_send_internal(
                                session):
                            log.warning("closing a connection from %s: %s may not send cluster-internal requests "
                                        "(CLUSTER_ACTION)", peer, session.principal)
                            return
                        if api_key == QUORUM_API_KEY:
                            await self.metadata.deliver(frame)
                        elif api_key == CONTROLLER_API_KEY:
                            await stream.send_all(rpc_response(correlation_id, await self.metadata.handle_rpc(frame)))
                        else:
                            log.info("closing a client connection: node %d is a dedicated controller; "
                                     "Kafka clients use the brokers", self.node_id)
                            return
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return
        except ProtocolError as exc:
            log.warning("closing a connection: %s", exc)

    async def run(self, host: str, port: int, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        write_meta_properties(self.data_dir, self.node_id, self.cluster_id)
        async with trio.open_nursery() as nursery:
            listeners = await trio.open_tcp_listeners(port, host=host)
            await nursery.start(trio.serve_listeners, self.handle_connection, listeners)
            await nursery.start(self.metadata.run)
            log.info("controller node %d listening on %s:%d", self.node_id, host, port)
            task_status.started()


async def serve_controller_until_signalled(node: ControllerNode, host: str, port: int) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run, host, port)
            async for signum in signals:
                log.info("received %s: controller node %d stopping", signal.Signals(signum).name, node.node_id)
                with trio.move_on_after(3):
                    await node.metadata.resign()
                nursery.cancel_scope.cancel()
                break
    log.info("controller node %d stopped cleanly", node.node_id)
