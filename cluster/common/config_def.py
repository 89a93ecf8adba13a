"""Kafka-style configuration definitions: a name, a type, a default, bounds and choices.

Broker, topic and client configs all use Kafka's names (a user's existing config works),
and all are parsed and checked here, so a bad value gets the same clear error everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class InvalidConfig(ValueError):
    """A config value users gave that cannot be used; the message names key and fix."""


@dataclass(frozen=True, slots=True)
class ConfigDef:
    name: str
    type: type
    default: Any
    broker_key: str | None  # the broker config that supplies the default, as in Kafka
    doc: str
    minimum: int | None = None
    choices: tuple[str, ...] | None = None


def _parse_bool(value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise ValueError(f"{value!r} is not a boolean (true/false)")


def parse_value(definition: ConfigDef, raw: object) -> Any:
    """Parse a raw (usually string) value and check its range; raises InvalidConfig."""
    try:
        if definition.type is bool:
            value: Any = raw if isinstance(raw, bool) else _parse_bool(str(raw))
        elif definition.type is int:
            value = int(str(raw).strip())
        else:
            value = str(raw).strip()
    except ValueError as exc:
        raise InvalidConfig(f"config {definition.name}: {exc}") from None
    if definition.minimum is not None and isinstance(value, int) and value < definition.minimum:
        raise InvalidConfig(f"config {definition.name}={value} is below its minimum {definition.minimum}")
    if definition.choices is not None:
        parts = [p.strip() for p in str(value).split(",")]
        bad = [p for p in parts if p not in definition.choices]
        if bad:
            raise InvalidConfig(
                f"config {definition.name}={value!r}: {bad[0]!r} is not one of {', '.join(definition.choices)}"
            )
    return value
