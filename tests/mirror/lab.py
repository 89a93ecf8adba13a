"""The mirror tests' lab: several clusters (ClusterProcesses, each with its own topology file
for its brokers), one combined topology file naming them all plus the `[[mirrors]]` flows
under test, and the mirror run either as `dcmirror mirror --config FILE` (the supervisor, one
child process per worker) or as single `--flow NAME --worker N` processes the test owns.

The checks compare a target topic with its source record by record: target partition p
holds exactly source partition p's records, in source offset order, each once, with the
source's key, value and headers and provenance headers naming the source cluster,
partition and offset. A worker fences the previous writer with an invisible transaction
marker, so a consumer of the target reads nothing else: a fence record (what workers wrote
before markers) is a problem unless the check is told old fences may be there.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import ConfigResource, NewPartitions

from tests.cluster_helpers import NotYet, admin, create_topic, metadata, watermarks
from tests.harness import REPO, ClusterProcesses

SOURCE_CLUSTER = "dcmirror.source.cluster"
SOURCE_PARTITION = "dcmirror.source.partition"
SOURCE_OFFSET = "dcmirror.source.offset"
SOURCE_TOPIC_ID = "dcmirror.source.topic.id"
SOURCE_LEADER_EPOCH = "dcmirror.source.leader.epoch"
PATH = "dcmirror.path"
FENCE = "dcmirror.fence"
PROVENANCE = (SOURCE_CLUSTER, SOURCE_PARTITION, SOURCE_OFFSET, SOURCE_TOPIC_ID, SOURCE_LEADER_EPOCH, PATH)
HEARTBEATS_TOPIC = "dcmirror.heartbeats"

T = TypeVar("T")


class TimedOut(AssertionError):
    """A bounded wait ran out."""


class NotReady(Exception):
    """A poll saw a state that is not the awaited one (yet)."""


def wait_for(predicate: Callable[[], T], timeout_s: float, what: str, *, interval_s: float = 0.25,
             on_timeout: Callable[[], str] | None = None) -> T:
    """predicate() until truthy (client errors count as "not yet"); on the deadline an
    AssertionError naming `what`, the last value or error, and `on_timeout()`'s text."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            value = predicate()
            if value:
                return value
            last = value
        except (KafkaException, OSError, NotReady, NotYet) as exc:
            last = exc
        if time.monotonic() >= deadline:
            extra = f"\n{on_timeout()}" if on_timeout is not None else ""
            raise TimedOut(f"not within {timeout_s:.0f} s: {what}; last seen: {last!r}{extra}")
        time.sleep(interval_s)


# --------------------------------------------------------------------------- the lab


@dataclass
class Flow:
    """One `[[mirrors]]` entry."""

    source: str
    target: str
    topics: str
    workers: int = 1
    exclude: str | None = None
    rename: str | None = None
    config: dict[str, str] = field(default_factory=dict)
    name: str | None = None
    mirror_topics: bool = False

    @property
    def flow_name(self) -> str:
        return self.name or f"{self.source}-to-{self.target}"

    def rename_of(self, topic: str) -> str:
        """The target topic name of source topic `topic` (the lab's datacenters are named
        after their clusters)."""
        template = self.rename or "{source}.{topic}"
        return template.format(source=self.source, target=self.target, topic=topic, source_dc=self.source)

    def toml(self) -> list[str]:
        lines = ["[[mirrors]]", f'source = "{self.source}"', f'target = "{self.target}"',
                 f"topics = {json.dumps(self.topics)}", f"workers = {self.workers}"]
        if self.name:
            lines.append(f'name = "{self.name}"')
        if self.exclude:
            lines.append(f"exclude = {json.dumps(self.exclude)}")
        if self.rename:
            lines.append(f"rename = {json.dumps(self.rename)}")
        if self.mirror_topics:
            lines.append("mirror_topics = true")
        if self.config:
            lines.append("config = { " + ", ".join(f'"{k}" = "{v}"' for k, v in self.config.items()) + " }")
        return lines + [""]


@dataclass
class TopicDecl:
    """One `[[topics]]` entry (what `topology apply` creates)."""

    cluster: str
    name: str
    partitions: int = 1
    replication_factor: int | None = None
    config: dict[str, str] = field(default_factory=dict)

    def toml(self) -> list[str]:
        lines = ["[[topics]]", f'cluster = "{self.cluster}"', f"name = {json.dumps(self.name)}",
                 f"partitions = {self.partitions}"]
        if self.replication_factor is not None:
            lines.append(f"replication_factor = {self.replication_factor}")
        if self.config:
            lines.append("config = { " + ", ".join(f'"{k}" = "{v}"' for k, v in self.config.items()) + " }")
        return lines + [""]


