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
from cluster.protocol.sentinels import CONSUMER_REPLICA_ID, RESOURCE_TOPIC
from deploy.console.views import LagHistory, RateTracker, partition_state
from topology.model import ClusterSpec, Topology

log = logging.getLogger("dcmirror.console")

EARLIEST, LATEST = -2, -1
LOG_DIRS_EVERY_POLLS = 5
"""Sizes on disk change slowly: DescribeLogDirs every this many polls."""
LEDGER_EVERY_POLLS = 5
LEDGER_LOADS_SHOWN = 50
GROUPS_MAX = 1000
"""Groups described per cluster and poll (more are listed, not described)."""
OFFSET_FETCHES_IN_FLIGHT = 8
"""OffsetFetch requests out at once per cluster (v7: one group a request)."""
MIN_ISR_EVERY_POLLS = 5
"""Topic configs change rarely: min.insync.replicas of every topic every this many polls
(new topics at once)."""


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
    min_isr: dict[str, int] = field(default_factory=dict)

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
            # Kafka's internal topics, and the bookkeeping of registries and of dcmirror itself
            # (_schemas, dcmirror.*): shown with "internal topics", as Kafka UIs do.
            topics[t.name] = {"internal": bool(t.is_internal) or t.name.startswith(("_", "dcmirror.")),
                              "error_code": t.error_code,
                              "topic_id": str(t.topic_id) if getattr(t, "topic_id", None) else None,
                              "partitions": []}
            for p in sorted(t.partitions, key=lambda p: p.partition_index):
                row = {"topic": t.name, "partition": p.partition_index, "leader": p.leader_id,
                       "leader_epoch": p.leader_epoch, "replicas": list(p.replica_nodes), "isr": list(p.isr_nodes),
                       "offline": list(p.offline_replicas)}
                topics[t.name]["partitions"].append(row)
                parts.append(row)
        addresses = {b.node_id: (b.host, b.port) for b in meta.brokers}
        ends = await self._offsets(admin, addresses, parts, LATEST)
        starts = await self._offsets(admin, addresses, parts, EARLIEST)
        names = [n for n in topics if not topics[n]["internal"]]
        if self.polls % MIN_ISR_EVERY_POLLS == 1:
            self.min_isr = await self._min_isr(admin, names)
        elif new := [n for n in names if n not in self.min_isr]:
            self.min_isr.update(await self._min_isr(admin, new))
        min_isr = self.min_isr
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
        groups = await self._groups(admin, [(b.host, b.port) for b in described.brokers], ends)
        return {"cluster_id": described.cluster_id, "controller_id": described.controller_id,
                "brokers": [{"node_id": b.broker_id, "host": b.host, "port": b.port, "rack": b.rack}
                            for b in sorted(described.brokers, key=lambda b: b.broker_id)],
                "topics": topics, "groups": groups}

    async def _offsets(self, admin: Admin, addresses: Mapping[int, tuple[str, int]], parts: list[dict[str, Any]],
                       timestamp: int) -> dict[tuple[str, int], int]:
        """One ListOffsets per leader the Metadata answer just named, all at once. A
        partition that errs (a leader moving) has no offset this poll; the others keep
        theirs (Admin.list_offsets asks Metadata again for every topic, and one error there
        loses the whole cluster's offsets)."""
        by_leader: dict[int, dict[str, list[dict[str, Any]]]] = {}
        for p in parts:
            if p["leader"] in addresses:
                by_leader.setdefault(p["leader"], {}).setdefault(p["topic"], []).append(
                    {"partition_index": p["partition"], "timestamp": timestamp, "current_leader_epoch": -1})
        out: dict[tuple[str, int], int] = {}

        async def ask(leader: int, topics: dict[str, list[dict[str, Any]]]) -> None:
            try:
                conn = await admin.connection_to(*addresses[leader])
                resp = await conn.request(ApiKey.LIST_OFFSETS, {
                    "replica_id": CONSUMER_REPLICA_ID, "isolation_level": 0,
                    "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]})
            except (KafkaError, KafkaConnectionError, OSError) as exc:
                log.debug("console: offsets of %s from broker %d not listed: %s", self.name, leader, exc)
                return
            for t in resp.topics:
                for rp in t.partitions:
                    if rp.error_code == 0:
                        out[(t.name, rp.partition_index)] = rp.offset

        async with trio.open_nursery() as nursery:
            for leader, topics in by_leader.items():
                nursery.start_soon(ask, leader, topics)
        return out

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

    async def _groups(self, admin: Admin, brokers: list[tuple[str, int]],
                      ends: Mapping[tuple[str, int], int]) -> list[dict[str, Any]]:
        """Every broker's groups (DescribeCluster's brokers: the client's own metadata knows
        only the brokers it met), described by the broker that lists them (a group's
        coordinator lists it): one DescribeGroups per broker, one OffsetFetch per group
        (v7 takes one), no FindCoordinator."""
        listed: dict[tuple[str, int], list[tuple[str, str]]] = {}

        async def list_on(address: tuple[str, int]) -> None:
            try:
                resp = await (await admin.connection_to(*address)).request(ApiKey.LIST_GROUPS, {})
            except (KafkaError, KafkaConnectionError, OSError):
                return
            listed[address] = [(g.group_id, g.protocol_type) for g in resp.groups]

        async with trio.open_nursery() as nursery:
            for address in brokers:
                nursery.start_soon(list_on, address)
        wanted = set(sorted(g for gs in listed.values() for g, _ in gs)[:GROUPS_MAX])
        described: dict[str, Any] = {}
        committed: dict[str, dict[tuple[str, int], int] | str] = {}
        fetches = trio.Semaphore(OFFSET_FETCHES_IN_FLIGHT)

        async def describe_on(address: tuple[str, int], ids: list[str]) -> None:
            try:
                resp = await (await admin.connection_to(*address)).request(
                    ApiKey.DESCRIBE_GROUPS, {"groups": ids, "include_authorized_operations": False})
            except (KafkaError, KafkaConnectionError, OSError) as exc:
                for group_id in ids:
                    committed[group_id] = _reason(exc)
                return
            for g in resp.groups:
                described[g.group_id] = g

        async def offsets_on(address: tuple[str, int], group_id: str) -> None:
            async with fetches:
                try:
                    resp = await (await admin.connection_to(*address)).request(
                        ApiKey.OFFSET_FETCH, {"group_id": group_id, "topics": None})
                except (KafkaError, KafkaConnectionError, OSError) as exc:
                    committed[group_id] = _reason(exc)
                    return
            if resp.error_code != 0:
                committed[group_id] = f"offsets not fetched: error {resp.error_code}"
                return
            committed[group_id] = {(t.name, p.partition_index): p.committed_offset
                                   for t in resp.topics for p in t.partitions if p.committed_offset >= 0}

        kinds: dict[str, str] = {}
        async with trio.open_nursery() as nursery:
            for address, gs in listed.items():
                ids = [g for g, _ in gs if g in wanted]
                kinds.update((g, kind) for g, kind in gs if g in wanted)
                if ids:
                    nursery.start_soon(describe_on, address, ids)
                for group_id in ids:
                    nursery.start_soon(offsets_on, address, group_id)
        out: list[dict[str, Any]] = []
        for group_id in sorted(wanted):
            g, offsets = described.get(group_id), committed.get(group_id)
            if g is None or g.error_code != 0 or not isinstance(offsets, dict):
                error = offsets if isinstance(offsets, str) else f"not described (error {getattr(g, 'error_code', '?')})"
                out.append({"group_id": group_id, "protocol_type": kinds[group_id], "error": error})
                continue
            rows = [{"topic": t, "partition": p, "committed": off,
                     "end_offset": ends.get((t, p)),
                     "lag": None if ends.get((t, p)) is None else max(0, ends[(t, p)] - off)}
                    for (t, p), off in sorted(offsets.items())]
            out.append({"group_id": group_id, "protocol_type": kinds[group_id] or g.protocol_type,
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
        self.warehouse: dict[str, Any] = {}

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Poll forever; task_status.started() after the first round (pages have data). The
        warehouse is asked in a task of its own, so a slow service never holds up the
        clusters' and flows' polls."""
        try:
            started = trio.current_time()
            await self.poll_once(with_warehouse=True)
            task_status.started()
            async with trio.open_nursery() as nursery:
                if self.topology.warehouse is not None:
                    nursery.start_soon(self._warehouse_loop)
                while True:
                    # A poll every refresh_s from the start of the last (not after it ended), and
                    # never back to back: a poll slower than the interval is followed by a pause.
                    await trio.sleep_until(max(started + self.refresh_s, trio.current_time() + self.refresh_s / 4))
                    started = trio.current_time()
                    await self.poll_once(with_warehouse=False)
        finally:
            for c in self.clusters.values():
                await c.close()

    async def _warehouse_loop(self) -> None:
        while True:
            # Asking a service that is not there costs one stat: every poll until one runs.
            await trio.sleep(self.refresh_s * (LEDGER_EVERY_POLLS if self.warehouse.get("service") else 1))
            self.warehouse = await trio.to_thread.run_sync(self._warehouse)

    async def poll_once(self, *, with_warehouse: bool = True) -> Snapshot:
        """One round over every cluster and flow (and the warehouse, when asked)."""
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
                    state = partition_state(p, p.get("min_isr", 1))
                    counts[state] = counts.get(state, 0) + 1
            c["partition_counts"] = counts
        self._polls += 1
        poll_ms = round((time.monotonic() - started) * 1000, 1)
        if with_warehouse and self.topology.warehouse is not None:
            self.warehouse = await trio.to_thread.run_sync(self._warehouse)
        self.snapshot = Snapshot(at_s=now, polls=self._polls, clusters=clusters, flows=flows,
                                 warehouse=self.warehouse, poll_ms=poll_ms)
        self.changed.set()
        self.changed = trio.Event()
        return self.snapshot

    def _warehouse(self) -> dict[str, Any]:
        """The ledger's latest loads and the rows per table and Kafka partition, through the
        warehouse service ({"service": False}: none runs on this host). Three bounded queries:
        the loads, the topics loads wrote, and one count over their tables."""
        answer = warehouse_sql(self.topology, LEDGER_SQL, LEDGER_LOADS_SHOWN, timeout_s=LEDGER_TIMEOUT_S)
        if answer is None:
            return {"service": False}
        if answer.get("error"):
            return {"service": True, "error": answer["error"]}
        loads = _docs(answer)
        for load in loads:
            load["ranges_cut"] = (load.get("partitions") or 0) > RANGES_SHOWN
        found: dict[str, Any] = {"service": True, "loads": loads}
        topics = warehouse_sql(self.topology, LEDGER_TOPICS_SQL, TABLES_SHOWN + 1, timeout_s=LEDGER_TIMEOUT_S)
        if topics is None or topics.get("error"):
            found["partitions_error"] = (topics or {}).get("error", "the warehouse service went away")
            return found
        names = [str(row[0]) for row in topics["rows"]]
        found["tables_cut"] = len(names) > TABLES_SHOWN
        if names:
            counts = warehouse_sql(self.topology, partition_rows_sql(names[:TABLES_SHOWN]), PARTITION_ROWS_SHOWN,
                                   timeout_s=LEDGER_TIMEOUT_S)
            if counts is None or counts.get("error"):
                found["partitions_error"] = (counts or {}).get("error", "the warehouse service went away")
            else:
                found["partitions"] = _docs(counts)
                found["partitions_cut"] = bool(counts.get("truncated"))
        return found


def _docs(answer: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(zip(answer["columns"], row, strict=False)) for row in answer["rows"]]


LEDGER_TIMEOUT_S = 30.0
"""The poller's wait for one ledger query (the service answers one request at a time)."""
QUERY_TIMEOUT_S = 60.0
"""The query box's wait for an answer (the service runs a query to its end regardless)."""
TABLES_SHOWN = 50
PARTITION_ROWS_SHOWN = 1000
RANGES_SHOWN = 12

# The ledger (spark_aggregate/ledger.py): one row per load, topic partition and step; a load
# is done once its "committed" rows are written, with the rows loaded per partition and
# finished_at. Its seconds run from its plan to its commit (a resumed load's from its plan);
# times in UTC (the warehouse session's time zone, spark_aggregate/session.py).
LEDGER_SQL = (  # aliases named apart from the ledger's columns: Spark finds "planned_at" ambiguous otherwise
    "SELECT load_id, concat(date_format(planned, 'yyyy-MM-dd HH:mm:ss'), 'Z') AS planned_at, "
    "concat(date_format(finished, 'yyyy-MM-dd HH:mm:ss'), 'Z') AS finished_at, topics, partitions, ranges, offsets, "
    "`rows`, round((unix_micros(finished) - unix_micros(planned)) / 1000000.0, 1) AS seconds "
    "FROM (SELECT load_id, min(planned_at) AS planned, max(finished_at) AS finished, "
    "count(DISTINCT topic) AS topics, count(*) AS partitions, "
    "concat_ws(', ', slice(sort_array(collect_list(concat(topic, '-', CAST(`partition` AS STRING), ' [', "
    f"CAST(start_offset AS STRING), ', ', CAST(end_offset AS STRING), ')'))), 1, {RANGES_SHOWN})) AS ranges, "
    "sum(end_offset - start_offset) AS offsets, sum(`rows`) AS `rows` "
    "FROM dcmirror.loads WHERE status = 'committed' GROUP BY load_id) ORDER BY planned DESC, load_id")
LEDGER_TOPICS_SQL = "SELECT DISTINCT topic FROM dcmirror.loads WHERE status = 'committed' ORDER BY topic"


def partition_rows_sql(topics: list[str]) -> str:
    """Rows, first and last offset per table and Kafka partition of the tables of `topics`:
    one query (a UNION ALL of one GROUP BY per table), reading two columns of each."""
    from spark_aggregate.settings import DATABASE, table_name

    return " UNION ALL ".join(
        f"SELECT '{table_name(t)}' AS `table`, kafka_partition AS `partition`, count(*) AS `rows`, "
        f"min(kafka_offset) AS first_offset, max(kafka_offset) AS last_offset "
        f"FROM {DATABASE}.`{table_name(t)}` GROUP BY kafka_partition" for t in topics
    ) + " ORDER BY `table`, `partition`"


def warehouse_sql(topology: Topology, query: str, max_rows: int,
                  timeout_s: float = QUERY_TIMEOUT_S) -> dict[str, Any] | None:
    """A query through the warehouse service (blocking: call from a thread): its answer
    ({"columns", "rows", "truncated", "seconds"} or {"error"}), an error when it gives none
    within `timeout_s`, None when no service runs on this host."""
    import httpx
    import orjson

    from spark_aggregate.service_client import reachable, socket_path
    from spark_aggregate.settings import WarehouseSettings

    sock = socket_path(WarehouseSettings.from_topology(topology))
    if not sock.exists():
        return None
    try:
        with reachable(sock) as name, httpx.Client(transport=httpx.HTTPTransport(uds=name),
                                                   timeout=httpx.Timeout(timeout_s, connect=5.0)) as client:
            answer = client.post("http://warehouse/v1/sql",
                                 content=orjson.dumps({"query": query, "max_rows": max_rows}),
                                 headers={"content-type": "application/json"})
    except (httpx.ConnectError, FileNotFoundError):
        return None  # a socket file left by a service that is gone
    except httpx.TimeoutException:
        return {"error": f"the warehouse service gave no answer within {timeout_s:g} s (it may still be running "
                         "this query, or another request before it)"}
    except httpx.HTTPError as exc:
        return {"error": f"the warehouse service did not answer: {_reason(exc)}"}
    try:
        found = orjson.loads(answer.content)
    except orjson.JSONDecodeError:
        found = None
    if not isinstance(found, dict):
        return {"error": f"the warehouse service answered HTTP {answer.status_code} without a JSON object"}
    return found
