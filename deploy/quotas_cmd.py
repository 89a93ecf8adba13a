"""`dcmirror quotas describe|alter`: client quotas, in the shape of kafka-configs.sh.

    dcmirror quotas alter --bootstrap HOST:PORT --entity-type clients --entity-name mirror-east \\
        --add-config producer_byte_rate=1048576,consumer_byte_rate=2097152
    dcmirror quotas alter ... --entity-type users --entity-default --delete-config request_percentage
    dcmirror quotas describe ... [--entity-type users --entity-name alice --entity-type clients ...]

`--entity-type users|clients` (repeat both for a user and client-id quota), each followed
by `--entity-name NAME` or `--entity-default`. Describe without an entity lists every quota.
"""

from __future__ import annotations

import argparse

from cluster.broker.quotas import (
    ENTITY_CLIENT_ID,
    ENTITY_USER,
    MATCH_DEFAULT,
    MATCH_EXACT,
    MATCH_SPECIFIED,
)
from deploy.cluster_cmds import add_target, admin_command, admin_for

_TYPES = {"users": ENTITY_USER, "clients": ENTITY_CLIENT_ID}


class _EntityName(argparse.Action):
    """Pairs each --entity-name / --entity-default with the --entity-type before it."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        types = getattr(namespace, "entity_type", None) or []
        names = getattr(namespace, "entity_names", None) or []
        if len(names) >= len(types):
            parser.error(f"{option_string} must follow an --entity-type")
        names.append(None if option_string == "--entity-default" else str(values))
        namespace.entity_names = names


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    quotas = sub.add_parser("quotas", help="client quotas (producer_byte_rate, consumer_byte_rate, "
                                           "request_percentage) per user / client id, like kafka-configs")
    actions = quotas.add_subparsers(dest="action", required=True)
    for name, text in (("describe", "show quotas (every one without --entity-type)"),
                       ("alter", "set (--add-config) or remove (--delete-config) quota keys of one entity")):
        p = actions.add_parser(name, help=text)
        p.add_argument("--entity-type", action="append", choices=sorted(_TYPES), default=[],
                       help="users or clients; both for a user and client-id quota")
        p.add_argument("--entity-name", action=_EntityName, help="the entity's name (after its --entity-type)")
        p.add_argument("--entity-default", action=_EntityName, nargs=0,
                       help="the default entity (<default>) of the --entity-type before it")
        if name == "alter":
            p.add_argument("--add-config", default="", help="KEY=VALUE[,KEY=VALUE...]")
            p.add_argument("--delete-config", default="", help="KEY[,KEY...]")
            p.add_argument("--validate-only", action="store_true", help="check with the broker, change nothing")
        add_target(p)
    quotas.set_defaults(func=admin_command("quotas", _run), entity_names=None)


def _entity(args: argparse.Namespace) -> dict[str, str | None]:
    names = args.entity_names or []
    if len(names) != len(args.entity_type):
        raise ValueError("every --entity-type needs an --entity-name NAME or --entity-default after it")
    entity: dict[str, str | None] = {}
    for t, n in zip(args.entity_type, names, strict=True):
        if _TYPES[t] in entity:
            raise ValueError(f"--entity-type {t} is given twice")
        entity[_TYPES[t]] = n
    return entity


def _ops(args: argparse.Namespace) -> dict[str, float | None]:
    ops: dict[str, float | None] = {}
    for pair in filter(None, (p.strip() for p in args.add_config.split(","))):
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--add-config {pair!r} is not KEY=VALUE")
        try:
            ops[key] = float(value)
        except ValueError:
            raise ValueError(f"--add-config {key}: {value!r} is not a number") from None
    for key in filter(None, (k.strip() for k in args.delete_config.split(","))):
        if key in ops:
            raise ValueError(f"{key} is both added and deleted")
        ops[key] = None
    if not ops:
        raise ValueError("quotas alter needs --add-config KEY=VALUE or --delete-config KEY")
    return ops


def _show(entity: tuple[tuple[str, str | None], ...]) -> str:
    kinds = {ENTITY_USER: "user", ENTITY_CLIENT_ID: "client-id"}
    return ", ".join(f"{kinds.get(t, t)} {'<default>' if n is None else repr(n)}" for t, n in entity)


async def _run(args: argparse.Namespace) -> int:
    entity = _entity(args)
    async with admin_for(args, "dcmirror-quotas") as admin:
        if args.action == "alter":
            if not entity:
                raise ValueError("quotas alter needs --entity-type users|clients with --entity-name or "
                                 "--entity-default")
            ops = _ops(args)
            await admin.alter_client_quotas([(entity, ops)], validate_only=args.validate_only)
            verb = "would be" if args.validate_only else "were"
            print(f"Quotas of {_show(tuple(sorted(entity.items())))} {verb} changed: "
                  + ", ".join(f"{k}={v:g}" if v is not None else f"{k} removed" for k, v in ops.items()))
            return 0
        components = [(t, MATCH_DEFAULT if n is None else MATCH_EXACT, n) for t, n in entity.items()]
        found = await admin.describe_client_quotas(components or [(ENTITY_USER, MATCH_SPECIFIED, None)],
                                                   strict=bool(components))
        if not components:
            found.update(await admin.describe_client_quotas([(ENTITY_CLIENT_ID, MATCH_SPECIFIED, None)]))
        for e in sorted(found, key=lambda e: [(t, n or "") for t, n in e]):
            values = ", ".join(f"{k}={v:g}" for k, v in sorted(found[e].items()))
            print(f"Quota configs for {_show(e)} are {values}")
        return 0
