"""`dcmirror up` and `dcmirror status`: run a whole topology; one screen of its state.

    dcmirror up --config FILE          every broker, mirror worker and scheduled load as
                                       supervised child processes until SIGINT/SIGTERM
    dcmirror status --config FILE      clusters, brokers up, controller, offline and
                                       under-replicated partitions, mirror lag, last load
                                       (exit 0 healthy, 1 degraded, 2 bad config; --json)

`up` starts every node of every cluster (log: <cluster data_dir>/node-<id>.log), waits until
each cluster has a controller and every broker registered, applies the topology's topics
(as `dcmirror topology apply`), starts the mirror workers (log: next to their status files,
<state dir>/<flow>-w<i>.log) and waits until each reports, then schedules `dcmirror load`
every `load.interval.ms` of the [warehouse] config (0 or absent: never; log:
<warehouse path>/_logs/load.log), and prints one "dcmirror up: ready" line. A child that
exits is restarted with backoff (deploy/supervisor.py). SIGINT or SIGTERM stops the load
and the mirror workers (they hand their partitions over), then every cluster's brokers
with controlled shutdowns. While it runs, `up` keeps its children's pids, restarts and the
last load in <first cluster's data_dir>/../up.json, which `status` reads. Children run in
their own sessions (a Ctrl-C reaches only `up`, which stops them in order), so a `kill -9`
of `up` itself leaves them running: their pids are in up.json.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import trio

from deploy.config_names import CONFIG_NAMES
from deploy.health import ClusterHealth, cluster_health
from deploy.mirror_cmd import state_dir as mirror_state_dir
from deploy.mirror_cmd import worker_argv
from deploy.processes import ChildSpec, ProcessSupervisor, dcmirror_argv
from deploy.status_http import HISTORY_COUNTERS, flow_workers_from_files
from deploy.status_http import flow_reports as gather_flows
from topology import ClusterSpec, Topology, TopologyError, load

READY_POLL_S = 0.25
STATE_WRITE_INTERVAL_S = 1.0
MIRROR_STOP_TIMEOUT_S = 60.0  # workers hand their partitions over on SIGTERM (a load just ends), then SIGKILL
BROKER_STOP_GRACE_S = 10.0  # beyond the cluster's controlled.shutdown.timeout.ms, then SIGKILL
APPLY_TIMEOUT_S = 30.0
LAGGING_FLOW_S = 60.0  # status: a flow whose oldest uncopied record waits longer is degraded
LOAD_INTERVAL_KEY = "load.interval.ms"


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    up = sub.add_parser("up", help="run every broker, mirror worker and scheduled load of a topology, supervised")
    up.add_argument("--config", required=True, help="topology file")
    up.add_argument("--timeout", type=float, default=180.0, metavar="SECONDS",
                    help="how long to wait for the clusters and workers to be ready before giving up (default 180)")
    up.set_defaults(func=cmd_up)

    status = sub.add_parser("status", help="one screen for the whole topology (exit 0 healthy, 1 degraded, "
                                           "2 bad config)")
    status.add_argument("--config", required=True, help="topology file")
    status.add_argument("--json", action="store_true", help="one JSON document")
    status.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                        help="bound on each broker's answer (default 5)")
    status.set_defaults(func=cmd_status)


# ---- where things are ------------------------------------------------------------------------


def state_path(topology: Topology) -> Path:
    """`up`'s state file: beside the first cluster's data directory (where the mirror's
    state directory also lives for flows into it)."""
    first = next(iter(topology.clusters.values()))
    return Path(first.data_dir).parent / "up.json"


def broker_log(topology: Topology, cluster: str, node_id: int) -> Path:
    return Path(topology.cluster(cluster).data_dir) / f"node-{node_id}.log"


def load_interval_s(topology: Topology) -> float:
    """Seconds between scheduled loads (0: none). Raises TopologyError for a bad value."""
    w = topology.warehouse
    if w is None:
        return 0.0
    raw = w.config.get(LOAD_INTERVAL_KEY, "0")
    try:
        value = int(str(raw))
    except ValueError:
        raise TopologyError(f"[warehouse] config {LOAD_INTERVAL_KEY!r} must be a whole number of milliseconds, "
                            f"not {raw!r}", file=str(topology.path) if topology.path else None) from None
    if value < 0:
        raise TopologyError(f"[warehouse] config {LOAD_INTERVAL_KEY!r} must be 0 (no scheduled loads) or more, "
                            f"not {value}", file=str(topology.path) if topology.path else None)
    return value / 1000


def node_name(cluster: ClusterSpec, node_id: int) -> str:
    role = "controller" if cluster.is_controller(node_id) else "broker"
    return f"{role} {cluster.name}-{node_id}"


def child_specs(topology: Topology, config: str) -> tuple[list[ChildSpec], list[ChildSpec], ChildSpec | None]:
    """(brokers and controllers, mirror workers, the scheduled load or None)."""
    nodes = [ChildSpec(node_name(c, a.node_id),
                       dcmirror_argv("broker", "--config", config, "--cluster", c.name, "--node", str(a.node_id)),
                       broker_log(topology, c.name, a.node_id))
             for c in topology.clusters.values() for a in c.nodes]
    workers = [ChildSpec(f"mirror {f.name}-w{i}", worker_argv(config, f.name, i),
                         mirror_state_dir(topology, f) / f"{f.name}-w{i}.log")
               for f in topology.mirrors for i in range(f.workers)]
    interval_s = load_interval_s(topology)
    job = None
    if interval_s > 0 and topology.warehouse is not None:
        # Run in its own log directory: Spark's Python workers put their working directory on
        # sys.path, where a stray grp.py or tarfile.py would shadow the standard library.
        logs = Path(topology.warehouse.path) / "_logs"
        job = ChildSpec("load", dcmirror_argv("load", "--config", config), logs / "load.log",
                        interval_s=interval_s, cwd=logs)
    return nodes, workers, job


def console_spec(topology: Topology, config: str) -> ChildSpec | None:
    """`dcmirror console` when the topology has a [console]; its log beside the first
    cluster's data directory."""
    if topology.console is None:
        return None
    first = next(iter(topology.clusters.values()))
    return ChildSpec("console", dcmirror_argv("console", "--config", config), Path(first.data_dir).parent / "console.log")


