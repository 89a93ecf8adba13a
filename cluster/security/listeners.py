"""Listeners with Kafka's settings:

    listeners=INTERNAL://127.0.0.1:9092,EXTERNAL://0.0.0.0:9093
    advertised.listeners=INTERNAL://127.0.0.1:9092,EXTERNAL://east-1.example.com:9093
    listener.security.protocol.map=INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL
    inter.broker.listener.name=INTERNAL

A listener named like a protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL) needs no map
entry. Settings of one listener are given as `listener.name.<name lower-case>.<setting>`
and fall back to the plain `<setting>`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cluster.security.errors import SecurityConfigError

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
DEFAULT_PROTOCOL_MAP = ",".join(f"{p}:{p}" for p in PROTOCOLS)


@dataclass(frozen=True, slots=True)
class ListenerAddress:
    name: str
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.name}://{self.host}:{self.port}"


def uses_tls(protocol: str) -> bool:
    return protocol in ("SSL", "SASL_SSL")


def uses_sasl(protocol: str) -> bool:
    return protocol in ("SASL_PLAINTEXT", "SASL_SSL")


def parse_protocol_map(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, protocol = part.partition(":")
        name, protocol = name.strip().upper(), protocol.strip().upper()
        if not sep or not name or protocol not in PROTOCOLS:
            raise SecurityConfigError(f"listener.security.protocol.map: {part!r} must be NAME:PROTOCOL "
                                      f"with PROTOCOL one of {', '.join(PROTOCOLS)}")
        out[name] = protocol
    return out


def parse_listeners(text: str, setting: str = "listeners") -> list[ListenerAddress]:
    out: list[ListenerAddress] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, address = part.partition("://")
        host, colon, port = address.rpartition(":")
        if not sep or not name or not colon or not port.isdigit() or not 0 < int(port) < 65536:
            raise SecurityConfigError(f"{setting}: {part!r} must be NAME://HOST:PORT, e.g. SASL_SSL://0.0.0.0:9093")
        name = name.upper()
        if any(a.name == name for a in out):
            raise SecurityConfigError(f"{setting}: listener {name} is named twice")
        out.append(ListenerAddress(name, host.strip("[]"), int(port)))
    return out


def listener_setting(config: Mapping[str, Any], listener: str, key: str) -> Any:
    """`listener.name.<listener>.<key>` if set, else `<key>`."""
    specific = f"listener.name.{listener.lower()}.{key}"
    return config[specific] if specific in config else config.get(key)
