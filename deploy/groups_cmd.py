"""`dcmirror groups list|describe|reset-offsets|delete-offsets|delete`, like kafka-consumer-groups."""

from __future__ import annotations

import argparse
import datetime
import sys
from typing import Any

from cluster.client.admin import Admin
from cluster.client.errors import error_name
from deploy.cluster_cmds import add_target, admin_command, admin_for
from deploy.group_offsets import GroupNotEmpty, ResetTo, commit_moves, partitions_of, plan_reset


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    groups = sub.add_parser("groups", help="list, describe, reset offsets of, delete consumer groups")
    add_target(groups)  # --bootstrap, or --config FILE --cluster NAME; --command-config (as kafka-consumer-groups)
    actions = groups.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="every group with its state")
    describe = actions.add_parser("describe", help="offsets, log end, lag and owner per partition")
    describe.add_argument("group", help="the consumer group")
    delete = actions.add_parser("delete", help="delete an empty group and its offsets")
    delete.add_argument("group", help="the consumer group (it must have no members)")
    reset = actions.add_parser("reset-offsets", help="move a group's committed offsets (dry run by default)")
    reset.add_argument("group", help="the consumer group (it must have no members)")
    reset.add_argument("--topic", action="append", required=True, help="TOPIC or TOPIC:P1,P2 (repeatable)")
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true", help="to each partition's log start")
    target.add_argument("--to-latest", action="store_true", help="to each partition's end")
    target.add_argument("--to-offset", type=int, help="to this offset in every partition")
    target.add_argument("--to-datetime", help="ISO 8601, e.g. 2026-01-31T12:00:00Z")
    target.add_argument("--shift-by", type=int, help="by this many offsets from the committed ones (negative: back)")
    reset.add_argument("--execute", action="store_true", help="commit the new offsets (default: dry run)")
    forget = actions.add_parser("delete-offsets", help="delete a group's committed offsets of some topics")
    forget.add_argument("group", help="the consumer group")
    forget.add_argument("--topic", action="append", required=True, help="TOPIC or TOPIC:P1,P2 (repeatable)")
    groups.set_defaults(func=admin_command("groups", _run))


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


async def _run(args: argparse.Namespace) -> int:
    async with admin_for(args, "dcmirror-groups") as admin:
        if args.action == "list":
            rows = [["GROUP", "PROTOCOL-TYPE", "STATE"]]
            rows += [[g, p or "-", s] for g, p, s in sorted(await admin.list_groups())]
            print(_table(rows))
        elif args.action == "describe":
            group, lags = await admin.describe_group_lag(args.group)
            kip848 = await admin.describe_consumer_group(args.group)
            if kip848 is None:
                print(f"group {args.group}: state {group.group_state}, {len(group.members)} member(s)")
            else:
                print(_consumer_group(args.group, kip848))
            rows = [["TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID", "HOST",
                     "CLIENT-ID"]]
            for r in lags:
                rows.append([r.topic, str(r.partition), "-" if r.committed is None else str(r.committed),
                             str(r.log_end), "-" if r.lag is None else str(r.lag), r.member_id, r.host,
                             r.client_id])
            print(_table(rows))
        elif args.action == "delete":
            await admin.delete_group(args.group)
            print(f"deleted group {args.group}")
        elif args.action == "reset-offsets":
            return await _reset(admin, args)
        elif args.action == "delete-offsets":
            codes = await admin.delete_group_offsets(args.group, await partitions_of(admin, args.topic))
            rows = [["TOPIC", "PARTITION", "STATUS"]]
            rows += [[t, str(p), "deleted" if code == 0 else error_name(code)] for (t, p), code in sorted(codes.items())]
            print(_table(rows))
            return 0 if all(code == 0 for code in codes.values()) else 1
    return 0


def _assignment(topic_partitions: Any) -> str:
    """t:0,1 u:3 (a member's assignment, as kafka-consumer-groups --members --verbose)."""
    return " ".join(f"{t.topic_name}:{','.join(map(str, sorted(t.partitions)))}"
                    for t in sorted(topic_partitions, key=lambda t: t.topic_name)) or "-"


def _consumer_group(group_id: str, g: Any) -> str:
    """A KIP-848 group: its epochs and assignor, then each member's epoch and assignments
    (a member behind the group epoch is still revoking or waiting for partitions)."""
    head = (f"group {group_id}: state {g.group_state}, {len(g.members)} member(s), consumer protocol "
            f"(group epoch {g.group_epoch}, assignment epoch {g.assignment_epoch}, assignor {g.assignor_name})")
    rows = [["CONSUMER-ID", "HOST", "CLIENT-ID", "INSTANCE-ID", "EPOCH", "ASSIGNMENT", "TARGET-ASSIGNMENT"]]
    for m in sorted(g.members, key=lambda m: (m.client_id, m.member_id)):
        rows.append([m.member_id, m.client_host or "-", m.client_id or "-", m.instance_id or "-", str(m.member_epoch),
                     _assignment(m.assignment.topic_partitions), _assignment(m.target_assignment.topic_partitions)])
    return head + "\n" + _table(rows)


async def _reset(admin: Admin, args: argparse.Namespace) -> int:
    if args.to_earliest:
        to = ResetTo("earliest")
    elif args.to_latest:
        to = ResetTo("latest")
    elif args.to_offset is not None:
        to = ResetTo("offset", args.to_offset)
    elif args.to_datetime is not None:
        when = datetime.datetime.fromisoformat(args.to_datetime.replace("Z", "+00:00"))
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.UTC)
        to = ResetTo("datetime", timestamp_ms=int(when.timestamp() * 1000))
    else:
        to = ResetTo("shift", args.shift_by)
    try:
        moves = await plan_reset(admin, args.group, await partitions_of(admin, args.topic), to)
    except GroupNotEmpty as exc:
        print(f"dcmirror groups: {exc}", file=sys.stderr)
        return 1
    rows = [["TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET"]]
    rows += [[m.topic, str(m.partition), "-" if m.current is None else str(m.current), str(m.new)] for m in moves]
    print(_table(rows))
    if args.execute:
        await commit_moves(admin, args.group, moves)
        print(f"committed new offsets for group {args.group}")
    else:
        print("dry run: nothing committed (add --execute to commit)")
    return 0
