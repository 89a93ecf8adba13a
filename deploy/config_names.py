"""The topic and broker config names a dcmirror broker knows (its own definitions and Kafka's
broker config table), for `topology check` and the commands that load a topology before they
act: a misspelt name is refused at the file's line with the nearest known one, instead of
failing later at `topology apply` against live brokers (topology/load.py `ConfigNames`)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from cluster.broker.config import (
    BROKER_CONFIG_DEFS,
    BROKER_QUOTA_CONFIG_DEFS,
    KAFKA_CONFIG_DEFS,
    KAFKA_STATIC_ONLY_CONFIGS,
    LOG_DEFAULT_DEFS,
    is_known_broker_config,
)
from cluster.storage.config import EXTRA_TOPIC_CONFIG_DEFS, TOPIC_CONFIG_DEFS, topic_config_def


class BrokerConfigNames:
    def known(self, kind: str, name: str) -> bool:
        if kind == "topic":
            return topic_config_def(name) is not None
        return is_known_broker_config(name)

    def names(self, kind: str) -> Sequence[str]:
        return _topic_names() if kind == "topic" else _broker_names()


@cache
def _topic_names() -> tuple[str, ...]:
    return tuple(sorted({*TOPIC_CONFIG_DEFS, *EXTRA_TOPIC_CONFIG_DEFS}))


@cache
def _broker_names() -> tuple[str, ...]:
    return tuple(sorted({*BROKER_CONFIG_DEFS, *LOG_DEFAULT_DEFS, *KAFKA_CONFIG_DEFS, *BROKER_QUOTA_CONFIG_DEFS,
                         *KAFKA_STATIC_ONLY_CONFIGS}))


CONFIG_NAMES = BrokerConfigNames()
