"""`dcmirror mirror`: run a topology's mirror workers.

    dcmirror mirror --config FILE [--flow NAME]              every worker of the flows, each a
                                                             supervised child process
    dcmirror mirror --config FILE --flow NAME --worker N     one worker in this process
    dcmirror mirror status --config FILE [--json]            what the workers last reported
    dcmirror mirror pause --config FILE --flow NAME [--reason TEXT]
    dcmirror mirror resume --config FILE --flow NAME         stop / go on copying (mirror/flow_control.py)

Each worker serves its status (per partition lag, throughput, claims, data loss, last
problem) on its admin HTTP (`workers_http`, or config http.port.base) at /v1/status, which
`mirror status` and `dcmirror status` ask over the network (deploy/status_http.py). It also
writes it every second to <state dir>/<flow>/<worker>.json, the state dir being `mirror` next
to the target cluster's data directory: what status reads for flows without addresses.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import re
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import trio

log = logging.getLogger("dcmirror.mirror")

STATUS_INTERVAL_S = 1.0
STATUS_TIMEOUT_S = 3.0
WORKER_FENCED_EXIT = 78  # EX_CONFIG: another worker of the flow runs under this one's name
WORKER_STOP_TIMEOUT_S = 30.0  # then SIGKILL (a worker hands its partitions over on SIGTERM)


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    mirror = sub.add_parser("mirror", help="run mirror workers (or: mirror status | pause | resume | translate | "
                                           "promote | failover | failback)")
    mirror.add_argument("action", nargs="?", default="run",
                        choices=["run", "status", "pause", "resume", "translate", "promote", "failover", "failback"],
                        help="pause / resume (a flow's workers stop fetching and writing, and go on where they "
                             "stopped: a record in the target's dcmirror.flow-control, which needs WRITE on that "
                             "topic there), promote (planned: the copy side of a mirror-topics flow becomes the primary, nothing "
                             "lost), failover (the source is gone: the target's mirror topics become writable; "
                             "prints the RPO), failback (the old source is back: its topics become mirror topics "
                             "of the target's, records it took after the failover go to a side topic)")
    mirror.add_argument("--config", required=True, help="topology file")
    mirror.add_argument("--flow", help="only this flow (default: every flow of the file)")
    mirror.add_argument("--worker", type=worker_index,
                        help="run worker N of --flow in this process; `hostname`: N is the number ending the "
                             "host name (a Kubernetes StatefulSet pod's ordinal, e.g. mirror-east-3 -> 3)")
    mirror.add_argument("--name", help="with --worker: the worker's identity in heartbeats, status and metrics "
                                       "(default FLOW-wN); unique per flow")
    mirror.add_argument("--timeout", type=float, default=STATUS_TIMEOUT_S,
                        help=f"status: seconds to wait for each worker's answer (default {STATUS_TIMEOUT_S:g})")
    mirror.add_argument("--json", action="store_true", help="status, translate, promote, failover, failback: one "
                                                            "JSON document")
    mirror.add_argument("--wait", type=float, default=300.0,
                        help="promote, failover, failback: seconds to wait for each step (default 300)")
    mirror.add_argument("--reason", default="",
                        help="pause: why, shown in the workers' status (one line, at most 200 characters)")
    mirror.add_argument("--group", help="translate: the source consumer group to move to the target")
    mirror.add_argument("--live", action="store_true",
                        help="translate: compute from the source's committed offsets now (the source must be up) "
                             "instead of reading the workers' checkpoints")
    mirror.add_argument("--apply", action="store_true",
                        help="translate: commit the translated offsets for the group in the target "
                             "(the group must have no active members there)")
    mirror.set_defaults(func=cmd_mirror)


def worker_index(text: str) -> int:
    """--worker N, or `hostname`: the ordinal ending this host's name (StatefulSet pod-N)."""
    if text == "hostname":
        host = os.environ.get("HOSTNAME") or socket.gethostname()
        match = re.search(r"-(\d+)$", host.split(".")[0])
        if match is None:
            raise argparse.ArgumentTypeError(f"--worker hostname: host name {host!r} does not end in -N "
                                             "(a StatefulSet pod's ordinal)")
        return int(match.group(1))
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"--worker takes a worker number or `hostname`, not {text!r}")
    return int(text)


def state_dir(topology: Any, flow: Any) -> Path:
    return Path(topology.cluster(flow.target).data_dir).parent / "mirror" / flow.name


