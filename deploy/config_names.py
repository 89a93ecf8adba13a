"""The topic and broker config names a dcmirror broker knows (its own definitions and Kafka's
broker config table), for `topology check` and the commands that load a topology before they
act: a misspelt name is refused at the file's line with the nearest known one, and a value
the broker would refuse (not a number, out of range, not one of the choices) with the
broker's own message, instead of failing later at `topology apply` against live brokers
(topology/load.py `ConfigNames`)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from cluster.broker.config import (
    BROKER_CONFIG_DEFS,
    BROKER_QUOTA_CONFIG_DEFS,
    KAFKA_CONFIG_DEFS,
    KAFKA_STATIC_ONLY_CONFIGS,
    LOG_DEFAULT_DEFS,
    broker_config_def,
    is_known_broker_config,
)
from cluster.common.config_def import InvalidConfig, parse_value
from cluster.storage.config import EXTRA_TOPIC_CONFIG_DEFS, TOPIC_CONFIG_DEFS, topic_config_def


class BrokerConfigNames:
    def known(self, kind: str, name: str) -> bool:
        if kind == "topic":
            return topic_config_def(name) is not None
        return is_known_broker_config(name)

    def names(self, kind: str) -> Sequence[str]:
        return _topic_names() if kind == "topic" else _broker_names()

    def problem(self, kind: str, name: str, value: str) -> str | None:
        """The broker's own refusal of `value` for a known config (None: it takes it, or the
        value is a ${provider:...} reference resolved only where the broker runs)."""
        definition = topic_config_def(name) if kind == "topic" else broker_config_def(name)
        if definition is None or "${" in value:
            return None
        try:
            parse_value(definition, value)
        except InvalidConfig as exc:
            return str(exc)
        return None


@cache
def _topic_names() -> tuple[str, ...]:
    return tuple(sorted({*TOPIC_CONFIG_DEFS, *EXTRA_TOPIC_CONFIG_DEFS}))


@cache
def _broker_names() -> tuple[str, ...]:
    return tuple(sorted({*BROKER_CONFIG_DEFS, *LOG_DEFAULT_DEFS, *KAFKA_CONFIG_DEFS, *BROKER_QUOTA_CONFIG_DEFS,
                         *KAFKA_STATIC_ONLY_CONFIGS}))


CONFIG_NAMES = BrokerConfigNames()
