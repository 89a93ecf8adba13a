"""The `dcmirror` command line."""

from __future__ import annotations

import sys

if __name__ == "__main__":  # `python -m deploy.cli`; the console script goes through deploy.entry
    # kio imports hypothesis when it is installed (test environments) only to offer strategies
    # for its types; no command uses them, and the import cost ~1.3 s per process.
    sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]

import argparse
import faulthandler
import importlib
import logging
import signal
from pathlib import Path

from cluster.common.config_def import InvalidConfig

DEMO_RECORDS = 20_000  # deploy.demo.DEFAULT_RECORDS (a unit test keeps them equal)

# Each command's module and the one-line help `dcmirror --help` lists. A command's module is
# imported only when that command runs (or asks for its --help): importing every one (trio,
# the clients, the topology model, the console) made each `--help` take over a second. The
# module registers the command's own parser; a unit test keeps these lines equal to theirs.
COMMANDS: dict[str, tuple[str, str]] = {
    "acls": ("deploy.security_cmds", "ACLs, in the shape of kafka-acls: add, list, remove"),
    "configs": ("deploy.configs_cmd", "describe or alter topic, broker and group configs (like kafka-configs)"),
    "console": ("deploy.console.server",
                "the web console of a topology (map, clusters, records, flows, warehouse)"),
    "consume": ("deploy.records_cmd", "records of a topic to stdout (as rpk topic consume, kcat -C)"),
    "deploy": ("deploy.render_cmd", "production files for a topology"),
    "dev-secrets": ("deploy.dev_secrets", "make up the CA, certificates and passwords a topology references "
                                          "(labs and demos; never production)"),
    "elect-leaders": ("deploy.cluster_cmds", "preferred or unclean leader election"),
    "features": ("deploy.cluster_cmds", "cluster feature levels (like kafka-features): describe, upgrade, "
                                        "downgrade (eligible.leader.replicas.version turns KIP-966 on or off)"),
    "groups": ("deploy.groups_cmd", "list, describe, reset offsets of, delete consumer groups"),
    "lab": ("deploy.lab_cmd", "multi-datacenter lab on one machine: network namespaces, WAN latency, cuts"),
    "load": ("deploy.load_cmd", "load the warehouse topics' new records into warehouse tables, exactly once"),
    "log-dirs": ("deploy.cluster_cmds", "each broker's data directory: bytes per partition, disk space "
                                        "(like kafka-log-dirs --describe)"),
    "mirror": ("deploy.mirror_cmd", "run mirror workers (or: mirror status | pause | resume | translate | "
                                    "promote | failover | failback)"),
    "perf": ("deploy.perf_cmd", "producer and consumer throughput and latency tests"),
    "produce": ("deploy.records_cmd", "records from stdin into a topic (as rpk topic produce, kcat -P)"),
    "quotas": ("deploy.quotas_cmd", "client quotas (producer_byte_rate, consumer_byte_rate, "
                                    "request_percentage) per user / client id, like kafka-configs"),
    "reassign": ("deploy.cluster_cmds", "move partitions between brokers, change replication factor"),
    "registry": ("deploy.registry_cmd", "a cluster's schema registry (Confluent Schema Registry's REST API)"),
    "share-groups": ("deploy.share_groups_cmd", "list, describe, reset offsets of, delete share groups (like kafka-share-groups)"),
    "status": ("deploy.up_cmd", "one screen for the whole topology (exit 0 healthy, 1 degraded, 2 bad config)"),
    "topics": ("deploy.cluster_cmds", "create, list, describe, alter, delete topics"),
    "topology": ("deploy.topology_cmd", "validate a topology file, plan or apply its topics"),
    "transactions": ("deploy.txn_cmds", "transactions: list, describe, abort (kafka-transactions)"),
    "up": ("deploy.up_cmd", "run every broker, mirror worker and scheduled load of a topology, supervised"),
    "users": ("deploy.security_cmds", "SCRAM users: add, list, remove"),
    "verify-replicas": ("deploy.cluster_cmds",
                        "compare every replica byte for byte up to the high watermark, report lag"),
    "warehouse": ("deploy.load_cmd", "query the warehouse tables"),
}


