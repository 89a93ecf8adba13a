"""`dcmirror users add|list|remove` (kafka-configs --alter --add-config SCRAM-SHA-512=...)
and `dcmirror acls add|list|remove` (kafka-acls), against any cluster.

Both take `--bootstrap HOST:PORT` (acls also kafka-acls' `--bootstrap-server`) and
`--command-config FILE`: a client properties file with the caller's own security settings
(security.protocol, sasl.*, ssl.*), as Kafka's tools do. `acls remove` asks before it removes
anything, unless `--force` (kafka-acls' prompt).
Passwords are read from a file or the terminal, never from the command line; only the
salted password travels (AlterUserScramCredentials), never the password itself.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from pathlib import Path
from typing import Any

from cluster.client.admin import Admin
from cluster.security.acl import (
    CLUSTER_NAME,
    AclBinding,
    AclFilter,
    AclOperation,
    AclPermissionType,
    InvalidAcl,
    PatternType,
    ResourceType,
)
from cluster.security.scram import DEFAULT_ITERATIONS, MECHANISMS
from deploy.cluster_cmds import add_target, admin_command, admin_for


def _common(p: argparse.ArgumentParser, cluster_flag: str = "--cluster") -> None:
    add_target(p, cluster_flag)  # --bootstrap, or --config FILE --cluster NAME; --command-config


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    users = sub.add_parser("users", help="SCRAM users: add, list, remove")
    u = users.add_subparsers(dest="action", required=True)
    add = u.add_parser("add", help="add a user or change its password")
    add.add_argument("name", help="the user's name")
    add.add_argument("--password-file", help="file holding the password (default: ask on the terminal)")
    add.add_argument("--mechanism", action="append", choices=sorted(MECHANISMS),
                     help="SCRAM-SHA-256 / SCRAM-SHA-512 (repeatable; default both)")
    add.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS, help=f"SCRAM iterations (default {DEFAULT_ITERATIONS})")
    _common(add)
    lst = u.add_parser("list", help="users and their mechanisms")
    _common(lst)
    rm = u.add_parser("remove", help="remove a user's credentials")
    rm.add_argument("name", help="the user's name")
    rm.add_argument("--mechanism", action="append", choices=sorted(MECHANISMS), help="only this mechanism's credential (repeatable; default: every one)")
    _common(rm)
    users.set_defaults(func=admin_command("users", _users))

    acls = sub.add_parser("acls", help="ACLs, in the shape of kafka-acls: add, list, remove")
    a = acls.add_subparsers(dest="action", required=True)
    for name, text in (("add", "add ACLs"), ("list", "list ACLs (filters narrow)"), ("remove", "remove matching ACLs")):
        p = a.add_parser(name, help=text)
        p.add_argument("--allow-principal", action="append", default=[], metavar="User:NAME", help="the principal allowed (repeatable)")
        p.add_argument("--deny-principal", action="append", default=[], metavar="User:NAME", help="the principal denied (repeatable; deny wins over allow)")
        p.add_argument("--principal", help="list/remove: only this principal's ACLs")
        p.add_argument("--allow-host", action="append", default=[],
                       help="host of the --allow-principal ACLs (default *)")
        p.add_argument("--deny-host", action="append", default=[], help="host of the --deny-principal ACLs (default *)")
        p.add_argument("--operation", action="append", default=[],
                       help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs, "
                            "AlterConfigs, IdempotentWrite, All")
        p.add_argument("--topic", action="append", default=[], help="a topic resource (repeatable; * for every one)")
        p.add_argument("--group", action="append", default=[], help="a consumer group resource (repeatable)")
        p.add_argument("--transactional-id", action="append", default=[], help="a transactional id resource (repeatable)")
        p.add_argument("--cluster", action="store_true", help="the cluster resource")
        p.add_argument("--resource-pattern-type", default="literal",
                       choices=["literal", "prefixed", "any", "match"],
                       help="literal (the name itself), prefixed (names starting with it); list and remove "
                            "also take any and match (default literal)")
        _common(p, "--topology-cluster")  # --bootstrap-server is kafka-acls' name for --bootstrap
        if name == "remove":
            p.add_argument("--force", action="store_true", help="remove without asking (kafka-acls' --force)")
    acls.set_defaults(func=admin_command("acls", _acls, (InvalidAcl,)))


def _admin(args: argparse.Namespace) -> Admin:
    return admin_for(args, "dcmirror-security")


def _password(args: argparse.Namespace) -> bytes:
    if args.password_file:
        text = Path(args.password_file).read_text().rstrip("\r\n")
    elif sys.stdin.isatty():
        text = getpass.getpass(f"password for {args.name}: ")
        if getpass.getpass("again: ") != text:
            raise ValueError("the passwords differ")
    else:
        text = sys.stdin.readline().rstrip("\r\n")
    if len(text) < 8:
        raise ValueError("a password needs at least 8 characters")
    return text.encode()


async def _users(args: argparse.Namespace) -> int:
    async with _admin(args) as admin:
        if args.action == "list":
            users = await admin.describe_scram_credentials()
            for name in sorted(users):
                print(f"{name}  " + "  ".join(f"{m}(iterations={i})" for m, i in users[name]))
            return 0
        mechanisms = args.mechanism or sorted(MECHANISMS)
        if args.action == "add":
            results = await admin.set_scram_password(args.name, _password(args), mechanisms, args.iterations)
        else:
            results = await admin.alter_scram_credentials([], [(args.name, m) for m in mechanisms])
        failed = {u: r for u, r in results.items() if r[0] != 0}
        for user, (code, message) in failed.items():
            print(f"dcmirror users: {user}: {message or code}", file=sys.stderr)
        if not failed:
            print(f"user {args.name}: {'set' if args.action == 'add' else 'removed'} ({', '.join(mechanisms)})")
        return 1 if failed else 0


_OPERATIONS: dict[str, AclOperation] = {op.name.replace("_", "").lower(): op for op in AclOperation
                                         if op not in (AclOperation.UNKNOWN, AclOperation.ANY)}


def _resources(args: argparse.Namespace) -> list[tuple[ResourceType, str]]:
    out = [(ResourceType.TOPIC, t) for t in args.topic] + [(ResourceType.GROUP, g) for g in args.group]
    out += [(ResourceType.TRANSACTIONAL_ID, t) for t in args.transactional_id]
    if args.cluster:
        out.append((ResourceType.CLUSTER, CLUSTER_NAME))
    return out


def _operations(args: argparse.Namespace) -> list[AclOperation]:
    ops: list[AclOperation] = []
    for text in args.operation:
        op = _OPERATIONS.get(text.replace("-", "").replace("_", "").lower())
        if op is None:
            raise ValueError(f"--operation {text!r} is not one of {', '.join(sorted(_OPERATIONS))}")
        ops.append(op)
    return ops


def _show(b: AclBinding) -> str:
    return (f"{b.resource_type.name.lower()}:{b.resource_name} ({b.pattern_type.name.lower()})  "
            f"{b.principal}  {b.permission.name}  {b.operation.name}  from {b.host}")


async def _acls(args: argparse.Namespace) -> int:
    pattern = PatternType[args.resource_pattern_type.upper()]
    async with _admin(args) as admin:
        if args.action == "add":
            principals = [(p, AclPermissionType.ALLOW) for p in args.allow_principal]
            principals += [(p, AclPermissionType.DENY) for p in args.deny_principal]
            resources, ops = _resources(args), _operations(args)
            if not principals or not resources or not ops:
                raise ValueError("acls add needs --allow-principal/--deny-principal, --operation and a resource "
                                 "(--topic, --group, --transactional-id or --cluster)")
            bindings = [AclBinding(rt, name, pattern, principal, host, op, perm).validate()
                        for principal, perm in principals for rt, name in resources for op in ops
                        for host in _hosts(args, perm)]
            await admin.create_acls(bindings)
            for b in bindings:
                print(f"added  {_show(b)}")
            return 0
        filters = _filters(args, pattern)
        if args.action == "list":
            found: list[AclBinding] = []
            for f in filters:
                found += [b for b in await admin.describe_acls(f) if b not in found]
            for b in found:
                print(_show(b))
            return 0
        if not args.force:
            doomed: list[AclBinding] = []
            for f in filters:
                doomed += [b for b in await admin.describe_acls(f) if b not in doomed]
            if not doomed:
                return 0
            print("Are you sure you want to remove these ACLs? (y/n)\n" + "\n".join(f"  {_show(b)}" for b in doomed),
                  flush=True)
            if sys.stdin.readline().strip().lower() != "y":
                print("dcmirror acls: not confirmed, nothing removed (answer y, or pass --force)", file=sys.stderr)
                return 0
        for b in await admin.delete_acls(filters):
            print(f"removed  {_show(b)}")
        return 0


def _hosts(args: argparse.Namespace, permission: AclPermissionType) -> list[str]:
    """kafka-acls: --allow-host goes with the --allow-principal ACLs, --deny-host with the
    --deny-principal ones; * where none is given."""
    hosts = args.allow_host if permission is AclPermissionType.ALLOW else args.deny_host
    return hosts or ["*"]


def _filters(args: argparse.Namespace, pattern: PatternType) -> list[AclFilter]:
    ops = _operations(args) or [AclOperation.ANY]
    resources: list[tuple[ResourceType, Any]] = _resources(args) or [(ResourceType.ANY, None)]
    if args.action == "list" and args.resource_pattern_type == "literal" and resources[0][0] is ResourceType.ANY:
        pattern = PatternType.ANY
    # --principal: that principal's ACLs, any permission and host; --allow/--deny-principal
    # (kafka-acls --remove): exactly those ACLs, with their hosts (* where none is given).
    entries: list[tuple[str | None, str | None, AclPermissionType]] = []
    if args.principal or not (args.allow_principal or args.deny_principal):
        entries.append((args.principal, None, AclPermissionType.ANY))
    else:
        entries += [(p, h, perm) for perm, principals in ((AclPermissionType.ALLOW, args.allow_principal),
                                                          (AclPermissionType.DENY, args.deny_principal))
                    for p in principals for h in _hosts(args, perm)]
    return [AclFilter(rt, name, pattern, principal, host, op, perm)
            for rt, name in resources for op in ops for principal, host, perm in entries]
