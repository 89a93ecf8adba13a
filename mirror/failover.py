"""Promote, fail over and fail back the mirror topics of a flow (`dcmirror mirror promote |
failover | failback`), docs/design.md "Failover and failback".

Which side of a flow is the primary is recorded where the data is, in the clusters: a topic
that carries `mirror.source = "<cluster>:<topic>"` is a read-only copy of that topic. The
flow's direction has its target's topics carry it; after a failover neither side does (the
target is the primary, the source is gone); after a failback the source's topics carry it,
naming the target's, and the flow's workers copy back (mirror/mirror_topics.py, reverse);
during a promotion both do for a moment. `dcmirror mirror status` and `topology plan --live`
show it per topic; the topology file says which clusters a flow links, never which is ahead.

The failover ledger: a failover writes, per topic, where each partition's copy ended and
how far the source was known to be ahead (the RPO) into the compacted topic
`dcmirror.failovers` of the target cluster; a failback reads it to find the records the
old source took that were never mirrored (beyond that end), and copies them into the side
topic `dcmirror.diverged.<source cluster>.<topic>` of the new primary before the old
source's topic is made a mirror of it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
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
from mirror.mirror_topics import CONFIG_EXCLUDES, MIRROR_SOURCE_CONFIG, mirror_source_value
from mirror.worker import INTERNAL_PREFIXES, _admin_part
from topology.model import MirrorSpec, Topology

log = logging.getLogger("dcmirror.mirror.failover")

LEDGER_TOPIC = "dcmirror.failovers"
DIVERGED_PREFIX = "dcmirror.diverged."
RETRIABLE = (KafkaError, KafkaConnectionError, KafkaTimeoutError, OSError)
POLL_S = 0.5
Say = Callable[[str], None]


class FailoverError(Exception):
    """A promotion, failover or failback that cannot go on; the message says why and what to do."""


@dataclass
class TopicSides:
    """One topic of the flow on both sides, and which one is the copy."""

    source_topic: str  # the name in the flow's source cluster
    target_topic: str  # the name in the flow's target cluster
    source_marker: str | None = None  # mirror.source of the source's topic
    target_marker: str | None = None
    partitions: int = 0

    def direction(self, flow: MirrorSpec) -> str:
        """forward (the target copies the source), reverse (failed back: the source copies
        the target), promoting (both are copies), primary-target (failed over) or none."""
        forward = self.target_marker == mirror_source_value(flow.source, self.source_topic)
        reverse = self.source_marker == mirror_source_value(flow.target, self.target_topic)
        if forward and reverse:
            return "promoting"
        if forward:
            return "forward"
        if reverse:
            return "reverse"
        return "primary-target" if self.target_marker is None and self.partitions else "none"


@dataclass
class PartitionReport:
    topic: str
    partition: int
    end_offset: int  # the copy's end: the next offset of the new primary's partition
    source_known_end: int = -1  # the old primary's high watermark as the workers last saw it
    aborted_transactions: int = 0
    diverged_records: int = 0

    @property
    def rpo_records(self) -> int | None:
        return None if self.source_known_end < 0 else max(0, self.source_known_end - self.end_offset)


@dataclass
class Outcome:
    action: str
    flow: str
    primary: str  # the cluster whose topics are writable afterwards
    topics: dict[str, list[PartitionReport]] = field(default_factory=dict)
    side_topics: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"action": self.action, "flow": self.flow, "primary": self.primary, "side_topics": self.side_topics,
                "topics": {t: [asdict(p) | {"rpo_records": p.rpo_records} for p in ps] for t, ps in self.topics.items()}}

    def lines(self) -> list[str]:
        out = [f"{self.action} of flow {self.flow}: {self.primary} is the primary"]
        for topic, parts in sorted(self.topics.items()):
            for p in parts:
                text = f"  {topic}-{p.partition}: copy ends at offset {p.end_offset}"
                if self.action == "failover":
                    text += (f"; source known up to {p.source_known_end}, RPO {p.rpo_records} record(s)"
                             if p.rpo_records is not None else "; source's end unknown (no worker reported it)")
                    if p.aborted_transactions:
                        text += f"; {p.aborted_transactions} open transaction(s) aborted"
                if self.action == "failback" and p.diverged_records:
                    text += f"; {p.diverged_records} record(s) the old source took after it -> " \
                            f"{self.side_topics.get(topic, '?')}"
                out.append(text)
        return out


# ---- reading both sides ----------------------------------------------------------------


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


async def flow_topics(topology: Topology, flow: MirrorSpec, source: Admin | None, target: Admin, *,
                      ledger: bool = False) -> list[TopicSides]:
    """The flow's topics as the reachable sides name them (`source` None: the source is gone,
    the target's mirror topics of it are the flow's, and with `ledger` those it failed over)."""
    datacenter = topology.cluster(flow.source).datacenter
    found: dict[str, TopicSides] = {}
    if source is not None:
        meta = await source.metadata(None)
        for t in meta.topics:
            if t.error_code == 0 and not t.name.startswith(INTERNAL_PREFIXES) and flow.matches(t.name):
                found[t.name] = TopicSides(t.name, flow.target_topic(t.name, datacenter))
    target_meta = await target.metadata(None)
    counts = {t.name: len(t.partitions) for t in target_meta.topics if t.error_code == 0}
    if source is None:
        # The target's mirror topics of the source, and the topics it failed over (the ledger).
        for name in counts:
            marker = await topic_marker(target, name)
            if marker is not None and marker.startswith(f"{flow.source}:"):
                source_topic = marker.split(":", 1)[1]
                found[source_topic] = TopicSides(source_topic, name, target_marker=marker)
        if ledger:
            for name, doc in (await ledger_entries(topology, flow)).items():
                if name in counts and doc["source_topic"] not in found:
                    found[doc["source_topic"]] = TopicSides(doc["source_topic"], name,
                                                            target_marker=await topic_marker(target, name))
    for sides in found.values():
        sides.partitions = counts.get(sides.target_topic, 0)
        if source is not None:
            sides.source_marker = await topic_marker(source, sides.source_topic)
            sides.target_marker = await topic_marker(target, sides.target_topic)
    return [found[k] for k in sorted(found)]


async def partition_ends(admin: Admin, topic: str, partitions: int, *, committed: bool = False) -> dict[int, int]:
    tps = [(topic, p) for p in range(partitions)]
    got = await admin.list_offsets(tps, LATEST, isolation_level=READ_COMMITTED if committed else 0)
    return {p: got[(topic, p)] for _, p in tps}


async def _wait(what: str, timeout_s: float, check: Callable[[], Any], say: Say) -> None:
    """Until `await check()` is truthy, at most `timeout_s`; its falsy value is the progress said."""
    deadline = trio.current_time() + timeout_s
    last: Any = None
    while True:
        try:
            value = await check()
        except RETRIABLE as exc:
            value = None
            last = str(exc)
        if value is True:
            return
        if value and value != last:
            say(f"  waiting: {what}: {value}")
            last = value
        if trio.current_time() >= deadline:
            raise FailoverError(f"not within {timeout_s:.0f} s: {what} (last seen: {last})")
        await trio.sleep(POLL_S)


async def _set_marker(admin: Admin, topic: str, marker: str | None) -> None:
    if marker is None:
        await admin.alter_topic_configs(topic, {}, [MIRROR_SOURCE_CONFIG])
    else:
        await admin.alter_topic_configs(topic, {MIRROR_SOURCE_CONFIG: marker}, [])


async def _marker_is(admin: Admin, topic: str, marker: str | None) -> bool:
    return await topic_marker(admin, topic) == marker


async def abort_open_transactions(admin: Admin, topic: str, partition: int) -> int:
    """Write an ABORT marker for every transaction open on the partition (as `kafka-transactions
    abort` does for a hanging one); how many. The topic must be writable."""
    resp = await admin.cluster.leader_request(topic, partition, ApiKey.DESCRIBE_PRODUCERS, {
        "topics": [{"name": topic, "partition_indexes": [partition]}]})
    p = resp.topics[0].partitions[0]
    if p.error_code:
        raise KafkaError(f"describing the producers of {topic}-{partition}", p.error_code)
    aborted = 0
    for producer in p.active_producers:
        if producer.current_txn_start_offset < 0:
            continue
        code = await write_txn_marker(admin.cluster, topic, partition, producer_id=producer.producer_id,
                                      producer_epoch=producer.producer_epoch, commit=False,
                                      coordinator_epoch=max(0, producer.coordinator_epoch))
        if code:
            raise KafkaError(f"aborting the open transaction of producer {producer.producer_id} in "
                             f"{topic}-{partition}", code)
        aborted += 1
    return aborted


# ---- promote ---------------------------------------------------------------------------


async def promote(topology: Topology, flow: MirrorSpec, source: Admin, target: Admin, *, timeout_s: float,
                  say: Say) -> Outcome:
    """Planned: the copy side of every topic of the flow becomes the primary, nothing lost.
    The primary's topics are made read-only first (marked as mirrors of their copies), then
    this waits until no transaction is open there and every copy holds all of it, then the
    copies become ordinary topics; the old primary's are copies of them from then on."""
    sides = await flow_topics(topology, flow, source, target)
    if not sides:
        raise FailoverError(f"flow {flow.name} has no mirror topics")
    by_name = {flow.source: source, flow.target: target}
    plan = []
    for s in sides:
        d = s.direction(flow)
        if d == "promoting":
            # An interrupted promotion: the side behind is the one being promoted.
            ahead = sum((await partition_ends(source, s.source_topic, s.partitions)).values())
            d = "forward" if sum((await partition_ends(target, s.target_topic, s.partitions)).values()) <= ahead \
                else "reverse"
        if d == "forward":
            plan.append((flow.source, s.source_topic, flow.target, s.target_topic, s.partitions))
        elif d == "reverse":
            plan.append((flow.target, s.target_topic, flow.source, s.source_topic, s.partitions))
        else:
            raise FailoverError(f"{s.source_topic} / {s.target_topic}: neither side is a mirror topic of the other "
                                f"({d}); after a failover, `dcmirror mirror failback` makes the old source a "
                                "mirror first")
    if len({p[2] for p in plan}) != 1:
        raise FailoverError("the flow's topics are not all mirrored in the same direction: " +
                            ", ".join(f"{s.source_topic}: {s.direction(flow)}" for s in sides))
    outcome = Outcome("promote", flow.name, plan[0][2])
    for old_cluster, old_topic, new_cluster, new_topic, _ in plan:
        say(f"{old_cluster}:{old_topic} takes no more writes (mirror of {new_cluster}:{new_topic})")
        await _set_marker(by_name[old_cluster], old_topic, mirror_source_value(new_cluster, new_topic))
    for old_cluster, old_topic, new_cluster, new_topic, partitions in plan:
        old_admin, new_admin = by_name[old_cluster], by_name[new_cluster]

        async def caught_up(old_admin: Admin = old_admin, new_admin: Admin = new_admin, old_topic: str = old_topic,
                            new_topic: str = new_topic, partitions: int = partitions) -> Any:
            ends = await partition_ends(old_admin, old_topic, partitions)
            stable = await partition_ends(old_admin, old_topic, partitions, committed=True)
            copied = await partition_ends(new_admin, new_topic, partitions)
            open_txns = [p for p in ends if stable[p] < ends[p]]
            behind = {p: ends[p] - copied[p] for p in ends if copied[p] < ends[p]}
            if not open_txns and not behind:
                outcome.topics[new_topic] = [PartitionReport(new_topic, p, copied[p]) for p in sorted(copied)]
                return True
            return (f"{old_topic}: open transactions in partitions {open_txns}" if open_txns
                    else f"{new_topic}: {sum(behind.values())} record(s) to copy ({behind})")

        await _wait(f"{new_cluster}:{new_topic} holds all of {old_cluster}:{old_topic}", timeout_s, caught_up, say)
    for _, _, new_cluster, new_topic, _ in plan:
        await _set_marker(by_name[new_cluster], new_topic, None)
        say(f"{new_cluster}:{new_topic} is writable: the primary")
    return outcome


