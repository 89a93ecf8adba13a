"""`dcmirror mirror promote | failover | failback`: the trio shell over the procedures of
mirror/core/disaster_recovery.py (docs/design.md, "Failover and failback").

The procedures decide; this answers their requests with the clients of the two clusters
(`ClusterAnswers`) and says their progress. `run_action` is what the command line and the
console call; `gather_worker_views` reads the workers' last status into what a failover
knows of the source (its high watermarks and when they were seen, the topics deleted there).
`flow_directions` answers `topology plan`: per topic, which side is the copy.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import orjson
import trio

from cluster.client.admin import LATEST, Admin, AdminError, write_txn_marker
from cluster.client.consumer import Consumer
from cluster.client.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError
from cluster.client.producer import Producer
from cluster.protocol.api_keys import ApiKey
from cluster.protocol.errors import ErrorCode
from cluster.protocol.sentinels import READ_COMMITTED
from mirror.core import disaster_recovery as dr
from mirror.core.disaster_recovery import (
    LEDGER_TOPIC,
    MIRROR_SOURCE_CONFIG,
    FailoverError,
    KnownEnd,
    LedgerEntry,
    Outcome,
    TopicSides,
)
from mirror.worker import _admin_part
from topology.model import MirrorSpec, Topology

log = logging.getLogger("dcmirror.mirror.failover")

__all__ = ["FailoverError", "Outcome", "RETRIABLE", "TopicSides", "admin_for", "flow_directions", "gather_worker_views",
           "run_action", "run_steps"]

RETRIABLE = (KafkaError, KafkaConnectionError, KafkaTimeoutError, OSError, dr.Retriable)
REACH_TIMEOUT_S = 5.0  # failover: how long the source gets to answer before it counts as gone
READ_TIMEOUT_S = 120.0  # reading one partition's range back (failback)
FENCE_TIMEOUT_S = 30.0  # a transaction's coordinator ending it
Say = Callable[[str], None]


def admin_for(topology: Topology, cluster: str, overrides: Mapping[str, Any] | None = None, *,
              client_id: str = "dcmirror-failover") -> Admin:
    """An admin client of one of the topology's clusters (`overrides`: a flow's principal there)."""
    client = topology.cluster(cluster).client_config(dict(overrides or {}))
    return Admin(client["bootstrap.servers"], client_id=client_id, config=_admin_part(client))


async def topic_marker(admin: Admin, topic: str) -> str | None:
    try:
        entries = await admin.topic_configs(topic)
    except AdminError:
        return None
    for e in entries:
        if e.name == MIRROR_SOURCE_CONFIG and getattr(e, "config_source", None) == 1 and e.value:
            return str(e.value)
    return None


async def run_steps(step: dr.Step, answer: Callable[[dr.Request], Awaitable[Any]]) -> Any:
    """Drive a procedure: each request answered by `answer`; a retriable failure is thrown
    into the procedure as `Retriable` (it decides whether to ask again)."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            request = step.send(value) if error is None else step.throw(error)
        except StopIteration as done:
            return done.value
        value, error = None, None
        try:
            value = await answer(request)
        except (*RETRIABLE, trio.TooSlowError) as exc:
            error = dr.Retriable(str(exc) or type(exc).__name__)


