"""`dcmirror demo`: the embedded default topology end to end, in a temporary directory.

1. a copy of topology/default.toml with free ports (datacenters east and west, 3 brokers
   each, a 3-broker aggregate in central; data and warehouse in the temporary directory),
   secured as the file says (mutual TLS between brokers, SASL_SSL for the mirror and the
   operator's commands, plaintext on loopback for local producers) with a CA, certificates
   and passwords `dcmirror dev-secrets` makes up on the fly, run by `dcmirror up` (brokers,
   topics, mirror workers);
2. a traffic generator (the project's own producer) writing pageview and click events —
   JSON with user, url and ts, keyed by user — into east and west;
3. waits until the mirror has copied every source partition (lag 0 everywhere);
4. `dcmirror load`: the aggregate's topics into the warehouse tables;
5. one Spark SQL query over the tables (records, distinct source records, users, top url
   per datacenter and topic); then a summary of the records per datacenter and topic in the
   sources, the aggregate (read back, each source offset exactly once) and the warehouse,
   and everything is stopped.

Exit 0 only if the counts match everywhere (no record lost or doubled on the way).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from deploy.dev_secrets import dev_secrets
from topology import ClusterSpec, Topology, default_topology_text, load

DEFAULT_RECORDS = 20_000
TOPICS = ("pageviews", "clicks")
CLICK_SHARE = 0.3  # of each datacenter's events
USERS = 5_000
PAGES = 200
UP_READY_TIMEOUT_S = 180.0
MIRROR_TIMEOUT_S = 180.0
LOAD_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 90.0
PROGRESS_INTERVAL_S = 2.0
ADDRESS = re.compile(r'"127\.0\.0\.1:(\d+)"')


class DemoFailed(Exception):
    """A step of the demo failed; the message says which and why."""


def say(text: str = "") -> None:
    print(text, flush=True)


def step(number: int, text: str) -> None:
    say(f"\n== {number}/5 {text}")


def free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def demo_topology_text(text: str) -> str:
    """The default topology with every loopback address moved to a free port (data dirs
    and the warehouse path are relative, so they land beside the file)."""
    ports = sorted({int(m) for m in ADDRESS.findall(text)})
    mapping = dict(zip(ports, free_ports(len(ports)), strict=True))
    return ADDRESS.sub(lambda m: f'"127.0.0.1:{mapping[int(m.group(1))]}"', text)


def local_client(spec: ClusterSpec) -> dict[str, str]:
    """Client settings of a producer on the cluster's own host: the plaintext loopback
    listener LOCAL where the topology has one, else the cluster's client settings."""
    if "LOCAL" in spec.listeners:
        return {"bootstrap.servers": spec.bootstrap("LOCAL")}
    return spec.client_config()


def table_name(topic: str) -> str:
    """The warehouse table of an aggregate topic (non-alphanumerics become '_')."""
    return "dcmirror." + re.sub(r"[^0-9A-Za-z]", "_", topic)


@dataclass(frozen=True)
class Stream:
    """One source topic of one datacenter and where it lands."""

    cluster: str
    datacenter: str
    topic: str
    target_cluster: str
    target_topic: str

    @property
    def label(self) -> str:
        return f"{self.datacenter}/{self.topic}"


def streams_of(topology: Topology) -> list[Stream]:
    out = []
    for flow in topology.mirrors:
        source = topology.cluster(flow.source)
        for t in topology.topics_of(source.name):
            if flow.matches(t.name):
                out.append(Stream(source.name, source.datacenter, t.name, flow.target,
                                  flow.target_topic(t.name, source.datacenter)))
    return out


# ---- `dcmirror up` as a child process ---------------------------------------------------------


