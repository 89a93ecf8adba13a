"""A broker's security, built from its config: the listeners it serves (address, protocol,
TLS context, SASL mechanisms), the credential store and ACLs it reads from the metadata
image, its authorizer, and how it connects to other nodes (the inter-broker listener's
protocol, with its own certificate or SASL login).
"""

from __future__ import annotations

import base64
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from cluster.broker.config import BrokerConfig
from cluster.broker.context import Session
from cluster.common.secrets import resolve
from cluster.controller.image import MetadataImage
from cluster.security.acl import AclBinding, AclOperation, Authorizer, ResourceType
from cluster.security.connector import LinkSecurity
from cluster.security.errors import SecurityConfigError
from cluster.security.listeners import (
    PROTOCOLS,
    ListenerAddress,
    listener_setting,
    parse_listeners,
    parse_protocol_map,
    uses_sasl,
    uses_tls,
)
from cluster.security.principal import ANONYMOUS, KafkaPrincipal, SslPrincipalMapper
from cluster.security.sasl import SaslServerSession
from cluster.security.scram import ScramCredential
from cluster.security.tls import ReloadingContext, ServerTls, peer_subject
from cluster.security.tls_stream import TlsServerStream

log = logging.getLogger(__name__)

AUTHORIZERS = ("StandardAuthorizer", "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
               "kafka.security.authorizer.AclAuthorizer")
MAX_FAILED_LOGIN_DELAY_S = 5.0


@dataclass
class ListenerRuntime:
    address: ListenerAddress
    protocol: str
    advertised: tuple[str, int]
    tls: ReloadingContext | None
    sasl_mechanisms: tuple[str, ...]
    reauth_ms: int
    mapper: SslPrincipalMapper

    @property
    def name(self) -> str:
        return self.address.name