# ---- failover --------------------------------------------------------------------------


async def failover(topology: Topology, flow: MirrorSpec, target: Admin, *, known_source_ends: Mapping[tuple[str, int], int],
                   timeout_s: float, say: Say) -> Outcome:
    """Unplanned: the source is gone. Each mirror topic of the flow in the target becomes an
    ordinary topic; a transaction the source had open is aborted there (no half of it is ever
    read committed); per partition the copy's end and the RPO (how far the source was known
    to be ahead, from the workers' last status: `known_source_ends`, by source topic) are
    printed and kept in the failover ledger for the failback."""
    sides = [s for s in await flow_topics(topology, flow, None, target)]
    if not sides:
        raise FailoverError(f"{flow.target} has no mirror topics of {flow.source} in flow {flow.name} "
                            "(failed over already?)")
    outcome = Outcome("failover", flow.name, flow.target)
    for s in sides:
        ends = await partition_ends(target, s.target_topic, s.partitions)
        await _set_marker(target, s.target_topic, None)
        reports = [PartitionReport(s.target_topic, p, ends[p], known_source_ends.get((s.source_topic, p), -1))
                   for p in range(s.partitions)]
        for r in reports:

            async def settled(r: PartitionReport = r) -> Any:
                # The leader aborts only once it applied the promotion (a mirror topic's leader
                # answers a marker as done without writing it): until the LSO is the end.
                if await _marker_is(target, r.topic, None) is not True:
                    return "the promotion is not applied yet"
                r.aborted_transactions += await abort_open_transactions(target, r.topic, r.partition)
                end = (await partition_ends(target, r.topic, r.partition + 1))[r.partition]
                stable = (await partition_ends(target, r.topic, r.partition + 1, committed=True))[r.partition]
                return True if stable >= end else f"last stable offset {stable} < log end {end}"

            await _wait(f"{s.target_topic}-{r.partition}: no open transaction", timeout_s, settled, say)
        outcome.topics[s.target_topic] = reports
        await write_ledger(topology, target, flow, s, reports)
        say(f"{flow.target}:{s.target_topic} is writable: the primary")
    return outcome


