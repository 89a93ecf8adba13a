"""`dcmirror console --config FILE [--listen HOST:PORT]`: the web console of a topology,
served on trio by Hypercorn (the schema registry's server, cluster/registry/app.serve).

Binds where told: `[console] listen` (or --listen). A console without any login (no token,
no SASL cluster) is refused on anything but a loopback address. Prints its URL once the
first poll is in (pages have something to show), then serves until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import trio

log = logging.getLogger("dcmirror.console")


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("console", help="the web console of a topology (map, clusters, records, flows, warehouse)")
    p.add_argument("--config", required=True, help="topology file ([console] gives listen, auth_token, keystore)")
    p.add_argument("--listen", help="HOST:PORT to serve on (overrides [console] listen; default 127.0.0.1:8480)")
    p.add_argument("--refresh-ms", type=int, help="poll interval (overrides [console] refresh_ms)")
    p.set_defaults(func=cmd_console)


DEFAULT_LISTEN = ("127.0.0.1", 8480)


def make_console(topology: Any, refresh_s: float) -> Any:
    """The Console (app.py) for a topology: its token and HTTPS from [console]."""
    from cluster.common.secrets import secret
    from deploy.console.app import Console
    from deploy.console.poller import Poller

    spec = topology.console
    token = secret(spec.auth_token, "console.auth_token") if spec is not None and spec.auth_token else None
    console = Console(topology, Poller(topology, refresh_s), token=token,
                      https=bool(spec is not None and spec.keystore))
    console.flow_actions.update(_flow_actions())
    return console


def _flow_actions() -> dict[str, Any]:
    """pause/resume: the flow's control record in its target cluster (mirror/flow_control.py),
    written as the logged-in principal, so the brokers' ACLs decide (WRITE on the topic)."""
    import time

    from mirror.flow_control import set_flow_paused

    def action(paused: bool) -> Any:
        async def act(topology: Any, flow: Any, settings: dict[str, Any], reason: str) -> None:
            await set_flow_paused(settings, flow.name, paused, reason, now_ms=int(time.time() * 1000),
                                  cluster_name=flow.target, client_id="dcmirror-console")
        return act

    return {"pause": action(True), "resume": action(False)}


def cmd_console(args: argparse.Namespace) -> int:
    from cluster.broker.config import parse_listen
    from cluster.security.tls import https_context
    from topology import TopologyError, load
    from topology.model import is_loopback

    try:
        topology = load(args.config)
        spec = topology.console
        if args.listen:
            host, port = parse_listen(args.listen)
        elif spec is not None:
            host, port = spec.listen.host, spec.listen.port
        else:
            host, port = DEFAULT_LISTEN
        refresh_ms = args.refresh_ms or (spec.refresh_ms if spec is not None else 2000)
        if not 250 <= refresh_ms <= 60_000:
            raise ValueError("--refresh-ms must be between 250 and 60000")
        console = make_console(topology, refresh_ms / 1000)
        if console.open and not is_loopback(host):
            raise ValueError(f"refusing to serve a console without login on {host}: give [console] auth_token "
                             "or SASL clusters, or listen on a loopback address")
        tls = https_context(Path(spec.keystore), "console.keystore") if spec is not None and spec.keystore else None
    except (TopologyError, ValueError, OSError) as exc:
        print(f"dcmirror console: {exc}", file=sys.stderr)
        return 1
    try:
        trio.run(_serve, console, host, port, tls)
    except OSError as exc:
        print(f"dcmirror console: {exc}", file=sys.stderr)
        return 1
    return 0


async def _serve(console: Any, host: str, port: int, tls: Any) -> None:
    from cluster.registry.app import serve
    from deploy.console.app import build_app

    app = build_app(console)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(console.poller.run)
            nursery.start_soon(_close_idle_clients, console)
            await nursery.start(console.actions.run)  # promote / failover / failback in the background
            await nursery.start(lambda task_status: serve(app, host, port, tls=tls, logger=log,
                                                          task_status=task_status))
            shown = f"[{host}]" if ":" in host else host
            print(f"console ready on {'https' if tls else 'http'}://{shown}:{port}/", flush=True)
            async for signum in signals:
                log.info("signal %d: stopping the console", signum)
                nursery.cancel_scope.cancel()
                break


async def _close_idle_clients(console: Any) -> None:
    """Users' connections to the clusters are closed once idle, even when no page asks again."""
    from deploy.console.app import CLIENT_IDLE_S

    while True:
        await trio.sleep(CLIENT_IDLE_S / 2)
        await console.clients.close_idle()
