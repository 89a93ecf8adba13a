"""`dcmirror lab`: a topology on one machine as if it ran in several datacenters.

    dcmirror lab up --config FILE [--work-dir DIR] [--latency-ms 30]
                                     namespaces and links for every datacenter and node, the
                                     topology run across them (until SIGINT/SIGTERM or `down`)
    dcmirror lab cut DC [--from DC ...] [--reject]
                                     cut the WAN between DC and the others (default: all)
    dcmirror lab heal [DC] [--from DC ...]
                                     put it back (no DC: every cut)
    dcmirror lab latency MS          change the one-way latency between datacenters
    dcmirror lab status [--json]     namespaces, addresses, cuts, WAN counters
    dcmirror lab down [--stale]      stop the lab and remove everything it made (--stale:
                                     of every lab whose `lab up` is gone)

DC is a datacenter name or the name of a cluster in it. Without --work-dir the commands act
on the one lab that runs. deploy/lab/ explains the design.
"""

from __future__ import annotations

import argparse
import sys
import time
from ipaddress import IPv4Network
from pathlib import Path

import orjson

from deploy.config_names import CONFIG_NAMES
from deploy.lab.plan import DEFAULT_LATENCY_MS, LINKS, PlanError, check_latency
from deploy.lab.state import LabError, find_work_dir
from topology import TopologyError, load

DEFAULT_WORK_DIR = "dcmirror-lab"


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    lab = sub.add_parser("lab", help="multi-datacenter lab on one machine: network namespaces, WAN latency, cuts")
    actions = lab.add_subparsers(dest="lab_action", required=True)

    up = actions.add_parser("up", help="create the lab's network and run the topology across it")
    up.add_argument("--config", required=True, help="topology file")
    up.add_argument("--work-dir", default=DEFAULT_WORK_DIR,
                    help=f"lab topology, data, logs and state (default ./{DEFAULT_WORK_DIR})")
    up.add_argument("--latency-ms", type=float, default=DEFAULT_LATENCY_MS,
                    help=f"one-way latency between datacenters (default {DEFAULT_LATENCY_MS:g})")
    up.add_argument("--link", choices=("auto", *LINKS), default="auto",
                    help="WAN links: tc netem, or the user-space WAN over TUN devices (default: netem if the kernel "
                         "has it)")
    up.add_argument("--base-network", type=IPv4Network, metavar="CIDR",
                    help="a /16 for the lab's subnets (default: the first free one of 10.10.0.0/16, 10.11.0.0/16, ...)")
    up.add_argument("--timeout", type=float, default=180.0, metavar="SECONDS",
                    help="how long to wait for the clusters and workers to be ready (default 180)")
    up.set_defaults(func=cmd_up)

    cut = actions.add_parser("cut", help="cut a datacenter off the WAN (from every other, or those named)")
    cut.add_argument("datacenter", help="datacenter (or a cluster in it)")
    cut.add_argument("--from", dest="others", action="append", default=[], metavar="DC",
                     help="only from this datacenter (repeatable)")
    cut.add_argument("--reject", action="store_true",
                     help="refuse packets at once (ICMP prohibited) instead of dropping them silently")
    cut.set_defaults(func=cmd_cut)

    heal = actions.add_parser("heal", help="undo cuts")
    heal.add_argument("datacenter", nargs="?", help="datacenter (or a cluster in it); none: heal every cut")
    heal.add_argument("--from", dest="others", action="append", default=[], metavar="DC",
                      help="only towards this datacenter (repeatable)")
    heal.set_defaults(func=cmd_heal)

    latency = actions.add_parser("latency", help="change the one-way latency between datacenters")
    latency.add_argument("latency_ms", type=float, metavar="MS", help="one-way delay between datacenters, milliseconds")
    latency.set_defaults(func=cmd_latency)

    status = actions.add_parser("status", help="the lab's namespaces, addresses, cuts and WAN counters")
    status.add_argument("--json", action="store_true", help="one JSON document")
    status.set_defaults(func=cmd_status)

    down = actions.add_parser("down", help="stop the lab; remove every namespace, link and process it made")
    down.add_argument("--stale", action="store_true",
                      help="instead: clean up after every lab whose `lab up` no longer runs")
    down.set_defaults(func=cmd_down)

    wan = actions.add_parser("wan", help="(run by `lab up`) the user-space WAN over the routers' TUN devices")
    wan.set_defaults(func=cmd_wan)

    for p in (cut, heal, latency, status, down, wan):
        p.add_argument("--work-dir", help="the lab's directory (default: the one lab running)")