def _register(module_name: str, sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    module = importlib.import_module(module_name)
    (getattr(module, "add_parsers", None) or module.add_parser)(sub)


def _setup_logging(level: str) -> None:
    root = getattr(logging, level.upper(), logging.INFO)
    logging.basicConfig(
        level=root,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if root > logging.DEBUG:
        # httpx (and confluent-kafka's httpx2) log every request at INFO: a typed load's
        # registry lookups, the schema sync's rounds. Their warnings still show.
        for name in ("httpx", "httpx2"):
            logging.getLogger(name).setLevel(logging.WARNING)


def _parse_sets(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidConfig(f"--set {pair!r} must be KEY=VALUE, e.g. --set log.retention.ms=60000")
        out[key.strip()] = value.strip()
    return out


def bootstrap_scram_records(users: dict[str, str]) -> tuple[dict[str, object], ...]:
    """ScramCredential records (SCRAM-SHA-256 and -512) of the topology's users, passwords
    read from their references: what a new cluster's metadata log starts with, as Kafka's
    `kafka-storage format --add-scram`. Raises ValueError naming the user, never the secret."""
    from cluster.common.secrets import resolve
    from cluster.controller.image import record
    from cluster.security.scram import MECHANISMS, make_credential

    out = []
    for user, reference in users.items():
        password = resolve(reference, f"users.{user}")
        for mechanism in MECHANISMS:
            out.append(record("ScramCredential", name=user, **make_credential(mechanism, password.encode())
                              .record_fields()))
    return tuple(out)


def cmd_broker(args: argparse.Namespace) -> int:
    from cluster.broker.config import BrokerConfig
    from cluster.broker.server import serve_until_signalled, tune_garbage_collector

    membership = None
    overrides: dict[str, object] = {}
    if args.config or args.cluster or args.node is not None:
        from cluster.broker.broker import ClusterMembership
        from topology import TopologyError, load

        if not (args.config and args.cluster and args.node is not None):
            print("dcmirror broker: --config FILE, --cluster NAME and --node ID go together", file=sys.stderr)
            return 2
        try:
            spec = load(args.config).cluster(args.cluster)
            node = spec.node(args.node)
        except (TopologyError, OSError) as exc:
            print(f"dcmirror broker: {exc}", file=sys.stderr)
            return 2
        voters = {v.node_id: (v.host, v.port) for v in spec.voters}
        brokers = {b.node_id: (b.host, b.port) for b in spec.brokers}
        try:
            records = bootstrap_scram_records(spec.users)
        except ValueError as exc:
            print(f"dcmirror broker: {exc}", file=sys.stderr)
            return 2
        membership = ClusterMembership(node.node_id, voters, f"{args.cluster}", brokers, records)
        overrides = {**spec.broker_configs(node.node_id), "node.id": node.node_id}
        if spec.listeners:
            overrides["listeners"] = spec.node_listeners(node.node_id)
        data_dir = args.data_dir or str(spec.node_data_dir(node.node_id))
        listen = args.listen or f"{node.host}:{node.port}"
    else:
        if not args.data_dir or not args.listen:
            print("dcmirror broker: --data-dir DIR and --listen HOST:PORT are required "
                  "(or --config FILE --cluster NAME --node ID)", file=sys.stderr)
            return 2
        data_dir, listen = args.data_dir, args.listen
    try:
        config = BrokerConfig.from_overrides({**overrides, **_parse_sets(args.set)})
    except InvalidConfig as exc:
        print(f"dcmirror broker: {exc}", file=sys.stderr)
        return 2
    # `kill -USR1 PID` prints every thread's Python stack to stderr (a frozen event loop shows
    # where it is stuck), as jstack does for a Kafka broker.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    tune_garbage_collector()
    try:
        if membership is not None and membership.node_id not in membership.brokers:
            from cluster.broker.config import parse_listen
            from cluster.broker.controller_server import (
                ControllerNode,
                serve_controller_until_signalled,
            )

            controller = ControllerNode(membership.node_id, membership.voters, membership.brokers, Path(data_dir),
                                        config, membership.cluster_id, membership.bootstrap_records)
            import trio

            trio.run(serve_controller_until_signalled, controller, *parse_listen(listen))
            return 0
        import trio

        trio.run(serve_until_signalled, Path(data_dir), listen, config, membership)
    except (ValueError, OSError) as exc:
        print(f"dcmirror broker: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from deploy.demo import run_demo

    return run_demo(records=args.records, keep=args.keep, as_json=args.json)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with `command` that command's alone (the others listed by name
    and help, their modules not imported)."""
    parser = argparse.ArgumentParser(prog="dcmirror", description="Multi-datacenter log service")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = {module for name, (module, _) in COMMANDS.items() if command is None or name == command}
    for module in sorted(wanted):
        _register(module, sub)
    for name, (module, text) in COMMANDS.items():
        if module not in wanted:
            sub.add_parser(name, help=text, add_help=False).set_defaults(func=None)

    broker = sub.add_parser("broker", help="run one broker")
    broker.add_argument("--data-dir", help="directory holding the partition logs")
    broker.add_argument("--listen", help="HOST:PORT to accept Kafka clients on")
    broker.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="broker config with Kafka's names, e.g. num.partitions=3 (repeatable)")
    broker.add_argument("--config", help="topology file (multi-broker clusters)")
    broker.add_argument("--cluster", help="cluster name in the topology file")
    broker.add_argument("--node", type=int, help="node id within the cluster")
    broker.set_defaults(func=cmd_broker)

    demo = sub.add_parser("demo", help="run the embedded demo end to end")
    demo.add_argument("--records", type=int, default=DEMO_RECORDS, help=f"events to produce (default {DEMO_RECORDS:,}; "
                      "plus one Avro or JSON Schema order per 20 events)")
    demo.add_argument("--keep", action="store_true", help="keep the deployment running with its web console until "
                      "Ctrl-C, and its data directory (logs, data, warehouse) afterwards")
    demo.add_argument("--json", action="store_true", help="end with the summary as one JSON line")
    demo.set_defaults(func=cmd_demo)
    # `dcmirror --help` lists the commands by name (they are registered by module).
    sub._choices_actions.sort(key=lambda action: action.dest)
    return parser


def _command_word(words: list[str]) -> str:
    """The command a command line runs: its first word that is not --log-level's (or "" when
    there is none, as for `dcmirror --help`)."""
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word == "--log-level":
            skip = True
        elif not word.startswith("-"):
            return word
    return ""


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    args = build_parser(_command_word(words)).parse_args(words)
    if getattr(args, "func", None) is None:  # not the command's parser after all: the whole one
        args = build_parser().parse_args(words)
    _setup_logging(args.log_level)
    from deploy import lifeline

    lifeline.watch_supervisor()  # started by `dcmirror up` (or another supervisor): stop when it dies
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