def cmd_mirror(args: argparse.Namespace) -> int:
    from mirror.worker import flows_of
    from topology import TopologyError, load

    try:
        topology = load(args.config)
        flows = flows_of(topology, args.flow)
    except (TopologyError, ValueError) as exc:
        print(f"dcmirror mirror: {exc}", file=sys.stderr)
        return 1
    if args.action == "status":
        return show_status(topology, flows, as_json=args.json, timeout_s=args.timeout)
    if args.action == "translate":
        if not args.group:
            print("dcmirror mirror translate: --group is required", file=sys.stderr)
            return 1
        return trio.run(translate_group, topology, flows, args.group, args.live, args.apply, args.json)
    if args.action in ("pause", "resume"):
        if args.flow is None:
            print(f"dcmirror mirror {args.action}: --flow is required", file=sys.stderr)
            return 1
        return pause_or_resume(topology, flows[0], args.action == "pause", args.reason, args.json)
    if args.action in ("promote", "failover", "failback"):
        if args.flow is None:
            print(f"dcmirror mirror {args.action}: --flow is required", file=sys.stderr)
            return 1
        return disaster_recovery(topology, flows[0], args.action, args.wait, args.json)
    if args.worker is not None:
        if args.flow is None:
            print("dcmirror mirror: --worker needs --flow", file=sys.stderr)
            return 1
        if not 0 <= args.worker < flows[0].workers:
            print(f"dcmirror mirror: flow {flows[0].name} has {flows[0].workers} worker(s), numbered "
                  f"0 to {flows[0].workers - 1}; there is no worker {args.worker}", file=sys.stderr)
            return 1
        try:
            return run_worker(topology, flows[0], args.worker, args.name)
        except ValueError as exc:  # a bad http.* setting (named), before the worker starts
            print(f"dcmirror mirror: {exc}", file=sys.stderr)
            return 1
    return supervise(args.config, flows)


def disaster_recovery(topology: Any, flow: Any, action: str, wait_s: float, as_json: bool) -> int:
    """`mirror promote | failover | failback` of one mirror-topics flow (mirror/failover.py)."""
    from mirror.failover import RETRIABLE, FailoverError, gather_worker_views, run_action
    from mirror.worker import WorkerConfig

    if not flow.mirror_topics:
        print(f"dcmirror mirror {action}: flow {flow.name} has no mirror topics (mirror_topics = true)", file=sys.stderr)
        return 1
    config = WorkerConfig.from_flow(flow)
    say = (lambda text: None) if as_json else (lambda text: print(text, flush=True))
    known: Any = {}
    deleted: Any = {}
    if action == "failover":
        # How far the source was known to be, and when: the workers' last status (HTTP or
        # files), kept by a worker after its partitions were revoked (the source's death
        # takes the group with it); and the source topics they saw deleted.
        known, deleted = gather_worker_views(flow_reports(topology, [flow]))
    try:
        outcome = trio.run(functools.partial(run_action, topology, flow, action, source=config.source,
                                             target=config.target, known=known, deleted_sources=deleted,
                                             timeout_s=wait_s, say=say, client_id=f"dcmirror-{action}"))
    except FailoverError as exc:
        print(f"dcmirror mirror {action}: {exc}", file=sys.stderr)
        return 1
    except (*RETRIABLE, trio.TooSlowError) as exc:
        print(f"dcmirror mirror {action}: {exc or type(exc).__name__}", file=sys.stderr)
        return 1
    if as_json:
        print(orjson.dumps(outcome.as_json(), option=orjson.OPT_INDENT_2).decode())
    else:
        print("\n".join(outcome.lines()))
    return 0


def pause_or_resume(topology: Any, flow: Any, paused: bool, reason: str, as_json: bool) -> int:
    """`mirror pause | resume`: the flow's control record in its target cluster, written with
    the client settings the topology gives that cluster (and the flow's target.* principal,
    as promote connects); the target's brokers check the principal's WRITE on the topic."""
    from mirror.flow_control import (
        FLOW_CONTROL_TOPIC,
        FlowControlDenied,
        FlowControlError,
        set_flow_paused,
    )
    from mirror.worker import RETRIABLE, WorkerConfig

    action = "pause" if paused else "resume"
    if reason and not paused:
        print("dcmirror mirror resume: --reason is for pause", file=sys.stderr)
        return 1
    client = topology.cluster(flow.target).client_config(WorkerConfig.from_flow(flow).target)
    try:
        control = trio.run(functools.partial(set_flow_paused, client, flow.name, paused, reason,
                                             now_ms=int(time.time() * 1000), cluster_name=flow.target,
                                             client_id=f"dcmirror-mirror-{action}"))
    except (FlowControlDenied, FlowControlError, *RETRIABLE) as exc:
        print(f"dcmirror mirror {action}: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(orjson.dumps({"flow": flow.name, "target": flow.target, "topic": FLOW_CONTROL_TOPIC,
                            "paused": control.paused, "at_ms": control.at_ms, "reason": control.reason}).decode())
    else:
        print(f"flow {flow.name}: {'PAUSED' if paused else 'RESUMED'} ({FLOW_CONTROL_TOPIC} in {flow.target}"
              + (f", reason: {control.reason}" if control.reason else "") + "); its workers follow within "
              "flow.control.poll.ms, `dcmirror mirror status` shows when they did")
    return 0


