"""Calls to a remote active controller (MetadataService.call): a heartbeat is never held back
behind other calls that wait for their commit."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import orjson
import trio

from cluster.controller.controller import ControllerConfig
from cluster.controller.service import MetadataService
from cluster.protocol.framing import FrameDecoder
from cluster.protocol.internal import MAX_RPC_FRAME_BYTES, internal_payload, rpc_response
from cluster.quorum.raft import RaftConfig
from tests.harness import free_port


def test_a_heartbeat_does_not_wait_behind_isr_changes_waiting_for_their_commit(tmp_path: Path) -> None:
    """Broker 1 led many partitions whose followers caught up: its ISR expansions go to the
    controller on node 2 and each is answered once committed. Its heartbeat must reach the
    controller meanwhile (in the fault test, queued behind them on one connection for more
    than broker.session.timeout.ms, the live broker was fenced)."""
    controller_port = free_port()
    isr_change_arrived = trio.Event()
    commit = trio.Event()
    heartbeats: list[int] = []

    async def controller_endpoint(stream: trio.SocketStream) -> None:
        decoder = FrameDecoder(MAX_RPC_FRAME_BYTES)
        async with stream:
            while data := await stream.receive_some(65536):
                decoder.receive_data(data)
                while (frame := decoder.next_frame()) is not None:
                    correlation_id = int.from_bytes(frame[4:8], "big", signed=True)
                    call = orjson.loads(internal_payload(frame))
                    if call["op"] == "alter_partition":
                        isr_change_arrived.set()
                        await commit.wait()  # answered once its records commit
                    else:
                        heartbeats.append(call["args"]["broker_id"])
                    await stream.send_all(rpc_response(correlation_id, {"error_code": 0}))

    service = MetadataService(1, {1: ("127.0.0.1", free_port()), 2: ("127.0.0.1", controller_port)}, tmp_path,
                              raft_config=RaftConfig(), controller_config=ControllerConfig(node_id=1),
                              validate_configs=lambda configs: None)
    service.driver.node = SimpleNamespace(leader_id=2)  # type: ignore[assignment]  # node 2 leads the quorum

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_tcp, controller_endpoint, controller_port)
            isr_change_answers: list[int] = []
            isr_change_answered = trio.Event()

            async def alter_partition() -> None:
                result = await service.call("alter_partition", {"broker_id": 1}, timeout_s=30.0)
                isr_change_answers.append(result["error_code"])
                isr_change_answered.set()

            nursery.start_soon(alter_partition)
            await isr_change_arrived.wait()
            # Well inside broker.session.timeout.ms (2 s), while the ISR change still waits.
            with trio.fail_after(1.0):
                result = await service.call("broker_heartbeat", {"broker_id": 1, "broker_epoch": 1}, timeout_s=2.0)
            assert result["error_code"] == 0 and heartbeats == [1]
            assert not isr_change_answers, "the ISR change was answered before its commit"
            commit.set()
            await isr_change_answered.wait()
            assert isr_change_answers == [0]
            await service.aclose()
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_held_up_event_loop_does_not_get_its_brokers_fenced(tmp_path: Path) -> None:
    """The active controller's event loop is held up past broker.session.timeout.ms (in the
    scale benchmark: its own broker applying leadership of 10,000 partitions). Nobody could
    be heard meanwhile, so nobody is fenced for it when it resumes; a broker that then stays
    silent for a whole session is."""
    import time

    session_ms = 1000
    service = MetadataService(1, {1: ("127.0.0.1", free_port())}, tmp_path, raft_config=RaftConfig(),
                              controller_config=ControllerConfig(node_id=1, session_timeout_ms=session_ms),
                              validate_configs=lambda configs: None)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            with trio.fail_after(30):
                while not service.is_active_controller:
                    await trio.sleep(0.01)
                result = await service.execute("register_broker", {
                    "broker_id": 1, "incarnation_id": "i1", "host": "127.0.0.1", "port": 9092})
                epoch = result["broker_epoch"]
                result = await service.execute("broker_heartbeat", {"broker_id": 1, "broker_epoch": epoch,
                                                                    "caught_up": True})
                assert result["is_fenced"] is False
            time.sleep(session_ms * 1.6 / 1000)  # the loop held up: no task runs, nothing is heard
            await trio.sleep(0.2)  # the tick loop's deadline has passed: it runs now
            reg = service.image.brokers[1]
            assert not reg.fenced, "fenced for the controller's own pause"
            with trio.fail_after(30):  # silent from here on: fenced one session later
                while not service.image.brokers[1].fenced:
                    await trio.sleep(0.05)
            await service.aclose()
            nursery.cancel_scope.cancel()

    trio.run(main)