class MirrorLab:
    """Clusters by name (each `sizes[name]` brokers), the combined topology file and the
    mirror processes. `teardown()` kills everything it started."""

    def __init__(self, root: Path, sizes: dict[str, int], *, controllers: dict[str, int] | None = None,
                 cluster_config: dict[str, dict[str, object]] | None = None, **broker_config: object) -> None:
        self.root = Path(root)
        self.clusters = {name: ClusterProcesses(self.root / name, size, name=name,
                                                controllers=(controllers or {}).get(name, 0),
                                                **{**broker_config, **(cluster_config or {}).get(name, {})})
                         for name, size in sizes.items()}
        self.topology_path = self.root / "topology.toml"
        self.flows: list[Flow] = []
        self.supervisor: subprocess.Popen[bytes] | None = None
        self.workers: dict[tuple[str, int], subprocess.Popen[bytes]] = {}  # without the supervisor
        self.mirror_log_path = self.root / "mirror.log"

    def __getitem__(self, name: str) -> ClusterProcesses:
        return self.clusters[name]

    def bootstrap(self, name: str) -> str:
        cluster = self.clusters[name]
        return cluster.bootstrap_of(*cluster.alive()) if cluster.alive() else cluster.bootstrap

    def start(self, timeout_s: float = 90.0) -> MirrorLab:
        """Every node of every cluster at once, then wait until each broker is ready."""
        for cluster in self.clusters.values():
            for node in (*cluster.controllers.values(), *cluster.brokers.values()):
                node.start(wait_ready=False)
        for cluster in self.clusters.values():
            for broker in cluster.brokers.values():
                broker.wait_ready(timeout_s)
        return self

    def write_topology(self, flows: Iterable[Flow], replication_factor: int | None = None,
                       client: dict[str, str] | None = None, topics: Iterable[TopicDecl] = ()) -> Path:
        """The combined topology: every cluster (the brokers' addresses, data_dir pointing at
        that cluster's data directory, so the mirror state dir lands beside it), the declared
        `[[topics]]` and the flows. `replication_factor` (default: the smallest cluster's size)
        is what target topics get."""
        self.flows = list(flows)
        rf = replication_factor or min(len(c.brokers) for c in self.clusters.values())
        lines: list[str] = []
        for name, cluster in self.clusters.items():
            lines += [f"[clusters.{name}]", f'datacenter = "{name}"',
                      "brokers = [" + ", ".join(f'"{b.bootstrap}"' for b in cluster.brokers.values()) + "]",
                      f'data_dir = "{cluster.root / "data" / name}"']
            if client:  # every cluster's `client` table (security settings)
                lines.append("client = { " + ", ".join(f'"{k}" = "{v}"' for k, v in client.items()) + " }")
            lines.append("")
        lines += ["[defaults]", f"replication_factor = {rf}", ""]
        for topic in topics:
            lines += topic.toml()
        for flow in self.flows:
            lines += flow.toml()
        self.topology_path.write_text("\n".join(lines))
        check = subprocess.run([sys.executable, "-m", "deploy.cli", "topology", "check", str(self.topology_path)],
                               cwd=REPO, capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, f"topology check failed:\n{check.stdout}\n{check.stderr}"
        return self.topology_path

    def flow(self, name: str) -> Flow:
        (flow,) = [f for f in self.flows if f.flow_name == name]
        return flow

    # ---- mirror processes ------------------------------------------------------------

    def _spawn(self, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.mirror_log_path, "ab")
        try:
            level = ["--log-level", os.environ["DCMIRROR_LAB_LOG_LEVEL"]] if os.environ.get("DCMIRROR_LAB_LOG_LEVEL") else []
            return subprocess.Popen([sys.executable, "-m", "deploy.cli", *level, "mirror", "--config",
                                     str(self.topology_path), *args], cwd=REPO, stdout=log,
                                    stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        finally:
            log.close()

    def start_mirror(self) -> subprocess.Popen[bytes]:
        """`dcmirror mirror --config FILE`: the supervisor and its worker children."""
        assert self.supervisor is None or self.supervisor.poll() is not None
        self.supervisor = self._spawn([])
        return self.supervisor

    def stop_mirror(self, timeout_s: float = 45.0) -> int:
        assert self.supervisor is not None
        if self.supervisor.poll() is None:
            self.supervisor.send_signal(signal.SIGTERM)
        return self.supervisor.wait(timeout_s)

    def start_worker(self, flow: str, index: int) -> subprocess.Popen[bytes]:
        """One worker in its own process, without a supervisor (nothing restarts it)."""
        proc = self.workers.get((flow, index))
        assert proc is None or proc.poll() is not None, f"worker {flow}-w{index} runs already"
        self.workers[flow, index] = self._spawn(["--flow", flow, "--worker", str(index)])
        return self.workers[flow, index]

    def mirror_log(self) -> str:
        try:
            return self.mirror_log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def mirror_log_tail(self, lines: int = 60) -> str:
        """The log's last lines, then where every task of each live worker waits (kill -USR1:
        cluster/common/taskdump.py), for the diagnosis of a timeout."""
        kept = [line for line in self.mirror_log().splitlines() if "rdkafka" not in line]
        return "---- mirror log ----\n" + "\n".join(kept[-lines:]) + self.task_dumps()

    def task_dumps(self, timeout_s: float = 3.0) -> str:
        marker = "trio tasks of this process:"
        before = self.mirror_log().count(marker)
        pids = [p.pid for p in self.workers.values() if p.poll() is None]
        for flow in {f for f, _ in self.workers}:
            pids += [pid for pid in self.worker_pids(flow).values() if pid not in pids]
        signalled = []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGUSR1)
                signalled.append(pid)
            except OSError:
                pass
        pids = signalled
        deadline = time.monotonic() + timeout_s
        text = self.mirror_log()
        while text.count(marker) < before + len(pids) and time.monotonic() < deadline:
            time.sleep(0.1)
            text = self.mirror_log()
        dumps = text.split(marker)[before + 1:]  # the ones this call asked for
        return "".join(f"\n---- worker tasks ----{d}" for d in dumps)[-30_000:]

    def worker_pids(self, flow: str) -> dict[int, int]:
        """Worker index -> pid of the running `--flow FLOW --worker N` processes of this lab
        (from /proc: the supervisor's children are not ours to poll)."""
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                state = (entry / "stat").read_text().split(") ", 1)[1][0]
            except OSError:
                continue
            if state == "Z":
                continue
            args = [a.decode(errors="replace") for a in argv if a]
            if ("--worker" in args and str(self.topology_path) in args and "--flow" in args
                    and args[args.index("--flow") + 1] == flow):
                found[int(args[args.index("--worker") + 1])] = int(entry.name)
        return found

    def kill_worker(self, flow: str, index: int, sig: int = signal.SIGKILL) -> int:
        pid = self.worker_pids(flow).get(index)
        assert pid is not None, f"worker {flow}-w{index} is not running; running: {self.worker_pids(flow)}"
        status_pid = self.worker_status(flow).get(f"{flow}-w{index}", {}).get("pid")
        assert status_pid in (None, pid) or not _alive(status_pid), \
            f"status file names pid {status_pid}, the process list {pid}"
        os.kill(pid, sig)
        return pid

    # ---- status ------------------------------------------------------------------------

    def state_dir(self, flow: str) -> Path:
        target = self.flow(flow).target
        return self.clusters[target].root / "data" / "mirror" / flow

    def worker_status(self, flow: str) -> dict[str, dict[str, Any]]:
        """The status files of a flow's workers, by worker name."""
        out = {}
        for path in sorted(self.state_dir(flow).glob("*.json")):
            try:
                doc = json.loads(path.read_bytes())
            except (OSError, ValueError):
                continue
            out[doc["worker"]] = doc
        return out

    def status(self) -> list[dict[str, Any]]:
        """`dcmirror mirror status --config FILE --json`."""
        proc = subprocess.run([sys.executable, "-m", "deploy.cli", "mirror", "status", "--config",
                               str(self.topology_path), "--json"], cwd=REPO, capture_output=True, text=True,
                              timeout=60)
        if proc.returncode != 0:
            raise NotReady(f"mirror status: {proc.returncode} {proc.stderr[-500:]}")
        return json.loads(proc.stdout)

    def owners(self, flow: str, max_age_s: float = 5.0) -> dict[tuple[str, int], str]:
        """(source topic, partition) -> worker, from the fresh status files of the flow."""
        now_ms = time.time() * 1000
        out = {}
        for name, doc in self.worker_status(flow).items():
            if now_ms - doc.get("reported_ms", 0) > max_age_s * 1000:
                continue
            for p in doc["partitions"]:
                out[p["topic"], p["partition"]] = name
        return out

    def wait_caught_up(self, ends: dict[str, dict[tuple[str, int], int]], timeout_s: float,
                       stable_s: float = 3.0, count_mirrored: bool = False,
                       flow_lag: bool = True) -> list[dict[str, Any]]:
        """Until `mirror status --json` shows, for every flow in `ends` (flow -> {(source
        topic, partition): source end offset}), every partition owned by a live worker
        with everything up to the end offset acknowledged and lag 0, the flow's lag 0; then
        until the end offsets of the flows' target topics stay put for `stable_s` (with
        `count_mirrored`: their records with provenance, fences left out). `flow_lag=False`:
        the flow's total lag (over partitions not in `ends` too) need not be 0."""
        last_report: list[dict[str, Any]] = []

        def caught_up() -> bool:
            nonlocal last_report
            last_report = self.status()
            by_flow = {f["flow"]: f for f in last_report}
            for flow, want in ends.items():
                report = by_flow[flow]
                if flow_lag and report["lag_records"] != 0:
                    raise NotReady(f"{flow}: lag {report['lag_records']}")
                acked = {}
                for w in report["workers"]:
                    if w["age_s"] >= 5:
                        continue
                    for p in w["partitions"]:
                        acked[p["topic"], p["partition"]] = (p["acked_offset"] + 1, p["lag_records"])
                short = {tp: acked.get(tp) for tp, end in want.items() if acked.get(tp, (-1, None))[0] < end}
                if short:
                    raise NotReady(f"{flow}: not caught up (acked next offset, lag) {short}; want {want}")
            return True

        wait_for(caught_up, timeout_s, "mirror status: every partition owned and caught up, lag 0",
                 interval_s=1.0, on_timeout=lambda: json.dumps(last_report)[:3000] + "\n" + self.mirror_log_tail())
        targets = {(f.target, f.rename_of(t)) for flow in ends for f in [self.flow(flow)]
                   for t, _ in ends[flow]}
        previous: dict[tuple[str, str], dict[int, int]] = {}
        since = time.monotonic()

        def stable() -> bool:
            nonlocal previous, since
            now = {(c, t): mirrored_count(self.bootstrap(c), t) if count_mirrored else end_offsets(self.bootstrap(c), t)
                   for c, t in sorted(targets)}
            if now != previous:
                previous, since = now, time.monotonic()
            return time.monotonic() - since >= stable_s

        wait_for(stable, timeout_s, f"target end offsets unchanged for {stable_s} s", interval_s=0.5)
        return last_report

    def check_exactly_once(self, flow: str, topics: Iterable[str], timeout_s: float = 90.0,
                           path: str | None = None, count_mirrored: bool = False,
                           flow_lag: bool = True) -> dict[str, Comparison]:
        """Once the flow caught up with the source's current end offsets: every record of
        every topic in `topics` exactly once in its target topic (see `compare`)."""
        f = self.flow(flow)
        source, target = self.bootstrap(f.source), self.bootstrap(f.target)
        topics = list(topics)
        ends = {(t, p): end for t in topics for p, end in end_offsets(source, t).items()}
        self.wait_caught_up({flow: ends}, timeout_s, count_mirrored=count_mirrored, flow_lag=flow_lag)
        out = {}
        for t in topics:
            out[t] = outcome = compare(read_topic(source, t), read_topic(target, f.rename_of(t)), f.source, path)
            print(f"{f.source}/{t} -> {f.target}/{f.rename_of(t)}: {outcome.source_records} source records, "
                  f"{outcome.mirrored_records} mirrored, {outcome.fences} fences", flush=True)
        for outcome in out.values():
            outcome.assert_clean()
        return out

    # ---- teardown ------------------------------------------------------------------------

    def teardown(self) -> None:
        # kill -9 (a clean stop is what some tests check, not what teardown needs)
        procs = [p for p in [self.supervisor, *self.workers.values()] if p is not None and p.poll() is None]
        for p in procs:
            p.kill()
            p.wait()
        for flow in self.flows:  # workers orphaned by a killed supervisor
            for pid in self.worker_pids(flow.flow_name).values():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for cluster in self.clusters.values():
            for broker in (*cluster.brokers.values(), *cluster.controllers.values()):
                if broker.alive():
                    broker.resume()
                    broker.kill9()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# --------------------------------------------------------------------------- clients


def new_topic(bootstrap: str, name: str, partitions: int, rf: int = 1, config: dict[str, str] | None = None) -> None:
    create_topic(bootstrap, name, partitions, rf, config=config)
    wait_for(lambda: partition_count(bootstrap, name) == partitions, 30,
             f"topic {name} with {partitions} partitions")


def add_partitions(bootstrap: str, name: str, total: int) -> None:
    client = admin(bootstrap)
    futures = client.create_partitions([NewPartitions(name, total)], operation_timeout=30, request_timeout=30)
    futures[name].result(timeout=30)
    wait_for(lambda: partition_count(bootstrap, name) == total, 30,
             f"topic {name} with {total} partitions")


def topic_config(bootstrap: str, name: str) -> dict[str, Any]:
    """DescribeConfigs of a topic: name -> ConfigEntry."""
    client = admin(bootstrap)
    futures = client.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, name)], request_timeout=30)
    (future,) = futures.values()
    return dict(future.result(timeout=30))


