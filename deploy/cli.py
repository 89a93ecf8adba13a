"""The `dcmirror` command line."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import trio

from cluster.storage.config import InvalidConfig
from deploy import groups_cmd


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _parse_sets(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidConfig(f"--set {pair!r} must be KEY=VALUE, e.g. --set log.retention.ms=60000")
        out[key.strip()] = value.strip()
    return out


def cmd_broker(args: argparse.Namespace) -> int:
    from cluster.broker.config import BrokerConfig
    from cluster.broker.server import serve_until_signalled

    if args.config or args.cluster or args.node:
        print("dcmirror broker: topology clusters (--config/--cluster/--node) arrive with multi-broker "
              "support; use --data-dir and --listen for a standalone broker", file=sys.stderr)
        return 2
    if not args.data_dir or not args.listen:
        print("dcmirror broker: --data-dir DIR and --listen HOST:PORT are required", file=sys.stderr)
        return 2
    try:
        config = BrokerConfig.from_overrides(_parse_sets(args.set))
    except InvalidConfig as exc:
        print(f"dcmirror broker: {exc}", file=sys.stderr)
        return 2
    try:
        trio.run(serve_until_signalled, Path(args.data_dir), args.listen, config)
    except (ValueError, OSError) as exc:
        print(f"dcmirror broker: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from deploy.demo import run_demo

    return run_demo(records=args.records)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dcmirror", description="Multi-datacenter log service")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    sub = parser.add_subparsers(dest="command", required=True)

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

    demo = sub.add_parser("demo", help="run the embedded demo end to end")
    demo.add_argument("--records", type=int, default=100_000, help="records to produce")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.log_level)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