def registry_specs(topology: Topology, config: str) -> list[ChildSpec]:
    """`dcmirror registry` for every cluster with a [clusters.NAME.registry]; its log beside
    the cluster's broker logs."""
    return [ChildSpec(f"registry {c.name}", dcmirror_argv("registry", "--config", config, "--cluster", c.name),
                      Path(c.data_dir) / "registry.log")
            for c in topology.clusters.values() if c.registry is not None]


def service_spec(topology: Topology, config: str) -> ChildSpec | None:
    """`dcmirror warehouse serve` when the warehouse config asks for it (load.service =
    "true"): one Spark session that scheduled loads and `warehouse sql` use."""
    if topology.warehouse is None or not topology.warehouse.service:
        return None
    logs = Path(topology.warehouse.path) / "_logs"  # its own cwd, as the load's (see child_specs)
    return ChildSpec("warehouse service", dcmirror_argv("warehouse", "serve", "--config", config),
                     logs / "service.log", cwd=logs)


# ---- dcmirror up -----------------------------------------------------------------------------


def _checked_topology(args: argparse.Namespace, command: str) -> Topology | None:
    """The topology of --config with its load schedule checked, and a positive --timeout;
    None after printing why not (the command exits 2)."""
    try:
        topology = load(args.config, config_names=CONFIG_NAMES)
        load_interval_s(topology)
    except (TopologyError, OSError) as exc:
        print(f"dcmirror {command}: {exc}", file=sys.stderr)
        return None
    if args.timeout <= 0:
        print(f"dcmirror {command}: --timeout must be positive, not {args.timeout:g}", file=sys.stderr)
        return None
    return topology


