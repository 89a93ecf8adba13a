"""Load and validate a topology file (TOML; see docs/design.md, "The topology file").

Validation is strict: unknown keys, wrong types, bad addresses, impossible replication
factors, dangling cluster references, invalid regexes and rename templates, mirror flows
that would collide or loop are all errors. The first problem found is raised as a
:class:`TopologyError` reading ``"<file>:<line>: <key path>: <problem>"``.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.resources
import ipaddress
import math
import re
import string
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Protocol

from cluster.client.config import COMMON as CLIENT_COMMON_CONFIGS
from cluster.client.config import CONSUMER as CONSUMER_CONFIGS
from cluster.client.config import PRODUCER as PRODUCER_CONFIGS
from cluster.client.consumer import FETCH_LANES_MAX
from cluster.common.secrets import absolute_references, is_reference
from cluster.security.connector import CLIENT_SECURITY_KEYS
from cluster.security.errors import SecurityConfigError
from cluster.security.tls import check_certificates, check_keystore
from topology._lines import KeyPath, line_index, line_of
from topology.ddl import DdlError, column_names
from topology.errors import TopologyError
from topology.model import (
    DEFAULT_RENAME,
    MIRROR_CHOICE_KEYS,
    MIRROR_CONFIG_KEYS,
    MIRROR_CONFIG_PREFIXES,
    MIRROR_HTTP_KEYS,
    MIRROR_REGISTRY_SECRET_KEYS,
    POISON_ACTIONS,
    RENAME_PLACEHOLDERS,
    SUBJECT_NAME_STRATEGIES,
    WAREHOUSE_COLUMNS,
    WAREHOUSE_CONFIG_KEYS,
    WAREHOUSE_CONFIG_PREFIXES,
    ClusterSpec,
    ConsoleSpec,
    Defaults,
    MirrorSpec,
    NodeAddress,
    RegistrySpec,
    RegistryTableSpec,
    TopicSpec,
    Topology,
    WarehouseSpec,
)

__all__ = [
    "TopologyError",
    "default_topology_text",
    "format_key_path",
    "load",
    "load_default",
    "loads",
    "topic_name_problem",
]

MAX_BROKERS = 100
MAX_CONTROLLERS = 100
MAX_PARTITIONS = 10_000
MAX_WORKERS = 1000
MAX_TOPIC_NAME = 249
MAX_NAME = 249

_LEGAL_NAME = re.compile(r"[a-zA-Z0-9._-]+")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_HOSTNAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?")
_PRINCIPAL = re.compile(r"[A-Za-z][A-Za-z0-9_-]*:.+")
_TOML_POSITION = re.compile(r"\(at line (\d+), column \d+\)")

TOP_KEYS = ("clusters", "topics", "mirrors", "warehouse", "defaults", "console")
CONSOLE_KEYS = ("listen", "auth_token", "keystore", "refresh_ms")
CLUSTER_KEYS = ("datacenter", "brokers", "controllers", "data_dir", "config", "client", "listeners",
                "client_listener", "users", "racks", "registry")
REGISTRY_KEYS = ("listen", "auth_token", "basic_auth_users", "keystore")
_LISTENER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
TOPIC_KEYS = ("cluster", "name", "partitions", "replication_factor", "config")
MIRROR_KEYS = ("name", "source", "target", "topics", "exclude", "rename", "workers", "groups", "config",
               "workers_http", "mirror_topics", "mirror_groups", "acl_principal_map", "schemas",
               "schema_context")
WAREHOUSE_KEYS = ("source", "path", "topics", "config", "schemas", "registry_schemas")
REGISTRY_SCHEMA_KEYS = ("value", "key", "subject_name_strategy", "subject", "poison", "key_subject")
# The warehouse config keys' value types (names: topology.model.WAREHOUSE_CONFIG_KEYS).
_WAREHOUSE_WHOLE_NUMBERS = {"minPartitions": 1, "maxOffsetsPerLoad": 1, "pollTimeoutMs": 1, "load.interval.ms": 0}
_WAREHOUSE_BOOLEANS = ("failOnDataLoss",)
_WAREHOUSE_CHOICES = {"load.writer": ("auto", "arrow", "spark"), "load.service": ("true", "false")}
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S*")
DEFAULTS_KEYS = ("partitions", "replication_factor", "config")

# Broker configs the topology itself decides (from brokers, controllers, data_dir).
def _only_references(value: str, key: str) -> bool:
    """A secret setting written as references only (a JAAS line may hold other text, but its
    password must be a reference)."""
    if key.endswith("sasl.jaas.config"):
        m = re.search(r'password\s*=\s*"([^"]*)"', value)
        return m is None or is_reference(m.group(1))
    return is_reference(value)


RESERVED_BROKER_CONFIGS = frozenset(
    {
        "node.id",
        "broker.id",
        "listeners",
        "log.dir",
        "log.dirs",
        "process.roles",
        "controller.quorum.voters",
        "controller.quorum.bootstrap.servers",
    }
)

_MISSING: Any = object()


def format_key_path(path: KeyPath) -> str:
    """``("clusters", "east", "brokers", 1)`` -> ``clusters.east.brokers[1]``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            text = part if _BARE_KEY.fullmatch(part) else '"' + part.replace("\\", "\\\\").replace('"', '\\"') + '"'
            out += f".{text}" if out else text
    return out


