"""`dcmirror share-groups list|describe|delete`, like kafka-share-groups (KIP-932).

    dcmirror share-groups --bootstrap B list
    dcmirror share-groups --bootstrap B describe G [--members | --state]
    dcmirror share-groups --bootstrap B delete G      (an empty share group; one with members is refused)

A share group's configs (share.auto.offset.reset, ...) are `dcmirror configs --entity-type groups`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cluster.client.admin import Admin, AdminError
from cluster.protocol.errors import ErrorCode
from deploy.cluster_cmds import add_target, admin_command, admin_for
from deploy.groups_cmd import _table


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("share-groups", help="list, describe, delete share groups (like kafka-share-groups)")
    add_target(p)  # --bootstrap, or --config FILE --cluster NAME; --command-config
    actions = p.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="every share group with its state")
    describe = actions.add_parser("describe", help="a share group's members and assignments, or its state")
    describe.add_argument("group", help="the share group")
    what = describe.add_mutually_exclusive_group()
    what.add_argument("--members", action="store_true", help="each member and its partitions (the default)")
    what.add_argument("--state", action="store_true", help="the coordinator, the state and the member count")
    delete = actions.add_parser("delete", help="delete an empty share group")
    delete.add_argument("group", help="the share group (it must have no members)")
    p.set_defaults(func=admin_command("share-groups", _run))


def _assignment(topic_partitions: Any) -> str:
    """t:0,1 u:3 (as kafka-share-groups --describe --members writes it)."""
    return " ".join(f"{t.topic_name}:{','.join(map(str, sorted(t.partitions)))}"
                    for t in sorted(topic_partitions, key=lambda t: t.topic_name)) or "-"


def _members(group: Any) -> str:
    head = (f"share group {group.group_id}: state {group.group_state}, {len(group.members)} member(s) "
            f"(group epoch {group.group_epoch}, assignment epoch {group.assignment_epoch}, "
            f"assignor {group.assignor_name})")
    rows = [["CONSUMER-ID", "HOST", "CLIENT-ID", "EPOCH", "#PARTITIONS", "ASSIGNMENT"]]
    for m in sorted(group.members, key=lambda m: (m.client_id, m.member_id)):
        parts = m.assignment.topic_partitions
        rows.append([m.member_id, m.client_host or "-", m.client_id or "-", str(m.member_epoch),
                     str(sum(len(t.partitions) for t in parts)), _assignment(parts)])
    return head + ("\n" + _table(rows) if group.members else "\nno members")


async def _share_group(admin: Admin, group_id: str) -> Any:
    try:
        return await admin.describe_share_group(group_id)
    except AdminError as exc:
        if exc.code == ErrorCode.group_id_not_found:
            raise ValueError(f"{group_id!r} is not a share group (none of that name, or a consumer group: "
                             f"see dcmirror groups)") from None
        raise


async def _run(args: argparse.Namespace) -> int:
    async with admin_for(args, "dcmirror-share-groups") as admin:
        if args.action == "list":
            rows = [["GROUP", "STATE"]] + [[g, s] for g, s in await admin.list_share_groups()]
            print(_table(rows))
        elif args.action == "describe":
            group = await _share_group(admin, args.group)
            if args.state:
                node = await admin.cluster.coordinator(args.group)
                conn = await admin.coordinator(args.group)
                print(_table([["GROUP", "COORDINATOR (ID)", "STATE", "#MEMBERS"],
                              [group.group_id, f"{conn.address} ({node})", group.group_state,
                               str(len(group.members))]]))
            else:
                print(_members(group))
        elif args.action == "delete":
            await _share_group(admin, args.group)  # as kafka-share-groups: only a share group
            try:
                await admin.delete_group(args.group)
            except AdminError as exc:
                if exc.code != ErrorCode.non_empty_group:
                    raise
                print(f"dcmirror share-groups: share group {args.group!r} has members; it can be deleted once "
                      f"they have left", file=sys.stderr)
                return 1
            print(f"deleted share group {args.group}")
    return 0