async def write_ledger(topology: Topology, target: Admin, flow: MirrorSpec, sides: TopicSides,
                       reports: list[PartitionReport]) -> None:
    try:
        await target.create_topic(LEDGER_TOPIC, 1, min(3, len(topology.cluster(flow.target).brokers)),
                                  {"cleanup.policy": "compact"})
    except AdminError as exc:
        if exc.code != ErrorCode.topic_already_exists:
            raise
    value = orjson.dumps({"flow": flow.name, "source": flow.source, "source_topic": sides.source_topic,
                          "target_topic": sides.target_topic,
                          "partitions": {str(r.partition): {"end_offset": r.end_offset,
                                                            "source_known_end": r.source_known_end}
                                         for r in reports}})
    config = topology.cluster(flow.target).client_config()
    async with Producer({**config, "acks": "all", "enable.idempotence": True}) as producer:
        await producer.send_and_wait(LEDGER_TOPIC, value, key=_ledger_key(flow, sides.target_topic), partition=0)


def _ledger_key(flow: MirrorSpec, target_topic: str) -> bytes:
    return f"{flow.name}/{target_topic}".encode()


async def read_ledger(topology: Topology, flow: MirrorSpec, target_topic: str) -> dict[int, int] | None:
    """The copy's end per partition at the flow's last failover of the topic (None: none recorded)."""
    found = (await ledger_entries(topology, flow)).get(target_topic)
    return None if found is None else {int(p): int(v["end_offset"]) for p, v in found["partitions"].items()}