class ClusterAnswers:
    """Answers a procedure's requests with real clients: the flow's two clusters, each with
    the flow's principal there (`settings`). The source's admin is opened when first needed
    (a failover may never reach it)."""

    def __init__(self, topology: Topology, flow: MirrorSpec, settings: Mapping[str, Mapping[str, Any]],
                 stack: contextlib.AsyncExitStack, *, say: Say, client_id: str) -> None:
        self.topology, self.flow, self.settings, self.stack = topology, flow, settings, stack
        self.say, self.client_id = say, client_id
        self.admins: dict[str, Admin] = {}

    def cluster_of(self, side: str) -> str:
        return self.flow.source if side == "source" else self.flow.target

    def client_config(self, side: str) -> dict[str, Any]:
        return self.topology.cluster(self.cluster_of(side)).client_config(dict(self.settings.get(side) or {}))

    async def admin(self, side: str) -> Admin:
        found = self.admins.get(side)
        if found is None:
            made = admin_for(self.topology, self.cluster_of(side), self.settings.get(side), client_id=self.client_id)
            with trio.fail_after(REACH_TIMEOUT_S if side == "source" else 60):
                found = self.admins[side] = await self.stack.enter_async_context(made)
        return found

    async def __call__(self, r: dr.Request) -> Any:  # noqa: C901 - one case per request type
        if isinstance(r, dr.Say):
            self.say(r.text)
            return None
        if isinstance(r, dr.Now):
            return int(time.time() * 1000)
        if isinstance(r, dr.Sleep):
            await trio.sleep(r.seconds)
            return None
        if isinstance(r, dr.Reachable):
            try:
                admin = await self.admin(r.side)
                with trio.fail_after(REACH_TIMEOUT_S):
                    await admin.metadata([])
                return True
            except (*RETRIABLE, trio.TooSlowError):
                return False
        if isinstance(r, dr.ReadLedger):
            return await read_ledger(self.topology, self.flow, self.client_config("target"))
        if isinstance(r, dr.WriteLedger):
            await write_ledger(await self.admin("target"), self.topology, self.flow, self.client_config("target"),
                               r.entry)
            return None
        admin = await self.admin(r.side)
        if isinstance(r, dr.ListTopics):
            meta = await admin.metadata(None)
            return {t.name: len(t.partitions) for t in meta.topics if t.error_code == 0}
        if isinstance(r, dr.GetMarker):
            return await topic_marker(admin, r.topic)
        if isinstance(r, dr.SetMarker):
            if r.marker is None:
                await admin.alter_topic_configs(r.topic, {}, [MIRROR_SOURCE_CONFIG])
            else:
                await admin.alter_topic_configs(r.topic, {MIRROR_SOURCE_CONFIG: r.marker}, [])
            return None
        if isinstance(r, dr.GetEnds):
            return await partition_ends(admin, r.topic, r.partitions, committed=r.committed)
        if isinstance(r, dr.GetOpenTxns):
            return await open_transactions(admin, r.topic, r.partition)
        if isinstance(r, dr.AbortTxn):
            code = await write_txn_marker(admin.cluster, r.topic, r.partition, producer_id=r.txn.producer_id,
                                          producer_epoch=r.txn.producer_epoch, commit=False,
                                          coordinator_epoch=max(0, r.txn.coordinator_epoch))
            if code:
                raise KafkaError(f"aborting the open transaction of producer {r.txn.producer_id} in "
                                 f"{r.topic}-{r.partition}", code)
            return None
        if isinstance(r, dr.EndTxns):
            await end_transactions(admin, r.topic, r.partition, r.txns)
            return None
        if isinstance(r, dr.GetConfigs):
            return {e.name: e.value for e in await admin.topic_configs(r.topic)
                    if getattr(e, "config_source", None) == 1 and e.value is not None}
        if isinstance(r, dr.AlterConfigs):
            await admin.alter_topic_configs(r.topic, dict(r.set), list(r.delete))
            return None
        if isinstance(r, dr.DeleteTopic):
            try:
                await admin.delete_topic(r.topic)
            except AdminError as exc:
                if exc.code != ErrorCode.unknown_topic_or_partition:
                    raise
            return None
        if isinstance(r, dr.CreateTopic):
            await self._create(admin, r.side, r.topic, r.partitions, dict(r.configs))
            return None
        if isinstance(r, dr.ReadRecords):
            return await read_committed(self.client_config(r.side), r.topic, r.partition, r.start, r.end)
        if isinstance(r, dr.Produce):
            await self._create(admin, r.side, r.topic, r.partitions, {})
            await produce_records(self.client_config(r.side), r.topic, r.records)
            return None
        raise AssertionError(f"no answer for {r!r}")

    async def _create(self, admin: Admin, side: str, topic: str, partitions: int, configs: dict[str, str]) -> None:
        rf = min(self.topology.defaults.replication_factor, len(self.topology.cluster(self.cluster_of(side)).brokers))
        try:
            await admin.create_topic(topic, partitions, rf, configs)
        except AdminError as exc:
            if exc.code != ErrorCode.topic_already_exists:
                raise