def cmd_up(args: argparse.Namespace) -> int:
    topology = _checked_topology(args, "up")
    if topology is None:
        return 2
    if (refused := _ports_refused(topology, args.config)) is not None:
        print(refused, file=sys.stderr)
        return 2
    return trio.run(functools.partial(run_up, topology, str(Path(args.config).resolve()), timeout_s=args.timeout))


def _ports_refused(topology: Topology, config: str) -> str | None:
    """Why `up` cannot start (an address it needs is taken, or wanted twice); None: it can."""
    from deploy.ports import clashes, in_use, listen_addresses

    addresses = listen_addresses(topology)
    twice = clashes(addresses)
    if twice:
        return "dcmirror up: " + "; ".join(f"{second} is wanted by both {first.what} and {second.what}"
                                           for first, second in twice) + f" in {config}"
    taken = in_use(addresses)
    if not taken:
        return None
    shown = "; ".join(f"{a} ({a.what})" for a in taken[:5]) + (f"; and {len(taken) - 5} more" if len(taken) > 5 else "")
    return (f"dcmirror up: in use by another process: {shown}. Another `dcmirror up` of this file "
            f"(`dcmirror status --config {config}`), or a process left from a killed one, or something else "
            f"on those ports: stop it, or move the ports in {config}")


def _say(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)


