"""`dcmirror registry`: a cluster's schema registry (Confluent's REST API).

    dcmirror registry --config FILE --cluster NAME        # [clusters.NAME.registry] of the topology
    dcmirror registry --bootstrap HOST:PORT --listen HOST:PORT   # a standalone cluster, no auth

State lives in the cluster's `_schemas` topic; the HTTP port opens once it is replayed.
SIGINT/SIGTERM stop it.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import trio

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("registry", help="a cluster's schema registry (Confluent Schema Registry's REST API)")
    p.add_argument("--config", help="topology file")
    p.add_argument("--cluster", help="cluster name in the topology file (its [clusters.NAME.registry])")
    p.add_argument("--bootstrap", help="HOST:PORT of a cluster without a topology (plaintext)")
    p.add_argument("--listen", help="HOST:PORT to serve on (overrides the topology's registry.listen)")
    p.add_argument("--advertised-url", help="the URL other instances forward writes to when this one is the "
                                            "primary (default: the listen address; 127.0.0.1 for 0.0.0.0)")
    p.set_defaults(func=cmd_registry)


def settings(args: argparse.Namespace) -> tuple[dict[str, str], str, int, Any]:
    """(client config, host, port, RegistrySecurity) from the arguments; ValueError says
    what is missing or wrong."""
    from cluster.broker.config import parse_listen
    from cluster.common.secrets import secret
    from cluster.registry.app import RegistrySecurity, read_basic_users
    from cluster.security.tls import https_context

    if args.config:
        from topology import load

        if not args.cluster:
            raise ValueError("--cluster is required with --config")
        cluster = load(args.config).cluster(args.cluster)
        spec = cluster.registry
        if spec is None and not args.listen:
            raise ValueError(f"cluster {args.cluster!r} has no [clusters.{args.cluster}.registry] "
                             "(listen = \"host:port\"); or give --listen")
        client = cluster.client_config()
        if args.listen:
            host, port = parse_listen(args.listen)
        else:
            assert spec is not None
            host, port = spec.listen.host, spec.listen.port
        security = RegistrySecurity()
        if spec is not None:
            security = RegistrySecurity(
                token=secret(spec.auth_token, "registry.auth_token") if spec.auth_token else None,
                basic_users=read_basic_users(Path(spec.basic_auth_users)) if spec.basic_auth_users else {},
                tls=https_context(Path(spec.keystore), "registry.keystore") if spec.keystore else None)
        return client, host, port, security
    if not args.bootstrap or not args.listen:
        raise ValueError("give --config FILE --cluster NAME, or --bootstrap HOST:PORT --listen HOST:PORT")
    host, port = parse_listen(args.listen)
    return {"bootstrap.servers": args.bootstrap}, host, port, RegistrySecurity()


def cmd_registry(args: argparse.Namespace) -> int:
    from topology import TopologyError

    try:
        client, host, port, security = settings(args)
    except (TopologyError, ValueError, OSError) as exc:
        print(f"dcmirror registry: {exc}", file=sys.stderr)
        return 1
    from cluster.client.connection import KafkaConnectionError
    from cluster.client.errors import KafkaError

    failed: list[BaseException] = []
    try:
        trio.run(_serve, client, host, port, security, getattr(args, "advertised_url", None))
    except* (KafkaConnectionError, KafkaError, OSError) as group:
        failed.extend(_leaves(group))
    if failed:
        print(f"dcmirror registry: {failed[0]}", file=sys.stderr)
        return 1
    return 0


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


async def _serve(client: dict[str, str], host: str, port: int, security: Any,
                 advertised_url: str | None = None) -> None:
    from cluster.registry.app import run_registry

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: run_registry(client, host, port, security=security,
                                                                 advertised_url=advertised_url,
                                                                 task_status=task_status))
            print(f"schema registry ready on {'https' if security.tls else 'http'}://{host}:{port}", flush=True)
            async for signum in signals:
                log.info("signal %d: stopping the schema registry", signum)
                nursery.cancel_scope.cancel()
                break
