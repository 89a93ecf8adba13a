"""What the console knows, asked once per refresh interval however many browsers are open
(trio): each cluster over the Kafka protocol (DescribeCluster, Metadata, ListOffsets, one
DescribeConfigs for every topic's min.insync.replicas, DescribeLogDirs, ListGroups,
DescribeGroups, OffsetFetch), each flow's workers over their admin HTTP, the warehouse's
ledger through its service. Pages read the last snapshot; nothing a browser does makes a
request to a broker except the record browser and actions, which act as the logged-in user.

One cluster that does not answer within the interval is shown as unreachable with the
reason; the others are not held up.
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from cluster.client.admin import Admin
from cluster.client.connection import KafkaConnectionError
from cluster.client.errors import KafkaError
from cluster.protocol.api_keys import ApiKey
from cluster.protocol.sentinels import RESOURCE_TOPIC
from deploy.console.views import LagHistory, RateTracker
from topology.model import ClusterSpec, Topology

log = logging.getLogger("dcmirror.console")

EARLIEST, LATEST = -2, -1
LOG_DIRS_EVERY_POLLS = 5
"""Sizes on disk change slowly: DescribeLogDirs every this many polls."""
LEDGER_EVERY_POLLS = 5
LEDGER_LOADS_SHOWN = 50
GROUPS_MAX = 1000
"""Groups described per cluster and poll (more are listed, not described)."""


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text[:300]


@dataclass
class ClusterPoller:
    """One cluster, asked with the topology's client settings for that cluster."""

    name: str
    spec: ClusterSpec
    admin: Admin | None = None
    polls: int = 0
    sizes: dict[tuple[str, int], int] = field(default_factory=dict)

    async def _admin(self) -> Admin:
        if self.admin is None:
            config: dict[str, Any] = dict(self.spec.client)
            config.setdefault("default.api.timeout.ms", 5000)
            admin = Admin(self.spec.bootstrap(), client_id="dcmirror-console", config=config)
            await admin.__aenter__()
            self.admin = admin
        return self.admin

    async def close(self) -> None:
        admin, self.admin = self.admin, None
        if admin is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                await admin.__aexit__(None, None, None)

    async def poll(self, timeout_s: float) -> dict[str, Any]:
        started = time.monotonic()
        try:
            with trio.fail_after(timeout_s):
                found = await self._poll()
        except (KafkaError, KafkaConnectionError, OSError, trio.TooSlowError, ValueError) as exc:
            await self.close()
            what = f"no answer within {timeout_s:g} s" if isinstance(exc, trio.TooSlowError) else _reason(exc)
            return {"error": what, "asked_ms": round((time.monotonic() - started) * 1000, 1)}
        found["asked_ms"] = round((time.monotonic() - started) * 1000, 1)
        return found

    async def _poll(self) -> dict[str, Any]:
        admin = await self._admin()
        self.polls += 1
        described = await admin.describe_cluster()
        meta = await admin.metadata(None)
        parts: list[dict[str, Any]] = []
        topics: dict[str, dict[str, Any]] = {}
        for t in sorted(meta.topics, key=lambda t: t.name):
            topics[t.name] = {"internal": bool(t.is_internal), "error_code": t.error_code,
                              "topic_id": str(t.topic_id) if getattr(t, "topic_id", None) else None,
                              "partitions": []}
            for p in sorted(t.partitions, key=lambda p: p.partition_index):
                row = {"topic": t.name, "partition": p.partition_index, "leader": p.leader_id,
                       "leader_epoch": p.leader_epoch, "replicas": list(p.replica_nodes), "isr": list(p.isr_nodes),
                       "offline": list(p.offline_replicas)}
                topics[t.name]["partitions"].append(row)
                parts.append(row)
        led = [(p["topic"], p["partition"]) for p in parts if p["leader"] >= 0]
        starts, ends = {}, {}
        if led:
            try:
                ends = await admin.list_offsets(led, LATEST)
                starts = await admin.list_offsets(led, EARLIEST)
            except KafkaError as exc:  # a partition changing leader: offsets next time
                log.debug("console: offsets of %s not listed: %s", self.name, exc)
        min_isr = await self._min_isr(admin, [n for n in topics if not topics[n]["internal"]])
        if self.polls % LOG_DIRS_EVERY_POLLS == 1:
            try:
                dirs = await admin.describe_log_dirs()
                sizes: dict[tuple[str, int], int] = {}
                for d in dirs.values():
                    for tp, (size, _) in d["partitions"].items():
                        sizes[tp] = max(sizes.get(tp, 0), size)
                self.sizes = sizes
            except KafkaError as exc:
                log.debug("console: log dirs of %s not described: %s", self.name, exc)
        for p in parts:
            tp = (p["topic"], p["partition"])
            p["start_offset"], p["end_offset"] = starts.get(tp), ends.get(tp)
            p["size_bytes"] = self.sizes.get(tp)
            p["min_isr"] = min_isr.get(p["topic"], 1)
        groups = await self._groups(admin, ends)
        return {"cluster_id": described.cluster_id, "controller_id": described.controller_id,
                "brokers": [{"node_id": b.broker_id, "host": b.host, "port": b.port, "rack": b.rack}
                            for b in sorted(described.brokers, key=lambda b: b.broker_id)],
                "topics": topics, "groups": groups}

    async def _min_isr(self, admin: Admin, names: list[str]) -> dict[str, int]:
        if not names:
            return {}
        resp = await admin.raw(ApiKey.DESCRIBE_CONFIGS, {
            "resources": [{"resource_type": RESOURCE_TOPIC, "resource_name": n,
                           "configuration_keys": ["min.insync.replicas"]} for n in names],
            "include_synonyms": False, "include_documentation": False})
        out = {}
        for r in resp.results:
            for c in r.configs if r.error_code == 0 else ():
                if c.name == "min.insync.replicas" and c.value and c.value.isdigit():
                    out[r.resource_name] = int(c.value)
        return out

    async def _groups(self, admin: Admin, ends: Mapping[tuple[str, int], int]) -> list[dict[str, Any]]:
        listed = (await admin.raw(ApiKey.LIST_GROUPS, {})).groups  # one broker's; below: every broker
        ids: dict[str, str] = {}
        meta_brokers = list(admin.cluster.metadata.brokers.items())
        for node_id, _ in meta_brokers:
            try:
                resp = await (await admin.cluster.connection(node_id)).request(ApiKey.LIST_GROUPS, {})
            except (KafkaError, KafkaConnectionError, OSError):
                continue
            for g in resp.groups:
                ids[g.group_id] = g.protocol_type
        for g in listed:
            ids.setdefault(g.group_id, g.protocol_type)
        out: list[dict[str, Any]] = []
        for group_id in sorted(ids)[:GROUPS_MAX]:
            try:
                (g,) = await admin.describe_groups([group_id])
                committed = await admin.committed_offsets(group_id)
            except (KafkaError, KafkaConnectionError, ValueError) as exc:
                out.append({"group_id": group_id, "protocol_type": ids[group_id], "error": _reason(exc)})
                continue
            rows = [{"topic": t, "partition": p, "committed": off,
                     "end_offset": ends.get((t, p)),
                     "lag": None if ends.get((t, p)) is None else max(0, ends[(t, p)] - off)}
                    for (t, p), off in sorted(committed.items())]
            out.append({"group_id": group_id, "protocol_type": ids[group_id] or g.protocol_type,
                        "state": g.group_state, "protocol": g.protocol_data,
                        "members": [{"member_id": m.member_id, "client_id": m.client_id, "host": m.client_host,
                                     "assignment": _assignment(bytes(m.member_assignment))}
                                    for m in g.members],
                        "offsets": rows, "lag": sum(r["lag"] or 0 for r in rows)})
        return out