def topics_of(bootstrap: str) -> dict[str, int]:
    """Topic -> partition count (internal __ topics left out). A Metadata request for all
    topics: naming a topic that does not exist would make the broker create it
    (auto.create.topics.enable), with 1 partition and no configs, ahead of the mirror."""
    md = metadata(bootstrap)
    return {name: len(t.partitions) for name, t in md.topics.items()
            if not name.startswith("__") and t.error is None}


def partition_count(bootstrap: str, topic: str) -> int:
    count = topics_of(bootstrap).get(topic)
    if not count:
        raise NotReady(f"no topic {topic} (yet)")
    return count


def all_end_offsets(bootstrap: str, skip: Callable[[str], bool] = lambda t: False) -> dict[str, dict[int, int]]:
    """topic -> partition -> end offset of every topic (but those `skip` names), one client."""
    md = metadata(bootstrap)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "lab-offsets", "log_level": 2})
    try:
        return {name: {p: watermarks(consumer, name, p)[1]
                       for p in sorted(t.partitions)}
                for name, t in sorted(md.topics.items())
                if t.error is None and not name.startswith("__") and not skip(name)}
    finally:
        consumer.close()


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """Per partition, the end a read_committed consumer sees (librdkafka's default): the
    last stable offset, which an open transaction holds back (`log_ends`: the log end)."""
    count = partition_count(bootstrap, topic)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "lab-offsets", "log_level": 2})
    try:
        return {p: watermarks(consumer, topic, p)[1] for p in range(count)}
    finally:
        consumer.close()