async def partition_ends(admin: Admin, topic: str, partitions: int, *, committed: bool = False) -> dict[int, int]:
    """Log ends (`committed`: last stable offsets) of partitions 0..n-1; {} for no such topic."""
    tps = [(topic, p) for p in range(partitions)]
    try:
        got = await admin.list_offsets(tps, LATEST, isolation_level=READ_COMMITTED if committed else 0)
    except AdminError as exc:
        if exc.code == ErrorCode.unknown_topic_or_partition:
            return {}
        raise
    return {p: got[(topic, p)] for _, p in tps}


async def open_transactions(admin: Admin, topic: str, partition: int) -> list[dr.OpenTxn]:
    resp = await admin.cluster.leader_request(topic, partition, ApiKey.DESCRIBE_PRODUCERS, {
        "topics": [{"name": topic, "partition_indexes": [partition]}]})
    p = resp.topics[0].partitions[0]
    if p.error_code:
        raise KafkaError(f"describing the producers of {topic}-{partition}", p.error_code)
    return [dr.OpenTxn(x.producer_id, x.producer_epoch, x.coordinator_epoch, x.current_txn_start_offset)
            for x in p.active_producers if x.current_txn_start_offset >= 0]


TXN_IN_PROGRESS = frozenset({"Ongoing", "PrepareCommit", "PrepareAbort"})  # its markers still to be written


async def end_transactions(admin: Admin, topic: str, partition: int, txns: Iterable[dr.OpenTxn]) -> None:
    """End open transactions through their coordinator (fencing their producers: one preparing
    to commit commits, one open aborts); one that no coordinator of the cluster has in
    progress on this partition, while every broker answered, is hanging and gets an ABORT
    marker (kafka-transactions find-hanging, then abort). A transactional id that only has
    the same producer id is not its owner: ids collide across clusters, and a mirror topic's
    open transaction is the other cluster's, its coordinator there (fencing the id here would
    end nothing, ever)."""
    ids = {pid: txn_id for txn_id, _, pid, _ in await admin.list_transactions()}
    for txn in txns:
        txn_id = ids.get(txn.producer_id)
        if txn_id is not None and await _in_progress_on(admin, txn_id, txn.producer_id, topic, partition):
            with trio.fail_after(FENCE_TIMEOUT_S):
                await admin.fence_transactional_id(txn_id)
            log.info("%s-%d: the open transaction of %s (producer %d) ended by its coordinator, its producer fenced",
                     topic, partition, txn_id, txn.producer_id)
            continue
        code = await write_txn_marker(admin.cluster, topic, partition, producer_id=txn.producer_id,
                                      producer_epoch=txn.producer_epoch, commit=False,
                                      coordinator_epoch=max(0, txn.coordinator_epoch))
        if code:
            raise KafkaError(f"aborting the hanging transaction of producer {txn.producer_id} in {topic}-{partition}",
                             code)
        log.warning("%s-%d: the transaction of producer %d, which no coordinator knows, aborted (hanging)", topic,
                    partition, txn.producer_id)


async def _in_progress_on(admin: Admin, txn_id: str, producer_id: int, topic: str, partition: int) -> bool:
    """Whether the coordinator of `txn_id` has its transaction, under `producer_id`, in
    progress on the partition (DescribeTransactions): then it writes that partition's marker."""
    with trio.fail_after(FENCE_TIMEOUT_S):
        conn = await admin.transaction_coordinator(txn_id)
        resp = await conn.request(ApiKey.DESCRIBE_TRANSACTIONS, {"transactional_ids": [txn_id]})
    s = resp.transaction_states[0]
    if s.error_code == ErrorCode.transactional_id_not_found:
        return False
    if s.error_code:
        raise KafkaError(f"describing the transaction of {txn_id}", s.error_code)
    return (s.producer_id == producer_id and s.transaction_state in TXN_IN_PROGRESS
            and any(t.topic == topic and partition in t.partitions for t in s.topics))


