"""The configuration in force on this broker: its static config under the dynamic broker
configs of the metadata log (KIP-226, Kafka's DynamicBrokerConfig), and how DescribeConfigs
reports each value's source.

Precedence, highest first, as in Kafka:
    DYNAMIC_BROKER_CONFIG          AlterConfigs on resource BROKER "<this broker's id>"
    DYNAMIC_DEFAULT_BROKER_CONFIG  AlterConfigs on resource BROKER "" (every broker)
    STATIC_BROKER_CONFIG           the broker's own config (properties, topology)
    DEFAULT_CONFIG                 Kafka's default
A topic config not set on the topic (TOPIC_CONFIG) follows its broker synonym down the same
chain (retention.ms → log.retention.ms). Every broker applies the metadata log, so a change
reaches each one with its next metadata update; the replica manager then gives every log
its new LogConfig (broker.py wires it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from cluster.broker.config import (
    ALTERABLE_BROKER_CONFIGS,
    BROKER_CONFIG_DEFS,
    BROKER_QUOTA_CONFIG_DEFS,
    KAFKA_CONFIG_DEFS,
    KAFKA_NULL_DEFAULTS,
    LOG_DEFAULT_DEFS,
    BrokerConfig,
    broker_config_def,
    is_sensitive,
    per_listener_setting,
)
from cluster.common.config_def import ConfigDef, InvalidConfig, parse_value, render_value
from cluster.controller.image import MetadataImage
from cluster.protocol.sentinels import (
    CONFIG_SOURCE_DEFAULT,
    CONFIG_SOURCE_DYNAMIC_BROKER,
    CONFIG_SOURCE_DYNAMIC_DEFAULT_BROKER,
    CONFIG_SOURCE_STATIC_BROKER,
    CONFIG_SOURCE_TOPIC,
)
from cluster.storage.config import EXTRA_TOPIC_CONFIG_DEFS, TOPIC_CONFIG_DEFS, LogConfig

log = logging.getLogger(__name__)

DEFAULT_RESOURCE = ""  # the resource name of the cluster-wide default
Synonym = dict[str, Any]  # DescribeConfigs synonym: name, value, source


class DynamicBrokerConfig:
    def __init__(self, static: BrokerConfig, node_id: int, image: Callable[[], MetadataImage]) -> None:
        self.static = static
        self.node_id = node_id
        self._image = image
        self._key: tuple[tuple[tuple[str, str], ...], ...] = ((), ())
        self._current = static

    def layers(self) -> tuple[Mapping[str, str], Mapping[str, str]]:
        """(cluster default, this broker's own) dynamic configs, raw, from the metadata image."""
        configs = self._image().broker_configs
        return configs.get(DEFAULT_RESOURCE, {}), configs.get(str(self.node_id), {})

    @property
    def current(self) -> BrokerConfig:
        default, own = self.layers()
        key = (tuple(sorted(default.items())), tuple(sorted(own.items())))
        if key != self._key:
            self._current, skipped = self.static.with_dynamic(default, own)
            for name, why in sorted(skipped.items()):
                log.error("dynamic broker config %s is not applied: %s", name, why)
            self._key = key
            log.info("broker %d applies dynamic broker configs: cluster default %s, own %s", self.node_id,
                     sorted(default), sorted(own))
        return self._current

    def log_config(self, topic_overrides: Mapping[str, object]) -> LogConfig:
        """A topic's LogConfig: its own configs over the log defaults in force. A dynamic
        default that conflicts with the topic's own configs (say a cluster-wide
        log.cleaner.max.compaction.lag.ms below the topic's min.compaction.lag.ms) does not
        make the topic fail to load, as in Kafka, where such checks run only when a topic's
        configs are set."""
        return LogConfig.build(topic_overrides, self.current.log_defaults, check_across=False)

    # ---- DescribeConfigs -----------------------------------------------------------------

    def synonyms(self, name: str) -> list[Synonym]:
        """Where the broker config `name` may come from, highest precedence first (Kafka's
        DynamicBrokerConfig synonyms): layer by layer (this broker's dynamic configs, the
        cluster's, the static config, Kafka's defaults), each of the names that set the same
        thing (log.retention.ms, .minutes, .hours); then everything before the first entry of
        `name` itself is dropped, as Kafka drops it. A default Kafka has as null is none: with
        nothing set, retention.ms has no synonym at all, and once log.retention.ms is set its
        chain ends at log.retention.hours' default."""
        group = _SYNONYM_GROUPS.get(name, (name,))
        default, own = self.layers()
        out: list[Synonym] = []
        for layer, source in ((own, CONFIG_SOURCE_DYNAMIC_BROKER), (default, CONFIG_SOURCE_DYNAMIC_DEFAULT_BROKER)):
            for n in group:
                if n in layer and (value := _rendered(broker_config_def(n), n, layer[n])) is not None:
                    out.append({"name": n, "value": value, "source": source})
        for n in group:
            if n in self.static.static_keys and n in self.static:
                out.append({"name": n, "value": render_value(self.static[n]), "source": CONFIG_SOURCE_STATIC_BROKER})
        for n in group:
            definition = broker_config_def(n)
            if (definition is not None and definition.default is not None and n not in KAFKA_NULL_DEFAULTS
                    and n not in BROKER_QUOTA_CONFIG_DEFS):
                out.append({"name": n, "value": render_value(definition.default), "source": CONFIG_SOURCE_DEFAULT})
        while out and out[0]["name"] != name:
            out.pop(0)
        return out

    def describe_broker(self, resource_name: str, keys: set[str] | None, with_synonyms: bool) -> list[dict[str, Any]]:
        """DescribeConfigs entries of resource BROKER "<this id>" (every config in force) or
        "" (only the cluster-wide dynamic defaults, as Kafka answers)."""
        per_broker = resource_name != DEFAULT_RESOURCE
        if per_broker:
            names = [*BROKER_CONFIG_DEFS, *LOG_DEFAULT_DEFS, *KAFKA_CONFIG_DEFS,
                     *sorted(n for n in self.static.static_keys if per_listener_setting(n) is not None),
                     # Kafka's broker quotas: described when set
                     *sorted({n for layer in self.layers() for n in layer if n in BROKER_QUOTA_CONFIG_DEFS})]
        else:
            names = sorted(self.layers()[0])
        entries = []
        for name in names:
            if keys is not None and name not in keys:
                continue
            chain = self.synonyms(name)
            if not per_broker:
                chain = [s for s in chain if s["source"] == CONFIG_SOURCE_DYNAMIC_DEFAULT_BROKER]
                if not chain:
                    continue
            entries.append(_entry(name, chain, read_only=name not in ALTERABLE_BROKER_CONFIGS,
                                  with_synonyms=with_synonyms))
        return entries

    def describe_topic(self, topic_configs: Mapping[str, str], keys: set[str] | None,
                       with_synonyms: bool) -> list[dict[str, Any]]:
        """DescribeConfigs entries of a topic: its own value (TOPIC_CONFIG) over the chain of
        its broker synonym (Kafka's createTopicConfigEntry)."""
        cfg = self.log_config(topic_configs)
        entries = []
        extras = [(n, d) for n, d in EXTRA_TOPIC_CONFIG_DEFS.items() if n in cfg.overrides]  # only when set
        for name, definition in [*TOPIC_CONFIG_DEFS.items(), *extras]:
            if keys is not None and name not in keys:
                continue
            chain: list[Synonym] = []
            if name in cfg.overrides:
                chain.append({"name": name, "value": render_value(cfg[name]), "source": CONFIG_SOURCE_TOPIC})
            if definition.broker_key:
                chain.extend(self.synonyms(definition.broker_key))
            entry = _entry(name, chain, read_only=False, with_synonyms=with_synonyms)
            entry["value"] = render_value(cfg[name])
            entries.append(entry)
        return entries


# Broker configs that set the same thing, as Kafka's DynamicBrokerConfig.brokerConfigSynonyms
# lists them (the first name wins).
_SYNONYM_GROUPS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("log.retention.ms", "log.retention.minutes", "log.retention.hours"),
                    ("log.retention.ms", "log.retention.minutes", "log.retention.hours")),
    **dict.fromkeys(("log.roll.ms", "log.roll.hours"), ("log.roll.ms", "log.roll.hours")),
    **dict.fromkeys(("log.roll.jitter.ms", "log.roll.jitter.hours"), ("log.roll.jitter.ms", "log.roll.jitter.hours")),
    "log.flush.interval.ms": ("log.flush.interval.ms", "log.flush.scheduler.interval.ms"),
}


def _rendered(definition: ConfigDef | None, name: str, raw: str) -> str | None:
    """A dynamic value as the broker uses it, or None when it cannot be used (skipped)."""
    if definition is None or name not in ALTERABLE_BROKER_CONFIGS:
        return None  # (the definitions of a dynamic config are the same wherever it is found)
    try:
        return render_value(parse_value(definition, raw))
    except InvalidConfig:
        return None


def _entry(name: str, chain: list[Synonym], *, read_only: bool, with_synonyms: bool) -> dict[str, Any]:
    hidden = is_sensitive(name)
    if hidden:
        chain = [{**s, "value": None} for s in chain]
    head = chain[0] if chain else {"value": None, "source": CONFIG_SOURCE_DEFAULT}
    return {"name": name, "value": None if hidden else head["value"], "read_only": read_only,
            "config_source": head["source"], "is_sensitive": hidden, "synonyms": chain if with_synonyms else []}