class UpProcess:
    """`dcmirror up --config FILE`; its lines are echoed (indented) and watched for readiness."""

    def __init__(self, config: Path, log_path: Path) -> None:
        self.log_path = log_path
        self.ready = threading.Event()
        self.lines: list[str] = []
        self.echo = True
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "deploy.cli", "up", "--config", str(config), "--timeout", str(UP_READY_TIMEOUT_S)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True, cwd=config.parent)
        self._reader = threading.Thread(target=self._read, name="dcmirror-up-output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with open(self.log_path, "ab") as log:
            for raw in self.proc.stdout:
                log.write(raw)
                log.flush()
                line = raw.decode(errors="replace").rstrip()
                self.lines.append(line)
                if self.echo:
                    say(f"   up | {line}")
                if "dcmirror up: ready" in line:
                    self.ready.set()

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.ready.wait(0.2):
            if self.proc.poll() is not None:
                raise DemoFailed(f"dcmirror up exited ({self.proc.returncode}) before it was ready; "
                                 f"its output is in {self.log_path}")
            if time.monotonic() > deadline:
                raise DemoFailed(f"dcmirror up was not ready within {timeout_s:g} s; see {self.log_path}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            say(f"dcmirror up did not stop within {STOP_TIMEOUT_S:g} s: SIGKILL")
            self.proc.kill()
            code = self.proc.wait()
        self._reader.join(10)
        return code


# ---- traffic ---------------------------------------------------------------------------------


@dataclass
class Traffic:
    acked: dict[tuple[str, str], int] = field(default_factory=dict)
    failed: int = 0
    first_error: str | None = None
    elapsed_s: float = 0.0


def event(rng: random.Random, topic: str, ts_ms: int) -> tuple[bytes, bytes]:
    """(key, value) of one pageview or click: JSON with user, url and ts, keyed by user."""
    user = f"user-{rng.randrange(USERS)}"
    # A few pages get most of the views (Zipf-like), so the example query has a clear top 5.
    page = min(int(rng.paretovariate(1.2)) - 1, PAGES - 1)
    url = f"/page/{page}" if topic == "pageviews" else f"/page/{page}#buy"
    value = json.dumps({"user": user, "url": url, "ts": ts_ms}, separators=(",", ":")).encode()
    return user.encode(), value


async def produce_traffic(topology: Topology, records: int, seed: int,
                          progress: Callable[[int, float], None]) -> Traffic:
    """`records` events split evenly over the source datacenters, CLICK_SHARE of each are
    clicks; every datacenter written by its own idempotent producer (acks=all), at once."""
    from cluster.client.accumulator import BufferFull
    from cluster.client.producer import Producer

    sources = sorted({s.cluster for s in streams_of(topology)})
    traffic = Traffic()
    sent = [0]
    started = time.monotonic()

    async def write(cluster: str, count: int, rng: random.Random) -> None:
        spec = topology.cluster(cluster)

        def delivered(topic: str) -> Callable[[Any, Exception | None], None]:
            key = (cluster, topic)

            def report(_metadata: Any, error: Exception | None) -> None:
                if error is None:
                    traffic.acked[key] = traffic.acked.get(key, 0) + 1
                else:
                    traffic.failed += 1
                    traffic.first_error = traffic.first_error or f"{cluster}/{topic}: {error}"
            return report

        callbacks = {t: delivered(t) for t in TOPICS}
        async with Producer({**local_client(spec), "acks": "all", "enable.idempotence": True,
                             "linger.ms": 10, "compression.type": "lz4",
                             "client.id": f"dcmirror-demo-{cluster}"}) as producer:
            for i in range(count):
                topic = "clicks" if rng.random() < CLICK_SHARE else "pageviews"
                key, value = event(rng, topic, int(time.time() * 1000))
                while True:
                    try:
                        producer.produce(topic, value, key, on_delivery=callbacks[topic])
                        break
                    except BufferFull:
                        await trio.sleep(0.005)
                sent[0] += 1
                if i % 256 == 255:
                    await trio.lowlevel.checkpoint()  # let the sender ship batches
            await producer.flush(120)

    async def report() -> None:
        while True:
            await trio.sleep(PROGRESS_INTERVAL_S)
            progress(sent[0], time.monotonic() - started)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(report)
        async with trio.open_nursery() as writers:
            for i, cluster in enumerate(sources):
                count = records // len(sources) + (1 if i < records % len(sources) else 0)
                writers.start_soon(write, cluster, count, random.Random(f"{seed}-{cluster}"))
        nursery.cancel_scope.cancel()
    traffic.elapsed_s = time.monotonic() - started
    return traffic


# ---- counting ----------------------------------------------------------------------------------


async def source_offsets(topology: Topology) -> dict[tuple[str, str, int], tuple[int, int]]:
    """(cluster, topic, partition) -> (log start offset, log end offset) of every source topic."""
    from cluster.client.admin import EARLIEST, LATEST, Admin

    out: dict[tuple[str, str, int], tuple[int, int]] = {}
    for cluster in sorted({s.cluster for s in streams_of(topology)}):
        local = local_client(topology.cluster(cluster))
        async with Admin(local.pop("bootstrap.servers"), client_id="dcmirror-demo", config=local) as admin:
            tps = [(t.name, p) for t in topology.topics_of(cluster) for p in range(t.partitions)]
            starts = await admin.list_offsets(tps, EARLIEST)
            ends = await admin.list_offsets(tps, LATEST)
        for tp in tps:
            out[(cluster, tp[0], tp[1])] = (starts[tp], ends[tp])
    return out


@dataclass
class AggregateCount:
    records: int = 0
    duplicates: int = 0
    missing: int = 0
    fences: int = 0


async def count_aggregate(topology: Topology, stream: Stream,
                          offsets: dict[tuple[str, str, int], tuple[int, int]]) -> AggregateCount:
    """Read the stream's target topic to its end: records with provenance from the stream's
    source, checked against the source's offsets (each exactly once); fences skipped."""
    from cluster.client.consumer import Consumer
    from mirror.provenance import FENCE, SOURCE_CLUSTER, SOURCE_OFFSET, SOURCE_PARTITION, header

    partitions = [p for (c, t, p) in offsets if c == stream.cluster and t == stream.topic]
    seen: dict[int, set[int]] = {p: set() for p in partitions}
    result = AggregateCount()
    async with Consumer({**topology.cluster(stream.target_cluster).client_config(), "auto.offset.reset": "earliest",
                         "client.id": "dcmirror-demo", "enable.auto.commit": False}) as consumer:
        tps = [(stream.target_topic, p) for p in partitions]
        ends = await consumer.end_offsets(tps)
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        remaining = {tp for tp in tps if ends[tp] > 0}
        with trio.fail_after(120):
            while remaining:
                for tp, records in (await consumer.getmany(timeout_s=1.0)).items():
                    for r in records:
                        if header(r.headers, FENCE) is not None or header(r.headers, SOURCE_OFFSET) is None:
                            result.fences += 1
                            continue
                        source = (header(r.headers, SOURCE_CLUSTER) or b"").decode()
                        partition = int(header(r.headers, SOURCE_PARTITION) or b"-1")
                        offset = int(header(r.headers, SOURCE_OFFSET) or b"-1")
                        if source != stream.cluster or partition not in seen:
                            raise DemoFailed(f"{stream.target_topic}-{tp[1]} offset {r.offset} came from "
                                             f"{source} partition {partition}, not from {stream.cluster}")
                        if offset in seen[partition]:
                            result.duplicates += 1
                        seen[partition].add(offset)
                    if (consumer.position(tp) or 0) >= ends[tp]:
                        remaining.discard(tp)
    for p, got in seen.items():
        start, end = offsets[(stream.cluster, stream.topic, p)]
        result.records += len(got)
        result.missing += len(set(range(start, end)) - got)
    return result


def wait_mirrored(topology: Topology, offsets: dict[tuple[str, str, int], tuple[int, int]],
                  timeout_s: float) -> tuple[float, int]:
    """Until every source partition is reported by a live worker as copied to its end (lag 0
    at the log end offset we know). Returns (seconds waited, largest lag seen)."""
    from deploy.mirror_cmd import flow_reports

    started = time.monotonic()
    last_print = 0.0
    max_lag = 0
    while True:
        reported: dict[tuple[str, str, int], int] = {}  # source offset copied up to
        for f in flow_reports(topology, list(topology.mirrors)):
            for w in f["workers"]:
                if not w.get("reachable"):
                    continue
                for p in w.get("partitions", []):
                    key = (f["source"], p["topic"], p["partition"])
                    reported[key] = max(reported.get(key, 0), p["acked_offset"] + 1)
        behind = 0
        for key, (_start, end) in offsets.items():
            copied = reported.get(key, 0)
            behind += max(0, end - copied)
        max_lag = max(max_lag, behind)
        if behind == 0:
            return time.monotonic() - started, max_lag
        waited = time.monotonic() - started
        if waited - last_print >= PROGRESS_INTERVAL_S:
            last_print = waited
            say(f"   mirror: {behind:,} records still to copy ({waited:.0f} s)")
        if waited > timeout_s:
            raise DemoFailed(f"the mirror did not catch up within {timeout_s:g} s: {behind:,} records behind; "
                             "see the worker logs under the data directory's mirror/ folder")
        time.sleep(0.25)


# ---- the warehouse (dcmirror load, dcmirror warehouse sql) -----------------------------------


def run_dcmirror(args: list[str], cwd: Path, timeout_s: float, echo: bool) -> tuple[int, str, float]:
    """A `dcmirror ...` subprocess in `cwd`: (exit code, its output, seconds). The demo's own
    directory, not the caller's: Spark's Python workers put their working directory on
    sys.path, where any stray grp.py or tarfile.py would shadow the standard library."""
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    lines: list[str] = []
    timer = threading.Timer(timeout_s, proc.kill)
    timer.start()
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            lines.append(line)
            if echo:
                say(f"   {args[0]} | {line}")
        code = proc.wait()
    finally:
        timer.cancel()
    return code, "\n".join(lines), time.monotonic() - started


QUERY_LINE = re.compile(r"^query: \d+ row\(s\)(?: \(truncated\))? in ([\d.]+) s")


def warehouse_query(streams: list[Stream]) -> str:
    """One Spark SQL query over the four tables: per datacenter and topic the records, the
    distinct source records (provenance: source topic id, partition, leader epoch and
    offset: a re-created topic's offsets and a diverged copy count apart), the distinct users
    and the most frequent url (fields read from the JSON values)."""
    union = "\n  UNION ALL\n".join(
        f"  SELECT '{s.target_topic}' AS topic, source_dc, source_topic_id, source_partition,\n"
        f"         source_leader_epoch, source_offset,\n"
        f"         get_json_object(CAST(value AS STRING), '$.user') AS user,\n"
        f"         get_json_object(CAST(value AS STRING), '$.url') AS url\n"
        f"  FROM {table_name(s.target_topic)}" for s in streams)
    return ("SELECT source_dc AS dc, topic, count(*) AS records,\n"
            "       count(DISTINCT coalesce(source_topic_id, ''), source_partition,\n"
            "                      coalesce(source_leader_epoch, -1), source_offset) AS distinct_records,\n"
            "       count(DISTINCT user) AS users, mode(url) AS top_url\n"
            f"FROM (\n{union}\n)\nGROUP BY source_dc, topic ORDER BY topic")


# ---- the demo --------------------------------------------------------------------------------


def _table(rows: list[list[str]], right: int = 1) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) if i < right else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
            for r in rows]