async def ledger_entries(topology: Topology, flow: MirrorSpec) -> dict[str, dict[str, Any]]:
    """The flow's last failover of each topic, by target topic (the ledger's documents)."""
    config = topology.cluster(flow.target).client_config()
    async with Admin(config["bootstrap.servers"], config=_admin_part(config)) as admin:
        try:
            end = (await partition_ends(admin, LEDGER_TOPIC, 1))[0]
        except AdminError:
            return {}
    found: dict[str, dict[str, Any]] = {}
    if end <= 0:
        return found
    prefix = f"{flow.name}/".encode()
    async with Consumer({**config, "enable.auto.commit": False, "auto.offset.reset": "earliest"}) as consumer:
        consumer.assign([(LEDGER_TOPIC, 0)])
        consumer.seek((LEDGER_TOPIC, 0), 0)
        seen = 0
        with trio.fail_after(30):
            while seen < end:
                for records in (await consumer.getmany(timeout_s=0.5)).values():
                    for r in records:
                        seen = r.offset + 1
                        if r.key is not None and r.key.startswith(prefix) and r.value:
                            doc = orjson.loads(r.value)
                            found[doc["target_topic"]] = doc
    return found


# ---- failback --------------------------------------------------------------------------


async def failback(topology: Topology, flow: MirrorSpec, source: Admin, target: Admin, *, timeout_s: float,
                   say: Say) -> Outcome:
    """The old source is back: each of its topics the flow failed over becomes a mirror topic
    of the target's. The records it holds beyond the copy's end at the failover (taken there,
    never mirrored) are first copied into `dcmirror.diverged.<source>.<topic>` in the target
    and counted; then the topic is created again as a mirror topic, which the flow's workers
    fill from the target (the reverse direction). `promote` later restores the flow's
    direction."""
    sides = await flow_topics(topology, flow, source, target)
    todo = [s for s in sides if s.direction(flow) == "primary-target"]
    if not todo:
        raise FailoverError(f"flow {flow.name}: no topic is failed over to {flow.target} "
                            f"({', '.join(f'{s.source_topic}: {s.direction(flow)}' for s in sides) or 'no topics'})")
    outcome = Outcome("failback", flow.name, flow.target)
    for s in todo:
        source_parts = len((await source.metadata([s.source_topic])).topics[0].partitions)
        copied_end = await read_ledger(topology, flow, s.target_topic)
        if copied_end is None:
            raise FailoverError(f"no failover of {flow.target}:{s.target_topic} is recorded in {LEDGER_TOPIC}: "
                                "was it promoted by hand? make the source's topic a mirror topic by hand")
        # Transactions the old source had open are aborted while its topic still takes markers.
        for p in range(source_parts):
            await abort_open_transactions(source, s.source_topic, p)
        await _set_marker(source, s.source_topic, mirror_source_value(flow.target, s.target_topic))
        say(f"{flow.source}:{s.source_topic} takes no more writes")
        ends = await partition_ends(source, s.source_topic, source_parts)
        side_topic = f"{DIVERGED_PREFIX}{flow.source}.{s.source_topic}"
        reports = [PartitionReport(s.target_topic, p, copied_end.get(p, 0)) for p in range(source_parts)]
        ranges = {p: (copied_end.get(p, 0), ends[p]) for p in range(source_parts) if ends[p] > copied_end.get(p, 0)}
        if ranges:
            counts = await copy_diverged(topology, flow, s.source_topic, side_topic, source_parts, ranges)
            for r in reports:
                r.diverged_records = counts.get(r.partition, 0)
            outcome.side_topics[s.target_topic] = side_topic
            say(f"{sum(counts.values())} record(s) {flow.source}:{s.source_topic} took after the failover -> "
                f"{flow.target}:{side_topic}")
        configs = {e.name: e.value for e in await target.topic_configs(s.target_topic)
                   if getattr(e, "config_source", None) == 1 and e.value is not None and e.name not in CONFIG_EXCLUDES}
        await source.delete_topic(s.source_topic)

        async def gone(name: str = s.source_topic) -> Any:
            meta = await source.metadata([name])
            return True if meta.topics[0].error_code != 0 else "still listed"

        await _wait(f"{flow.source}:{s.source_topic} deleted", timeout_s, gone, say)
        rf = min(topology.defaults.replication_factor, len(topology.cluster(flow.source).brokers))

        async def created(s: TopicSides = s, configs: dict[str, str] = configs, rf: int = rf) -> Any:
            try:
                await source.create_topic(s.source_topic, s.partitions, rf, {
                    **configs, MIRROR_SOURCE_CONFIG: mirror_source_value(flow.target, s.target_topic)})
            except AdminError as exc:
                if exc.code != ErrorCode.topic_already_exists:
                    raise
            return True

        await _wait(f"{flow.source}:{s.source_topic} created as a mirror topic", timeout_s, created, say)
        say(f"{flow.source}:{s.source_topic} is a mirror topic of {flow.target}:{s.target_topic}; the flow's "
            "workers copy it back")
        outcome.topics[s.target_topic] = reports
    return outcome


