"""The `dcmirror` command line."""

from __future__ import annotations

import sys

if __name__ == "__main__":  # `python -m deploy.cli`; the console script goes through deploy.entry
    # kio imports hypothesis when it is installed (test environments) only to offer strategies
    # for its types; no command uses them, and the import cost ~1.3 s per process.
    sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]

import argparse
import faulthandler
import logging
import signal
from pathlib import Path

import trio

from cluster.common.config_def import InvalidConfig
from deploy import (
    cluster_cmds,
    configs_cmd,
    dev_secrets,
    groups_cmd,
    lab_cmd,
    lifeline,
    load_cmd,
    mirror_cmd,
    perf_cmd,
    quotas_cmd,
    records_cmd,
    registry_cmd,
    render_cmd,
    security_cmds,
    topology_cmd,
    txn_cmds,
    up_cmd,
)
from deploy.console import server as console_server
from deploy.demo import DEFAULT_RECORDS as DEMO_RECORDS


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
    from cluster.broker.server import serve_until_signalled

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
    try:
        if membership is not None and membership.node_id not in membership.brokers:
            from cluster.broker.config import parse_listen
            from cluster.broker.controller_server import (
                ControllerNode,
                serve_controller_until_signalled,
            )

            controller = ControllerNode(membership.node_id, membership.voters, membership.brokers, Path(data_dir),
                                        config, membership.cluster_id, membership.bootstrap_records)
            trio.run(serve_controller_until_signalled, controller, *parse_listen(listen))
            return 0
        trio.run(serve_until_signalled, Path(data_dir), listen, config, membership)
    except (ValueError, OSError) as exc:
        print(f"dcmirror broker: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from deploy.demo import run_demo

    return run_demo(records=args.records, keep=args.keep, as_json=args.json)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dcmirror", description="Multi-datacenter log service")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    broker = sub.add_parser("broker", help="run one broker")
    broker.add_argument("--data-dir", help="directory holding the partition logs")
    broker.add_argument("--listen", help="HOST:PORT to accept Kafka clients on")
    broker.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="broker config with Kafka's names, e.g. num.partitions=3 (repeatable)")
    broker.add_argument("--config", help="topology file (multi-broker clusters)")
    broker.add_argument("--cluster", help="cluster name in the topology file")
    broker.add_argument("--node", type=int, help="node id within the cluster")
    broker.set_defaults(func=cmd_broker)

    groups_cmd.add_parser(sub)
    topology_cmd.add_parser(sub)
    mirror_cmd.add_parser(sub)
    cluster_cmds.add_parsers(sub)
    configs_cmd.add_parser(sub)   # configs (like kafka-configs)
    load_cmd.add_parser(sub)      # load, warehouse
    up_cmd.add_parser(sub)        # up, status
    perf_cmd.add_parser(sub)      # perf produce|consume
    records_cmd.add_parser(sub)   # produce, consume (as rpk topic produce|consume, kcat)
    render_cmd.add_parser(sub)    # deploy render
    lab_cmd.add_parser(sub)       # lab up|cut|heal|latency|status|down
    dev_secrets.add_parser(sub)   # dev-secrets
    security_cmds.add_parsers(sub)  # users, acls
    txn_cmds.add_parser(sub)      # transactions list|describe|abort
    quotas_cmd.add_parser(sub)    # quotas describe|alter
    registry_cmd.add_parser(sub)  # registry (schema registry of a cluster)
    console_server.add_parser(sub)  # console (the web console)

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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.log_level)
    lifeline.watch_supervisor()  # started by `dcmirror up` (or another supervisor): stop when it dies
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
