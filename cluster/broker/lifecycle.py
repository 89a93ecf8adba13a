"""A broker's life as the controller sees it (Kafka's BrokerLifecycleManager): register,
heartbeat, get unfenced, and at the end a controlled shutdown that moves leadership away.

Registration gives the broker its epoch; every heartbeat carries it, and a heartbeat the
controller no longer accepts (the broker was registered again elsewhere, or forgotten)
makes the broker register anew. A broker is ready once the metadata it applied shows it
registered with its current epoch and unfenced.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

import trio

from cluster.common.backoff import Backoff
from cluster.controller.service import ControllerUnavailable, MetadataService
from cluster.protocol.errors import ErrorCode

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Registration:
    """What a broker tells the controller about itself."""

    node_id: int
    host: str
    port: int
    rack: str | None
    listeners: dict[str, list[object]] | None = None  # advertised: name → [host, port]


class BrokerLifecycle:
    def __init__(self, metadata: MetadataService, registration: Registration, *, heartbeat_interval_ms: int) -> None:
        self.metadata = metadata
        self.registration = registration
        self.heartbeat_interval_s = heartbeat_interval_ms / 1000
        self.broker_epoch = -1
        self.incarnation_id = str(uuid.uuid4())
        self._shutting_down = False
        self._shutdown_wanted = trio.Event()
        self._shutdown_done = trio.Event()

    @property
    def node_id(self) -> int:
        return self.registration.node_id

    async def register(self, previous_broker_epoch: int = -1) -> None:
        """Register (again) until the controller accepts; then wait for that metadata.
        `previous_broker_epoch`: the epoch of the last clean shutdown (-1: none), so the
        controller knows whether this broker may have lost its unsynced tail (KIP-966)."""
        backoff = Backoff(0.5, 2.0)
        while True:
            r = self.registration
            try:
                result = await self.metadata.call("register_broker", {
                    "broker_id": r.node_id, "incarnation_id": self.incarnation_id,
                    "host": r.host, "port": r.port, "rack": r.rack, "listeners": r.listeners or {},
                    "previous_broker_epoch": previous_broker_epoch,
                }, timeout_s=10.0)
            except ControllerUnavailable as exc:
                log.warning("broker %d is waiting for the metadata quorum: %s", r.node_id, exc)
                continue
            if result["error_code"] == ErrorCode.none:
                self.broker_epoch = int(result["broker_epoch"])
                await self.metadata.wait_for_offset(int(result["metadata_offset"]))
                return
            log.warning("registration of broker %d failed: %s", r.node_id, result.get("error_message"))
            await backoff.sleep()

    def is_unfenced(self) -> bool:
        reg = self.metadata.image.brokers.get(self.node_id)
        return reg is not None and reg.broker_epoch == self.broker_epoch and not reg.fenced

    async def wait_unfenced(self) -> None:
        while not self.is_unfenced():
            await self.metadata.wait_for_offset(self.metadata.image.offset + 1)

    async def heartbeat_loop(self) -> None:
        while True:
            reg = self.metadata.image.brokers.get(self.node_id)
            caught_up = reg is not None and reg.broker_epoch == self.broker_epoch
            try:
                result = await self.metadata.call("broker_heartbeat", {
                    "broker_id": self.node_id, "broker_epoch": self.broker_epoch, "caught_up": caught_up,
                    "want_shutdown": self._shutting_down,
                }, timeout_s=max(1.0, 4 * self.heartbeat_interval_s))
            except ControllerUnavailable as exc:
                log.warning("heartbeat of broker %d got no answer: %s", self.node_id, exc)
                continue
            code = result["error_code"]
            if code == ErrorCode.stale_broker_epoch:
                log.warning("broker %d was registered again elsewhere or forgotten: registering anew", self.node_id)
                self.incarnation_id = str(uuid.uuid4())
                # The same process: nothing of its logs was lost, its last epoch vouches for it.
                await self.register(previous_broker_epoch=self.broker_epoch)
                continue
            if code == ErrorCode.none and self._shutting_down and result.get("should_shut_down"):
                self._shutdown_done.set()
                return
            with trio.move_on_after(self.heartbeat_interval_s):
                await self._shutdown_wanted.wait()

    async def controlled_shutdown(self, timeout_s: float) -> bool:
        """Ask the controller to move leadership away; True when it confirmed."""
        self._shutting_down = True
        self._shutdown_wanted.set()
        with trio.move_on_after(timeout_s):
            await self._shutdown_done.wait()
            log.info("broker %d: controlled shutdown complete, it leads no partitions", self.node_id)
            await self.metadata.resign()
            return True
        log.warning("broker %d: controlled shutdown did not complete within %.1f s", self.node_id, timeout_s)
        return False
