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

import trio
from kio.serial.errors import SerialError

from cluster.client.admin import Admin, write_txn_marker
from cluster.client.errors import KafkaError
from cluster.protocol.api_keys import ApiKey
from deploy.cluster_cmds import add_target, admin_command, admin_for

_RETRY_S = 0.3
_ABORT_WAIT_S = 30.0


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    txns = sub.add_parser("transactions", help="transactions: list, describe, abort (kafka-transactions)")
    t = txns.add_subparsers(dest="action", required=True)
    lst = t.add_parser("list", help="transactional ids and their state, from every broker")
    add_target(lst)
    desc = t.add_parser("describe", help="one transactional id, as its coordinator sees it")
    desc.add_argument("--transactional-id", required=True, help="the transactional id")
    add_target(desc)
    ab = t.add_parser("abort", help="abort an open or hanging transaction")
    ab.add_argument("--transactional-id", help="fence this id's producer and abort its open transaction")
    ab.add_argument("--topic", help="with --partition and --start-offset: a hanging transaction")
    ab.add_argument("--partition", type=int, help="with --topic: the partition of the hanging transaction")
    ab.add_argument("--start-offset", type=int, help="with --topic: the offset the hanging transaction starts at")
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
    rows = await admin.list_transactions()
    print(f"{'TransactionalId':<32} {'Coordinator':>11} {'ProducerId':>10}  TransactionState")
    for txn_id, node, pid, state in sorted(rows):
        print(f"{txn_id:<32} {node:>11} {pid:>10}  {state}")
    return 0


async def _describe(admin: Admin, txn_id: str) -> int:
    with trio.fail_after(_ABORT_WAIT_S):
        conn = await admin.transaction_coordinator(txn_id, retry_s=_RETRY_S)
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
        producer_id, epoch = await admin.fence_transactional_id(txn_id, retry_s=_RETRY_S)
    print(f"{txn_id}: open transaction aborted, producer {producer_id} fenced (epoch now {epoch})")
    return 0


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
