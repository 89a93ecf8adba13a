"""`dcmirror configs`, in the shape of kafka-configs.sh: describe and alter the configs of
topics, brokers (dynamic broker configs, KIP-226: one broker's with --entity-name ID,
the cluster-wide default with --entity-default) and groups (KIP-848/KIP-932 group configs).

    dcmirror configs --bootstrap B --entity-type brokers --entity-default --alter --add-config log.retention.ms=3600000
    dcmirror configs --bootstrap B --entity-type brokers --entity-name 1 --describe [--all]
    dcmirror configs --bootstrap B --entity-type topics --entity-name T --alter --delete-config retention.ms
    dcmirror configs --bootstrap B --entity-type groups --entity-name G --alter --add-config share.auto.offset.reset=earliest
"""

from __future__ import annotations

import argparse
from typing import Any

from cluster.client.admin import Admin
from cluster.protocol.sentinels import (
    CONFIG_RESOURCE_GROUP,
    CONFIG_SOURCE_DYNAMIC_BROKER,
    CONFIG_SOURCE_DYNAMIC_DEFAULT_BROKER,
    CONFIG_SOURCE_GROUP,
    CONFIG_SOURCE_TOPIC,
    RESOURCE_BROKER,
    RESOURCE_TOPIC,
)
from deploy.cluster_cmds import _runner, add_target, admin_for

# Kafka's ConfigSource names (DescribeConfigsResponse.ConfigSource).
SOURCE_NAMES = {0: "UNKNOWN", 1: "TOPIC_CONFIG", 2: "DYNAMIC_BROKER_CONFIG", 3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
                4: "STATIC_BROKER_CONFIG", 5: "DEFAULT_CONFIG", 6: "DYNAMIC_BROKER_LOGGER_CONFIG",
                8: "GROUP_CONFIG"}
ENTITY_TYPES = {"topics": RESOURCE_TOPIC, "brokers": RESOURCE_BROKER, "groups": CONFIG_RESOURCE_GROUP}
ENTITY_TEXT = {RESOURCE_TOPIC: "topic", RESOURCE_BROKER: "broker", CONFIG_RESOURCE_GROUP: "group"}
MAX_CONFIGS = 1000  # configs one --add-config may carry


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("configs", help="describe or alter topic, broker and group configs (like kafka-configs)")
    add_target(p)
    p.add_argument("--entity-type", required=True, choices=sorted(ENTITY_TYPES), help="what the configs are of")
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--entity-name", help="topic name, broker id or group id")
    who.add_argument("--entity-default", action="store_true",
                     help="the cluster-wide default of every broker (brokers only)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--describe", action="store_true", help="print the configs, their values and sources")
    what.add_argument("--alter", action="store_true", help="set (--add-config) or remove (--delete-config) configs")
    p.add_argument("--all", action="store_true", help="with --describe: every config, not only the dynamic ones")
    p.add_argument("--add-config", action="append", default=[], metavar="K=V,K2=[V1,V2]",
                   help="configs to set, comma separated; a list value in brackets (repeatable)")
    p.add_argument("--delete-config", action="append", default=[], metavar="K,K2",
                   help="configs to remove, comma separated (repeatable)")
    p.set_defaults(func=_runner(_configs))


def parse_add_config(text: str) -> dict[str, str]:
    """kafka-configs' --add-config: k=v pairs split at commas outside square brackets;
    `[a,b]` is the list value a,b."""
    pairs: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            pairs.append(text[start:i])
            start = i + 1
    pairs.append(text[start:])
    out: dict[str, str] = {}
    for pair in (p.strip() for p in pairs):
        if not pair:
            continue
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--add-config {pair!r} must be KEY=VALUE (a list value as KEY=[V1,V2])")
        value = value.strip()
        if value.startswith("[") and value.endswith("]"):
            value = value[1:-1]
        out[key.strip()] = value
    if len(out) > MAX_CONFIGS:
        raise ValueError(f"--add-config carries {len(out)} configs; at most {MAX_CONFIGS}")
    return out


def _entity(args: argparse.Namespace) -> tuple[int, str, str]:
    """(resource type, resource name, how kafka-configs names it)."""
    kind = ENTITY_TYPES[args.entity_type]
    if args.entity_default:
        if kind != RESOURCE_BROKER:
            raise ValueError("--entity-default is for --entity-type brokers only")
        return kind, "", "default config for brokers in the cluster"
    name = str(args.entity_name)
    if kind == RESOURCE_BROKER and not name.isdigit():
        raise ValueError(f"--entity-name {name!r}: a broker is named by its id (or use --entity-default)")
    if kind == CONFIG_RESOURCE_GROUP and not name:
        raise ValueError("--entity-name: a group id is needed (group configs have no default entity)")
    return kind, name, f"config for {ENTITY_TEXT[kind]} {name}"


async def _configs(args: argparse.Namespace) -> int:
    kind, name, text = _entity(args)
    async with admin_for(args) as admin:
        if args.alter:
            return await _alter(admin, args, kind, name, text)
        return await _describe(admin, args, kind, name)


async def _alter(admin: Admin, args: argparse.Namespace, kind: int, name: str, text: str) -> int:
    to_set: dict[str, str] = {}
    for item in args.add_config:
        to_set.update(parse_add_config(item))
    to_delete = [k.strip() for item in args.delete_config for k in item.split(",") if k.strip()]
    if not to_set and not to_delete:
        raise ValueError("--alter needs --add-config K=V or --delete-config K")
    both = sorted(set(to_set) & set(to_delete))
    if both:
        raise ValueError(f"{', '.join(both)} both added and deleted")
    await admin.alter_configs(kind, name, to_set, to_delete)
    print(f"Completed updating {text}.")
    return 0


def _synonyms(entry: Any) -> str:
    return ", ".join(f"{SOURCE_NAMES.get(s.source, s.source)}:{s.name}={'' if s.value is None else s.value}"
                     for s in entry.synonyms)


async def _describe(admin: Admin, args: argparse.Namespace, kind: int, name: str) -> int:
    entries = await admin.describe_configs(kind, name, synonyms=True)
    # Kafka's ConfigCommand: a topic's own configs, a broker's own dynamic ones, or the
    # cluster-wide defaults (not what a broker inherits from them).
    own = (CONFIG_SOURCE_TOPIC if kind == RESOURCE_TOPIC else CONFIG_SOURCE_GROUP if kind == CONFIG_RESOURCE_GROUP
           else CONFIG_SOURCE_DYNAMIC_BROKER if name else CONFIG_SOURCE_DYNAMIC_DEFAULT_BROKER)
    shown = [e for e in entries if args.all or e.config_source == own]
    what = ("Default configs for brokers in the cluster" if kind == RESOURCE_BROKER and not name
            else f"{'All' if args.all else 'Dynamic'} configs for {ENTITY_TEXT[kind]} {name}")
    print(f"{what} are:")
    for e in sorted(shown, key=lambda e: str(e.name)):
        value = "" if e.value is None else e.value
        print(f"  {e.name}={value} sensitive={str(e.is_sensitive).lower()} synonyms={{{_synonyms(e)}}}")
    return 0