class Up:
    """One `dcmirror up` run: the supervisor, its children and the state file."""

    def __init__(self, topology: Topology, config: str, sup: ProcessSupervisor,
                 say: Callable[[str], None], timeout_s: float) -> None:
        self.topology = topology
        self.timeout_s = timeout_s
        self.config = config
        self.sup = sup
        self.say = say
        self.nodes, self.workers, self.job = child_specs(topology, config)
        self.service = service_spec(topology, config)
        self.registries = registry_specs(topology, config)
        self.console = console_spec(topology, config)
        self.phase = "starting"
        self.started_ms = int(time.time() * 1000)

    # ---- state file ----

    def state(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"pid": os.getpid(), "config": self.config, "phase": self.phase,
                               "started_ms": self.started_ms, "written_ms": int(time.time() * 1000),
                               "children": self.sup.snapshot(), "last_load": None}
        if self.job is not None and self.job.name in self.sup.specs:
            r = self.sup.record(self.job.name)
            doc["load_interval_s"] = self.job.interval_s
            if r.last_exit_s is not None and r.last_run_s is not None:
                finished_ms = int((time.time() - (time.monotonic() - r.last_exit_s)) * 1000)
                doc["last_load"] = {"finished_ms": finished_ms, "exit_code": r.last_exit_code,
                                    "duration_s": round(r.last_run_s, 3), "log": str(self.job.log_path)}
        return doc

    def write_state(self) -> None:
        path = state_path(self.topology)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(self.state(), option=orjson.OPT_INDENT_2))
        tmp.replace(path)

    async def keep_state(self) -> None:
        while True:
            self.write_state()
            await trio.sleep(STATE_WRITE_INTERVAL_S)

    # ---- bringing it up ----

    async def bring_up(self) -> bool:
        started = time.monotonic()
        for c in self.topology.clusters.values():
            self.say(f"starting cluster {c.name} ({c.datacenter}): "
                     + ", ".join(f"node {a.node_id} on {a}" for a in c.nodes)
                     + f"; logs in {c.data_dir}/node-<id>.log")
        for spec in self.nodes:
            self.sup.start(spec)
        if not await self.wait_clusters():
            return False
        await self.apply_topics()
        for spec in self.registries:
            self.sup.start(spec)
            registry = self.topology.cluster(spec.name.removeprefix("registry ")).registry
            assert registry is not None
            self.say(f"starting the {spec.name.removeprefix('registry ')} schema registry on {registry.url}; "
                     f"log {spec.log_path}")
        if self.workers:
            for f in self.topology.mirrors:
                self.say(f"starting mirror flow {f.name}: {f.source} -> {f.target}, {f.workers} worker(s), "
                         f"logs in {mirror_state_dir(self.topology, f)}")
            for spec in self.workers:
                self.sup.start(spec)
            if not await self.wait_workers():
                return False
        if self.console is not None:
            assert self.topology.console is not None
            self.sup.start(self.console)
            # It listens once its first poll of the clusters and workers is in: "ready" waits
            # for that, so a browser opened at "ready" finds it.
            if not await self.wait_console():
                return False
            self.say(f"web console on {self.topology.console.url}/; log {self.console.log_path}")
        if self.service is not None:
            self.sup.start(self.service)
            self.say(f"warehouse service (one Spark session for loads and `warehouse sql`); log "
                     f"{self.service.log_path}")
        if self.job is not None:
            assert self.job.interval_s is not None
            self.sup.start(self.job, delay_s=self.job.interval_s)
            self.say(f"warehouse load (dcmirror load) every {self.job.interval_s:g} s, first in "
                     f"{self.job.interval_s:g} s; log {self.job.log_path}")
        elif self.topology.warehouse is not None:
            self.say(f"no scheduled warehouse loads ({LOAD_INTERVAL_KEY} is 0 or not set): run "
                     f"`dcmirror load --config {self.config}` when you want one")
        self.phase = "ready"
        self.write_state()
        clusters = ", ".join(f"{c.name} {c.bootstrap()}" for c in self.topology.clusters.values())
        self.say(f"dcmirror up: ready in {time.monotonic() - started:.1f} s: {len(self.nodes)} nodes, "
                 f"{len(self.workers)} mirror workers; clusters: {clusters}. "
                 "`dcmirror status --config FILE` shows the state; Ctrl-C stops everything.")
        return True

    def _exited_logs(self, specs: Sequence[ChildSpec]) -> list[str]:
        lines = []
        for spec in specs:
            r = self.sup.record(spec.name)
            if r.last_exit_code is not None:
                lines.append(f"  {spec.name} exited ({r.last_exit_code}) {r.failures} time(s); its log: {spec.log_path}")
                lines += [f"    | {line}" for line in _tail(spec.log_path, 8)]
        return lines

    async def wait_clusters(self) -> bool:
        pending = dict(self.topology.clusters)
        started = time.monotonic()
        last: dict[str, ClusterHealth] = {}
        with trio.move_on_after(self.timeout_s):
            while pending:
                for name, spec in list(pending.items()):
                    health = await cluster_health(spec, 2.0, with_partitions=False)
                    last[name] = health
                    if health.ready:
                        controller = (f"controller {health.controller_id}" if spec.combined else
                                      f"{len(health.controllers_up)} dedicated controllers")
                        self.say(f"cluster {name} ready after {time.monotonic() - started:.1f} s: "
                                 f"{len(health.registered)} brokers registered, {controller}")
                        del pending[name]
                if pending:
                    await trio.sleep(READY_POLL_S)
            return True
        self.say(f"dcmirror up: not ready after {self.timeout_s:g} s:")
        for name in pending:
            waiting = last[name].waiting if name in last else ("no answer",)
            self.say(f"  cluster {name}: " + "; ".join(waiting))
        for line in self._exited_logs(self.nodes):
            self.say(line)
        return False

    async def apply_topics(self) -> None:
        from topology.apply import apply_exit_code, apply_topology, format_apply

        if not self.topology.topics:
            return
        self.say(f"applying the topology's {len(self.topology.topics)} topics (as `dcmirror topology apply`):")
        results = await apply_topology(self.topology, timeout_s=APPLY_TIMEOUT_S)
        for line in format_apply(results, self.topology).splitlines():
            print(f"    {line}", flush=True)
        if apply_exit_code(results) != 0:
            self.say("WARNING: some topics are not as the file says (above); `dcmirror topology plan FILE` shows it")

    async def wait_workers(self) -> bool:
        """Until every worker process wrote a fresh status file (with its own pid)."""
        started = time.monotonic()
        want = {spec.name: (flow, i) for spec, (flow, i) in
                zip(self.workers, [(f.name, i) for f in self.topology.mirrors for i in range(f.workers)], strict=True)}
        missing = list(want)
        with trio.move_on_after(self.timeout_s):
            while True:
                reported = {(w["flow"], w["worker"]): w.get("pid")  # this host's own children: their files
                            for f in self.topology.mirrors
                            for w in flow_workers_from_files(mirror_state_dir(self.topology, f)) if w["age_s"] < 5}
                missing = [name for name, (flow, i) in want.items()
                           if reported.get((flow, f"{flow}-w{i}")) != self.sup.pid(name) or self.sup.pid(name) is None]
                if not missing:
                    self.say(f"{len(want)} mirror workers running after {time.monotonic() - started:.1f} s")
                    return True
                await trio.sleep(READY_POLL_S)
        self.say(f"dcmirror up: mirror workers not reporting after {self.timeout_s:g} s: {', '.join(missing)}")
        for line in self._exited_logs(self.workers):
            self.say(line)
        return False

    async def wait_console(self) -> bool:
        """Until the console accepts connections on its listen address."""
        assert self.console is not None and self.topology.console is not None
        listen = self.topology.console.listen
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(listen.host, listen.host)
        started = time.monotonic()
        with trio.move_on_after(self.timeout_s):
            while True:
                try:
                    stream = await trio.open_tcp_stream(host, listen.port)
                except OSError:
                    await trio.sleep(READY_POLL_S)
                    continue
                await stream.aclose()
                self.say(f"web console listening after {time.monotonic() - started:.1f} s")
                return True
        self.say(f"dcmirror up: the web console is not listening on {listen} after {self.timeout_s:g} s")
        for line in self._exited_logs([self.console]):
            self.say(line)
        return False

    # ---- stopping ----

    async def shut_down(self) -> dict[str, int | None]:
        self.phase = "stopping"
        self.write_state()
        codes: dict[str, int | None] = {}
        kinds = [("the scheduled load", [self.job] if self.job else []),
                 ("the warehouse service", [self.service] if self.service else []),
                 ("the web console", [self.console] if self.console else []),
                 ("schema registries", self.registries), ("mirror workers", self.workers)]
        first = [s.name for _, specs in kinds for s in specs if s.name in self.sup.specs]
        if first:
            t = time.monotonic()
            what = ", ".join(kind for kind, specs in kinds if any(s.name in self.sup.specs for s in specs))
            self.say(f"stopping {len(first)} process(es): {what}")
            codes.update(await self.sup.stop(first, MIRROR_STOP_TIMEOUT_S))
            self.say(f"  stopped in {time.monotonic() - t:.1f} s")
        t = time.monotonic()
        self.say(f"stopping {len(self.nodes)} nodes (controlled shutdown: leadership moves off each broker first)")

        async def stop_cluster(name: str) -> None:
            cluster = self.topology.cluster(name)
            grace = float(cluster.config.get("controlled.shutdown.timeout.ms", 10_000)) / 1000 + BROKER_STOP_GRACE_S
            # All brokers at once: each hands its leadership to the controller while the quorum
            # still stands (one after the other, the last ones would wait out their controlled
            # shutdown without a quorum). Dedicated controllers go last.
            for group in (cluster.brokers, cluster.controllers):
                names = [node_name(cluster, a.node_id) for a in group]
                codes.update(await self.sup.stop([n for n in names if n in self.sup.specs], grace))

        async with trio.open_nursery() as nursery:
            for name in self.topology.clusters:
                nursery.start_soon(stop_cluster, name)
        self.say(f"  stopped in {time.monotonic() - t:.1f} s")
        self.phase = "stopped"
        self.write_state()
        return codes


