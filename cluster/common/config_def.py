"""Kafka-style configuration definitions: a name, a type, a default, bounds and choices.

Broker, topic and client configs all use Kafka's names (a user's existing config works),
and all are parsed and checked here with the rules of Kafka's ConfigDef, so a bad value
gets the same error everywhere, worded as Kafka's ConfigException words it:
"Invalid value X for configuration Y: <why>".

Types, as Kafka's: `bool` (BOOLEAN: true or false, any case), `int` (INT when
width_bits=32, else LONG), `float` (DOUBLE), `str` (STRING) and `list` (LIST: a comma
separated list, kept as its canonical comma-joined string, which is also how Kafka
describes it). `choices` checks a STRING as a whole and a LIST element by element
(ValidString / ValidList); `minimum` and `maximum` are Kafka's Range; `validator` is
any other check (it raises InvalidConfig, see `invalid_value`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any


class InvalidConfig(ValueError):
    """A config value users gave that cannot be used; the message names key and fix."""


class ConfigUpdateRefused(InvalidConfig):
    """A dynamic broker config change Kafka refuses with INVALID_REQUEST rather than
    INVALID_CONFIG: a read-only config, or a value its checks refuse (Kafka's
    ConfigAdminManager turns every such ConfigException into InvalidRequestException,
    KAFKA-13609)."""


@dataclass(frozen=True, slots=True)
class ConfigDef:
    name: str
    type: type
    default: Any
    broker_key: str | None  # the broker config that supplies the default, as in Kafka
    doc: str
    minimum: int | float | None = None
    choices: tuple[str, ...] | None = None
    maximum: int | float | None = None
    width_bits: int = 64  # of an int: 32 is Kafka's INT, 64 its LONG
    validator: Callable[[str, Any], None] | None = None  # (name, parsed value); raises InvalidConfig

    @property
    def kafka_type(self) -> str:
        if self.type is int:
            return "INT" if self.width_bits == 32 else "LONG"
        return {bool: "BOOLEAN", float: "DOUBLE", list: "LIST"}.get(self.type, "STRING")


def invalid_value(name: str, value: object, why: str) -> InvalidConfig:
    """Kafka's ConfigException(name, value, message) wording."""
    return InvalidConfig(f"Invalid value {render_value(value)} for configuration {name}: {why}")


_INTEGER = re.compile(r"[+-]?[0-9]+")
_LIST_SEPARATOR = re.compile(r"\s*,\s*")


def list_items(value: str) -> list[str]:
    """The elements of a LIST value as Kafka splits it (empty: no element)."""
    text = value.strip()
    return _LIST_SEPARATOR.split(text) if text else []


def _parse(definition: ConfigDef, raw: object) -> Any:
    name, kind = definition.name, definition.type
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("true", "false"):
            return text == "true"
        raise invalid_value(name, raw, "Expected value to be either true or false")
    if kind is int:
        text = str(raw).strip()
        limit = 2 ** (definition.width_bits - 1)
        if isinstance(raw, bool) or not _INTEGER.fullmatch(text) or not -limit <= int(text) < limit:
            raise invalid_value(name, raw, f"Not a number of type {definition.kafka_type}")
        return int(text)
    if kind is float:
        try:
            return float(str(raw).strip())
        except ValueError:
            raise invalid_value(name, raw, "Not a number of type DOUBLE") from None
    if kind is list:
        return ",".join(list_items(",".join(map(str, raw)) if isinstance(raw, (list, tuple)) else str(raw)))
    return str(raw).strip()


def _check(definition: ConfigDef, value: Any) -> None:
    name = definition.name
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if definition.minimum is not None and value < definition.minimum:
            raise invalid_value(name, value, f"Value must be at least {definition.minimum}")
        if definition.maximum is not None and value > definition.maximum:
            raise invalid_value(name, value, f"Value must be no more than {definition.maximum}")
    if definition.choices is not None:
        items = list_items(value) if definition.type is list else [value]
        for item in items:
            if item not in definition.choices:
                raise invalid_value(name, item, f"String must be one of: {', '.join(definition.choices)}")
    if definition.validator is not None:
        definition.validator(name, value)


def parse_value(definition: ConfigDef, raw: object) -> Any:
    """Parse a raw (usually string) value as Kafka's ConfigDef does and check it; raises InvalidConfig."""
    value = _parse(definition, raw)
    _check(definition, value)
    return value


def java_double(value: float) -> str:
    """A double as Java's Double.toString writes it (how Kafka describes a DOUBLE config)."""
    if math.isnan(value) or math.isinf(value):
        return "NaN" if math.isnan(value) else ("-" if value < 0 else "") + "Infinity"
    if value == 0 or 1e-3 <= abs(value) < 1e7:
        return repr(value)
    sign, digit_tuple, exponent = Decimal(repr(value)).normalize().as_tuple()
    digits = "".join(map(str, digit_tuple))
    assert isinstance(exponent, int)
    return f"{'-' if sign else ''}{digits[0]}.{digits[1:] or '0'}E{len(digits) + exponent - 1}"


def render_value(value: Any) -> str:
    """A parsed value as Kafka writes it (DescribeConfigs, error messages)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return java_double(value)
    return str(value)