async def copy_diverged(topology: Topology, flow: MirrorSpec, topic: str, side_topic: str, partitions: int,
                        ranges: Mapping[int, tuple[int, int]]) -> dict[int, int]:
    """The old source's committed records in [start, end) per partition, into the side topic
    of the target (same partition, key, value, headers, timestamp; the origin in headers)."""
    source_config = topology.cluster(flow.source).client_config()
    target_config = topology.cluster(flow.target).client_config()
    async with Admin(target_config["bootstrap.servers"], config=_admin_part(target_config)) as admin:
        try:
            await admin.create_topic(side_topic, partitions,
                                     min(topology.defaults.replication_factor,
                                         len(topology.cluster(flow.target).brokers)))
        except AdminError as exc:
            if exc.code != ErrorCode.topic_already_exists:
                raise
    counts = {p: 0 for p in ranges}
    async with Consumer({**source_config, "enable.auto.commit": False, "auto.offset.reset": "none",
                         "isolation.level": "read_committed"}) as consumer, \
            Producer({**target_config, "acks": "all", "enable.idempotence": True}) as producer:
        consumer.assign([(topic, p) for p in ranges])
        for p, (start, _) in ranges.items():
            consumer.seek((topic, p), start)
        left = dict(ranges)
        with trio.fail_after(120):
            while left:
                for (_, p), records in (await consumer.getmany(timeout_s=0.5)).items():
                    if p not in left:
                        continue
                    end = left[p][1]
                    for r in records:
                        if r.offset >= end:
                            break
                        headers = list(r.headers or []) + [
                            ("dcmirror.diverged.cluster", flow.source.encode()),
                            ("dcmirror.diverged.topic", topic.encode()),
                            ("dcmirror.diverged.offset", str(r.offset).encode())]
                        producer.produce(side_topic, r.value, key=r.key, partition=p, headers=headers,
                                         timestamp_ms=r.timestamp)
                        counts[p] += 1
                    position = consumer.position((topic, p))
                    if records and (records[-1].offset + 1 >= end or (position is not None and position >= end)):
                        del left[p]
                for p in list(left):
                    position = consumer.position((topic, p))
                    if position is not None and position >= left[p][1]:
                        del left[p]
        await producer.flush()
    return counts


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
            admins: dict[str, Admin | None] = {}
            for name in (flow.source, flow.target):
                client = topology.cluster(name).client_config()
                try:
                    with trio.fail_after(timeout_s):
                        admins[name] = await stack.enter_async_context(
                            Admin(client["bootstrap.servers"], client_id="dcmirror-plan", config=_admin_part(client)))
                except (*RETRIABLE, trio.TooSlowError):
                    admins[name] = None
            target = admins[flow.target]
            if target is None:
                rows.append({"flow": flow.name, "topic": None, "direction": "unknown",
                             "why": f"{flow.target} is unreachable"})
                continue
            with trio.fail_after(timeout_s * 4):
                for s in await flow_topics(topology, flow, admins[flow.source], target, ledger=True):
                    d = s.direction(flow)
                    rows.append({"flow": flow.name, "source_topic": f"{flow.source}:{s.source_topic}",
                                 "target_topic": f"{flow.target}:{s.target_topic}", "direction": d,
                                 "primary": {"source": flow.source, "target": flow.target}.get(PRIMARY_OF[d],
                                                                                              PRIMARY_OF[d]),
                                 "source_reachable": admins[flow.source] is not None})
    return rows


def direction_lines(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    out = ["", "mirror topics (which side is the copy, as the clusters say):"]
    for r in rows:
        if r.get("topic", "") is None:
            out.append(f"  {r['flow']}: {r['direction']} ({r['why']})")
            continue
        arrow = {"forward": "->", "reverse": "<-", "promoting": "<->", "primary-target": "x->"}.get(r["direction"], "?")
        out.append(f"  {r['flow']}: {r['source_topic']} {arrow} {r['target_topic']}  {r['direction']}, "
                   f"primary {r['primary']}" + ("" if r["source_reachable"] else " (source unreachable)"))
    return out