def _assignment(raw: bytes) -> list[tuple[str, int]]:
    from cluster.client.group import decode_assignment

    try:
        return sorted(decode_assignment(raw))
    except ValueError:
        return []


@dataclass
class Snapshot:
    """The last answer of everything, and when it came."""

    at_s: float = 0.0
    polls: int = 0
    clusters: dict[str, dict[str, Any]] = field(default_factory=dict)
    flows: dict[str, dict[str, Any]] = field(default_factory=dict)
    warehouse: dict[str, Any] = field(default_factory=dict)
    poll_ms: float = 0.0


class Poller:
    """Asks everything every `refresh_s`; `snapshot` is what pages read."""

    def __init__(self, topology: Topology, refresh_s: float) -> None:
        self.topology = topology
        self.refresh_s = refresh_s
        self.clusters = {name: ClusterPoller(name, spec) for name, spec in topology.clusters.items()}
        self.snapshot = Snapshot()
        self.rates = RateTracker()
        self.lag_history = LagHistory()
        self.changed = trio.Event()
        self._polls = 0

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Poll forever; task_status.started() after the first round (pages have data)."""
        try:
            await self.poll_once()
            task_status.started()
            while True:
                await trio.sleep(self.refresh_s)
                await self.poll_once()
        finally:
            for c in self.clusters.values():
                await c.close()

    async def poll_once(self) -> Snapshot:
        started = time.monotonic()
        timeout_s = max(2.0, self.refresh_s * 2)
        clusters: dict[str, dict[str, Any]] = {}
        flows: dict[str, dict[str, Any]] = {}

        async def cluster(name: str) -> None:
            clusters[name] = await self.clusters[name].poll(timeout_s)

        async def all_flows() -> None:
            from deploy.mirror_cmd import state_dir
            from deploy.status_http import flow_reports

            if self.topology.mirrors:
                for report in await flow_reports(self.topology, list(self.topology.mirrors), timeout_s, state_dir):
                    flows[report["flow"]] = report

        async with trio.open_nursery() as nursery:
            for name in self.clusters:
                nursery.start_soon(cluster, name)
            nursery.start_soon(all_flows)
        now = time.time()
        for name, report in flows.items():
            self.rates.observe(name, now, report.get("records", 0))
            report["records_per_s"] = self.rates.rate(name)
            self.lag_history.observe(name, now, [p for w in report.get("workers", []) if w.get("reachable")
                                                 for p in w.get("partitions", [])])
        for c in clusters.values():
            counts: dict[str, int] = {}
            for t in c.get("topics", {}).values():
                for p in t["partitions"]:
                    from deploy.console.views import partition_state

                    state = partition_state(p, p.get("min_isr", 1))
                    counts[state] = counts.get(state, 0) + 1
            c["partition_counts"] = counts
        self._polls += 1
        warehouse = self.snapshot.warehouse
        if self.topology.warehouse is not None and (self._polls % LEDGER_EVERY_POLLS == 1 or not warehouse):
            warehouse = await trio.to_thread.run_sync(self._warehouse)
        self.snapshot = Snapshot(at_s=now, polls=self._polls, clusters=clusters, flows=flows,
                                 warehouse=warehouse, poll_ms=round((time.monotonic() - started) * 1000, 1))
        self.changed.set()
        self.changed = trio.Event()
        return self.snapshot

    def _warehouse(self) -> dict[str, Any]:
        """The ledger's latest loads through the warehouse service (None: no service)."""
        answer = warehouse_sql(self.topology, LEDGER_SQL, LEDGER_LOADS_SHOWN)
        if answer is None:
            return {"service": False}
        if answer.get("error"):
            return {"service": True, "error": answer["error"]}
        return {"service": True, "loads": [dict(zip(answer["columns"], row, strict=False)) for row in answer["rows"]]}


LEDGER_SQL = (
    "SELECT load_id, min(planned_at) AS planned_at, max(finished_at) AS finished_at, "
    "count(DISTINCT topic) AS topics, count(*) AS partitions, sum(end_offset - start_offset) AS offsets, "
    "sum(rows) AS rows, "
    "CAST(unix_timestamp(max(finished_at)) - unix_timestamp(min(planned_at)) AS DOUBLE) AS seconds "
    "FROM dcmirror.loads WHERE status = 'committed' GROUP BY load_id ORDER BY min(planned_at) DESC")


def warehouse_sql(topology: Topology, query: str, max_rows: int) -> dict[str, Any] | None:
    """A query through the warehouse service (blocking: call from a thread); None when no
    service runs on this host."""
    from spark_aggregate.service_client import ask_service
    from spark_aggregate.settings import WarehouseSettings

    settings = WarehouseSettings.from_topology(topology)
    return ask_service(settings, "/v1/sql", {"query": query, "max_rows": max_rows}, io.StringIO())
