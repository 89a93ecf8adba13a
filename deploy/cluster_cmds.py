"""`dcmirror topics|elect-leaders|reassign`, like kafka-topics, kafka-leader-election and
kafka-reassign-partitions. Each takes `--bootstrap HOST:PORT,...` or `--config FILE --cluster NAME`."""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from cluster.client.admin import Admin, AdminError
from cluster.client.connection import KafkaConnectionError
from cluster.client.replica_verification import ReplicaReadError, verify_replicas
from cluster.controller.assignment import AssignmentError, assign_replicas
from cluster.protocol.errors import ErrorCode

ELECTION_TYPES = {"preferred": 0, "unclean": 1}


class _ConfigOption(argparse.Action):
    """`--config` of a command that mirrors kafka-topics: KEY=VALUE is a topic config as in
    Kafka's tool (appended to `topic_config`), anything else the topology file."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        value = str(values)
        if "=" in value and not Path(value).exists():
            namespace.topic_config = [*(getattr(namespace, "topic_config", None) or []), value]
        else:
            namespace.config = value


def add_target(p: argparse.ArgumentParser, cluster_flag: str = "--cluster", topic_configs: bool = False) -> None:
    """--bootstrap (Kafka's --bootstrap-server too), or --config/--topology FILE with
    `cluster_flag` NAME (acls keep --cluster for the cluster resource, as kafka-acls);
    --command-config. With `topic_configs` (topics create/alter, as kafka-topics), a
    `--config KEY=VALUE` is a topic config."""
    p.add_argument("--bootstrap", "--bootstrap-server", dest="bootstrap", metavar="HOST:PORT[,...]",
                   help="the cluster's brokers (--bootstrap-server as in Kafka's tools)")
    if topic_configs:
        p.add_argument("--config", "--topology", dest="config", action=_ConfigOption, metavar="FILE|KEY=VALUE",
                       help=f"the topology file (with {cluster_flag} instead of --bootstrap); KEY=VALUE is a "
                            "topic config as in kafka-topics (repeatable)")
    else:
        p.add_argument("--config", "--topology", dest="config", metavar="FILE",
                       help=f"topology file (with {cluster_flag} instead of --bootstrap)")
    p.add_argument(cluster_flag, dest="target_cluster", metavar="NAME", help="cluster name in the topology file")
    p.add_argument("--command-config", metavar="FILE",
                   help="client properties (security.protocol, sasl.*, ssl.*; secrets as "
                        "${file:...}/${env:...}) over the topology cluster's `client` table")


def _bootstrap(args: argparse.Namespace) -> str:
    if args.bootstrap:
        return str(args.bootstrap)
    if args.config and args.target_cluster:
        from topology import load

        return load(args.config).cluster(args.target_cluster).bootstrap()
    raise ValueError("give --bootstrap HOST:PORT or --config FILE --cluster NAME")


def admin_for(args: argparse.Namespace, client_id: str = "dcmirror-admin") -> Admin:
    """The admin client for the command's cluster: --bootstrap, or --config --cluster (the
    topology cluster's client listener and `client` security settings), overlaid by the
    --command-config properties file."""
    from cluster.common.secrets import read_properties_file

    client: dict[str, str] = {}
    if not args.bootstrap and args.config and args.target_cluster:
        from topology import load

        client = dict(load(args.config).cluster(args.target_cluster).client)
    if getattr(args, "command_config", None):
        client.update(read_properties_file(Path(args.command_config), "--command-config"))
    return Admin(_bootstrap(args), client_id=client_id, config=client)


def _kv(pairs: list[str], flag: str) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} {pair!r} must be KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    topics = sub.add_parser("topics", help="create, list, describe, alter, delete topics")
    actions = topics.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="create a topic")
    create.add_argument("topic", help="the topic's name")
    create.add_argument("--partitions", type=int, default=-1, help="partition count (default: the broker's num.partitions)")
    create.add_argument("--replication-factor", type=int, default=-1, help="replicas per partition (default: the broker's default.replication.factor)")
    create.add_argument("--replica-assignment", help="manual: 1:2,2:3,3:1 (partitions by comma, replicas by colon)")
    create.add_argument("--set", dest="topic_config", action="append", default=[], metavar="KEY=VALUE",
                        help="topic config (Kafka's names), repeatable")
    create.add_argument("--if-not-exists", action="store_true", help="a topic of that name already there is no error")
    lst = actions.add_parser("list", help="topic names")
    describe = actions.add_parser("describe", help="partitions, leaders, replicas, ISR, configs")
    describe.add_argument("topics", nargs="*", help="topics to describe (default: every one)")
    describe.add_argument("--under-replicated", action="store_true", help="only partitions whose ISR is short")
    describe.add_argument("--unavailable", action="store_true", help="only partitions without a leader")
    describe.add_argument("--under-min-isr", action="store_true",
                          help="only partitions whose ISR is smaller than min.insync.replicas (acks=all fails)")
    describe.add_argument("--at-min-isr", action="store_true",
                          help="only partitions whose ISR is exactly min.insync.replicas (one more loss stops acks=all)")
    describe.add_argument("--json", action="store_true", help="one JSON document")
    alter = actions.add_parser("alter", help="add partitions or change configs")
    alter.add_argument("topic", help="the topic's name")
    alter.add_argument("--partitions", type=int, help="the new partition count (only more)")
    alter.add_argument("--set", dest="topic_config", action="append", default=[], metavar="KEY=VALUE",
                       help="set a topic config, repeatable")
    alter.add_argument("--unset", "--delete-config", dest="delete_config", action="append", default=[], metavar="KEY",
                       help="remove a topic config override, repeatable")
    delete = actions.add_parser("delete", help="delete a topic")
    delete.add_argument("topic", help="the topic's name")
    purge = actions.add_parser("delete-records", help="delete records below an offset (like kafka-delete-records)")
    purge.add_argument("topic", help="the topic's name")
    purge.add_argument("--partition", type=int, action="append", help="repeatable (default: every partition)")
    purge.add_argument("--offset", type=int, required=True,
                       help="records below this offset go; -1: everything below the high watermark")
    for p in (lst, describe, delete, purge):
        add_target(p)
    for p in (create, alter):
        add_target(p, topic_configs=True)
    topics.set_defaults(func=_runner(_topics))

    log_dirs = sub.add_parser("log-dirs", help="each broker's data directory: bytes per partition, disk space "
                                               "(like kafka-log-dirs --describe)")
    add_target(log_dirs)
    log_dirs.add_argument("--topic", action="append", help="only these topics (repeatable)")
    log_dirs.add_argument("--json", action="store_true", help="one JSON document")
    log_dirs.set_defaults(func=_runner(_log_dirs))

    elect = sub.add_parser("elect-leaders", help="preferred or unclean leader election")
    add_target(elect)
    elect.add_argument("--election-type", choices=sorted(ELECTION_TYPES), default="preferred", help="preferred (the first replica leads again) or unclean (an out-of-sync replica may lead: data loss)")
    elect.add_argument("--topic", help="the topic whose partitions to elect for")
    elect.add_argument("--partition", type=int, action="append", help="with --topic: this partition (repeatable; default every one)")
    elect.add_argument("--all-topic-partitions", action="store_true", help="every partition of every topic")
    elect.set_defaults(func=_runner(_elect))

    reassign = sub.add_parser("reassign", help="move partitions between brokers, change replication factor")
    ractions = reassign.add_subparsers(dest="action", required=True)
    gen = ractions.add_parser("generate", help="propose an assignment of topics over a broker list")
    gen.add_argument("--topics", required=True, help="comma-separated topic names")
    gen.add_argument("--brokers", required=True, help="comma-separated broker ids to spread over")
    gen.add_argument("--replication-factor", type=int, help="new replication factor (default: keep)")
    gen.add_argument("--seed", type=int, help="start index seed (default random)")
    gen.add_argument("--output", help="also write the proposal to this file")
    for name, text in (("execute", "start the moves in a reassignment file"),
                       ("verify", "report whether the moves finished (exit 1 while in progress)"),
                       ("cancel", "cancel the moves in a reassignment file")):
        p = ractions.add_parser(name, help=text)
        p.add_argument("--reassignment-json-file", required=True, help="the plan, as kafka-reassign-partitions writes it")
        add_target(p)
    add_target(gen)
    reassign.set_defaults(func=_runner(_reassign))

    features = sub.add_parser("features", help="cluster feature levels (like kafka-features): describe, upgrade, "
                                               "downgrade (eligible.leader.replicas.version turns KIP-966 on or off)")
    factions = features.add_subparsers(dest="action", required=True)
    add_target(factions.add_parser("describe", help="supported and finalized levels"))
    for name, text in (("upgrade", "raise feature levels"), ("downgrade", "lower feature levels")):
        fp = factions.add_parser(name, help=text)
        fp.add_argument("--feature", action="append", required=True, metavar="NAME=LEVEL", help="a feature and the level to finalize (repeatable)")
        fp.add_argument("--dry-run", action="store_true", help="validate only")
        if name == "downgrade":
            fp.add_argument("--unsafe", action="store_true", help="an unsafe downgrade (metadata may be lost)")
        add_target(fp)
    features.set_defaults(func=_runner(_features))

    verify = sub.add_parser("verify-replicas",
                            help="compare every replica byte for byte up to the high watermark, report lag")
    verify.add_argument("topics", nargs="*", help="topics (default: every non-internal topic)")
    verify.add_argument("--json", action="store_true", help="one JSON array of partition reports")
    add_target(verify)
    verify.set_defaults(func=_runner(_verify_replicas))


def admin_command(name: str | None, coro: Callable[[argparse.Namespace], Awaitable[int]],
                  errors: tuple[type[BaseException], ...] = (), *,
                  exit_code: int = 1) -> Callable[[argparse.Namespace], int]:
    """The `func` of an admin subcommand: runs `coro(args)` under trio; the errors a user can
    cause (an admin answer, an unreachable cluster, a bad value, a file, and `errors`) become
    "dcmirror NAME: message" on stderr and `exit_code` (NAME None: the parsed command's name)."""
    caught: tuple[type[BaseException], ...] = (AdminError, KafkaConnectionError, ValueError, OSError, *errors)

    def run(args: argparse.Namespace) -> int:
        try:
            return int(trio.run(coro, args))
        except caught as exc:
            print(f"dcmirror {name or args.command}: {exc}", file=sys.stderr)
            return exit_code
    return run


def _runner(coro: Callable[[argparse.Namespace], Awaitable[int]]) -> Callable[[argparse.Namespace], int]:
    return admin_command(None, coro, (ReplicaReadError, AssignmentError), exit_code=2)


async def _partitions_of(admin: Admin, topics: list[str] | None) -> dict[str, list[Any]]:
    meta = await admin.metadata(topics)
    out: dict[str, list[Any]] = {}
    for t in meta.topics:
        if t.error_code != 0:
            raise AdminError(f"topic {t.name!r}", t.error_code)
        out[t.name] = sorted(t.partitions, key=lambda p: p.partition_index)
    return out


# ---- topics ---------------------------------------------------------------------------


async def _topics(args: argparse.Namespace) -> int:
    async with admin_for(args) as admin:
        if args.action == "create":
            assignments = None
            if args.replica_assignment:
                assignments = [[int(b) for b in part.split(":")] for part in args.replica_assignment.split(",")]
            try:
                await admin.create_topic(args.topic, args.partitions, args.replication_factor,
                                         _kv(args.topic_config, "--set"), assignments)
            except AdminError as exc:
                if args.if_not_exists and exc.code == ErrorCode.topic_already_exists:
                    return 0
                raise
            print(f"Created topic {args.topic}.")
        elif args.action == "list":
            meta = await admin.metadata(None)
            for name in sorted(t.name for t in meta.topics):
                print(name)
        elif args.action == "describe":
            return await _describe(admin, args)
        elif args.action == "alter":
            if args.partitions is None and not args.topic_config and not args.delete_config:
                raise ValueError("give --partitions N, --set KEY=VALUE or --unset KEY")
            if args.partitions is not None:
                await admin.create_partitions(args.topic, args.partitions)
                print(f"Topic {args.topic} now has {args.partitions} partitions.")
            if args.topic_config or args.delete_config:
                await admin.alter_topic_configs(args.topic, _kv(args.topic_config, "--set"), args.delete_config)
                print(f"Updated the configs of topic {args.topic}.")
        elif args.action == "delete":
            await admin.delete_topic(args.topic)
            print(f"Deleted topic {args.topic}.")
        elif args.action == "delete-records":
            indexes = args.partition or [p.partition_index for p in (await _partitions_of(admin, [args.topic]))[args.topic]]
            low = await admin.delete_records({(args.topic, i): args.offset for i in indexes})
            for (topic, index), watermark in sorted(low.items()):
                print(f"{topic}-{index}: records below {watermark} deleted (low watermark {watermark})")
    return 0


async def _log_dirs(args: argparse.Namespace) -> int:
    async with admin_for(args) as admin:
        dirs = await admin.describe_log_dirs()
    wanted = set(args.topic or ())
    if args.json:
        print(json.dumps({"brokers": [
            {"broker": node, "log_dir": d["log_dir"], "error_code": d["error_code"], "total_bytes": d["total_bytes"],
             "usable_bytes": d["usable_bytes"], "partitions": [
                 {"topic": t, "partition": i, "size_bytes": size, "offset_lag": lag}
                 for (t, i), (size, lag) in sorted(d["partitions"].items()) if not wanted or t in wanted]}
            for node, d in sorted(dirs.items())]}))
        return 0
    for node, d in sorted(dirs.items()):
        print(f"broker {node}: {d['log_dir']} ({d['usable_bytes']:,} of {d['total_bytes']:,} bytes usable)")
        rows = [["TOPIC", "PARTITION", "SIZE-BYTES", "OFFSET-LAG"]]
        rows += [[t, str(i), str(size), str(lag)] for (t, i), (size, lag) in sorted(d["partitions"].items())
                 if (not wanted or t in wanted) and not t.startswith("__")]
        widths = [max(len(r[c]) for r in rows) for c in range(4)]
        print("\n".join("  " + "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows))
    return 0


async def _describe(admin: Admin, args: argparse.Namespace) -> int:
    """kafka-topics --describe: partitions from DescribeTopicPartitions, so the eligible leader
    replicas (KIP-966) and the last known leader show beside the ISR, as Kafka 4 prints them."""
    described = await admin.describe_topic_partitions(args.topics or None)
    rows = []
    for t in described:
        if t["error_code"] != 0:
            raise AdminError(f"topic {t['name']!r}", t["error_code"])
        parts = sorted(t["partitions"], key=lambda p: p["partition"])
        all_configs = await admin.topic_configs(t["name"])
        configs = {c.name: c.value for c in all_configs if c.config_source == 1}
        min_isr = int(next((c.value for c in all_configs if c.name == "min.insync.replicas"), None) or 1)
        selected = []
        for p in parts:
            under = len(p["isr"]) < len(p["replicas"])
            if args.under_replicated and not under:
                continue
            if args.unavailable and p["leader"] != -1:
                continue
            if args.under_min_isr and not len(p["isr"]) < min_isr:
                continue
            if args.at_min_isr and len(p["isr"]) != min_isr:
                continue
            selected.append({k: p[k] for k in ("partition", "leader", "leader_epoch", "replicas", "isr", "elr",
                                                "last_known_elr", "offline")})
        if (args.under_replicated or args.unavailable or args.under_min_isr or args.at_min_isr) and not selected:
            continue
        rows.append({"topic": t["name"], "internal": t["is_internal"], "partition_count": len(parts),
                     "replication_factor": len(parts[0]["replicas"]) if parts else 0, "configs": configs,
                     "min_insync_replicas": min_isr, "partitions": selected})
    if args.json:
        print(json.dumps(rows))
        return 0

    def ids(nodes: list[int]) -> str:
        return ",".join(map(str, nodes))
    for r in rows:
        cfg = ",".join(f"{k}={v}" for k, v in sorted(r["configs"].items()))
        print(f"Topic: {r['topic']}\tPartitionCount: {r['partition_count']}\t"
              f"ReplicationFactor: {r['replication_factor']}\tConfigs: {cfg}")
        for p in r["partitions"]:
            leader = p["leader"] if p["leader"] >= 0 else "none"  # as Kafka's kafka-topics prints it
            print(f"\tTopic: {r['topic']}\tPartition: {p['partition']}\tLeader: {leader}\t"
                  f"Replicas: {ids(p['replicas'])}\tIsr: {ids(p['isr'])}\tElr: {ids(p['elr'])}\t"
                  f"LastKnownElr: {ids(p['last_known_elr'])}"
                  + (f"\tOffline: {ids(p['offline'])}" if p["offline"] else ""))
    return 0


# ---- features ---------------------------------------------------------------------------


async def _features(args: argparse.Namespace) -> int:
    async with admin_for(args) as admin:
        if args.action == "describe":
            for name, (low, high, level) in sorted((await admin.describe_features()).items()):
                print(f"Feature: {name}\tSupportedMinVersion: {low}\tSupportedMaxVersion: {high}\t"
                      f"FinalizedVersionLevel: {level}")
            return 0
        levels = {k: int(v) for k, v in _kv(args.feature, "--feature").items()}
        downgrade = ("unsafe" if args.unsafe else "safe") if args.action == "downgrade" else None
        await admin.update_features(levels, downgrade=downgrade, validate_only=args.dry_run)
        for name, level in levels.items():
            print(f"{name} was {args.action}d to {level}." + (" (dry run)" if args.dry_run else ""))
    return 0


# ---- elections ------------------------------------------------------------------------


async def _elect(args: argparse.Namespace) -> int:
    if args.all_topic_partitions == bool(args.topic):
        raise ValueError("give --all-topic-partitions or --topic T [--partition P ...]")
    async with admin_for(args) as admin:
        partitions = None
        if args.topic:
            if args.partition:
                partitions = [(args.topic, p) for p in args.partition]
            else:
                partitions = [(args.topic, p.partition_index)
                              for p in (await _partitions_of(admin, [args.topic]))[args.topic]]
        results = await admin.elect_leaders(ELECTION_TYPES[args.election_type], partitions)
    failed = 0
    elected = sorted(tp for tp, (code, _) in results.items() if code == 0)
    if elected:
        print(f"Successfully completed leader election ({args.election_type}) for partitions "
              + ", ".join(f"{t}-{p}" for t, p in elected))
    for (t, p), (code, message) in sorted(results.items()):
        if code == ErrorCode.election_not_needed:
            print(f"Valid replica already elected for partitions {t}-{p}")
        elif code != 0:
            failed += 1
            print(f"Error completing leader election ({args.election_type}) for partition {t}-{p}: "
                  f"{ErrorCode(code).name.upper()}: {message}")
    if not results:
        print("No partition needed an election.")
    return 1 if failed else 0


# ---- reassignment ---------------------------------------------------------------------


def _assignment_doc(assignment: dict[tuple[str, int], list[int]]) -> dict[str, Any]:
    return {"version": 1, "partitions": [{"topic": t, "partition": p, "replicas": r}
                                         for (t, p), r in sorted(assignment.items())]}


def _read_assignment(path: str) -> dict[tuple[str, int], list[int]]:
    try:
        doc = json.loads(Path(path).read_text())
        return {(str(e["topic"]), int(e["partition"])): [int(b) for b in e["replicas"]] for e in doc["partitions"]}
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a reassignment file ({{\"version\":1,\"partitions\":[{{\"topic\",\"partition\","
                         f"\"replicas\"}}]}}): {exc}") from None


async def _reassign(args: argparse.Namespace) -> int:
    async with admin_for(args) as admin:
        if args.action == "generate":
            topics = [t.strip() for t in args.topics.split(",") if t.strip()]
            brokers = sorted(int(b) for b in args.brokers.split(","))
            parts = await _partitions_of(admin, topics)
            current = {(t, p.partition_index): list(p.replica_nodes) for t, ps in parts.items() for p in ps}
            rng = random.Random(args.seed)
            proposed: dict[tuple[str, int], list[int]] = {}
            for t, ps in sorted(parts.items()):
                rf = args.replication_factor or (len(ps[0].replica_nodes) if ps else 1)
                for i, replicas in enumerate(assign_replicas(brokers, len(ps), rf, rng.randrange(1 << 16))):
                    proposed[(t, i)] = replicas
            print("Current partition replica assignment")
            print(json.dumps(_assignment_doc(current)))
            print("\nProposed partition reassignment configuration")
            print(json.dumps(_assignment_doc(proposed)))
            if args.output:
                Path(args.output).write_text(json.dumps(_assignment_doc(proposed)) + "\n")
            return 0
        targets = _read_assignment(args.reassignment_json_file)
        if args.action == "execute":
            parts = await _partitions_of(admin, sorted({t for t, _ in targets}))
            current = {(t, p.partition_index): list(p.replica_nodes) for t, ps in parts.items() for p in ps
                       if (t, p.partition_index) in targets}
            print("Current partition replica assignment (save it to roll back)")
            print(json.dumps(_assignment_doc(current)))
            results = await admin.alter_reassignments(dict(targets.items()))
            failed = {tp: r for tp, r in results.items() if r[0] != 0}
            for (t, p), (code, message) in sorted(failed.items()):
                print(f"Failed to reassign {t}-{p}: {ErrorCode(code).name.upper()}: {message}", file=sys.stderr)
            print(f"Successfully started partition reassignment{'s' if len(targets) - len(failed) != 1 else ''} "
                  f"for {len(targets) - len(failed)} partition(s).")
            return 1 if failed else 0
        if args.action == "cancel":
            results = await admin.alter_reassignments(dict.fromkeys(targets))
            for (t, p), (code, message) in sorted(results.items()):
                state = "cancelled" if code == 0 else f"not cancelled: {ErrorCode(code).name.upper()}: {message}"
                print(f"Reassignment of partition {t}-{p}: {state}")
            return 0
        # verify
        ongoing = await admin.list_reassignments()
        parts = await _partitions_of(admin, sorted({t for t, _ in targets}))
        actual = {(t, p.partition_index): list(p.replica_nodes) for t, ps in parts.items() for p in ps}
        pending = 0
        print("Status of partition reassignment:")
        for (t, p), replicas in sorted(targets.items()):
            if (t, p) in ongoing:
                pending += 1
                print(f"Reassignment of partition {t}-{p} is still in progress.")
            elif actual.get((t, p)) == replicas:
                print(f"Reassignment of partition {t}-{p} is completed.")
            else:
                pending += 1
                print(f"There is no active reassignment of partition {t}-{p}, but replicas are "
                      f"{actual.get((t, p))} rather than {replicas}.")
        return 1 if pending else 0


# ---- replica verification -----------------------------------------------------------------


async def _verify_replicas(args: argparse.Namespace) -> int:
    """Exit 0 when every partition is consistent, 1 when a replica differs below the high
    watermark or an in-sync replica could not be read."""
    async with admin_for(args) as admin:
        reports = await verify_replicas(admin, args.topics or None)
    bad = [r for r in reports if not r.consistent]
    if args.json:
        print(json.dumps([r.to_json() for r in reports]))
        return 1 if bad else 0
    print(f"{'TOPIC':<30} {'PART':>4} {'LEADER':>6} {'HW':>12} {'REPLICA':>7} {'ISR':>3} "
          f"{'LOG-END':>12} {'LAG':>8} {'BATCHES':>9}  STATUS")
    for r in reports:
        for rep in r.replicas:
            status = rep.status + (f" ({rep.detail})" if rep.detail else "")
            print(f"{r.topic:<30} {r.partition:>4} {r.leader:>6} {r.high_watermark:>12} {rep.broker_id:>7} "
                  f"{'yes' if rep.in_isr else 'no':>3} {rep.log_end_offset:>12} {rep.lag:>8} "
                  f"{rep.batches_compared:>9}  {status}")
    compared = sum(rep.batches_compared for r in reports for rep in r.replicas)
    print(f"{len(reports)} partition(s), {compared} replica batches compared below the high watermarks: "
          + ("all replicas consistent" if not bad else f"{len(bad)} partition(s) INCONSISTENT"))
    return 1 if bad else 0
