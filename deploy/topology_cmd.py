"""`dcmirror topology check FILE`: validate a topology file and summarize it."""

from __future__ import annotations

import argparse
import sys

from topology import ClusterSpec, Topology, TopologyError, load


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    topo = sub.add_parser("topology", help="validate a topology file")
    actions = topo.add_subparsers(dest="topology_action", required=True)
    check = actions.add_parser("check", help="validate a topology file and print what it describes")
    check.add_argument("file", help="topology file (TOML)")
    check.set_defaults(func=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    try:
        topology = load(args.file)
    except TopologyError as exc:
        print(f"dcmirror topology check: {exc}", file=sys.stderr)
        return 2
    print(summary(topology))
    return 0


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

    w = topology.warehouse
    lines.append("")
    if w is None:
        lines.append("warehouse: none")
    else:
        lines.append(f"warehouse: topics {w.topics} of cluster {w.source} into {w.path}")
    return "\n".join(lines)