def log_ends(bootstrap: str, topic: str) -> dict[int, int]:
    """Per partition, the log end offset (high watermark), open transactions included."""
    count = partition_count(bootstrap, topic)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "lab-offsets", "log_level": 2,
                         "isolation.level": "read_uncommitted"})
    try:
        return {p: watermarks(consumer, topic, p)[1] for p in range(count)}
    finally:
        consumer.close()


class Rec(NamedTuple):
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]

    def header(self, name: str) -> bytes | None:
        found = None
        for k, v in self.headers:
            if k == name:
                found = v
        return found

    @property
    def mirrored(self) -> bool:
        return any(k in PROVENANCE for k, _ in self.headers)

    @property
    def fence(self) -> bool:
        return any(k == FENCE for k, _ in self.headers)


def read_topic(bootstrap: str, topic: str, timeout_s: float = 300.0,
               isolation: str = "read_uncommitted") -> dict[int, list[Rec]]:
    """Every record of every partition of `topic` a consumer with `isolation` reads, from the
    log start to the high watermark (read_committed: the last stable offset)."""
    count = partition_count(bootstrap, topic)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"lab-reader-{time.monotonic_ns()}",
                         "isolation.level": isolation,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "enable.partition.eof": True, "log_level": 2, "fetch.max.bytes": 16 << 20})
    try:
        ends = {p: watermarks(consumer, topic, p)[1] for p in range(count)}
        out: dict[int, list[Rec]] = {p: [] for p in range(count)}
        done = {p for p, end in ends.items() if end == 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in range(count) if p not in done])
        deadline = time.monotonic() + timeout_s
        while len(done) < count:
            assert time.monotonic() < deadline, f"reading {topic}: {sum(map(len, out.values()))} records, not done"
            for msg in consumer.consume(10_000, timeout=1.0):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if msg.offset() >= ends[msg.partition()]:
                            done.add(msg.partition())
                        continue
                    raise AssertionError(f"reading {topic}: {err}")
                p = msg.partition()
                if msg.offset() >= ends[p]:
                    done.add(p)
                    continue
                out[p].append(Rec(msg.offset(), msg.key(), msg.value(), tuple(msg.headers() or ())))
                if msg.offset() + 1 >= ends[p]:
                    done.add(p)
        return out
    finally:
        consumer.close()


