"""`dcmirror topology check|plan|apply FILE`: validate a topology file and summarize it;
show (plan) or make (apply) the difference between its topics and the live clusters.

The work is in topology.plan (the diff) and topology.apply (talking to the clusters).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys

import trio

from deploy.config_names import CONFIG_NAMES
from topology import ClusterSpec, Topology, TopologyError, load
from topology.apply import (
    DEFAULT_TIMEOUT_S,
    apply_exit_code,
    apply_topology,
    format_apply,
    plan_topology,
)
from topology.plan import format_plan, plan_document, plan_exit_code


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    topo = sub.add_parser("topology", help="validate a topology file, plan or apply its topics")
    actions = topo.add_subparsers(dest="topology_action", required=True)
    check = actions.add_parser("check", help="validate a topology file and print what it describes")
    _file_arguments(check)
    check.set_defaults(func=cmd_check)

    plan = actions.add_parser(
        "plan", help="show what apply would change in the clusters (exit 0: nothing, 2: changes, 1: problems)")
    apply = actions.add_parser(
        "apply", help="create topics, add partitions, set configs as the file says (never deletes)")
    for p in (plan, apply):
        _file_arguments(p)
        p.add_argument("--cluster", action="append", metavar="NAME",
                       help="only this cluster (repeatable; default: every cluster the file declares topics for)")
        p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                       help="bound on reaching and reading each cluster, on each change, and on waiting "
                            f"for every broker to show the changes (default {DEFAULT_TIMEOUT_S:g})")
    plan.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    plan.set_defaults(func=cmd_plan)
    apply.set_defaults(func=cmd_apply)


def _file_arguments(parser: argparse.ArgumentParser) -> None:
    """The topology file, as the other commands take it (`--config FILE`) or positionally."""
    parser.add_argument("file", nargs="?", help="topology file (TOML); or --config FILE")
    parser.add_argument("--config", dest="config_file", metavar="FILE", help="topology file (TOML)")


def _file_of(args: argparse.Namespace) -> str | None:
    if args.file and args.config_file and args.file != args.config_file:
        print(f"dcmirror topology {args.topology_action}: two topology files given ({args.file}, --config "
              f"{args.config_file}): give one", file=sys.stderr)
        return None
    found: str | None = args.file or args.config_file
    if found is None:
        print(f"dcmirror topology {args.topology_action}: which topology file? give it as --config FILE",
              file=sys.stderr)
    return found


def cmd_check(args: argparse.Namespace) -> int:
    path = _file_of(args)
    if path is None:
        return 2
    try:
        topology = load(path, config_names=CONFIG_NAMES)
    except TopologyError as exc:
        print(f"dcmirror topology check: {exc}", file=sys.stderr)
        return 2
    print(summary(topology))
    return 0


def _load(args: argparse.Namespace) -> Topology | None:
    if args.timeout <= 0:
        print(f"dcmirror topology {args.topology_action}: --timeout must be positive, not {args.timeout:g}",
              file=sys.stderr)
        return None
    path = _file_of(args)
    if path is None:
        return None
    try:
        topology = load(path, config_names=CONFIG_NAMES)
        for name in args.cluster or []:
            topology.cluster(name)  # unknown names raise
    except (TopologyError, OSError) as exc:
        print(f"dcmirror topology {args.topology_action}: {exc}", file=sys.stderr)
        return None
    return topology


def cmd_plan(args: argparse.Namespace) -> int:
    """Exit 0: nothing to change, 2: changes to apply, 1: problems or errors."""
    topology = _load(args)
    if topology is None:
        return 1
    plans = trio.run(functools.partial(plan_topology, topology, args.cluster, timeout_s=args.timeout))
    # Mirror topics: which side is the copy lives in the clusters (mirror/failover.py).
    from mirror.failover import direction_lines, flow_directions

    directions = trio.run(flow_directions, topology, args.timeout) if any(m.mirror_topics for m in topology.mirrors) \
        else []
    if args.json:
        print(json.dumps({**plan_document(plans, topology), "mirror_topics": directions}, indent=2))
    else:
        print("\n".join([format_plan(plans, topology), *direction_lines(directions)]))
    return plan_exit_code([c for p in plans for c in p.changes])


def cmd_apply(args: argparse.Namespace) -> int:
    """Exit 0 when every cluster now holds what the file says, else 1."""
    topology = _load(args)
    if topology is None:
        return 1
    results = trio.run(functools.partial(apply_topology, topology, args.cluster, timeout_s=args.timeout))
    print(format_apply(results, topology))
    return apply_exit_code(results)


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _ids(cluster: ClusterSpec) -> str:
    voters = ",".join(str(a.node_id) for a in cluster.voters)
    return f"{voters} (combined)" if cluster.combined else f"{voters} (controllers)"


def summary(topology: Topology) -> str:
    """What ``topology check`` prints for a valid topology."""
    lines = [f"{topology.path or '<string>'}: OK", ""]
    lines.append(f"clusters ({len(topology.clusters)}):")
    rows = [["CLUSTER", "DATACENTER", "BROKERS", "VOTERS", "DATA-DIR"]]
    for c in topology.clusters.values():
        rows.append([c.name, c.datacenter, str(len(c.brokers)), _ids(c), str(c.data_dir)])
    lines += _table(rows)
    rows = [["CLUSTER", "NODE", "ADDRESS", "ROLE"]]
    for c in topology.clusters.values():
        rows += [[c.name, str(a.node_id), str(a), "broker, voter" if c.combined else "broker"] for a in c.brokers]
        rows += [[c.name, str(a.node_id), str(a), "controller"] for a in c.controllers]
    lines += ["", *_table(rows)]
    secured = [c for c in topology.clusters.values() if c.listeners or c.users or c.client]
    if secured:
        rows = [["CLUSTER", "LISTENER", "PROTOCOL", "ADDRESSES", "USED BY"]]
        for c in secured:
            for name in (c.inter_broker_listener, *c.listeners):
                used = ["brokers" if name == c.inter_broker_listener else ""]
                used.append("dcmirror clients" if name == (c.client_listener or c.inter_broker_listener) else "")
                rows.append([c.name, name, c.listener_protocol(name),
                             ",".join(str(a) for a in c.listener_addresses(name)),
                             ", ".join(u for u in used if u) or "-"])
        lines += ["", *_table(rows)]
        for c in secured:
            if c.users:
                lines.append(f"  {c.name} starts with SCRAM users: {', '.join(sorted(c.users))}")
    registries = [c for c in topology.clusters.values() if c.registry is not None]
    if registries:
        lines += ["", "schema registries:", *(f"  {c.name} on {c.registry.url}" for c in registries
                                                if c.registry is not None)]

    lines += ["", f"topics ({len(topology.topics)}):"]
    if topology.topics:
        rows = [["CLUSTER", "TOPIC", "PARTITIONS", "RF", "CONFIG"]]
        for t in topology.topics:
            config = ",".join(f"{k}={v}" for k, v in sorted(t.config.items())) or "-"
            rows.append([t.cluster, t.name, str(t.partitions), str(t.replication_factor), config])
        lines += _table(rows)

    lines += ["", f"flows ({len(topology.mirrors)}):"]
    if topology.mirrors:
        rows = [["FLOW", "SOURCE", "TARGET", "TOPICS", "EXCLUDE", "RENAME", "WORKERS", "GROUPS"]]
        for m in topology.mirrors:
            rows.append([m.name, m.source, m.target, m.topics, m.exclude or "-", m.rename, str(m.workers),
                         m.groups or "-"])
        lines += _table(rows)
        for m in topology.mirrors:
            dc = topology.clusters[m.source].datacenter
            copied = [f"{t.name} -> {m.target_topic(t.name, dc)}"
                      for t in topology.topics_of(m.source) if m.matches(t.name)]
            lines.append(f"  {m.name} copies declared topics: {', '.join(copied) if copied else '(none)'}")
            if m.schemas:
                lines.append(f"  {m.name} copies their schemas into {m.target}'s registry, context {m.schema_context}")

    w = topology.warehouse
    lines.append("")
    if w is None:
        lines.append("warehouse: none")
    else:
        lines.append(f"warehouse: topics {w.topics} of cluster {w.source} into {w.path}")
        for typed in w.registry_schemas:
            lines.append(f"  topics {typed.topics}: typed tables from {w.source}'s registry")
        if w.service:
            lines.append("  warehouse service: one Spark session for loads and `warehouse sql` (load.service)")
    if topology.console is not None:
        lines += ["", f"web console: {topology.console.url}/"]
    return "\n".join(lines)