async def read_committed(config: Mapping[str, Any], topic: str, partition: int, start: int,
                         end: int) -> list[dr.Rec]:
    """The partition's committed records in [start, end) (from the log start when it is
    above `start`; to its last stable offset when that is below `end`), read_committed."""
    out: list[dr.Rec] = []
    async with Admin(config["bootstrap.servers"], config=_admin_part(dict(config))) as admin:
        end = min(end, (await partition_ends(admin, topic, partition + 1, committed=True)).get(partition, 0))
    if end <= start:
        return out
    async with Consumer({**config, "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed"}) as consumer:
        tp = (topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, start)
        with trio.fail_after(READ_TIMEOUT_S):
            while True:
                position = consumer.position(tp)
                if position is not None and position >= end:
                    return out
                for records in (await consumer.getmany(timeout_s=0.5)).values():
                    out.extend(dr.Rec(r.offset, r.key, r.value, tuple(r.headers or ()), r.timestamp)
                               for r in records if r.offset < end)


async def produce_records(config: Mapping[str, Any], topic: str, records: Iterable[tuple[int, dr.Rec]]) -> None:
    async with Producer({**config, "acks": "all", "enable.idempotence": True}) as producer:
        futures = [await producer.send(topic, r.value, r.key, partition=p, headers=list(r.headers),
                                       timestamp_ms=r.timestamp_ms if r.timestamp_ms >= 0 else None)
                   for p, r in records]
        for f in futures:
            await f.wait()


# ---- the ledger ------------------------------------------------------------------------


async def write_ledger(admin: Admin, topology: Topology, flow: MirrorSpec, config: Mapping[str, Any],
                       entry: LedgerEntry) -> None:
    try:
        await admin.create_topic(LEDGER_TOPIC, 1, min(3, len(topology.cluster(flow.target).brokers)),
                                 {"cleanup.policy": "compact"})
    except AdminError as exc:
        if exc.code != ErrorCode.topic_already_exists:
            raise
    async with Producer({**config, "acks": "all", "enable.idempotence": True}) as producer:
        await producer.send_and_wait(LEDGER_TOPIC, orjson.dumps(entry.as_json()), key=entry.key(), partition=0)


async def read_ledger(topology: Topology, flow: MirrorSpec, config: Mapping[str, Any]) -> dict[str, LedgerEntry]:
    """The flow's last entry of each target topic (its failover, and how far its failback got)."""
    async with Admin(config["bootstrap.servers"], config=_admin_part(dict(config))) as admin:
        end = (await partition_ends(admin, LEDGER_TOPIC, 1)).get(0, 0)
    found: dict[str, LedgerEntry] = {}
    if end <= 0:
        return found
    prefix = f"{flow.name}/".encode()
    for r in await read_committed(config, LEDGER_TOPIC, 0, 0, end):
        if r.key is not None and r.key.startswith(prefix) and r.value:
            entry = LedgerEntry.from_json(orjson.loads(r.value))
            found[entry.target_topic] = entry
    return found


# ---- what the workers saw ----------------------------------------------------------------


def gather_worker_views(reports: Iterable[Mapping[str, Any]]) -> tuple[dict[tuple[str, int], KnownEnd],
                                                                       dict[str, str]]:
    """From the flow's workers' last status (`dcmirror mirror status` reports): per (source
    topic, partition) the source's high watermark as last seen by any worker, and when (the
    latest view: a topic created again starts low; within one history a later view is never
    lower, but for clocks apart); and the source topics a worker saw deleted (why)."""
    known: dict[tuple[str, int], KnownEnd] = {}
    deleted: dict[str, str] = {}
    for report in reports:
        for worker in report.get("workers") or []:
            for p in worker.get("source_known_ends") or []:
                key = (p["topic"], int(p["partition"]))
                seen = KnownEnd(int(p["high_watermark"]), int(p.get("seen_ms") or -1))
                have = known.get(key)
                if have is None or (seen.seen_ms, seen.high_watermark) > (have.seen_ms, have.high_watermark):
                    known[key] = seen
            for topic, why in (worker.get("refused_topics") or {}).items():
                if str(why).startswith("SOURCE_DELETED"):
                    deleted[topic] = str(why)
    return known, deleted