def run_demo(records: int = DEFAULT_RECORDS, *, keep: bool = False, as_json: bool = False, seed: int = 1) -> int:
    if records < 1:
        print("dcmirror demo: --records must be at least 1", file=sys.stderr)
        return 2
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        print("dcmirror demo: the warehouse load runs Spark, which needs a Java runtime (17): install one "
              "(`make sysdeps` does: apt-get install openjdk-17-jre-headless) or set JAVA_HOME", file=sys.stderr)
        return 2
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="dcmirror-demo-"))
    config = workdir / "topology.toml"
    config.write_text(demo_topology_text(default_topology_text()))
    made = dev_secrets(config)  # a CA, the brokers' certificate and passwords, made up on the fly
    topology = load(config)
    say(f"dcmirror demo: the default topology with free ports, everything under {workdir}")
    say(f"   secured as a deployment across datacenters would be: mutual TLS between brokers, SASL_SSL "
        f"(SCRAM) for the mirror and operators, plaintext on loopback for local producers; "
        f"{len(made.files)} certificate files and {len(made.passwords)} passwords made up under "
        f"{workdir / 'secrets'}")
    summary: dict[str, Any] = {"ok": False, "records": records, "workdir": str(workdir)}
    up: UpProcess | None = None
    try:
        step(1, "dcmirror up: 3 clusters (east, west, aggregate) x 3 brokers, topics, mirror workers")
        up_started = time.monotonic()
        up = UpProcess(config, workdir / "up.log")
        up.wait_ready(UP_READY_TIMEOUT_S + 30)
        summary["phases_s"] = {"clusters up": round(time.monotonic() - up_started, 1)}
        up.echo = False  # from here on its lines go to up.log only (restarts are still printed below)
        summary.update(_demo_steps(topology, config, records, seed, up, summary["phases_s"]))
    except DemoFailed as exc:
        say(f"\ndcmirror demo FAILED: {exc}")
        summary["error"] = str(exc)
    except KeyboardInterrupt:
        say("\ndcmirror demo: interrupted")
        summary["error"] = "interrupted"
    except Exception as exc:  # noqa: BLE001 - reported, then everything is stopped as usual
        traceback.print_exc()
        say(f"\ndcmirror demo FAILED: {type(exc).__name__}: {exc}")
        summary["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if up is not None:
            say("\n== stopping (dcmirror up: mirror workers, then every cluster with controlled shutdowns)")
            code = up.stop()
            say(f"   dcmirror up exited {code}; " + (up.lines[-1] if up.lines else ""))
        summary["elapsed_s"] = round(time.monotonic() - started, 1)
        if keep or not summary["ok"]:
            say(f"data, logs and topology kept in {workdir} (dcmirror status --config {config})")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    phases = summary.get("phases_s", {})
    say(f"\ndcmirror demo: {'OK' if summary['ok'] else 'FAILED'} in {summary['elapsed_s']:.0f} s"
        + (" (" + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases.items()) + ")" if phases else ""))
    if as_json:
        print(json.dumps(summary), flush=True)
    return 0 if summary["ok"] else 1