def _fail(action: str, exc: Exception, code: int = 1) -> int:
    print(f"dcmirror lab {action}: {exc}", file=sys.stderr)
    return code


def _say(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)


def _requirements(action: str) -> int | None:
    from deploy.lab.network import missing_requirements

    why = missing_requirements()
    return None if why is None else _fail(action, LabError(why), 2)


def cmd_up(args: argparse.Namespace) -> int:
    from deploy.lab import run

    if (code := _requirements("up")) is not None:
        return code
    try:
        check_latency(args.latency_ms)
        topology = load(args.config, config_names=CONFIG_NAMES)
    except (TopologyError, PlanError, OSError) as exc:
        return _fail("up", exc, 2)
    if args.timeout <= 0:
        return _fail("up", ValueError(f"--timeout must be positive, not {args.timeout:g}"), 2)
    try:
        return run.up(topology, Path(args.config).resolve(), Path(args.work_dir).resolve(),
                      latency_ms=args.latency_ms, link=args.link, base=args.base_network, timeout_s=args.timeout,
                      say=_say)
    except (LabError, PlanError, TopologyError, OSError) as exc:
        return _fail("up", exc)


def cmd_cut(args: argparse.Namespace) -> int:
    from deploy.lab import run

    try:
        pairs = run.cut(find_work_dir(args.work_dir), args.datacenter, args.others, reject=args.reject)
    except (LabError, TopologyError) as exc:
        return _fail("cut", exc)
    for a, b in pairs:
        _say(f"cut {a} <-> {b} ({'refused' if args.reject else 'dropped'})")
    return 0


def cmd_heal(args: argparse.Namespace) -> int:
    from deploy.lab import run

    try:
        pairs = run.heal(find_work_dir(args.work_dir), args.datacenter, args.others)
    except (LabError, TopologyError) as exc:
        return _fail("heal", exc)
    for a, b in pairs:
        _say(f"healed {a} <-> {b}")
    if not pairs:
        _say("nothing was cut")
    return 0


def cmd_latency(args: argparse.Namespace) -> int:
    from deploy.lab import run

    try:
        run.set_latency(find_work_dir(args.work_dir), args.latency_ms)
    except (LabError, TopologyError, PlanError) as exc:
        return _fail("latency", exc)
    _say(f"latency between datacenters: {args.latency_ms:g} ms each way")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from deploy.lab import run

    try:
        doc = run.status(find_work_dir(args.work_dir))
    except LabError as exc:
        return _fail("status", exc)
    print(orjson.dumps(doc).decode() if args.json else run.format_status(doc))
    return 0 if doc["running"] else 1


def cmd_down(args: argparse.Namespace) -> int:
    from deploy.lab import run

    if (code := _requirements("down")) is not None:
        return code
    try:
        left = run.down_stale(_say) if args.stale else run.down(find_work_dir(args.work_dir), say=_say)
    except LabError as exc:
        return _fail("down", exc)
    if left:
        return _fail("down", LabError(f"could not remove: {', '.join(left)}"))
    _say("lab down: nothing of it is left")
    return 0


def cmd_wan(args: argparse.Namespace) -> int:
    from deploy.lab import tun

    try:
        return tun.serve(find_work_dir(args.work_dir))
    except (LabError, OSError) as exc:
        return _fail("wan", exc)