def declared_topic_configs(topology: Topology) -> dict[tuple[str, str], dict[str, str]]:
    """(cluster, topic) -> the configs the topology file declares for it."""
    return {(t.cluster, t.name): dict(t.config) for t in topology.topics if t.config}


async def run_action(topology: Topology, flow: MirrorSpec, action: str, *, source: Mapping[str, Any],
                     target: Mapping[str, Any], known: Mapping[tuple[str, int], KnownEnd] | None = None,
                     deleted_sources: Mapping[str, str] | None = None, timeout_s: float, say: Say,
                     client_id: str = "dcmirror-failover") -> Outcome:
    """promote | failover | failback of one mirror-topics flow, acting with the client settings
    `source` and `target` (the flow's principal on each side)."""
    datacenter = topology.cluster(flow.source).datacenter
    declared = declared_topic_configs(topology)
    if action == "promote":
        step = dr.promote(flow, datacenter, timeout_s=timeout_s, declared=declared)
    elif action == "failover":
        step = dr.failover(flow, datacenter, known=known or {}, deleted_sources=deleted_sources, timeout_s=timeout_s,
                           declared=declared)
    elif action == "failback":
        step = dr.failback(flow, datacenter, timeout_s=timeout_s, declared=declared)
    else:
        raise ValueError(f"no such action {action!r}")
    async with contextlib.AsyncExitStack() as stack:
        answers = ClusterAnswers(topology, flow, {"source": source, "target": target}, stack, say=say,
                                 client_id=client_id)
        outcome: Outcome = await run_steps(step, answers)
        return outcome


# ---- where each flow stands ------------------------------------------------------------

PRIMARY_OF = {"forward": "source", "promoting": "both read-only", "reverse": "target", "primary-target": "target",
              "none": "-"}


async def flow_directions(topology: Topology, timeout_s: float) -> list[dict[str, Any]]:
    """Per topic of every mirror-topics flow: which side is the copy, as the clusters say
    (`topology plan` prints it; the file only says which clusters a flow links)."""
    rows: list[dict[str, Any]] = []
    for flow in topology.mirrors:
        if not flow.mirror_topics:
            continue
        async with contextlib.AsyncExitStack() as stack:
            reached: dict[str, bool] = {}
            answers = ClusterAnswers(topology, flow, {}, stack, say=lambda _: None, client_id="dcmirror-plan")
            for side in ("source", "target"):
                try:
                    with trio.fail_after(timeout_s):
                        await answers.admin(side)
                    reached[side] = True
                except (*RETRIABLE, trio.TooSlowError):
                    reached[side] = False
            if not reached["target"]:
                rows.append({"flow": flow.name, "topic": None, "direction": "unknown",
                             "why": f"{flow.target} is unreachable"})
                continue
            with trio.fail_after(timeout_s * 4):
                ledger = await read_ledger(topology, flow, answers.client_config("target"))
                sides = await run_steps(dr.flow_topics(flow, topology.cluster(flow.source).datacenter,
                                                       source=reached["source"], ledger=ledger), answers)
            for s in sides:
                d = "source-deleted" if s.source_deleted else s.direction(flow)
                rows.append({"flow": flow.name, "source_topic": f"{flow.source}:{s.source_topic}",
                             "target_topic": f"{flow.target}:{s.target_topic}", "direction": d,
                             "primary": {"source": flow.source, "target": flow.target}.get(PRIMARY_OF.get(d, "-"),
                                                                                          PRIMARY_OF.get(d, "-")),
                             "source_reachable": reached["source"]})
    return rows


def direction_lines(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    out = ["", "mirror topics (which side is the copy, as the clusters say):"]
    for r in rows:
        if r.get("topic", "") is None:
            out.append(f"  {r['flow']}: {r['direction']} ({r['why']})")
            continue
        arrow = {"forward": "->", "reverse": "<-", "promoting": "<->", "primary-target": "x->",
                 "source-deleted": "?->"}.get(r["direction"], "?")
        out.append(f"  {r['flow']}: {r['source_topic']} {arrow} {r['target_topic']}  {r['direction']}, "
                   f"primary {r['primary']}" + ("" if r["source_reachable"] else " (source unreachable)"))
    return out