def _type_name(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return "a date/time"


def topic_name_problem(name: str) -> str | None:
    """None when Kafka accepts ``name`` as a topic name, else why not."""
    if not name:
        return "topic names cannot be empty"
    if name in (".", ".."):
        return f"topic name {name!r} is not allowed"
    if len(name) > MAX_TOPIC_NAME:
        return f"topic name is {len(name)} characters long; Kafka allows at most {MAX_TOPIC_NAME}"
    if not _LEGAL_NAME.fullmatch(name):
        bad = sorted({c for c in name if not _LEGAL_NAME.fullmatch(c)})
        return (f"topic name {name!r} has {', '.join(repr(c) for c in bad)}; "
                "Kafka allows only ASCII letters, digits, '.', '_' and '-'")
    return None


@dataclass(frozen=True)
class _Template:
    text: str
    fields: frozenset[str]

    @property
    def identity(self) -> bool:
        return self.text == "{topic}"


class ConfigNames(Protocol):
    """The topic and broker config names a cluster knows (deploy/config_names.py: the
    broker's own definitions, Kafka's names), for `topology check` to refuse a misspelt one."""

    def known(self, kind: str, name: str) -> bool:
        """Whether `name` is a `kind` ("topic" or "broker") config name."""
        ...

    def names(self, kind: str) -> Sequence[str]:
        """Every `kind` config name, for suggestions."""
        ...

    def problem(self, kind: str, name: str, value: str) -> str | None:
        """Why a cluster would refuse `value` for the known config `name` (None: it takes it)."""
        ...


# A flow's client settings by prefix: the client configs each takes.
_MIRROR_CLIENT_CONFIGS = {"producer.": PRODUCER_CONFIGS, "consumer.": CONSUMER_CONFIGS,
                          "source.": CLIENT_COMMON_CONFIGS, "target.": CLIENT_COMMON_CONFIGS}


class _Loader:
    def __init__(self, text: str, file: str, base_dir: Path, check_files: bool = True,
                 config_names: ConfigNames | None = None) -> None:
        self.text = text
        self.file = file
        self.base_dir = base_dir
        self.check_files = check_files
        self.config_names = config_names
        self._index: dict[KeyPath, int] | None = None
        self.addresses: dict[tuple[str, int], KeyPath] = {}

    # -- errors -----------------------------------------------------------------------

    def line(self, path: KeyPath) -> int | None:
        if self._index is None:
            self._index = line_index(self.text)
        return line_of(self._index, path)

    def where(self, path: KeyPath) -> str:
        """``clusters.east.brokers[0] (line 5)``, for messages that point elsewhere."""
        line = self.line(path)
        return f"{format_key_path(path)} (line {line})" if line else format_key_path(path)

    def fail(self, path: KeyPath, problem: str) -> NoReturn:
        raise TopologyError(problem, file=self.file, line=self.line(path),
                            key_path=format_key_path(path) or None)

    # -- typed getters ----------------------------------------------------------------

    def table(self, value: object, path: KeyPath, hint: str = "") -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(path, f"must be a table{hint}, not {_type_name(value)}")
        return value

    def keys(self, table: dict[str, Any], path: KeyPath, known: Sequence[str], required: Sequence[str] = ()) -> None:
        for key in table:
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                self.fail(path + (key,), f"unknown key {key!r}{hint}; known keys: {', '.join(known)}")
        for key in required:
            if key not in table:
                self.fail(path, f"missing required key {key!r}")

    def string(self, table: dict[str, Any], path: KeyPath, key: str, default: Any = _MISSING) -> Any:
        value = table.get(key, default)
        if value is _MISSING:
            self.fail(path, f"missing required key {key!r}")
        if value is default and key not in table:
            return value
        if not isinstance(value, str):
            self.fail(path + (key,), f"must be a string, not {_type_name(value)}")
        if not value:
            self.fail(path + (key,), "must not be empty")
        return value

    def integer(self, table: dict[str, Any], path: KeyPath, key: str, default: int, low: int, high: int | None) -> int:
        if key not in table:
            return default
        value = table[key]
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path + (key,), f"must be an integer, not {_type_name(value)}")
        if value < low or (high is not None and value > high):
            bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
            self.fail(path + (key,), f"must be {bounds}, not {value}")
        return value

    def boolean(self, table: dict[str, Any], path: KeyPath, key: str, default: bool) -> bool:
        if key not in table:
            return default
        value = table[key]
        if not isinstance(value, bool):
            self.fail(path + (key,), f"must be true or false, not {_type_name(value)}")
        return value

    def name(self, value: str, path: KeyPath, what: str) -> str:
        """Cluster, datacenter and flow names end up in topic names and paths."""
        if not value or len(value) > MAX_NAME or value in (".", "..") or not _LEGAL_NAME.fullmatch(value):
            self.fail(path, f"{what} {value!r} must be 1 to {MAX_NAME} ASCII letters, digits, '.', '_' "
                            "or '-' (and not '.' or '..')")
        return value

    def regex(self, table: dict[str, Any], path: KeyPath, key: str, default: Any = _MISSING) -> Any:
        value = self.string(table, path, key, default)
        if value is None:
            return None
        try:
            re.compile(value)
        except re.error as exc:
            self.fail(path + (key,), f"invalid regex {value!r}: {exc}")
        return value

    def directory(self, table: dict[str, Any], path: KeyPath, key: str, default: str) -> Path:
        value = self.string(table, path, key, default)
        return self.base_dir / Path(value).expanduser()

    def config(self, table: dict[str, Any], path: KeyPath, reserved: frozenset[str] = frozenset(),
               why_reserved: str = "", key: str = "config", kind: str | None = None) -> dict[str, str]:
        if key not in table:
            return {}
        cpath = path + (key,)
        raw = self.table(table[key], cpath, hint=' of Kafka config names to values, e.g. { "retention.ms" = 60000 }')
        out: dict[str, str] = {}
        self._flatten(raw, cpath, (), out)
        for name in out:
            if name in reserved:
                self.fail(cpath + (name,), f"{name!r} is {why_reserved}, not in config")
            if kind is not None and self.config_names is not None:
                if not self.config_names.known(kind, name):
                    self.unknown_config(cpath + (name,), kind, name, self.config_names.names(kind))
                why = self.config_names.problem(kind, name, out[name])
                if why is not None:
                    self.fail(cpath + (name,), why)
        return out

    def unknown_config(self, path: KeyPath, kind: str, name: str, known: Sequence[str]) -> NoReturn:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        self.fail(path, f"unknown {kind} config {name!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
                  + f"; {kind} configs take Kafka's names")

    def _flatten(self, raw: dict[str, Any], cpath: KeyPath, prefix: tuple[str, ...], out: dict[str, str]) -> None:
        # config = { log.retention.ms = 1 } is a nested table to TOML; the dotted name is meant.
        for key, value in raw.items():
            parts = prefix + (key,)
            name = ".".join(parts)
            vpath = cpath + parts
            if not key:
                self.fail(vpath, "config names cannot be empty")
            if isinstance(value, dict):
                self._flatten(value, cpath, parts, out)
                continue
            if name in out:
                self.fail(vpath, f"config {name!r} is given twice (once as a quoted name, once as dotted keys)")
            if isinstance(value, bool):
                out[name] = "true" if value else "false"
            elif isinstance(value, int):
                out[name] = str(value)
            elif isinstance(value, float):
                if not math.isfinite(value):
                    self.fail(vpath, f"must be a finite number, not {value}")
                out[name] = repr(value)
            elif isinstance(value, str):
                out[name] = value
            elif isinstance(value, list):
                self.fail(vpath, 'config values cannot be arrays; write a list as one comma-separated '
                                 'string, e.g. "compact,delete"')
            else:
                self.fail(vpath, f"config values must be strings, integers, booleans or floats, not {_type_name(value)}")

    def security_settings(self, settings: dict[str, str], path: KeyPath, *, broker: bool, prefix: str = "",
                          into: dict[str, str] | None = None) -> None:
        """Secrets only by reference; files of ssl.* settings made absolute (relative to the
        topology file), present, readable and holding valid certificates."""
        target = settings if into is None else into
        for key, value in list(settings.items()):
            kpath = path + (prefix + key,)
            if "${" in value:
                target[prefix + key] = absolute_references(value, self.base_dir)
            bare = key.rsplit(".", 1)[-1] if key.startswith("listener.name.") else key
            secret_key = key.endswith(("sasl.password", "ssl.key.password", "sasl.jaas.config", "ssl.keystore.password",
                                       "ssl.truststore.password", "auth.token"))
            if secret_key and value and not _only_references(value, key):
                self.fail(kpath, f"{prefix + key} holds a secret inline; write a reference instead: "
                                 '"${file:/etc/dcmirror/secrets.properties:KEY}", "${dir:/run/secrets:FILE}" '
                                 'or "${env:VARIABLE}"')
            if key.endswith(".location") and value:
                file = Path(value).expanduser()
                if not file.is_absolute():
                    file = self.base_dir / file
                    target[prefix + key] = str(file)
                if not self.check_files:
                    continue
                try:
                    if key.endswith(("ssl.keystore.location",)) and broker:
                        check_keystore(file, setting=prefix + key)
                    elif bare in ("ssl.key.location", "ssl.keystore.location"):
                        if not file.is_file():
                            raise SecurityConfigError(f"{prefix + key}: {file} does not exist")
                    else:
                        check_certificates(file, setting=prefix + key)
                except SecurityConfigError as exc:
                    hint = ""
                    if not file.exists():
                        hint = (f"; for a first try, `dcmirror dev-secrets --config {self.file}` makes the development CA, "
                                "certificates and passwords the file references (bring your own in production)")
                    self.fail(kpath, str(exc) + hint)

    def array_of_tables(self, doc: dict[str, Any], key: str) -> list[dict[str, Any]]:
        value = doc.get(key, [])
        if not isinstance(value, list):
            self.fail((key,), f"must be an array of tables ([[{key}]] sections), not {_type_name(value)}")
        for i, item in enumerate(value):
            self.table(item, (key, i), hint=f" ([[{key}]] section)")
        return value

    # -- addresses --------------------------------------------------------------------

    def address(self, value: object, path: KeyPath, node_id: int) -> NodeAddress:
        if not isinstance(value, str):
            self.fail(path, f"must be a \"host:port\" string, not {_type_name(value)}")
        host, port = self._split_address(value, path)
        key = (host.lower(), port)
        if key in self.addresses:
            self.fail(path, f"address {value!r} is already used by {self.where(self.addresses[key])}; "
                            "every broker, controller and mirror worker needs its own host:port")
        self.addresses[key] = path
        return NodeAddress(node_id, host, port)

    def _split_address(self, value: str, path: KeyPath) -> tuple[str, int]:
        example = 'e.g. "127.0.0.1:9092" or "[::1]:9092"'
        host, sep, port_text = value.rpartition(":")
        if not sep or not host:
            self.fail(path, f"address {value!r} must be host:port, {example}")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
            try:
                ipaddress.IPv6Address(host)
            except ValueError:
                self.fail(path, f"address {value!r}: {host!r} is not an IPv6 address")
        elif not _HOSTNAME.fullmatch(host):
            self.fail(path, f"address {value!r}: {host!r} is not a host name or IPv4 address "
                            f"(IPv6 addresses go in brackets), {example}")
        if not port_text.isascii() or not port_text.isdigit():
            self.fail(path, f"address {value!r}: port {port_text!r} is not a number")
        port = int(port_text)
        if not 1 <= port <= 65535:
            self.fail(path, f"address {value!r}: port {port} is not between 1 and 65535")
        return host, port

    # -- sections ---------------------------------------------------------------------

    def load(self, doc: dict[str, Any], path: Path | None) -> Topology:
        self.keys(doc, (), TOP_KEYS, required=("clusters",))
        defaults = self.defaults(doc)
        clusters = self.clusters(doc)
        topics = self.topics(doc, clusters, defaults)
        mirrors = self.mirrors(doc, clusters, topics)
        warehouse = self.warehouse(doc, clusters)
        return Topology(path=path, clusters=clusters, topics=topics, mirrors=mirrors,
                        warehouse=warehouse, defaults=defaults, console=self.console(doc))

    def defaults(self, doc: dict[str, Any]) -> Defaults:
        if "defaults" not in doc:
            return Defaults()
        path: KeyPath = ("defaults",)
        table = self.table(doc["defaults"], path)
        self.keys(table, path, DEFAULTS_KEYS)
        base = Defaults()
        return Defaults(
            partitions=self.integer(table, path, "partitions", base.partitions, 1, MAX_PARTITIONS),
            replication_factor=self.integer(table, path, "replication_factor", base.replication_factor, 1, None),
            config=self.config(table, path, kind="topic"),
        )

    def clusters(self, doc: dict[str, Any]) -> dict[str, ClusterSpec]:
        tables = self.table(doc["clusters"], ("clusters",), hint=" of clusters ([clusters.NAME] sections)")
        if not tables:
            self.fail(("clusters",), "must define at least one cluster ([clusters.NAME] section)")
        clusters: dict[str, ClusterSpec] = {}
        data_dirs: dict[Path, KeyPath] = {}
        for name, raw in tables.items():
            path: KeyPath = ("clusters", name)
            self.name(name, path, "cluster name")
            table = self.table(raw, path)
            self.keys(table, path, CLUSTER_KEYS, required=("datacenter", "brokers"))
            datacenter = self.name(self.string(table, path, "datacenter"), path + ("datacenter",), "datacenter")
            brokers = self.nodes(table, path, "brokers", first_id=1, low=1, high=MAX_BROKERS)
            controllers = self.nodes(table, path, "controllers", first_id=len(brokers) + 1, low=0,
                                     high=MAX_CONTROLLERS)
            data_dir = self.directory(table, path, "data_dir", f"data/{name}")
            dpath = path + ("data_dir",)
            if data_dir in data_dirs:
                self.fail(dpath, f"data_dir {str(data_dir)!r} is also the data_dir of "
                                 f"{self.where(data_dirs[data_dir][:2])}; clusters need their own")
            data_dirs[data_dir] = dpath
            config = self.config(table, path, RESERVED_BROKER_CONFIGS,
                                 "set by the topology (brokers, controllers, data_dir)", kind="broker")
            self.security_settings(config, path + ("config",), broker=True)
            client = self.config(table, path, key="client")
            for key in client:
                if key not in CLIENT_SECURITY_KEYS:
                    close = difflib.get_close_matches(key, CLIENT_SECURITY_KEYS, n=1)
                    self.fail(path + ("client", key), f"unknown client security setting {key!r}"
                              + (f" (did you mean {close[0]!r}?)" if close else "")
                              + "; known: " + ", ".join(CLIENT_SECURITY_KEYS))
            self.security_settings(client, path + ("client",), broker=False)
            spec = ClusterSpec(name=name, datacenter=datacenter, brokers=brokers, controllers=controllers,
                               data_dir=data_dir, config=config, client=client)
            listeners = self.listeners(table, path, spec)
            protocol = dict(pair.strip().upper().split(":", 1) for pair in
                            config.get("listener.security.protocol.map", "").split(",") if ":" in pair)
            inter_protocol = protocol.get(spec.inter_broker_listener, spec.inter_broker_listener)
            if controllers and inter_protocol.startswith("SASL"):
                self.fail(path + ("controllers",), f"dedicated controllers cannot use SASL (the inter-broker listener "
                                                   f"{spec.inter_broker_listener} is {inter_protocol}): the quorum "
                                                   "forms before any SCRAM user exists; use SSL (mutual TLS)")
            client_listener = ""
            if "client_listener" in table:
                client_listener = self.string(table, path, "client_listener").upper()
                known = [spec.inter_broker_listener, *listeners]
                if client_listener not in known:
                    self.fail(path + ("client_listener",), f"{client_listener!r} is not a listener of cluster "
                                                           f"{name!r}; its listeners: {', '.join(known)}")
            clusters[name] = dataclasses.replace(spec, listeners=listeners, client_listener=client_listener,
                                                 users=self.users(table, path), racks=self.racks(table, path, spec),
                                                 registry=self.registry(table, path))
        return clusters

    def listeners(self, table: dict[str, Any], path: KeyPath, spec: ClusterSpec) -> dict[str, tuple[NodeAddress, ...]]:
        """More listeners of every broker: NAME = ["host:port", ...] (one per broker); each
        name needs a protocol (it is one, or listener.security.protocol.map maps it)."""
        if "listeners" not in table:
            return {}
        lpath = path + ("listeners",)
        raw = self.table(table["listeners"], lpath, hint=' of listener names to broker addresses, e.g. '
                                                         '{ EXTERNAL = ["10.0.0.1:9093", "10.0.0.2:9093"] }')
        mapped = {}
        for pair in spec.config.get("listener.security.protocol.map", "").split(","):
            key, _, protocol = pair.partition(":")
            if key.strip():
                mapped[key.strip().upper()] = protocol.strip().upper()
        inter = spec.inter_broker_listener
        if inter not in _PROTOCOLS and inter not in mapped:
            self.fail(path + ("config",), f"the inter-broker listener {inter} needs a protocol: add "
                                          f'"listener.security.protocol.map" = "{inter}:SSL,..."')
        out: dict[str, tuple[NodeAddress, ...]] = {}
        for raw_name in raw:
            npath = lpath + (raw_name,)
            listener = raw_name.upper()
            if not _LISTENER_NAME.fullmatch(raw_name):
                self.fail(npath, f"listener name {raw_name!r}: letters, digits and '_', starting with a letter")
            if listener == inter or listener in out:
                self.fail(npath, f"listener {listener} is declared twice (the `brokers` addresses are the "
                                 f"inter-broker listener {inter})" if listener == inter
                          else f"listener {listener} is declared twice")
            if listener not in _PROTOCOLS and listener not in mapped:
                self.fail(npath, f"listener {listener} has no protocol: name it after one ({', '.join(_PROTOCOLS)}) "
                                 f'or map it in config "listener.security.protocol.map" (e.g. "{listener}:SASL_SSL")')
            if not isinstance(raw[raw_name], list) or len(raw[raw_name]) != len(spec.brokers):
                self.fail(npath, f'must be an array of {len(spec.brokers)} "host:port" strings, one per broker '
                                 "in the order of `brokers`")
            addresses = self.nodes(raw, lpath, raw_name, first_id=1, low=0, high=len(spec.brokers))
            out[listener] = addresses
        return out

    def secret_reference(self, raw: dict[str, Any], path: KeyPath, key: str) -> str:
        """A secret reference at `key` (absolute), "" when absent; the secret itself is refused."""
        if key not in raw:
            return ""
        value = raw[key]
        if not isinstance(value, str) or not is_reference(value):
            self.fail(path + (key,), "must be a reference to the secret, never the secret: "
                                     '"${file:...}", "${dir:...}" or "${env:...}"')
        return absolute_references(value, self.base_dir)

    def console(self, doc: dict[str, Any]) -> ConsoleSpec | None:
        """[console]: listen = "host:port" (required), auth_token = a secret reference,
        keystore = a PEM keystore (HTTPS), refresh_ms."""
        if "console" not in doc:
            return None
        path: KeyPath = ("console",)
        raw = self.table(doc["console"], path, hint=' ([console] with listen = "host:port")')
        self.keys(raw, path, CONSOLE_KEYS, required=("listen",))
        keystore = ""
        if "keystore" in raw:
            value = self.string(raw, path, "keystore")
            keystore = str((self.base_dir / value) if not Path(value).is_absolute() else Path(value))
        return ConsoleSpec(listen=self.address(raw["listen"], path + ("listen",), 0),
                           auth_token=self.secret_reference(raw, path, "auth_token"), keystore=keystore,
                           refresh_ms=self.integer(raw, path, "refresh_ms", 2000, 250, 60_000))

    def registry(self, table: dict[str, Any], path: KeyPath) -> RegistrySpec | None:
        """[clusters.NAME.registry]: listen = "host:port" (required), auth_token = a secret
        reference, basic_auth_users = a users file, keystore = a PEM keystore (HTTPS)."""
        if "registry" not in table:
            return None
        rpath = path + ("registry",)
        raw = self.table(table["registry"], rpath, hint=' ([clusters.NAME.registry] with listen = "host:port")')
        self.keys(raw, rpath, REGISTRY_KEYS, required=("listen",))
        listen = self.address(raw["listen"], rpath + ("listen",), 0)
        token = self.secret_reference(raw, rpath, "auth_token")
        files = {}
        for key in ("basic_auth_users", "keystore"):
            if key in raw:
                value = self.string(raw, rpath, key)
                files[key] = str((self.base_dir / value) if not Path(value).is_absolute() else Path(value))
        return RegistrySpec(listen=listen, auth_token=token, **files)

    def racks(self, table: dict[str, Any], path: KeyPath, spec: ClusterSpec) -> tuple[str, ...]:
        """Each broker's broker.rack, in broker order: a cluster stretched over zones or
        datacenters names them, and consumers in a rack read from its replicas (KIP-392)."""
        if "racks" not in table:
            return ()
        rpath = path + ("racks",)
        raw = table["racks"]
        if not isinstance(raw, list) or not all(isinstance(r, str) for r in raw):
            self.fail(rpath, f"must be an array of rack names, one per broker, not {_type_name(raw)}")
        if len(raw) != len(spec.brokers):
            self.fail(rpath, f"lists {len(raw)} rack(s) for {len(spec.brokers)} broker(s); give one per broker, "
                             "in the order of brokers")
        for i, rack in enumerate(raw):
            self.name(rack, rpath + (i,), "rack name")
        if "broker.rack" in spec.config:
            self.fail(path + ("config", "broker.rack"), "set each broker's rack with racks = [...], not config")
        return tuple(raw)

    def users(self, table: dict[str, Any], path: KeyPath) -> dict[str, str]:
        """SCRAM users: name = "${file:...}" / "${dir:...}" / "${env:...}" (never a password)."""
        if "users" not in table:
            return {}
        upath = path + ("users",)
        raw = self.table(table["users"], upath, hint=' of user names to password references, e.g. '
                                                     '{ admin = "${file:/etc/dcmirror/passwords.properties:admin}" }')
        out: dict[str, str] = {}
        for user, value in raw.items():
            if not user or len(user) > MAX_NAME or any(c in user for c in ",=") or not user.isprintable():
                self.fail(upath + (user,), f"user name {user!r}: 1 to {MAX_NAME} printable characters without ',' or '='")
            if not isinstance(value, str) or not is_reference(value):
                self.fail(upath + (user,), "must be a reference to the password, never the password: "
                                           '"${file:/etc/dcmirror/passwords.properties:KEY}", "${dir:/run/secrets:FILE}" '
                                           'or "${env:VARIABLE}"')
            out[user] = absolute_references(value, self.base_dir)
        return out

    def nodes(self, table: dict[str, Any], path: KeyPath, key: str, first_id: int, low: int,
              high: int) -> tuple[NodeAddress, ...]:
        raw = table.get(key, [])
        kpath = path + (key,)
        if not isinstance(raw, list):
            self.fail(kpath, f'must be an array of "host:port" strings, not {_type_name(raw)}')
        if len(raw) < low:
            self.fail(kpath, f'must list at least {low} {key[:-1]} ("host:port")')
        if len(raw) > high:
            self.fail(kpath, f"lists {len(raw)} {key}; at most {high} are allowed")
        return tuple(self.address(value, kpath + (i,), first_id + i) for i, value in enumerate(raw))

    def topics(self, doc: dict[str, Any], clusters: dict[str, ClusterSpec], defaults: Defaults) -> tuple[TopicSpec, ...]:
        topics: list[TopicSpec] = []
        seen: dict[tuple[str, str], KeyPath] = {}
        metric_names: dict[tuple[str, str], tuple[str, KeyPath]] = {}
        for i, table in enumerate(self.array_of_tables(doc, "topics")):
            path: KeyPath = ("topics", i)
            self.keys(table, path, TOPIC_KEYS, required=("cluster", "name"))
            cluster = self.cluster_ref(table, path, "cluster", clusters)
            name = self.string(table, path, "name")
            problem = topic_name_problem(name)
            if problem:
                self.fail(path + ("name",), problem)
            if name.startswith("__"):
                self.fail(path + ("name",), f"topic name {name!r}: names starting with '__' are for Kafka's internal topics")
            if (cluster, name) in seen:
                self.fail(path + ("name",), f"topic {name!r} of cluster {cluster!r} is already declared at "
                                            f"{self.where(seen[cluster, name])}")
            seen[cluster, name] = path
            # Kafka refuses topics whose names differ only in '.' versus '_' (metric names collide).
            metric = (cluster, name.replace(".", "_"))
            if metric in metric_names:
                other, other_path = metric_names[metric]
                self.fail(path + ("name",), f"topic {name!r} collides with {other!r} ({self.where(other_path)}): "
                                            "Kafka refuses names that differ only in '.' and '_'")
            metric_names[metric] = (name, path)
            brokers = len(clusters[cluster].brokers)
            partitions = self.integer(table, path, "partitions", defaults.partitions, 1, MAX_PARTITIONS)
            if "replication_factor" in table:
                rf = self.integer(table, path, "replication_factor", 0, 1, None)
                if rf > brokers:
                    self.fail(path + ("replication_factor",),
                              f"replication_factor {rf} is more than the {brokers} broker(s) of cluster {cluster!r}")
            else:
                rf = min(defaults.replication_factor, brokers)
            config = {**defaults.config, **self.config(table, path, kind="topic")}
            topics.append(TopicSpec(cluster=cluster, name=name, partitions=partitions,
                                    replication_factor=rf, config=config))
        return tuple(topics)

    def cluster_ref(self, table: dict[str, Any], path: KeyPath, key: str, clusters: dict[str, ClusterSpec]) -> str:
        name: str = self.string(table, path, key)
        if name not in clusters:
            close = difflib.get_close_matches(name, list(clusters), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            self.fail(path + (key,), f"unknown cluster {name!r}{hint}; clusters: {', '.join(clusters)}")
        return name

    def template(self, table: dict[str, Any], path: KeyPath) -> _Template:
        text: str = self.string(table, path, "rename", DEFAULT_RENAME)
        tpath = path + ("rename",)
        allowed = ", ".join("{" + p + "}" for p in RENAME_PLACEHOLDERS)
        try:
            parsed = list(string.Formatter().parse(text))
        except ValueError as exc:
            self.fail(tpath, f"bad rename template {text!r}: {exc} (write literal braces as {{{{ and }}}})")
        fields: set[str] = set()
        for literal, field, spec, conversion in parsed:
            bad = sorted({c for c in literal if not _LEGAL_NAME.fullmatch(c)})
            if bad:
                self.fail(tpath, f"rename template {text!r} has {', '.join(repr(c) for c in bad)} outside "
                                 "placeholders; topic names allow only ASCII letters, digits, '.', '_' and '-'")
            if field is None:
                continue
            if field not in RENAME_PLACEHOLDERS or spec or conversion:
                shown = "{" + field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
                self.fail(tpath, f"rename template {text!r}: unknown placeholder {shown}; allowed: {allowed}")
            fields.add(field)
        if "topic" not in fields:
            self.fail(tpath, f"rename template {text!r} must contain {{topic}} (allowed placeholders: {allowed})")
        return _Template(text, frozenset(fields))

    def mirrors(self, doc: dict[str, Any], clusters: dict[str, ClusterSpec],
                topics: tuple[TopicSpec, ...]) -> tuple[MirrorSpec, ...]:
        mirrors: list[MirrorSpec] = []
        templates: list[_Template] = []
        names: dict[str, KeyPath] = {}
        for i, table in enumerate(self.array_of_tables(doc, "mirrors")):
            path: KeyPath = ("mirrors", i)
            self.keys(table, path, MIRROR_KEYS, required=("source", "target", "topics"))
            source = self.cluster_ref(table, path, "source", clusters)
            target = self.cluster_ref(table, path, "target", clusters)
            if source == target:
                self.fail(path + ("target",), f"a flow cannot mirror cluster {source!r} into itself")
            name = self.name(self.string(table, path, "name", f"{source}-to-{target}"),
                             path + ("name",) if "name" in table else path, "flow name")
            if name in names:
                self.fail(path + ("name",) if "name" in table else path,
                          f"flow name {name!r} is already used by {self.where(names[name])}; "
                          "give one of them a distinct `name`")
            names[name] = path
            topics_re = self.regex(table, path, "topics")
            exclude = self.regex(table, path, "exclude", None)
            template = self.template(table, path)
            workers = self.integer(table, path, "workers", 1, 1, MAX_WORKERS)
            groups = self.regex(table, path, "groups", None)
            config = self.config(table, path)
            for side in MIRROR_CONFIG_PREFIXES:
                self.security_settings({k.removeprefix(side): v for k, v in config.items() if k.startswith(side)},
                                       path + ("config",), broker=False, prefix=side, into=config)
            self.security_settings({k: v for k, v in config.items() if k in MIRROR_HTTP_KEYS}, path + ("config",),
                                   broker=True, into=config)
            for key, value in config.items():
                if key in MIRROR_HTTP_KEYS:
                    continue
                if key in MIRROR_REGISTRY_SECRET_KEYS:
                    if not is_reference(value):
                        self.fail(path + ("config", key), "must be a reference to `user:password`, never the "
                                                          'secret itself: "${file:...}", "${dir:...}" or "${env:...}"')
                    config[key] = absolute_references(value, self.base_dir)
                    continue
                if key in MIRROR_CONFIG_KEYS:
                    if not value.isdigit():
                        self.fail(path + ("config", key), f"mirror config {key!r} takes a whole number, not {value!r}")
                    if key == "num.replica.fetchers" and not 1 <= int(value) <= FETCH_LANES_MAX:
                        self.fail(path + ("config", key), f"num.replica.fetchers takes 1..{FETCH_LANES_MAX}, "
                                                          f"not {value}")
                elif key in MIRROR_CHOICE_KEYS:
                    if value not in MIRROR_CHOICE_KEYS[key]:
                        self.fail(path + ("config", key), f"mirror config {key!r} takes one of "
                                  + ", ".join(MIRROR_CHOICE_KEYS[key]) + f", not {value!r}")
                elif key.startswith(MIRROR_CONFIG_PREFIXES):
                    side = next(p for p in _MIRROR_CLIENT_CONFIGS if key.startswith(p))
                    client_key = key.removeprefix(side)
                    if client_key not in _MIRROR_CLIENT_CONFIGS[side]:
                        kind = {"producer.": "producer", "consumer.": "consumer"}.get(side, "client")
                        self.unknown_config(path + ("config", key), kind, client_key, list(_MIRROR_CLIENT_CONFIGS[side]))
                else:
                    known = MIRROR_CONFIG_KEYS + tuple(MIRROR_CHOICE_KEYS) + MIRROR_HTTP_KEYS + MIRROR_REGISTRY_SECRET_KEYS
                    close = difflib.get_close_matches(key, known, n=1)
                    self.fail(path + ("config", key),
                              f"unknown mirror config {key!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
                              + "; known: " + ", ".join(known) + ", producer.*, consumer.*, source.*, target.*")
            workers_http: tuple[NodeAddress, ...] = ()
            if "workers_http" in table:
                listed = table["workers_http"]
                if isinstance(listed, list) and len(listed) != workers:
                    self.fail(path + ("workers_http",), f"lists {len(listed)} address(es); the flow has {workers} "
                                                        "worker(s): one \"host:port\" per worker, worker 0 first")
                workers_http = self.nodes(table, path, "workers_http", first_id=0, low=workers, high=workers)
                if "http.port.base" in config:
                    self.fail(path + ("workers_http",), "give the workers' admin HTTP addresses either here or "
                                                        "with config http.port.base, not both")
            mirror_topics = self.boolean(table, path, "mirror_topics", False)
            mirror_groups = self.regex(table, path, "mirror_groups", None)
            principal_map = self.principal_map(table, path)
            if not mirror_topics:
                for key in ("mirror_groups", "acl_principal_map"):
                    if key in table:
                        self.fail(path + (key,), f"{key} applies to a flow of mirror topics (mirror_topics = true)")
            elif groups is not None:
                self.fail(path + ("groups",), "a flow of mirror topics keeps offsets, so nothing is translated: "
                                              "name the groups whose committed offsets follow with mirror_groups")
            schemas, schema_context = self.schema_sync(table, path, clusters[source], clusters[target],
                                                       mirror_topics)
            mirrors.append(MirrorSpec(name=name, source=source, target=target, topics=topics_re,
                                      exclude=exclude, rename=template.text, workers=workers,
                                      groups=groups, config=config, workers_http=workers_http,
                                      mirror_topics=mirror_topics, mirror_groups=mirror_groups,
                                      acl_principal_map=principal_map, schemas=schemas,
                                      schema_context=schema_context))
            templates.append(template)
        self.check_collisions(mirrors, templates, clusters, topics)
        self.check_cycles(mirrors, templates)
        return tuple(mirrors)

    def schema_sync(self, table: dict[str, Any], path: KeyPath, source: ClusterSpec, target: ClusterSpec,
                    mirror_topics: bool) -> tuple[bool, str]:
        """`schemas` (default: on when both clusters have a registry and the flow copies records)
        and `schema_context` (default `.<source>`): where the source's schemas go in the target."""
        both = source.registry is not None and target.registry is not None
        schemas = self.boolean(table, path, "schemas", both and not mirror_topics)
        if schemas and not both:
            missing = source.name if source.registry is None else target.name
            self.fail(path + ("schemas",), f"cluster {missing!r} has no schema registry: declare "
                                           f"[clusters.{missing}.registry] or set schemas = false")
        if schemas and mirror_topics:
            self.fail(path + ("schemas",), "a flow of mirror topics copies batches byte for byte; schemas "
                                           "applies to flows of records (mirror_topics = false)")
        context = self.string(table, path, "schema_context", f".{source.name}")
        if not re.fullmatch(r"\.[^:\s]+", context) or context in (".", ".."):
            self.fail(path + ("schema_context",), f"{context!r} is not a context name: a dot and a name, e.g. "
                                                  f'".{source.name}" (the default context "." is the target\'s own)')
        if "schema_context" in table and not schemas:
            self.fail(path + ("schema_context",), "applies when the flow copies schemas (schemas = true)")
        return schemas, context if schemas else ""

    def principal_map(self, table: dict[str, Any], path: KeyPath) -> dict[str, str]:
        """acl_principal_map: { "User:east-app" = "User:app" }, principals as Kafka writes them."""
        if "acl_principal_map" not in table:
            return {}
        mpath = path + ("acl_principal_map",)
        raw = self.table(table["acl_principal_map"], mpath, hint=' of source principal to target principal, e.g. '
                                                                 '{ "User:east-app" = "User:app" }')
        for source, target in raw.items():
            for principal, what in ((source, "key"), (target, "value")):
                if not isinstance(principal, str) or not _PRINCIPAL.fullmatch(principal):
                    self.fail(mpath + (source,), f"{what} {principal!r} is not a principal: write TYPE:NAME, "
                                                 'e.g. "User:app"')
        return dict(raw)

    def check_collisions(self, mirrors: list[MirrorSpec], templates: list[_Template],
                         clusters: dict[str, ClusterSpec], topics: tuple[TopicSpec, ...]) -> None:
        # Structural: flows from different clusters into one target must tell the source apart.
        for j, g in enumerate(mirrors):
            for i in range(j):
                f = mirrors[i]
                if f.target != g.target:
                    continue
                ft, gt = templates[i], templates[j]
                if f.source == g.source:
                    if f.topics == g.topics and f.exclude == g.exclude and ft.text == gt.text:
                        self.fail(("mirrors", j, "topics"),
                                  f"flow {g.name!r} copies the same topics from {g.source!r} to {g.target!r} "
                                  f"as flow {f.name!r} ({self.where(('mirrors', i))})")
                    continue
                by_source = "source" in ft.fields and "source" in gt.fields
                by_dc = ("source_dc" in ft.fields and "source_dc" in gt.fields
                         and clusters[f.source].datacenter != clusters[g.source].datacenter)
                if not (by_source or by_dc):
                    self.fail(("mirrors", j, "rename"),
                              f"flows {f.name!r} ({self.where(('mirrors', i))}) and {g.name!r} both copy into "
                              f"{g.target!r} with rename templates {ft.text!r} and {gt.text!r}, which can give "
                              "topics from different sources the same target name; put {source} in both "
                              "(or {source_dc}, when the sources are in different datacenters)")
        # Concrete: declared source topics must map to distinct, legal target names.
        written: dict[tuple[str, str], tuple[int, str]] = {}
        for j, flow in enumerate(mirrors):
            source_dc = clusters[flow.source].datacenter
            for topic in topics:
                if topic.cluster != flow.source or not flow.matches(topic.name):
                    continue
                renamed = flow.target_topic(topic.name, source_dc)
                problem = topic_name_problem(renamed)
                if problem:
                    self.fail(("mirrors", j, "rename"), f"topic {topic.name!r} of {flow.source!r} would be "
                                                        f"renamed to {renamed!r}: {problem}")
                if (flow.target, renamed) in written:
                    i, other = written[flow.target, renamed]
                    self.fail(("mirrors", j), f"flows {mirrors[i].name!r} (topic {other!r}) and {flow.name!r} "
                                              f"(topic {topic.name!r}) would both write topic {renamed!r} "
                                              f"of cluster {flow.target!r}")
                written[flow.target, renamed] = (j, topic.name)

    def check_cycles(self, mirrors: list[MirrorSpec], templates: list[_Template]) -> None:
        # Flows that keep topic names ("{topic}") around a cycle would copy a topic forever.
        edges: dict[str, list[int]] = {}
        for i, (flow, template) in enumerate(zip(mirrors, templates, strict=True)):
            if template.identity:
                edges.setdefault(flow.source, []).append(i)
        done: set[str] = set()
        stack: list[int] = []  # flow indexes along the current path
        on_path: dict[str, int] = {}  # cluster -> its position in stack

        def visit(cluster: str) -> None:
            on_path[cluster] = len(stack)
            for i in edges.get(cluster, []):
                target = mirrors[i].target
                if target in on_path:
                    cycle = stack[on_path[target]:] + [i]
                    hops = " -> ".join([mirrors[k].source for k in cycle] + [target])
                    flows = ", ".join(repr(mirrors[k].name) for k in cycle)
                    self.fail(("mirrors", cycle[0], "rename"),
                              f"flows {flows} form a cycle {hops} and all keep topic names (rename = \"{{topic}}\"), "
                              "so a topic would be copied around it forever; give at least one of them a "
                              "rename template with {source}")
                if target not in done:
                    stack.append(i)
                    visit(target)
                    stack.pop()
            del on_path[cluster]
            done.add(cluster)

        for cluster in list(edges):
            if cluster not in done:
                visit(cluster)

    def warehouse(self, doc: dict[str, Any], clusters: dict[str, ClusterSpec]) -> WarehouseSpec | None:
        if "warehouse" not in doc:
            return None
        path: KeyPath = ("warehouse",)
        table = self.table(doc["warehouse"], path)
        self.keys(table, path, WAREHOUSE_KEYS, required=("source",))
        config = self.config(table, path)
        for key, value in config.items():
            kpath = path + ("config", key)
            if key in _WAREHOUSE_WHOLE_NUMBERS:
                if not value.isdigit() or int(value) < _WAREHOUSE_WHOLE_NUMBERS[key]:
                    self.fail(kpath, f"warehouse config {key!r} takes a whole number of at least "
                                     f"{_WAREHOUSE_WHOLE_NUMBERS[key]}, not {value!r}")
            elif key in _WAREHOUSE_BOOLEANS:
                if value not in ("true", "false"):
                    self.fail(kpath, f"warehouse config {key!r} takes true or false, not {value!r}")
            elif key in _WAREHOUSE_CHOICES:
                if value not in _WAREHOUSE_CHOICES[key]:
                    self.fail(kpath, f"warehouse config {key!r} takes one of " + ", ".join(_WAREHOUSE_CHOICES[key])
                              + f", not {value!r}")
            elif key == "registry.basic.auth.user.info":
                if not is_reference(value):
                    self.fail(kpath, "must be a reference to `user:password`, never the secret itself: "
                                     '"${file:...}", "${dir:...}" or "${env:...}"')
                else:
                    config[key] = absolute_references(value, self.base_dir)
            elif key in ("metastore.uri", "warehouse.uri"):
                if not _URI.fullmatch(value):
                    example = "thrift://metastore:9083" if key == "metastore.uri" else "hdfs://namenode:8020/warehouse"
                    self.fail(kpath, f"warehouse config {key!r} takes a URI such as {example!r}, not {value!r}")
            elif not key.startswith(WAREHOUSE_CONFIG_PREFIXES) or key in WAREHOUSE_CONFIG_PREFIXES:
                close = difflib.get_close_matches(key, WAREHOUSE_CONFIG_KEYS, n=1)
                self.fail(kpath, f"unknown warehouse config {key!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
                          + "; known: " + ", ".join(WAREHOUSE_CONFIG_KEYS) + ", spark.*, kafka.*")
        source = self.cluster_ref(table, path, "source", clusters)
        return WarehouseSpec(
            source=source,
            path=self.directory(table, path, "path", "warehouse"),
            topics=self.regex(table, path, "topics", ".*"),
            config=config,
            schemas=self.warehouse_schemas(table, path),
            registry_schemas=self.warehouse_registry_schemas(table, path, clusters[source]),
        )

    def warehouse_registry_schemas(self, table: dict[str, Any], path: KeyPath,
                                   source: ClusterSpec) -> tuple[RegistryTableSpec, ...]:
        """[warehouse.registry_schemas]: topic regex -> { value, subject_name_strategy,
        subject, poison, key, key_subject }; the source cluster must run a registry."""
        if "registry_schemas" not in table:
            return ()
        spath = path + ("registry_schemas",)
        raw = self.table(table["registry_schemas"], spath,
                         hint=' of topic regexes to tables such as { "east[.]orders" = { value = true } }')
        if raw and source.registry is None:
            self.fail(spath, f"typed tables read schemas from the warehouse source cluster's registry, and "
                             f"cluster {source.name!r} has none: add [clusters.{source.name}.registry]")
        out: list[RegistryTableSpec] = []
        for pattern, entry in raw.items():
            kpath = spath + (pattern,)
            try:
                re.compile(pattern)
            except re.error as exc:
                self.fail(kpath, f"invalid topic regex {pattern!r}: {exc}")
            entry = self.table(entry, kpath, hint=' such as { value = true, poison = "dead-letter" }')
            self.keys(entry, kpath, REGISTRY_SCHEMA_KEYS)
            for flag in ("value", "key"):
                if flag in entry and not isinstance(entry[flag], bool):
                    self.fail(kpath + (flag,), f"takes true or false, not {_type_name(entry[flag])}")
            if not entry.get("value", True):
                self.fail(kpath + ("value",), "a typed table decodes the value: set value = true or "
                                              "drop the entry")
            strategy = entry.get("subject_name_strategy", "TopicNameStrategy")
            if strategy not in SUBJECT_NAME_STRATEGIES:
                close = difflib.get_close_matches(str(strategy), SUBJECT_NAME_STRATEGIES, n=1)
                self.fail(kpath + ("subject_name_strategy",),
                          f"unknown subject name strategy {strategy!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
                          + "; known: " + ", ".join(SUBJECT_NAME_STRATEGIES))
            subject = entry.get("subject", "")
            if not isinstance(subject, str):
                self.fail(kpath + ("subject",), f"takes a subject name, not {_type_name(subject)}")
            if strategy != "TopicNameStrategy" and not subject:
                self.fail(kpath + ("subject",), f"{strategy} names subjects after the record, which the "
                                                "loader cannot know before reading: name the subject whose "
                                                "latest version is the table's schema")
            poison = entry.get("poison", "dead-letter")
            if poison not in POISON_ACTIONS:
                self.fail(kpath + ("poison",), f"takes one of {', '.join(POISON_ACTIONS)}, not {poison!r}")
            key_subject = entry.get("key_subject", "")
            if not isinstance(key_subject, str):
                self.fail(kpath + ("key_subject",), f"takes a subject name, not {_type_name(key_subject)}")
            if key_subject and not entry.get("key", False):
                self.fail(kpath + ("key_subject",), "names the key's subject, but key is not true")
            out.append(RegistryTableSpec(topics=pattern, value=True, subject_name_strategy=strategy,
                                         subject=subject, poison=poison, key=bool(entry.get("key", False)),
                                         key_subject=key_subject))
        return tuple(out)

    def warehouse_schemas(self, table: dict[str, Any], path: KeyPath) -> tuple[tuple[str, str], ...]:
        if "schemas" not in table:
            return ()
        spath = path + ("schemas",)
        raw = self.table(table["schemas"], spath,
                         hint=' of topic regexes to Spark DDL column lists, e.g. { "east.pageviews" = '
                              '"user STRING, url STRING, ts TIMESTAMP" }')
        reserved = {c.lower() for c in WAREHOUSE_COLUMNS}
        out: list[tuple[str, str]] = []
        for pattern, ddl in raw.items():
            kpath = spath + (pattern,)
            try:
                re.compile(pattern)
            except re.error as exc:
                self.fail(kpath, f"invalid topic regex {pattern!r}: {exc}")
            if isinstance(ddl, dict):
                self.fail(kpath, f"put topic names with dots in quotes: \"{pattern}.{next(iter(ddl), '')}\" = \"...\"")
            if not isinstance(ddl, str):
                self.fail(kpath, f"must be a Spark DDL column list such as \"user STRING, ts TIMESTAMP\", "
                                 f"not {_type_name(ddl)}")
            try:
                names = column_names(ddl)
            except DdlError as exc:
                self.fail(kpath, f"bad column list: {exc}")
            clash = [n for n in names if n.lower() in reserved]
            if clash:
                self.fail(kpath, f"column {clash[0]!r} is one of the warehouse's own columns "
                                 f"({', '.join(WAREHOUSE_COLUMNS)}); rename it in the schema")
            out.append((pattern, ddl))
        return tuple(out)


def loads(text: str, *, path: Path | None = None, base_dir: Path | None = None,
          check_files: bool = True, config_names: ConfigNames | None = None) -> Topology:
    """Parse and validate topology TOML ``text``.

    ``path`` names the file in error messages and is kept as ``Topology.path``; relative
    ``data_dir``, ``warehouse.path`` and secret file paths are resolved against
    ``base_dir``, by default the directory of ``path``, else the current directory.
    ``check_files=False`` leaves out the checks of certificate and key files (present,
    readable, valid): for rendering files of other hosts; inline secrets are refused anyway.
    ``config_names``: topic and broker config names are checked against it (client settings
    always are).
    """
    file = str(path) if path is not None else "<string>"
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = _TOML_POSITION.search(str(exc))
        raise TopologyError(f"invalid TOML: {exc}", file=file,
                            line=int(found.group(1)) if found else None) from None
    if base_dir is None:
        base_dir = path.parent if path is not None else Path.cwd()
    return _Loader(text, file, base_dir.absolute(), check_files, config_names).load(doc, path)


def load(path: str | Path, *, check_files: bool = True, config_names: ConfigNames | None = None) -> Topology:
    """Read, parse and validate the topology file at ``path``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TopologyError(f"cannot read the topology file: {exc.strerror or exc}", file=str(path)) from None
    except UnicodeDecodeError as exc:
        raise TopologyError(f"not UTF-8 text: {exc}", file=str(path)) from None
    return loads(text, path=path, check_files=check_files, config_names=config_names)


def default_topology_text() -> str:
    """The embedded default topology (three clusters in three datacenters on loopback)."""
    return importlib.resources.files("topology").joinpath("default.toml").read_text(encoding="utf-8")


def load_default(base_dir: Path | None = None, *, check_files: bool = False) -> Topology:
    """The embedded default topology, data directories under ``base_dir`` (default: cwd);
    its secret files (``dcmirror dev-secrets``) are only checked with ``check_files``."""
    return loads(default_topology_text(), base_dir=base_dir, check_files=check_files)
