"""mirror/failover.py's `end_transactions` (failback's EndTxns) against a fake admin: an open
transaction is ended through a coordinator only when that coordinator has it in progress on
the partition; one whose producer id only collides with a transactional id of the cluster (a
mirror topic's copy of the other cluster's transaction, its marker never copied) is hanging
and gets an ABORT marker (soak seed 28085677 of tests/mirror_sim.py: fencing the colliding
id, again and again, never ended it)."""

from __future__ import annotations

import datetime
from types import SimpleNamespace
from typing import Any

import trio
from kio.schema.describe_transactions.v0.response import (
    DescribeTransactionsResponse,
    TopicData,
    TransactionState,
)
from kio.schema.errors import ErrorCode
from kio.schema.types import ProducerId, TopicName, TransactionalId
from kio.static.primitive import i16, i32

from cluster.protocol.api_keys import ApiKey
from mirror.core import disaster_recovery as dr
from mirror.failover import end_transactions

EPOCH0 = datetime.datetime.fromtimestamp(0, datetime.UTC)


class FakeAdmin:
    """A cluster with one transactional id, `app`, producer id 0, in `state` on `partitions`."""

    def __init__(self, state: str, partitions: dict[str, tuple[int, ...]]) -> None:
        self.state, self.partitions = state, partitions
        self.fenced: list[str] = []
        self.markers: list[dict[str, Any]] = []
        self.cluster = SimpleNamespace(leader_request=self._leader_request)

    async def list_transactions(self) -> list[tuple[str, int, int, str]]:
        return [("app", 1, 0, self.state)]

    async def transaction_coordinator(self, txn_id: str) -> Any:
        return SimpleNamespace(request=self._request)

    async def _request(self, api_key: int, body: dict[str, Any]) -> DescribeTransactionsResponse:
        assert api_key == ApiKey.DESCRIBE_TRANSACTIONS and body == {"transactional_ids": ["app"]}
        state = TransactionState(
            error_code=ErrorCode.none, transactional_id=TransactionalId("app"), transaction_state=self.state,
            transaction_timeout=datetime.timedelta(seconds=60), transaction_start_time=EPOCH0,
            producer_id=ProducerId(0), producer_epoch=i16(3),
            topics=tuple(TopicData(topic=TopicName(t), partitions=tuple(i32(p) for p in ps))
                         for t, ps in self.partitions.items()))
        return DescribeTransactionsResponse(throttle_time=datetime.timedelta(0), transaction_states=(state,))

    async def fence_transactional_id(self, txn_id: str) -> tuple[int, int]:
        self.fenced.append(txn_id)
        return 0, 4

    async def _leader_request(self, topic: str, partition: int, api_key: int, body: dict[str, Any]) -> Any:
        assert api_key == ApiKey.WRITE_TXN_MARKERS
        self.markers.append(body["markers"][0])
        return SimpleNamespace(markers=[SimpleNamespace(topics=[SimpleNamespace(partitions=[
            SimpleNamespace(error_code=0)])])])


OPEN = dr.OpenTxn(producer_id=0, producer_epoch=0, coordinator_epoch=0, first_offset=399)


def _end(admin: FakeAdmin) -> None:
    trio.run(end_transactions, admin, "orders", 1, [OPEN])


def test_a_transaction_its_coordinator_has_open_here_ends_through_it() -> None:
    for state in ("Ongoing", "PrepareCommit", "PrepareAbort"):
        admin = FakeAdmin(state, {"orders": (0, 1)})
        _end(admin)
        assert (admin.fenced, admin.markers) == (["app"], []), state


def test_a_colliding_producer_id_is_no_owner_the_transaction_is_hanging() -> None:
    # The id with producer id 0 has nothing open (or open elsewhere): the open transaction on
    # orders-1 is another's (a copy of the other cluster's), aborted with its own epoch.
    for admin in (FakeAdmin("Empty", {}), FakeAdmin("CompleteCommit", {}), FakeAdmin("Ongoing", {"orders": (0,)}),
                  FakeAdmin("Ongoing", {"other": (1,)})):
        _end(admin)
        assert admin.fenced == []
        assert [(m["producer_id"], m["producer_epoch"], m["transaction_result"]) for m in admin.markers] == \
            [(0, 0, False)]