def worker_http_security(config: Any) -> Any:
    """A worker's admin HTTP guard from its flow's http.auth.token / http.ssl.keystore.location."""
    from cluster.common.admin_http import HttpSecurity
    from cluster.common.secrets import secret
    from cluster.security.tls import https_context

    return HttpSecurity(
        secret(config.http_auth_token, "http.auth.token") if config.http_auth_token else None,
        https_context(Path(config.http_keystore), "http.ssl.keystore.location") if config.http_keystore else None)


def run_worker(topology: Any, flow: Any, index: int, name: str | None = None) -> int:
    from cluster.common.taskdump import dump_on_signal
    from mirror.worker import MirrorWorker, ProblemRecorder

    name = name or f"{flow.name}-w{index}"
    worker: Any
    if flow.mirror_topics:
        from mirror.mirror_topics import MirrorTopicsFlowWorker

        worker = MirrorTopicsFlowWorker(topology, flow, name)
    else:
        worker = MirrorWorker(topology, flow, name)
    logging.getLogger("dcmirror").addHandler(ProblemRecorder(worker))  # its last warning, in its status
    http_security = worker_http_security(worker.config)  # bad settings fail the start, naming the setting
    out = state_dir(topology, flow) / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)

    async def report() -> None:
        while True:
            await trio.sleep(STATUS_INTERVAL_S)
            try:
                status = worker.status() | {"reported_ms": int(time.time() * 1000), "pid": os.getpid()}
            except AssertionError:
                continue  # not started yet
            tmp = out.with_suffix(".tmp")
            tmp.write_bytes(orjson.dumps(status, option=orjson.OPT_INDENT_2))
            tmp.replace(out)

    async def main() -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(worker.run)
                nursery.start_soon(report)
                nursery.start_soon(dump_on_signal)  # kill -USR1: where every task waits, in the log
                address = flow.http_address(index)
                if address is not None:
                    from cluster.common.admin_http import serve

                    bind_host = flow.config.get("http.host", address[0])  # e.g. 0.0.0.0 in a pod
                    nursery.start_soon(functools.partial(serve, security=http_security), bind_host, address[1],
                                       worker.routes())
                async for signum in signals:
                    log.info("worker %s: %s, handing its partitions over", name, signal.Signals(signum).name)
                    with trio.move_on_after(90):
                        await worker.stop()
                    nursery.cancel_scope.cancel()
                    break

    log.info("mirror worker %s: %s -> %s, topics /%s/%s", name, flow.source, flow.target, flow.topics,
             f" except /{flow.exclude}/" if flow.exclude else "")
    try:
        trio.run(main)
    except BaseException:
        # Fenced, the worker stops wherever it was (a poll, a claim): any error then is that.
        if worker.fenced() is None:
            raise
    fenced = worker.fenced()
    if fenced is not None:
        # Another worker runs under this name (a copy on another host): the newer one keeps
        # the partitions; this one stops rather than take them back in turn.
        print(f"dcmirror mirror: worker {name}: {fenced}; names are unique per flow "
              "(--worker N, --name)", file=sys.stderr)
        return WORKER_FENCED_EXIT
    return 0


def supervise(config: str, flows: list[Any]) -> int:
    """Every worker as a child process, restarted with backoff when it exits; SIGTERM/SIGINT
    stops them all."""
    from deploy.processes import ChildSpec, run_until_signalled

    specs = [ChildSpec(f"{f.name}-w{i}", worker_argv(config, f.name, i)) for f in flows for i in range(f.workers)]
    return trio.run(functools.partial(run_until_signalled, specs, stop_timeout_s=WORKER_STOP_TIMEOUT_S))


def worker_argv(config: str, flow: str, index: int) -> list[str]:
    from deploy.processes import dcmirror_argv

    return dcmirror_argv("mirror", "--config", config, "--flow", flow, "--worker", str(index))