class BrokerSecurity:
    def __init__(self, config: BrokerConfig, listen_host: str, listen_port: int, advertised_host: str,
                 image: Callable[[], MetadataImage]) -> None:
        self._image = image
        protocol_map = parse_protocol_map(str(config["listener.security.protocol.map"]))
        values = config.values
        if config["listeners"]:
            addresses = parse_listeners(str(config["listeners"]))
        else:
            name = str(config["inter.broker.listener.name"]).upper() or str(config["security.inter.broker.protocol"])
            addresses = [ListenerAddress(name, listen_host, listen_port)]
        advertised = {a.name: (a.host, a.port) for a in parse_listeners(str(config["advertised.listeners"]),
                                                                         "advertised.listeners")}
        self.inter_broker = str(config["inter.broker.listener.name"]).upper()
        if not self.inter_broker:
            wanted = str(config["security.inter.broker.protocol"])
            self.inter_broker = wanted if any(a.name == wanted for a in addresses) else addresses[0].name
        self.listeners: list[ListenerRuntime] = []
        for a in addresses:
            protocol = protocol_map.get(a.name) or (a.name if a.name in PROTOCOLS else "")
            if not protocol:
                raise SecurityConfigError(f"listener {a.name} has no entry in listener.security.protocol.map")
            host, port = advertised.get(a.name, (a.host, a.port))
            if host in ("", "0.0.0.0", "::"):
                host = advertised_host
            self.listeners.append(ListenerRuntime(
                a, protocol, (host, port), self._server_tls(values, a.name) if uses_tls(protocol) else None,
                tuple(str(listener_setting(values, a.name, "sasl.enabled.mechanisms")).split(","))
                if uses_sasl(protocol) else (),
                int(listener_setting(values, a.name, "connections.max.reauth.ms")),
                SslPrincipalMapper(str(listener_setting(values, a.name, "ssl.principal.mapping.rules")))))
        names = [listener.name for listener in self.listeners]
        if self.inter_broker not in names:
            raise SecurityConfigError(f"inter.broker.listener.name={self.inter_broker} is not one of the listeners "
                                      f"({', '.join(names)})")
        for name in filter(None, (n.strip().upper() for n in str(config["controller.listener.names"]).split(","))):
            if name not in names:
                raise SecurityConfigError(f"controller.listener.names names {name}, which is not a listener")
        inter = self.listener(self.inter_broker)
        if inter.address.port != listen_port:
            raise SecurityConfigError(f"the inter-broker listener {inter.address} must be the node's address "
                                      f"{listen_host}:{listen_port} (--listen / the topology's host:port)")
        authorizer = str(config["authorizer.class.name"])
        if authorizer and authorizer.rsplit(".", 1)[-1] not in {a.rsplit(".", 1)[-1] for a in AUTHORIZERS}:
            raise SecurityConfigError(f"authorizer.class.name={authorizer!r}: use StandardAuthorizer "
                                      "(org.apache.kafka.metadata.authorizer.StandardAuthorizer) or leave it empty")
        super_users = [p.strip() for p in str(config["super.users"]).split(";") if p.strip()]
        for p in super_users:
            KafkaPrincipal.parse(p)
        self._authorizer = Authorizer(super_users=super_users,
                                      allow_everyone_if_no_acl_found=bool(config["allow.everyone.if.no.acl.found"])) \
            if authorizer else None
        self._synced: tuple[int, int] = (-1, -1)
        self.failed_login_delay_s = int(config["connection.failed.authentication.delay.ms"]) / 1000
        self.failed_authentications = 0
        self.successful_authentications = 0
        self.failed_tls_handshakes = 0
        self._recent_failures: dict[str, int] = {}
        self.link = self._inter_broker_link(config, inter)

    # ---- listeners ---------------------------------------------------------------------

    def listener(self, name: str) -> ListenerRuntime:
        return next(listener for listener in self.listeners if listener.name == name)

    def advertised_listeners(self) -> dict[str, list[object]]:
        return {listener.name: [*listener.advertised] for listener in self.listeners}

    @staticmethod
    def _server_tls(values: dict[str, object], name: str) -> ReloadingContext:
        def setting(key: str) -> str:
            return str(listener_setting(values, name, key) or "")

        if not setting("ssl.keystore.location"):
            raise SecurityConfigError(f"listener {name} uses TLS: set ssl.keystore.location "
                                      f"(or listener.name.{name.lower()}.ssl.keystore.location)")
        password = setting("ssl.key.password")
        return ReloadingContext(ServerTls(
            keystore=Path(setting("ssl.keystore.location")),
            truststore=Path(setting("ssl.truststore.location")) if setting("ssl.truststore.location") else None,
            client_auth=setting("ssl.client.auth") or "none",
            key_password=resolve(password, "ssl.key.password") if password else None,
            enabled_protocols=tuple(setting("ssl.enabled.protocols").split(",")),
            cipher_suites=setting("ssl.cipher.suites")))

    def _inter_broker_link(self, config: BrokerConfig, inter: ListenerRuntime) -> LinkSecurity:
        """How this broker connects to the others: the client settings of the inter-broker
        listener (its keystore as the client certificate, its truststore, its JAAS login),
        read by the same code as every client's (LinkSecurity.from_config)."""
        values = config.values

        def setting(key: str) -> str:
            return str(listener_setting(values, inter.name, key) or "")

        client: dict[str, object] = {
            "security.protocol": inter.protocol,
            "ssl.truststore.location": setting("ssl.truststore.location"),
            "ssl.keystore.location": setting("ssl.keystore.location"),
            "ssl.key.password": setting("ssl.key.password"),
            "ssl.endpoint.identification.algorithm": str(config["ssl.endpoint.identification.algorithm"]),
        }
        if uses_sasl(inter.protocol):
            mechanism = str(config["sasl.mechanism.inter.broker.protocol"])
            for key in (f"listener.name.{inter.name.lower()}.{mechanism.lower()}.sasl.jaas.config",
                        f"listener.name.{inter.name.lower()}.sasl.jaas.config", "sasl.jaas.config"):
                if values.get(key):
                    client.update({"sasl.mechanism": mechanism, "sasl.jaas.config": str(values[key])})
                    break
            else:
                raise SecurityConfigError(f"the inter-broker listener {inter.name} uses SASL: set "
                                          f"listener.name.{inter.name.lower()}.{mechanism.lower()}.sasl.jaas.config "
                                          "(or sasl.jaas.config) with this broker's user")
        return LinkSecurity.from_config(client)

    # ---- sessions ----------------------------------------------------------------------

    async def accept_tls(self, stream: trio.SocketStream, listener: ListenerRuntime, peer: str,
                         timeout_s: float) -> tuple[trio.abc.Stream, str | None] | None:
        """The connection's transport and TLS subject: the TLS handshake on a TLS listener
        (None: it failed or timed out, logged and counted), the plain stream otherwise."""
        if listener.tls is None:
            return stream, None
        tls_stream = TlsServerStream(stream, listener.tls.context)
        with trio.move_on_after(timeout_s) as timed_out:
            try:
                await tls_stream.do_handshake()
            except trio.BrokenResourceError as exc:
                self.failed_tls_handshakes += 1
                cause = exc.__cause__
                # A port probe (connect, close) is not worth a warning; a refused handshake is.
                level = logging.INFO if isinstance(cause, ssl.SSLEOFError) else logging.WARNING
                log.log(level, "TLS handshake with %s on listener %s failed: %s", peer, listener.name, cause or exc)
                await tls_stream.aclose()
                return None
        if timed_out.cancelled_caught:
            self.failed_tls_handshakes += 1
            log.warning("TLS handshake with %s on listener %s timed out", peer, listener.name)
            await tls_stream.aclose()
            return None
        return tls_stream, peer_subject(tls_stream.ssl_object)

    def may_send_internal(self, session: Session) -> bool:
        """Quorum messages and controller calls come from other nodes only: with an
        authorizer, the principal needs CLUSTER_ACTION on the cluster (brokers are super users)."""
        authorizer = self.authorizer()
        return authorizer is None or authorizer.authorize(session.principal, session.client_ip,
                                                          AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER,
                                                          "kafka-cluster")

    def new_session(self, listener: ListenerRuntime, client_ip: str, tls_subject: str | None) -> Session:
        principal = ANONYMOUS
        if tls_subject is not None:
            principal = listener.mapper.principal_for(tls_subject)
        sasl = SaslServerSession(listener.sasl_mechanisms, self.lookup_credential, reauth_ms=listener.reauth_ms) \
            if listener.sasl_mechanisms else None
        return Session(listener.name, listener.protocol, client_ip, principal, sasl)

    def scram_store(self) -> dict[tuple[str, str], dict[str, Any]]:
        return self._image().scram

    def acl_store(self) -> dict[str, dict[str, Any]]:
        return self._image().acls

    def lookup_credential(self, name: str, mechanism: str) -> ScramCredential | None:
        c = self._image().scram.get((name, mechanism))
        if c is None:
            return None
        return ScramCredential(mechanism, base64.b64decode(c["salt"]), int(c["iterations"]),
                               base64.b64decode(c["stored_key"]), base64.b64decode(c["server_key"]))

    def login_failed(self, client_ip: str) -> float:
        """Count a failed login; how long to wait before answering and closing: the delay
        doubles with each failure from the same address in a row (capped)."""
        self.failed_authentications += 1
        n = self._recent_failures.get(client_ip, 0) + 1
        if len(self._recent_failures) > 10_000:
            self._recent_failures.clear()
        self._recent_failures[client_ip] = n
        return min(MAX_FAILED_LOGIN_DELAY_S, self.failed_login_delay_s * (2 ** min(n - 1, 16)))

    def login_succeeded(self, client_ip: str) -> None:
        self.successful_authentications += 1
        self._recent_failures.pop(client_ip, None)

    # ---- authorization -----------------------------------------------------------------

    def authorizer(self) -> Authorizer | None:
        """The authorizer with the image's current ACLs; None when none is configured."""
        if self._authorizer is None:
            return None
        image = self._image()
        key = (id(image), image.security_version)
        if key != self._synced:
            self._authorizer.set_acls(AclBinding.from_record(a) for a in image.acls.values())
            self._synced = key
        return self._authorizer

    def reload_certificates(self) -> None:
        for listener in self.listeners:
            if listener.tls is not None:
                try:
                    if listener.tls.maybe_reload():
                        log.info("listener %s: reloaded %s", listener.name, listener.tls.tls.keystore)
                except SecurityConfigError as exc:
                    log.error("listener %s keeps its certificate: %s", listener.name, exc)
