"""Producer ids for InitProducerId: blocks of ids handed out by the controller.

Each block is recorded in the metadata log before use, so ids are unique across the
cluster's brokers and across restarts (a restarted broker takes a fresh block).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from cluster.controller.service import ControllerUnavailable
from cluster.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from cluster.broker.broker import Broker


class ProducerIdAllocator:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._next = 0
        self._block_end = 0
        self._lock = trio.Lock()

    async def next_id(self) -> int:
        async with self._lock:
            if self._next >= self._block_end:
                result = await self.broker.metadata.call("allocate_producer_ids", {"broker_id": self.broker.node_id})
                if result["error_code"] != ErrorCode.none:
                    raise ControllerUnavailable(str(result.get("error_message")))
                self._next = int(result["start"])
                self._block_end = self._next + int(result["length"])
            pid = self._next
            self._next += 1
            return pid