def flow_reports(topology: Any, flows: list[Any], timeout_s: float = STATUS_TIMEOUT_S) -> list[dict[str, Any]]:
    """Per flow: its workers' state, over their admin HTTP (deploy/status_http.py)."""
    from deploy.status_http import flow_reports as gather

    return trio.run(gather, topology, flows, timeout_s, state_dir)


EVENTS_SHOWN = 5  # per worker, newest last (--json has them all)


def _event_text(e: dict[str, Any]) -> str:
    """One line for a history event of a worker's status (mirror/worker.py `_event`)."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(e.get("at_ms", 0) / 1000))
    where = f"{e.get('topic')}-{e.get('partition')}"
    kind = e.get("kind")
    if kind == "diverged":
        what = (f"DIVERGED: source offsets {e.get('start_offset')}..{e.get('end_offset')} ({e.get('offsets')}) "
                f"no longer at the source as mirrored (epoch {e.get('mirrored_epoch')}); kept in {e.get('target_topic')}")
    elif kind == "source_recreated":
        what = (f"source topic created again (topic id {e.get('old_topic_id')} -> {e.get('new_topic_id')}); "
                f"mirroring it from offset {e.get('resume_offset')}")
    elif kind == "target_refilled":
        what = f"target lost records; refilled from source offset {e.get('resume_offset')}" + (
            f", {e.get('source_gone')} no longer at the source" if e.get("source_gone") else "")
    elif kind == "dead_letter":
        what = f"DEAD LETTER: offset {e.get('offset')} ({e.get('size_bytes')} bytes): {e.get('reason')}"
    else:
        what = str(kind)
    return f"{when} UTC {where}: {what}"


def _paused_text(f: dict[str, Any]) -> str:
    since = f.get("paused_since_ms")
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since / 1000)) if since else "?"
    return f", PAUSED since {when}" + (f" ({f['pause_reason']})" if f.get("pause_reason") else "")


def show_status(topology: Any, flows: list[Any], *, as_json: bool, timeout_s: float = STATUS_TIMEOUT_S) -> int:
    report = flow_reports(topology, flows, timeout_s)
    # Unhealthy: a declared worker did not answer. A stale status file is a worker that was
    # (often: a replaced one), not a declared worker missing, so it does not count.
    healthy = all(f["live_workers"] == len(f["workers"]) or f["via"] == "files" for f in report)
    if as_json:
        print(orjson.dumps(report).decode())
        return 0 if healthy else 1
    for f in report:
        print(f"flow {f['flow']}: {f['source']} -> {f['target']}: {f['live_workers']} live worker(s), "
              f"{f['records']} records mirrored, lag {f['lag_records']} records"
              + (f", DATA LOSS {f['data_loss_records']} records" if f["data_loss_records"] else "")
              + (f", DIVERGED {f['diverged_records']} offsets in {f['divergences']} divergence(s)"
                 if f.get("divergences") else "")
              + (f", {f['source_recreations']} source topic re-creation(s)" if f.get("source_recreations") else "")
              + (f", {f['target_refills']} target refill(s)" if f.get("target_refills") else "")
              + (f", {f['dead_letter_records']} DEAD LETTER(S)" if f.get("dead_letter_records") else "")
              + (_paused_text(f) if f.get("paused") else "")
              + ("" if f["via"] == "http" else " (from this host's status files: the flow declares no worker "
                                               "admin HTTP addresses)"))
        sync = f.get("schema_sync")
        if sync is not None:
            age = (f"{(time.time() * 1000 - sync['last_sync_ms']) / 1000:.1f} s ago" if sync.get("last_sync_ms")
                   else "not yet")
            print(f"  schemas into context {sync['context']}: {sync['schemas_copied']} version(s) copied, "
                  f"{sync['deletes_followed']} delete(s) followed, last round {age}"
                  + (f", {sync['errors']} ERROR(S), last: {sync['last_errors'][-1]}" if sync.get("errors")
                     and sync.get("last_errors") else ""))
        for w in f["workers"]:
            where = f" at {w['address']}" if w.get("address") else ""
            if not w.get("reachable"):
                if w.get("error"):
                    print(f"  {w['worker']}{where}: NOT ANSWERING ({w['error']})")
                else:
                    print(f"  {w['worker']}: gone (last reported {w.get('age_s', 0):.0f} s ago)")
                continue
            parts = ", ".join(f"{p['topic']}-{p['partition']} lag {p['lag_records']}"
                              + (f" {p['state']}" if p.get("state", "MIRRORING") != "MIRRORING" else "")
                              for p in w.get("partitions", []))
            rate = w.get("records_per_s_recent")
            rate_text = f"{rate:.0f}/s now" if rate is not None else f"{w.get('records_per_s', 0):.0f}/s"
            problem = w.get("last_problem")
            print(f"  {w['worker']}{where}: {'PAUSED, ' if w.get('paused') else ''}{w.get('records', 0)} records, "
                  f"{rate_text}, claims {w.get('claims', 0)}; "
                  f"{parts or 'no partitions'}"
                  + (f"; last problem {problem['level']}: {problem['message']}" if problem else ""))
            for e in w.get("events", [])[-EVENTS_SHOWN:]:
                print(f"    {_event_text(e)}")
    return 0 if healthy else 1


async def translate_group(topology: Any, flows: list[Any], group: str, live: bool, apply: bool, as_json: bool) -> int:
    """The group's offsets translated into each flow's target: from the checkpoints the workers
    wrote (works with the source down), or --live from the source's committed offsets."""
    from cluster.client.admin import Admin, AdminError
    from cluster.client.config import admin_config
    from cluster.client.consumer import Consumer
    from cluster.client.errors import KafkaError
    from cluster.client.metadata import ClientCluster
    from mirror import checkpoints

    rows: list[dict[str, Any]] = []
    status = 0
    for flow in flows:
        target = topology.cluster(flow.target)
        found: dict[tuple[str, int], checkpoints.Checkpoint] = {}
        try:
            if live:
                source = topology.cluster(flow.source)
                async with Admin(source.bootstrap(), config=dict(source.client)) as sadmin:
                    committed = await sadmin.committed_offsets(group)
                tcluster = ClientCluster(admin_config(target.client_config()))
                try:
                    for (topic, p), offset in sorted(committed.items()):
                        if not flow.matches(topic):
                            continue
                        ttopic = flow.target_topic(topic, source.datacenter)
                        t = await checkpoints.translate(tcluster, ttopic, p, flow.source, p, offset)
                        if t is not None:
                            found[(topic, p)] = checkpoints.Checkpoint(group, flow.source, topic, p, offset, ttopic,
                                                                       t, int(time.time() * 1000))
                        else:
                            print(f"{flow.name}: {topic}-{p} committed at {offset} is not mirrored that far yet",
                                  file=sys.stderr)
                            status = 1
                finally:
                    await tcluster.aclose()
            else:
                async with Consumer({**target.client_config(), "auto.offset.reset": "earliest"}) as c:
                    ends = await c.end_offsets([(checkpoints.CHECKPOINTS_TOPIC, 0)])
                    end = ends[(checkpoints.CHECKPOINTS_TOPIC, 0)]
                    c.assign([(checkpoints.CHECKPOINTS_TOPIC, 0)])
                    c.seek((checkpoints.CHECKPOINTS_TOPIC, 0), 0)
                    while (c.position((checkpoints.CHECKPOINTS_TOPIC, 0)) or 0) < end:
                        for records in (await c.getmany(timeout_s=5.0)).values():
                            for record in records:
                                if record.value is None:
                                    continue
                                cp = checkpoints.Checkpoint.parse(record.value)
                                if cp.group == group and cp.source == flow.source:
                                    found[(cp.topic, cp.partition)] = cp
        except (KafkaError, AdminError, OSError) as exc:
            print(f"dcmirror mirror translate: flow {flow.name}: {exc}", file=sys.stderr)
            status = 1
            continue
        offsets = {(cp.target_topic, cp.partition): cp.target_offset for cp in found.values()}
        for cp in sorted(found.values(), key=lambda c: (c.topic, c.partition)):
            rows.append({"flow": flow.name, **cp.__dict__})
        if apply and offsets:
            try:
                async with Admin(target.bootstrap(), config=dict(target.client)) as tadmin:
                    await tadmin.commit_offsets(group, offsets)
            except (KafkaError, AdminError, OSError) as exc:
                print(f"dcmirror mirror translate: committing in {flow.target}: {exc}", file=sys.stderr)
                status = 1
    if as_json:
        print(orjson.dumps(rows).decode())
    else:
        for row in rows:
            print(f"{row['flow']}: {row['group']} {row['topic']}-{row['partition']} @ {row['source_offset']} -> "
                  f"{row['target_topic']}-{row['partition']} @ {row['target_offset']}")
        if apply:
            print(f"committed {len(rows)} offsets for group {group!r} in the target cluster(s)")
    return status
