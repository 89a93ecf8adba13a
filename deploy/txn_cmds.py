"""`dcmirror transactions list|describe|abort`, in the shape of kafka-transactions.

- list: every broker's transactional ids (ListTransactions), with their coordinator.
- describe --transactional-id ID: the coordinator's view (DescribeTransactions).
- abort --transactional-id ID: fence the id's producer and abort its open transaction
  (InitProducerId under the id bumps the epoch, as a new producer instance would).
- abort --topic T --partition P --start-offset O: a hanging transaction the coordinator no
  longer knows (kafka-transactions abort): the producer whose transaction started at O
  (DescribeProducers) gets an ABORT marker written by the partition's leader.
"""

from __future__ import annotations

import argparse
from typing import Any

import trio
from kio.serial.errors import SerialError

from cluster.client.admin import Admin, write_txn_marker
from cluster.client.errors import KafkaError
from cluster.protocol.api_keys import ApiKey
from cluster.protocol.errors import ErrorCode
from cluster.protocol.sentinels import COORDINATOR_TRANSACTION
from deploy.cluster_cmds import add_target, admin_command, admin_for

_RETRY_S = 0.3
_ABORT_WAIT_S = 30.0


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    txns = sub.add_parser("transactions", help="transactions: list, describe, abort (kafka-transactions)")
    t = txns.add_subparsers(dest="action", required=True)
    lst = t.add_parser("list", help="transactional ids and their state, from every broker")
    add_target(lst)
    desc = t.add_parser("describe", help="one transactional id, as its coordinator sees it")
    desc.add_argument("--transactional-id", required=True)
    add_target(desc)
    ab = t.add_parser("abort", help="abort an open or hanging transaction")
    ab.add_argument("--transactional-id", help="fence this id's producer and abort its open transaction")
    ab.add_argument("--topic", help="with --partition and --start-offset: a hanging transaction")
    ab.add_argument("--partition", type=int)
    ab.add_argument("--start-offset", type=int)
    add_target(ab)
    txns.set_defaults(func=admin_command("transactions", _run, (KafkaError,)))


async def _run(args: argparse.Namespace) -> int:
    async with admin_for(args, "dcmirror-transactions") as admin:
        if args.action == "list":
            return await _list(admin)
        if args.action == "describe":
            return await _describe(admin, args.transactional_id)
        if args.transactional_id:
            return await _abort_id(admin, args.transactional_id)
        if args.topic is None or args.partition is None or args.start_offset is None:
            raise ValueError("abort needs --transactional-id, or --topic, --partition and --start-offset")
        return await _abort_hanging(admin, args.topic, args.partition, args.start_offset)


async def _list(admin: Admin) -> int:
    md = await admin.metadata([])
    rows = []
    for b in sorted(md.brokers, key=lambda b: b.node_id):
        node = b.node_id
        conn = await admin._conn(b.host, b.port)
        resp = await conn.request(ApiKey.LIST_TRANSACTIONS, {"state_filters": [], "producer_id_filters": [],
                                                             "duration_filter": -1})
        if resp.error_code:
            raise KafkaError(f"ListTransactions on broker {node}", resp.error_code)
        rows += [(s.transactional_id, node, s.producer_id, s.transaction_state) for s in resp.transaction_states]
    print(f"{'TransactionalId':<32} {'Coordinator':>11} {'ProducerId':>10}  TransactionState")
    for txn_id, node, pid, state in sorted(rows):
        print(f"{txn_id:<32} {node:>11} {pid:>10}  {state}")
    return 0


async def _coordinator(admin: Admin, txn_id: str) -> Any:
    with trio.fail_after(_ABORT_WAIT_S):
        while True:
            conn = await admin.cluster.any_connection()
            resp = await conn.request(ApiKey.FIND_COORDINATOR, {"key": txn_id, "key_type": COORDINATOR_TRANSACTION})
            if resp.error_code == ErrorCode.none:
                return await admin._conn(resp.host, resp.port)
            if resp.error_code != ErrorCode.coordinator_not_available:
                raise KafkaError(f"finding the coordinator of {txn_id}", resp.error_code)
            await trio.sleep(_RETRY_S)


async def _describe(admin: Admin, txn_id: str) -> int:
    conn = await _coordinator(admin, txn_id)
    try:
        resp = await conn.request(ApiKey.DESCRIBE_TRANSACTIONS, {"transactional_ids": [txn_id]})
    except SerialError as exc:  # kio refuses the -1 start time of an idle id (no transaction open)
        raise ValueError(f"{txn_id} has no open transaction (see `dcmirror transactions list`): {exc}") from None
    (s,) = resp.transaction_states
    if s.error_code:
        raise KafkaError(f"describing {txn_id}", s.error_code)
    partitions = ",".join(f"{t.topic}-{p}" for t in s.topics for p in t.partitions)
    print(f"{'TransactionalId':<24} {'ProducerId':>10} {'Epoch':>5} {'State':<14} {'TimeoutMs':>9}  Partitions")
    print(f"{txn_id:<24} {s.producer_id:>10} {s.producer_epoch:>5} {s.transaction_state:<14} "
          f"{int(s.transaction_timeout.total_seconds() * 1000):>9}  {partitions or '-'}")
    return 0


async def _abort_id(admin: Admin, txn_id: str) -> int:
    """InitProducerId under the id: the coordinator aborts what is open (answering
    CONCURRENT_TRANSACTIONS meanwhile) and bumps the epoch; the old producer is fenced."""
    with trio.fail_after(_ABORT_WAIT_S):
        while True:
            conn = await _coordinator(admin, txn_id)
            resp = await conn.request(ApiKey.INIT_PRODUCER_ID, {"transactional_id": txn_id,
                                                                "transaction_timeout": 60_000})
            if resp.error_code == ErrorCode.none:
                print(f"{txn_id}: open transaction aborted, producer {resp.producer_id} fenced "
                      f"(epoch now {resp.producer_epoch})")
                return 0
            if resp.error_code not in (ErrorCode.concurrent_transactions, ErrorCode.not_coordinator,
                                       ErrorCode.coordinator_not_available, ErrorCode.coordinator_load_in_progress):
                raise KafkaError(f"aborting {txn_id}", resp.error_code)
            await trio.sleep(_RETRY_S)


async def _abort_hanging(admin: Admin, topic: str, partition: int, start_offset: int) -> int:
    resp = await admin.cluster.leader_request(topic, partition, ApiKey.DESCRIBE_PRODUCERS, {
        "topics": [{"name": topic, "partition_indexes": [partition]}]})
    p = resp.topics[0].partitions[0]
    if p.error_code:
        raise KafkaError(f"describing the producers of {topic}-{partition}", p.error_code)
    found = [s for s in p.active_producers if s.current_txn_start_offset == start_offset]
    if not found:
        raise ValueError(f"no open transaction starts at offset {start_offset} of {topic}-{partition}")
    producer = found[0]
    code = await write_txn_marker(admin.cluster, topic, partition, producer_id=producer.producer_id,
                                  producer_epoch=producer.producer_epoch, commit=False,
                                  coordinator_epoch=max(0, producer.coordinator_epoch))
    if code:
        raise KafkaError(f"writing the ABORT marker to {topic}-{partition}", code)
    print(f"{topic}-{partition}: transaction of producer {producer.producer_id} (epoch {producer.producer_epoch}) "
          f"starting at offset {start_offset} aborted")
    return 0
