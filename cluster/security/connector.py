"""The client side of every link — the project's clients, replication, controller calls,
the quorum: TCP, then TLS (SSL, SASL_SSL), then a SASL login (SASL_PLAINTEXT, SASL_SSL)
with Kafka's SaslHandshake v1 / SaslAuthenticate v1, so the stream that comes back belongs
to an authenticated principal.

`LinkSecurity.from_config` reads a Kafka client config (librdkafka's and the Java client's
names both work): security.protocol, sasl.mechanism(s), sasl.username / sasl.password or
sasl.jaas.config, ssl.ca.location / ssl.truststore.location, ssl.certificate.location +
ssl.key.location / ssl.keystore.location, ssl.key.password,
ssl.endpoint.identification.algorithm, enable.ssl.certificate.verification. Passwords may
be ${file:...}, ${dir:...} or ${env:...} references.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from cluster.common.secrets import Secret, secret
from cluster.protocol.api_keys import ApiKey
from cluster.protocol.errors import ErrorCode, ProtocolError
from cluster.protocol.framing import FrameDecoder
from cluster.protocol.messages import decode_response, encode_request
from cluster.security.errors import AuthenticationFailed, SecurityConfigError
from cluster.security.listeners import PROTOCOLS, uses_sasl, uses_tls
from cluster.security.sasl import SUPPORTED_MECHANISMS
from cluster.security.scram import ScramClient
from cluster.security.tls import ClientTls, client_context

MAX_SASL_RESPONSE_BYTES = 64 * 1024

# Client settings this module reads; clients accept them beside their own.
CLIENT_SECURITY_KEYS = (
    "security.protocol", "sasl.mechanism", "sasl.mechanisms", "sasl.username", "sasl.password", "sasl.jaas.config",
    "ssl.ca.location", "ssl.truststore.location", "ssl.truststore.type", "ssl.certificate.location",
    "ssl.key.location", "ssl.keystore.location", "ssl.keystore.type", "ssl.key.password",
    "ssl.endpoint.identification.algorithm", "enable.ssl.certificate.verification",
)

_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')


def parse_jaas(text: str, setting: str = "sasl.jaas.config") -> tuple[str, Secret]:
    """Username and password of a Kafka JAAS line (PlainLoginModule / ScramLoginModule)."""
    options = {k: v.replace('\\"', '"') for k, v in _JAAS_OPTION.findall(text)}
    if "username" not in options or "password" not in options:
        raise SecurityConfigError(f'{setting} must name username="..." and password="..."')
    return options["username"], secret(options["password"], setting)


@dataclass(frozen=True)
class LinkSecurity:
    protocol: str = "PLAINTEXT"
    tls: ssl.SSLContext | None = None
    sasl_mechanism: str = ""
    username: str = ""
    password: Secret | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise SecurityConfigError(f"security.protocol must be one of {', '.join(PROTOCOLS)}, not {self.protocol!r}")
        if uses_tls(self.protocol) and self.tls is None:
            raise SecurityConfigError(f"security.protocol={self.protocol} needs a TLS context")
        if uses_sasl(self.protocol):
            if self.sasl_mechanism not in SUPPORTED_MECHANISMS:
                raise SecurityConfigError(f"sasl.mechanism must be one of {', '.join(SUPPORTED_MECHANISMS)}, "
                                          f"not {self.sasl_mechanism!r}")
            if not self.username or self.password is None:
                raise SecurityConfigError(f"security.protocol={self.protocol} needs sasl.username and sasl.password "
                                          "(or sasl.jaas.config)")

    @classmethod
    def from_config(cls, values: Mapping[str, Any]) -> LinkSecurity:
        protocol = str(values.get("security.protocol") or "PLAINTEXT").upper()
        tls = None
        if uses_tls(protocol):
            def path(*keys: str) -> Path | None:
                for k in keys:
                    if values.get(k):
                        return Path(str(values[k]))
                return None

            verify = str(values.get("enable.ssl.certificate.verification", "true")).lower() != "false"
            endpoint = str(values.get("ssl.endpoint.identification.algorithm") or "none").lower()
            key_password = values.get("ssl.key.password") or None
            cert = path("ssl.certificate.location", "ssl.keystore.location")
            tls = client_context(ClientTls(
                truststore=path("ssl.ca.location", "ssl.truststore.location"), certificate=cert,
                key=path("ssl.key.location"),
                key_password=secret(key_password if isinstance(key_password, Secret) else str(key_password),
                                    "ssl.key.password").reveal() if key_password else None,
                check_hostname=endpoint == "https", verify=verify))
        mechanism, username, password = "", "", None
        if uses_sasl(protocol):
            mechanism = str(values.get("sasl.mechanism") or values.get("sasl.mechanisms") or "PLAIN").upper()
            jaas = values.get("sasl.jaas.config")
            if jaas:
                username, password = parse_jaas(jaas.reveal() if isinstance(jaas, Secret) else str(jaas))
            else:
                username = str(values.get("sasl.username") or "")
                raw = values.get("sasl.password") or None
                password = None if raw is None else secret(raw if isinstance(raw, Secret) else str(raw),
                                                           "sasl.password")
        return cls(protocol, tls, mechanism, username, password)


PLAINTEXT = LinkSecurity()


async def open_stream(host: str, port: int, link: LinkSecurity = PLAINTEXT, *,
                      client_id: bytes = b"dcmirror") -> trio.abc.Stream:
    """A connected, encrypted and authenticated stream, as `link` says; raises OSError
    (unreachable, TLS refused) or AuthenticationFailed."""
    tcp = await trio.open_tcp_stream(host, port)
    stream: trio.abc.Stream = tcp
    try:
        if link.tls is not None:
            tls_stream = trio.SSLStream(tcp, link.tls, server_hostname=host)
            try:
                await tls_stream.do_handshake()
            except trio.BrokenResourceError as exc:
                cause = exc.__cause__
                raise OSError(f"TLS handshake with {host}:{port} failed: {cause or exc}") from None
            stream = tls_stream
        if uses_sasl(link.protocol):
            await sasl_login(stream, link, client_id)
    except BaseException:
        with trio.CancelScope(shield=True):
            await stream.aclose()
        raise
    return stream


async def sasl_login(stream: trio.abc.Stream, link: LinkSecurity, client_id: bytes = b"dcmirror") -> None:
    assert link.password is not None
    exchange = _SaslExchange(stream, client_id)
    handshake = await exchange.request(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": link.sasl_mechanism})
    if handshake.error_code != ErrorCode.none:
        raise AuthenticationFailed(f"broker does not accept SASL mechanism {link.sasl_mechanism} "
                                   f"(it offers {', '.join(handshake.mechanisms) or 'none'})")
    password = link.password.reveal().encode()
    if link.sasl_mechanism == "PLAIN":
        await exchange.authenticate(b"\x00" + link.username.encode() + b"\x00" + password)
        return
    client = ScramClient(link.sasl_mechanism, link.username, password)
    server_first = await exchange.authenticate(client.first())
    server_final = await exchange.authenticate(client.final(server_first))
    client.verify(server_final)


class _SaslExchange:
    def __init__(self, stream: trio.abc.Stream, client_id: bytes) -> None:
        self.stream = stream
        self.client_id = client_id
        self.decoder = FrameDecoder(MAX_SASL_RESPONSE_BYTES)
        self.correlation_id = 0

    async def request(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        self.correlation_id += 1
        await self.stream.send_all(encode_request(api_key, version, self.correlation_id, self.client_id, body))
        while (frame := self.decoder.next_frame()) is None:
            data = await self.stream.receive_some(65536)
            if not data:
                raise AuthenticationFailed("the broker closed the connection during SASL authentication")
            try:
                self.decoder.receive_data(data)
            except ProtocolError as exc:
                raise AuthenticationFailed(f"bad SASL answer: {exc}") from None
        return decode_response(api_key, version, frame)

    async def authenticate(self, token: bytes) -> bytes:
        answer = await self.request(ApiKey.SASL_AUTHENTICATE, 1, {"auth_bytes": token})
        if answer.error_code != ErrorCode.none:
            raise AuthenticationFailed(answer.error_message or f"SASL authentication failed (error {answer.error_code})")
        return bytes(answer.auth_bytes)