def mirrored_count(bootstrap: str, topic: str) -> int:
    """Records with provenance in `topic` (fences left out)."""
    return sum(1 for rows in read_topic(bootstrap, topic, timeout_s=30).values() for r in rows if r.mirrored)


def checksum(records: Iterable[Rec]) -> str:
    h = hashlib.sha256()
    for r in records:
        for part in (r.key, r.value):
            h.update(b"-" if part is None else len(part).to_bytes(4, "big") + part)
    return h.hexdigest()


def own_headers(r: Rec) -> tuple[tuple[str, bytes | None], ...]:
    return tuple((k, v) for k, v in r.headers if k not in PROVENANCE)


@dataclass
class Comparison:
    """A target topic against its source, partition by partition."""

    source_records: int = 0
    mirrored_records: int = 0
    fences: int = 0
    problems: list[str] = field(default_factory=list)

    def assert_clean(self) -> None:
        assert not self.problems, "\n".join(self.problems[:40])


def compare(source: dict[int, list[Rec]], target: dict[int, list[Rec]], source_cluster: str,
            path: str | None = None, *, fences_allowed: bool = False) -> Comparison:
    """Exactly once, in order, with correct provenance: target partition p's records with
    provenance are source partition p's records, one for one in offset order, with their key,
    value and own headers (an earlier hop's provenance is replaced); every other target
    record is a fence (null key and value). `path` is the expected dcmirror.path (default:
    the source cluster). For a second hop pass the source's mirrored records only."""
    path = path or source_cluster
    out = Comparison()
    if set(target) != set(source):
        out.problems.append(f"partitions: source {sorted(source)}, target {sorted(target)}")
    for p in sorted(source):
        src = source[p]
        out.source_records += len(src)
        rows = target.get(p, [])
        mirrored = [r for r in rows if r.mirrored]
        others = [r for r in rows if not r.mirrored]
        out.mirrored_records += len(mirrored)
        out.fences += sum(1 for r in others if r.fence)
        odd = [r for r in others if not (r.fence and r.key is None and r.value is None)]
        if odd:
            out.problems.append(f"partition {p}: {len(odd)} records neither mirrored nor fences, e.g. {odd[:3]}")
        if others and not fences_allowed:
            out.problems.append(f"partition {p}: {len(others)} records a consumer reads that no source produced "
                                f"(the mirror's bookkeeping leaked), e.g. {others[:2]}")
        fenced_mirrors = [r for r in mirrored if r.fence]
        if fenced_mirrors:
            out.problems.append(f"partition {p}: {len(fenced_mirrors)} mirrored records carry a fence header, "
                                f"e.g. {fenced_mirrors[:2]}")
        wrong_origin = [r for r in mirrored if r.header(SOURCE_CLUSTER) != source_cluster.encode()
                        or r.header(SOURCE_PARTITION) != str(p).encode() or r.header(PATH) != path.encode()]
        if wrong_origin:
            out.problems.append(f"partition {p}: {len(wrong_origin)} records with other provenance than "
                                f"{source_cluster}/{p} path {path}, e.g. {wrong_origin[:3]}")
        try:
            got = [int(r.header(SOURCE_OFFSET) or b"-1") for r in mirrored]
        except ValueError:
            out.problems.append(f"partition {p}: unparsable source offsets")
            continue
        want = [r.offset for r in src]
        if got != want:
            counts: dict[int, int] = {}
            for o in got:
                counts[o] = counts.get(o, 0) + 1
            dupes = sorted(o for o, n in counts.items() if n > 1)
            missing = sorted(set(want) - set(got))
            extra = sorted(set(got) - set(want))
            disorder = [(a, b) for a, b in zip(got, got[1:], strict=False) if b <= a]
            out.problems.append(
                f"partition {p}: {len(got)} mirrored vs {len(want)} source records; {len(dupes)} source offsets "
                f"twice (e.g. {dupes[:5]}), {len(missing)} missing (e.g. {missing[:5]}), {len(extra)} not in "
                f"the source (e.g. {extra[:5]}), {len(disorder)} out of order (e.g. {disorder[:5]})")
            continue
        differ = [(s.offset, s.key, s.value, t.key, t.value) for s, t in zip(src, mirrored, strict=True)
                  if (s.key, s.value, own_headers(s)) != (t.key, t.value, own_headers(t))]
        if differ:
            out.problems.append(f"partition {p}: {len(differ)} records differ in key, value or headers, "
                                f"e.g. {differ[:3]}")
        if checksum(src) != checksum(mirrored):
            out.problems.append(f"partition {p}: checksums differ")
    return out