def _tail(path: Path | None, lines: int) -> list[str]:
    if path is None:
        return []
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 16_384))
            return f.read().decode(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


async def run_up(topology: Topology, config: str, *, timeout_s: float = 180.0,
                 say: Callable[[str], None] = _say) -> int:
    """Supervise the whole topology until SIGINT/SIGTERM. 0 after a clean stop, 1 when it
    never became ready (everything started is stopped again)."""
    result = 0
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            sup = ProcessSupervisor(nursery, on_event=lambda name, text: say(f"{name}: {text}"))
            up = Up(topology, config, sup, say, timeout_s)
            stop = trio.Event()

            async def watch_signals() -> None:
                async for signum in signals:
                    if not stop.is_set():
                        say(f"{signal.Signals(signum).name}: stopping everything")
                        stop.set()

            nursery.start_soon(watch_signals)
            nursery.start_soon(up.keep_state)
            with trio.CancelScope() as startup:
                nursery.start_soon(_cancel_when, stop, startup)
                if not await up.bring_up():
                    result = 1
                    stop.set()
            await stop.wait()
            codes = await up.shut_down()
            unclean = {name: code for name, code in codes.items() if code not in (0, None)}
            if unclean:
                say("dcmirror up: stopped; not clean: " + ", ".join(f"{n} ({c})" for n, c in unclean.items()))
            else:
                ran = sum(code is not None for code in codes.values())
                say(f"dcmirror up: stopped; all {ran} processes exited cleanly")
            nursery.cancel_scope.cancel()
    return result


async def _cancel_when(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


# ---- dcmirror status -------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    topology = _checked_topology(args, "status")
    if topology is None:
        return 2
    doc = trio.run(functools.partial(collect_status, topology, timeout_s=args.timeout))
    if args.json:
        print(orjson.dumps(doc).decode())
    else:
        print(format_status(doc))
    return 0 if doc["healthy"] else 1


async def collect_status(topology: Topology, *, timeout_s: float = 5.0) -> dict[str, Any]:
    """The whole topology's state as one document (what `status --json` prints)."""
    healths: dict[str, ClusterHealth] = {}

    gathered: list[dict[str, Any]] = []

    async def one(name: str) -> None:
        healths[name] = await cluster_health(topology.cluster(name), timeout_s)

    async def workers() -> None:
        gathered.extend(await gather_flows(topology, list(topology.mirrors), timeout_s, mirror_state_dir))

    async with trio.open_nursery() as nursery:  # every cluster and every worker asked at once
        for name in topology.clusters:
            nursery.start_soon(one, name)
        nursery.start_soon(workers)
    clusters = [healths[name].document() for name in topology.clusters]
    problems = [f"cluster {h['cluster']}: {p}" for h in clusters for p in h["problems"]]
    flows = []
    for f in gathered:
        spec = next(m for m in topology.mirrors if m.name == f["flow"])
        live = [w for w in f["workers"] if w.get("reachable")]
        lags = [p.get("lag_s") for w in live for p in w.get("partitions", [])]
        flow = {"flow": f["flow"], "source": f["source"], "target": f["target"], "workers": spec.workers,
                "via": f["via"], "worker_states": [
                    {k: w.get(k) for k in ("worker", "address", "reachable", "error", "records", "lag_records",
                                           "records_per_s_recent", "last_problem")} for w in f["workers"]],
                "live_workers": f["live_workers"], "records": f["records"],
                "lag_records": f["lag_records"] if live else None,
                "lag_s_max": max((x for x in lags if x is not None), default=0.0) if live else None,
                "partitions": sum(len(w.get("partitions", [])) for w in live),
                "data_loss_records": f["data_loss_records"], "schema_sync": f.get("schema_sync"),
                **{key: f.get(key, 0) for key in HISTORY_COUNTERS}}
        flows.append(flow)
        if f["live_workers"] < spec.workers:
            silent = [f"{w['worker']} at {w['address']}: {w['error']}" for w in f["workers"]
                      if not w.get("reachable") and w.get("error")]
            problems.append(f"flow {f['flow']}: {f['live_workers']} of {spec.workers} workers reporting"
                            + (" (" + "; ".join(silent) + ")" if silent else ""))
        if flow["lag_s_max"] is not None and flow["lag_s_max"] > LAGGING_FLOW_S:
            problems.append(f"flow {f['flow']}: lagging: {flow['lag_records']:,} records to copy, the oldest waiting "
                            f"{flow['lag_s_max']:.0f} s (more than {LAGGING_FLOW_S:.0f} s)")
        if f["data_loss_records"]:
            problems.append(f"flow {f['flow']}: {f['data_loss_records']} records lost at the source "
                            "(removed before they were mirrored)")
        if f.get("diverged_records"):
            problems.append(f"flow {f['flow']}: {f['diverged_records']} mirrored offsets no longer at the source as "
                            "mirrored (see `dcmirror mirror status`)")
        if f.get("dead_letter_records"):
            problems.append(f"flow {f['flow']}: {f['dead_letter_records']} records the target cannot take "
                            "(dead letters, see `dcmirror mirror status`)")
    up, scheduled = _up_state(topology)
    last_load = _last_load(topology, scheduled)
    if last_load is not None and last_load["status"] != "ok":
        problems.append(f"the last warehouse load failed: {last_load.get('error') or last_load['status']}"
                        + (f" (log: {last_load['log']})" if last_load.get("log") else ""))
    interval_s = load_interval_s(topology)
    down = not any(c["brokers_up"] for c in clusters) and not any(f["live_workers"] for f in flows)
    return {"config": str(topology.path) if topology.path else None, "healthy": not problems,
            "state": "HEALTHY" if not problems else "DOWN" if down else "DEGRADED", "problems": problems, "clusters": clusters, "flows": flows, "warehouse": topology.warehouse is not None,
            "load_interval_s": interval_s, "last_load": last_load, "up": up}


def _schema_cell(sync: dict[str, Any] | None) -> str:
    """A flow's schema sync in one cell: context, versions copied, last round, errors."""
    if sync is None:
        return "-"
    text = f"{sync['context']} {sync['schemas_copied']} copied"
    if sync.get("last_sync_ms"):
        text += f", synced {_ago(sync['last_sync_ms'])}"
    if sync.get("errors"):
        text += f", {sync['errors']} ERRORS"
    return text


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


LAST_LOAD_FILE = "last_load.json"  # written by `dcmirror load` (spark_aggregate) in the warehouse path


def _last_load(topology: Topology, scheduled: dict[str, Any] | None) -> dict[str, Any] | None:
    """The last load: what `dcmirror load` wrote into <warehouse path>/last_load.json (any load,
    scheduled or by hand), else what `up` saw of its scheduled one (exit code only)."""
    if topology.warehouse is None:
        return None
    try:
        doc = orjson.loads((Path(topology.warehouse.path) / LAST_LOAD_FILE).read_bytes())
        finished = doc.get("finished_at") or doc.get("started_at")
        return {"status": str(doc.get("status", "unknown")),
                "finished_ms": int(datetime.fromisoformat(finished).timestamp() * 1000) if finished else None,
                "duration_s": doc.get("seconds"), "rows": doc.get("rows"), "error": doc.get("error"),
                "log": scheduled.get("log") if scheduled else None}
    except (OSError, orjson.JSONDecodeError, ValueError, TypeError, AttributeError):
        pass
    if scheduled is None:
        return None
    return {"status": "ok" if scheduled.get("exit_code") == 0 else f"failed (exit {scheduled.get('exit_code')})",
            "finished_ms": scheduled.get("finished_ms"), "duration_s": scheduled.get("duration_s"), "rows": None,
            "error": None, "log": scheduled.get("log")}


def _up_state(topology: Topology) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(`up`'s pid, phase and restarts if it runs, the last load it ran) from its state file."""
    try:
        doc = orjson.loads(state_path(topology).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None, None
    running = isinstance(doc.get("pid"), int) and _pid_alive(doc["pid"]) and doc.get("phase") != "stopped"
    children = doc.get("children", [])
    up = {"pid": doc.get("pid"), "running": running, "phase": doc.get("phase") if running else "stopped",
          "children": len(children), "restarts": sum(c.get("restarts", 0) for c in children),
          "load_interval_s": doc.get("load_interval_s")}
    return up, doc.get("last_load")


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _ago(ms: float) -> str:
    s = max(0.0, time.time() - ms / 1000)
    return f"{s:.0f} s ago" if s < 120 else f"{s / 60:.0f} min ago" if s < 7200 else f"{s / 3600:.1f} h ago"


def _controller_cell(c: dict[str, Any]) -> str:
    if c["controllers"]:
        return f"dedicated {len(c['controllers_up'])}/{len(c['controllers'])} up"
    return "-" if c["controller"] is None else str(c["controller"])


def format_status(doc: dict[str, Any]) -> str:
    state = doc.get("state") or ("HEALTHY" if doc["healthy"] else "DEGRADED")
    lines = [f"dcmirror status: {doc['config']}: "
             + (state if doc["healthy"] else f"{state} ({len(doc['problems'])} problem(s))")
             + (": no broker and no mirror worker answers" if state == "DOWN" else ""), ""]
    rows = [["CLUSTER", "DC", "BROKERS-UP", "REGISTERED", "CONTROLLER", "TOPICS", "PARTITIONS", "OFFLINE",
             "UNDER-REPLICATED"]]
    for c in doc["clusters"]:
        rows.append([c["cluster"], c["datacenter"], f"{len(c['brokers_up'])}/{len(c['brokers'])}",
                     f"{len(c['brokers_registered'])}/{len(c['brokers'])}",
                     _controller_cell(c), str(c["topics"]),
                     str(c["partitions"]), str(len(c["offline_partitions"])),
                     str(len(c["under_replicated_partitions"]))])
    lines += _table(rows)
    if doc["flows"]:
        rows = [["FLOW", "SOURCE", "TARGET", "WORKERS", "PARTITIONS", "MIRRORED", "LAG-RECORDS", "LAG-S",
                 "SCHEMAS"]]
        for f in doc["flows"]:
            rows.append([f["flow"], f["source"], f["target"], f"{f['live_workers']}/{f['workers']}",
                         str(f["partitions"]), str(f["records"]),
                         "?" if f["lag_records"] is None else str(f["lag_records"]),
                         "?" if f["lag_s_max"] is None else f"{f['lag_s_max']:.1f}",
                         _schema_cell(f.get("schema_sync"))])
        lines += ["", *_table(rows)]
    lines.append("")
    load = doc["last_load"]
    if load is not None:
        parts = ["ok" if load["status"] == "ok" else f"FAILED: {load.get('error') or load['status']}"]
        if load.get("finished_ms"):
            parts.append(f"finished {_ago(load['finished_ms'])}")
        if load.get("duration_s") is not None:
            parts.append(f"took {load['duration_s']:.1f} s")
        if load.get("rows") is not None:
            parts.append(f"{load['rows']:,} rows")
        if load.get("log"):
            parts.append(f"log {load['log']}")
        lines.append("last load: " + ", ".join(parts))
    elif not doc["warehouse"]:
        lines.append("last load: - (the topology has no [warehouse])")
    elif not doc["load_interval_s"]:
        lines.append("last load: unknown (`dcmirror up` schedules no loads: load.interval.ms is 0 or not set)")
    else:
        lines.append("last load: unknown (none run by `dcmirror up` yet)")
    up = doc["up"]
    if up is not None and up["running"]:
        lines.append(f"dcmirror up: pid {up['pid']}, {up['phase']}, {up['children']} children, "
                     f"{up['restarts']} restart(s)")
    else:
        lines.append("dcmirror up: not running for this topology (`dcmirror up --config FILE` starts it)")
    if doc["problems"]:
        lines += ["", "problems:"] + [f"  - {p}" for p in doc["problems"]]
    return "\n".join(lines)

