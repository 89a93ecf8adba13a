"""`dcmirror share-groups list|describe|reset-offsets|delete-offsets|delete`, like
kafka-share-groups (KIP-932).

    dcmirror share-groups --bootstrap B list
    dcmirror share-groups --bootstrap B describe G [--members | --state | --offsets]
    dcmirror share-groups --bootstrap B reset-offsets G (--topic T[:P,..] ... | --all-topics)
        (--to-earliest | --to-latest | --to-offset N | --to-datetime T | --by-duration PnDTnHnMnS) [--execute]
    dcmirror share-groups --bootstrap B delete-offsets G --topic T ...
    dcmirror share-groups --bootstrap B delete G      (an empty share group; one with members is refused)

Offsets are the share partitions' start offsets (SPSO): the first record not yet accepted or
rejected. They are reset or deleted only while the group has no members.

A share group's configs (share.auto.offset.reset, ...) are `dcmirror configs --entity-type groups`.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from typing import Any

from cluster.client.admin import Admin, AdminError, SharePartitionOffset
from cluster.groups.group_configs import duration_ms
from cluster.protocol.errors import ErrorCode
from deploy.cluster_cmds import add_target, admin_command, admin_for
from deploy.group_offsets import ResetTo, partitions_of, plan_offsets
from deploy.groups_cmd import _table


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("share-groups", help="list, describe, reset offsets of, delete share groups "
                                            "(like kafka-share-groups)")
    add_target(p)  # --bootstrap, or --config FILE --cluster NAME; --command-config
    actions = p.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="every share group with its state")
    describe = actions.add_parser("describe", help="a share group's members and assignments, or its state")
    describe.add_argument("group", help="the share group")
    what = describe.add_mutually_exclusive_group()
    what.add_argument("--members", action="store_true", help="each member and its partitions (the default)")
    what.add_argument("--state", action="store_true", help="the coordinator, the state and the member count")
    what.add_argument("--offsets", action="store_true", help="each share partition's start offset and lag")
    reset = actions.add_parser("reset-offsets", help="move an empty share group's start offsets (dry run by default)")
    reset.add_argument("group", help="the share group (it must have no members; one that does not exist is made)")
    which = reset.add_mutually_exclusive_group(required=True)
    which.add_argument("--topic", action="append", help="TOPIC or TOPIC:P1,P2 (repeatable)")
    which.add_argument("--all-topics", action="store_true", help="every share partition the group has")
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true", help="to each partition's log start")
    target.add_argument("--to-latest", action="store_true", help="to each partition's end")
    target.add_argument("--to-offset", type=int, help="to this offset in every partition (kept in the log's range)")
    target.add_argument("--to-datetime", help="to the first record at or after this time (ISO 8601, e.g. "
                                              "2026-01-31T12:00:00Z)")
    target.add_argument("--by-duration", help="to the first record at or after this long ago (ISO 8601 duration, "
                                              "e.g. PT1H)")
    reset.add_argument("--execute", action="store_true", help="move the offsets (default: dry run)")
    forget = actions.add_parser("delete-offsets", help="delete an empty share group's offsets of some topics")
    forget.add_argument("group", help="the share group (it must have no members)")
    forget.add_argument("--topic", action="append", required=True, help="a topic (repeatable)")
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


def _offsets(group_id: str, offsets: list[SharePartitionOffset]) -> str:
    rows = [["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "LAG"]]
    rows += [[group_id, o.topic, str(o.partition), "-" if o.start_offset < 0 else str(o.start_offset),
              "-" if o.lag < 0 and o.start_offset < 0 else str(o.lag)] for o in offsets]
    return _table(rows) if offsets else f"share group {group_id} has no share partitions with offsets"


def _reset_to(args: argparse.Namespace) -> ResetTo:
    if args.to_earliest:
        return ResetTo("earliest")
    if args.to_latest:
        return ResetTo("latest")
    if args.to_offset is not None:
        return ResetTo("offset", args.to_offset)
    if args.to_datetime is not None:
        try:
            when = datetime.datetime.fromisoformat(args.to_datetime.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"--to-datetime {args.to_datetime!r} is not an ISO 8601 time (e.g. "
                             "2026-01-31T12:00:00Z)") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.UTC)
        return ResetTo("datetime", timestamp_ms=int(when.timestamp() * 1000))
    ago_ms = duration_ms(args.by_duration)
    if ago_ms is None:
        raise ValueError(f"--by-duration {args.by_duration!r} is not an ISO 8601 duration (e.g. PT1H, P1DT2H)")
    return ResetTo("datetime", timestamp_ms=int(time.time() * 1000) - ago_ms)


async def _reset(admin: Admin, args: argparse.Namespace) -> int:
    to = _reset_to(args)
    try:
        group = await admin.describe_share_group(args.group)
    except AdminError as exc:
        if exc.code != ErrorCode.group_id_not_found:
            raise
        group = None  # as kafka-share-groups: the reset makes an empty share group
    if group is not None and group.members:
        print(f"dcmirror share-groups: share group {args.group!r} has {len(group.members)} member(s); its offsets "
              f"can be reset once they have left", file=sys.stderr)
        return 1
    current = {(o.topic, o.partition): o.start_offset for o in await admin.share_group_offsets(args.group)} \
        if group is not None else {}
    partitions = sorted(current) if args.all_topics else await partitions_of(admin, args.topic)
    if not partitions:
        print(f"dcmirror share-groups: share group {args.group!r} has no share partitions to reset (name them "
              f"with --topic)", file=sys.stderr)
        return 1
    moves = await plan_offsets(admin, partitions, to, {tp: off for tp, off in current.items() if off >= 0})
    rows = [["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET"]]
    rows += [[args.group, m.topic, str(m.partition), "-" if m.current is None else str(m.current), str(m.new)]
             for m in moves]
    print(_table(rows))
    if not args.execute:
        print("dry run: nothing moved (add --execute to move the offsets)")
        return 0
    try:
        codes = await admin.alter_share_group_offsets(args.group, {(m.topic, m.partition): m.new for m in moves})
    except AdminError as exc:
        if exc.code != ErrorCode.non_empty_group:
            raise
        print(f"dcmirror share-groups: share group {args.group!r} has members; its offsets can be reset once they "
              f"have left", file=sys.stderr)
        return 1
    failed = {tp: code for tp, code in codes.items() if code != 0}
    for (t, p), code in sorted(failed.items()):
        print(f"dcmirror share-groups: {t}-{p}: {ErrorCode(code).name}", file=sys.stderr)
    if failed:
        return 1
    print(f"moved the start offsets of share group {args.group}")
    return 0


async def _delete_offsets(admin: Admin, args: argparse.Namespace) -> int:
    try:
        answers = await admin.delete_share_group_offsets(args.group, args.topic)
    except AdminError as exc:
        if exc.code == ErrorCode.non_empty_group:
            print(f"dcmirror share-groups: share group {args.group!r} has members; its offsets can be deleted once "
                  f"they have left", file=sys.stderr)
            return 1
        if exc.code == ErrorCode.group_id_not_found:
            raise ValueError(f"{args.group!r} is not a share group (none of that name, or a consumer group: see "
                             f"dcmirror groups)") from None
        raise
    rows = [["TOPIC", "STATUS"]]
    rows += [[t, "Successful" if code == 0 else f"Error: {message or ErrorCode(code).name}"]
             for t, (code, message) in sorted(answers.items())]
    print(_table(rows))
    return 0 if all(code == 0 for code, _ in answers.values()) else 1


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
            elif args.offsets:
                print(_offsets(args.group, await admin.share_group_offsets(args.group)))
            else:
                print(_members(group))
        elif args.action == "reset-offsets":
            return await _reset(admin, args)
        elif args.action == "delete-offsets":
            return await _delete_offsets(admin, args)
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