# --------------------------------------------------------------------------- workload


class SourceWriter:
    """An idempotent acks=all confluent-kafka producer writing `total` records into `topic`
    from a thread, at most `rate_per_s`: key `k<i>`, value `<prefix>-<i>`, record i into
    partition i % partitions.

    With `transactional_id`: the records go in transactions of `per_txn`, and before every
    `abort_every`-th of them a transaction of as many records (values
    `<prefix>-aborted-<n>-<j>`) is written and aborted; those count in `aborted`, not `acked`."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, total: int, prefix: str,
                 rate_per_s: float = 1e9, start: int = 0, *, transactional_id: str | None = None,
                 per_txn: int = 50, abort_every: int = 0) -> None:
        self.topic, self.partitions, self.total, self.prefix = topic, partitions, total, prefix
        self.rate_per_s, self.start_at = rate_per_s, start
        self.per_txn, self.abort_every = per_txn, abort_every
        config: dict[str, Any] = {
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
            "linger.ms": 5, "message.timeout.ms": 180_000, "request.timeout.ms": 10_000,
            "socket.connection.setup.timeout.ms": 3000, "reconnect.backoff.max.ms": 500,
            "topic.metadata.refresh.interval.ms": 1000, "log_level": 2}
        if transactional_id:
            config.update({"transactional.id": transactional_id, "message.timeout.ms": 60_000})
        self.producer = Producer(config)
        self.transactional = bool(transactional_id)
        if self.transactional:
            self.producer.init_transactions(60)
        self.sent = 0
        self.acked = 0
        self.aborted = 0
        self.errors: dict[str, int] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"writer-{prefix}", daemon=True)

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        with self._lock:
            if err is not None:
                self.errors[err.name()] = self.errors.get(err.name(), 0) + 1
            elif b"-aborted-" in (msg.value() or b""):
                self.aborted += 1
            else:
                self.acked += 1

    def _produce(self, i: int, value: bytes) -> None:
        while True:
            try:
                self.producer.produce(self.topic, value=value, key=f"k{i}".encode(),
                                      partition=i % self.partitions, on_delivery=self._delivered)
                return
            except BufferError:
                self.producer.poll(0.05)

    def _run_transactions(self) -> None:
        begin = time.monotonic()
        txns = 0
        while self.sent < self.total:
            count = min(self.per_txn, self.total - self.sent)
            if (time.monotonic() - begin) * self.rate_per_s < self.sent + count:
                self.producer.poll(0.005)
                continue
            txns += 1
            first = self.start_at + self.sent
            try:
                if self.abort_every and txns % self.abort_every == 0:
                    self.producer.begin_transaction()
                    for j in range(count):
                        self._produce(first + j, f"{self.prefix}-aborted-{txns}-{j}".encode())
                    self.producer.flush(60)  # written, then aborted (abort purges what is unsent)
                    self.producer.abort_transaction(60)
                self.producer.begin_transaction()
                for j in range(count):
                    self._produce(first + j, f"{self.prefix}-{first + j}".encode())
                self.producer.commit_transaction(60)
            except KafkaException as exc:
                with self._lock:
                    self.errors[f"transaction: {exc}"] = 1
                return
            self.sent += count

    def _run(self) -> None:
        if self.transactional:
            self._run_transactions()
            return
        begin = time.monotonic()
        while self.sent < self.total:
            due = min(self.total, int((time.monotonic() - begin) * self.rate_per_s) + 1)
            while self.sent < due:
                i = self.start_at + self.sent
                try:
                    self.producer.produce(self.topic, value=f"{self.prefix}-{i}".encode(), key=f"k{i}".encode(),
                                          partition=i % self.partitions, on_delivery=self._delivered)
                except BufferError:
                    self.producer.poll(0.05)
                    continue
                self.sent += 1
            self.producer.poll(0.005)

    def start(self) -> SourceWriter:
        self._thread.start()
        return self

    def stop_after(self, more: int) -> None:
        """Write `more` records beyond what was sent so far, then stop (for a writer started
        with a large `total` to keep records flowing until a fault is over)."""
        self.total = min(self.total, self.sent + more)

    def finish(self, timeout_s: float = 200.0) -> None:
        """Wait until every record was sent and acknowledged."""
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), f"{self.prefix}: only {self.sent} of {self.total} sent in {timeout_s} s"
        left = self.producer.flush(timeout_s)
        assert left == 0, f"{self.prefix}: {left} records unacknowledged"
        assert self.acked == self.total and not self.errors, \
            f"{self.prefix}: {self.acked} of {self.total} acknowledged, errors {self.errors}"

    def run(self) -> None:
        self.start().finish()


def write(bootstrap: str, topic: str, partitions: int, total: int, prefix: str, start: int = 0) -> None:
    SourceWriter(bootstrap, topic, partitions, total, prefix, start=start).run()


# --------------------------------------------------------------------------- history


def topic_id_of(bootstrap: str, topic: str) -> str:
    """The topic's id in the text form the mirror's provenance carries."""
    from cluster.client.sync import SyncAdmin
    from mirror.history import topic_id_text

    with SyncAdmin(bootstrap) as a:
        (desc,) = a.describe_topic_partitions([topic])
    assert desc["error_code"] == 0 and desc["topic_id"] is not None, desc
    return topic_id_text(desc["topic_id"])


def delete_topic(bootstrap: str, topic: str) -> None:
    """Delete `topic` and wait until the cluster no longer lists it."""
    client = admin(bootstrap)
    client.delete_topics([topic], operation_timeout=30, request_timeout=30)[topic].result(timeout=30)
    wait_for(lambda: topic not in topics_of(bootstrap), 30, f"topic {topic} gone")


class Mirrored(NamedTuple):
    """A target record as the history checks see it."""

    topic_id: str | None
    offset: int
    epoch: int
    key: bytes | None
    value: bytes | None


def mirrored_history(rows: list[Rec]) -> list[Mirrored]:
    """The mirrored records of a target partition, in target order."""
    out = []
    for r in rows:
        if not r.mirrored:
            continue
        tid = r.header(SOURCE_TOPIC_ID)
        epoch = r.header(SOURCE_LEADER_EPOCH)
        out.append(Mirrored(tid.decode() if tid else None, int(r.header(SOURCE_OFFSET) or b"-1"),
                            int(epoch) if epoch else -1, r.key, r.value))
    return out


def assert_history(got: list[Mirrored], want: list[tuple[str, Rec]], what: str) -> None:
    """Target records (topic id, source offset, key, value) exactly `want` ((topic id, source
    record) in target order): every record of every incarnation once, in order."""
    g = [(m.topic_id, m.offset, m.key, m.value) for m in got]
    w = [(tid, r.offset, r.key, r.value) for tid, r in want]
    if g == w:
        return
    counts: dict[tuple[Any, ...], int] = {}
    for item in g:
        counts[item[:2]] = counts.get(item[:2], 0) + 1
    dupes = [k for k, n in counts.items() if n > 1]
    missing = [x[:2] for x in w if x[:2] not in counts]
    extra = [x[:2] for x in g if x[:2] not in {y[:2] for y in w}]
    first = next((i for i, (a, b) in enumerate(zip(g, w, strict=False)) if a != b), min(len(g), len(w)))
    raise AssertionError(f"{what}: {len(g)} mirrored, {len(w)} wanted; {len(dupes)} twice (e.g. {dupes[:3]}), "
                         f"{len(missing)} missing (e.g. {missing[:3]}), {len(extra)} not wanted (e.g. {extra[:3]}); "
                         f"first difference at {first}: got {g[first:first + 2]}, want {w[first:first + 2]}")
