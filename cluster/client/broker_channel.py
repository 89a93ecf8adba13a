"""Requests from one broker to the others, by broker id, over one cached connection each.

The transaction coordinator (AddPartitionsToTxn verification, WriteTxnMarkers) and the
share-state service (the share-state APIs to another broker's share coordinator) call
other brokers this way. A connection that fails is dropped, and the next request to that
broker connects again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from cluster.client.connection import BrokerConnection, KafkaConnectionError, UnsupportedApi
from cluster.protocol.api_keys import ApiKey
from cluster.security.connector import PLAINTEXT, LinkSecurity

log = logging.getLogger(__name__)

# Where a broker takes inter-broker requests (None: it is not registered).
BrokerAddress = Callable[[int], tuple[str, int] | None]


class BrokerChannel:
    def __init__(self, address: BrokerAddress, *, client_id: str, link: LinkSecurity = PLAINTEXT) -> None:
        self._address = address
        self.client_id = client_id
        self._link = link
        self._connections: dict[int, BrokerConnection] = {}
        self._connect_lock = trio.Lock()

    async def request(self, broker_id: int, api: ApiKey, body: dict[str, Any], *, timeout_s: float,
                      version: int | None = None, what: str | None = None) -> Any:
        """One request to broker `broker_id`: its answer, or None when it could not be
        answered (logged, naming the request as `what`, default the API's name; the
        connection is dropped then). `version` None: the highest both speak."""
        try:
            conn = await self.connection(broker_id)
            return await conn.request(api, body, version=version, timeout_s=timeout_s)
        except (KafkaConnectionError, UnsupportedApi, OSError) as exc:
            log.info("%s to broker %d: %s", what or api.api_name, broker_id, exc)
            await self.drop(broker_id)
            return None

    async def connection(self, broker_id: int) -> BrokerConnection:
        """The open connection to `broker_id`, connecting one when there is none."""
        async with self._connect_lock:
            conn = self._connections.get(broker_id)
            if conn is not None and not conn.closed:
                return conn
            address = self._address(broker_id)
            if address is None:
                raise KafkaConnectionError(f"broker {broker_id} is not registered")
            conn = await BrokerConnection(*address, client_id=self.client_id, link=self._link).connect()
            self._connections[broker_id] = conn
            return conn

    async def drop(self, broker_id: int) -> None:
        conn = self._connections.pop(broker_id, None)
        if conn is not None:
            with trio.CancelScope(shield=True):
                await conn.aclose()

    async def aclose(self) -> None:
        for broker_id in list(self._connections):
            await self.drop(broker_id)