def _demo_steps(topology: Topology, config: Path, records: int, seed: int, up: UpProcess,
                phases: dict[str, float]) -> dict[str, Any]:
    """Steps 2 to 5; each one's seconds go into `phases` as it ends (so a failed demo still
    shows where the time went)."""
    started = time.monotonic()
    streams = streams_of(topology)
    sources = sorted({s.cluster for s in streams})
    step(2, f"traffic: {records:,} pageview and click events (JSON user/url/ts, keyed by user) into "
            f"{' and '.join(sources)}, with the project's idempotent producer (acks=all)")
    say(f"   e.g. {event(random.Random(seed), 'pageviews', 1_700_000_000_000)[1].decode()}")

    def progress(sent: int, elapsed_s: float) -> None:
        say(f"   produced {sent:,} of {records:,} ({sent / max(elapsed_s, 1e-9):,.0f} records/s)")

    traffic = trio.run(produce_traffic, topology, records, seed, progress)
    acked = sum(traffic.acked.values())
    say(f"   {acked:,} records acknowledged in {traffic.elapsed_s:.1f} s "
        f"({acked / max(traffic.elapsed_s, 1e-9):,.0f} records/s), {traffic.failed} failed")
    if traffic.failed:
        raise DemoFailed(f"{traffic.failed} records were not acknowledged; first: {traffic.first_error}")
    offsets = trio.run(source_offsets, topology)
    phases["traffic"] = round(time.monotonic() - started, 1)
    started = time.monotonic()

    step(3, "mirror: waiting until every source partition is copied into the aggregate (lag 0)")
    caught_up_s, max_lag = wait_mirrored(topology, offsets, MIRROR_TIMEOUT_S)
    say(f"   lag 0 on all {len(offsets)} source partitions, {caught_up_s:.1f} s after the last acknowledgement")
    aggregate = {s: trio.run(count_aggregate, topology, s, offsets) for s in streams}
    fences = sum(a.fences for a in aggregate.values())
    say(f"   read back from the aggregate: {sum(a.records for a in aggregate.values()):,} records "
        f"(+{fences} fence records the workers wrote when they took their partitions)")
    phases["mirror caught up"] = round(time.monotonic() - started, 1)

    step(4, "warehouse load: dcmirror load (Spark, local mode) from the aggregate into Parquet tables, then the "
            "query of step 5 in the same Spark session")
    query = warehouse_query(streams)
    code, output, total_s = run_dcmirror(["load", "--config", str(config), "--query", query], config.parent,
                                         LOAD_TIMEOUT_S, echo=False)
    lines = output.splitlines()
    for line in lines[:-1]:
        say(f"   load | {line}")
    if code != 0:
        raise DemoFailed(f"dcmirror load exited {code}" + (
            " (this build has no `dcmirror load` command)" if "invalid choice: 'load'" in output else ""))
    asked = next((m for m in map(QUERY_LINE.search, lines) if m), None)
    sql_s = float(asked.group(1)) if asked else 0.0
    load_s = total_s - sql_s
    say(f"   load took {load_s:.1f} s (Spark's start included)")
    phases["load"] = round(load_s, 1)
    try:
        rows = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        rows = None
    if not isinstance(rows, list):
        raise DemoFailed(f"dcmirror load --query: the last line is not a JSON array: {(lines or [''])[-1][:200]!r}")

    step(5, "the warehouse: one Spark SQL query over the four tables (`dcmirror warehouse sql` runs the same "
            "on its own)")
    for line in query.splitlines():
        say(f"   | {line}")
    say(f"   ({sql_s:.1f} s in the load's Spark session: no second JVM or metastore start)")
    phases["query"] = round(sql_s, 1)
    if rows:
        cols = list(rows[0])
        for line in _table([cols] + [[f"{r[c]:,}" if isinstance(r[c], int) else str(r[c]) for c in cols]
                                     for r in rows], right=2):
            say(f" {line}")
    warehouse: dict[str, dict[str, int]] = {}
    problems: list[str] = []
    for r in rows:
        w = warehouse.setdefault(r["topic"], {"records": 0, "distinct_records": 0})
        w["records"] += int(r["records"])
        w["distinct_records"] += int(r["distinct_records"])
    source_count = {s: sum(e - b for (c, t, _), (b, e) in offsets.items() if c == s.cluster and t == s.topic)
                    for s in streams}
    for s in streams:
        stray = [r["dc"] for r in rows if r["topic"] == s.target_topic and r["dc"] != s.datacenter]
        if stray:
            problems.append(f"{table_name(s.target_topic)} holds rows of datacenter(s) {', '.join(stray)}, "
                            f"not only {s.datacenter}")

    counts: dict[str, Any] = {}
    table = [["DATACENTER", "TOPIC", "PRODUCED", "SOURCE", "AGGREGATE", "WAREHOUSE", "TABLE"]]
    totals = [0, 0, 0, 0]
    for s in streams:
        w = warehouse.get(s.target_topic, {"records": 0, "distinct_records": 0})
        row = {"produced": traffic.acked.get((s.cluster, s.topic), 0), "source": source_count[s],
               "aggregate": aggregate[s].records, "warehouse": w["records"],
               "warehouse_distinct": w["distinct_records"],
               "aggregate_duplicates": aggregate[s].duplicates, "aggregate_missing": aggregate[s].missing}
        counts[s.target_topic] = row
        values = [row["produced"], row["source"], row["aggregate"], row["warehouse"]]
        totals = [a + b for a, b in zip(totals, values, strict=True)]
        table.append([s.datacenter, s.topic, *(f"{v:,}" for v in values), table_name(s.target_topic)])
        if len(set(values)) != 1 or row["warehouse_distinct"] != row["warehouse"]:
            problems.append(f"{s.label}: produced {values[0]}, source {values[1]}, aggregate {values[2]}, "
                            f"warehouse {values[3]} ({row['warehouse_distinct']} distinct)")
        if aggregate[s].duplicates or aggregate[s].missing:
            problems.append(f"{s.label}: the aggregate has {aggregate[s].duplicates} duplicates and misses "
                            f"{aggregate[s].missing} source offsets")
    table.append(["total", "", *(f"{v:,}" for v in totals), ""])

    restarts = [line for line in up.lines if "restarting in" in line]
    say("\n== summary")
    for line in _table(table, right=2):
        say(line)
    say(f"\n   mirror: lag 0 records on every one of the {len(offsets)} source partitions; the aggregate caught up "
        f"{caught_up_s:.1f} s after the last record was acknowledged (largest backlog seen then: {max_lag:,} records)")
    say(f"   traffic: {acked:,} records in {traffic.elapsed_s:.1f} s; warehouse load: {load_s:.1f} s; "
        f"warehouse query: {sql_s:.1f} s")
    if restarts:
        say(f"   dcmirror up restarted processes {len(restarts)} time(s): " + "; ".join(restarts[:3]))
    if problems:
        say("\n   MISMATCH:")
        for p in problems:
            say(f"   - {p}")
    else:
        say(f"\n   every record produced is in the sources, the aggregate and the warehouse exactly once "
            f"({totals[0]:,} records)")
    return {"ok": not problems, "problems": problems, "counts": counts,
            "traffic_s": round(traffic.elapsed_s, 2), "mirror_catch_up_s": round(caught_up_s, 2),
            "mirror_lag_records": 0, "load_s": round(load_s, 2), "sql_s": round(sql_s, 2), "query": query, "example": rows}
