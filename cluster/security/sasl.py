"""A connection's SASL state on the broker (Kafka's SaslServerAuthenticator), sans-IO.

    ApiVersions ─ SaslHandshake(mechanism) ─ SaslAuthenticate(token)... ─ authenticated
                                                                         │ (KIP-368) SaslHandshake again,
                                                                         └ same principal, before the session expires

Until a connection is authenticated it may send only ApiVersions, SaslHandshake and
SaslAuthenticate. SaslHandshake v0 means the tokens follow as raw size-prefixed frames
instead of SaslAuthenticate requests (old clients). A session lasts
`connections.max.reauth.ms` (0: for ever); after that the connection is closed at its
next request unless it re-authenticated.

PLAIN checks the password against the user's SCRAM credential (one store of users for
both mechanisms, as Redpanda does), so no password is ever stored.
"""

from __future__ import annotations

from collections.abc import Callable

from cluster.security.errors import AuthenticationFailed
from cluster.security.principal import KafkaPrincipal, user
from cluster.security.scram import ScramCredential, ScramServer, password_matches

SUPPORTED_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
MAX_PLAIN_BYTES = 1024

# user name, mechanism → the stored credential, or None
CredentialLookup = Callable[[str, str], ScramCredential | None]


class PlainServer:
    def __init__(self, lookup: CredentialLookup) -> None:
        self._lookup = lookup
        self.username: str | None = None
        self.complete = False

    def receive(self, message: bytes) -> bytes:
        if len(message) > MAX_PLAIN_BYTES:
            raise AuthenticationFailed(f"PLAIN message of {len(message)} bytes is over {MAX_PLAIN_BYTES}")
        parts = message.split(b"\x00")
        if len(parts) != 3:
            raise AuthenticationFailed("malformed PLAIN message (authzid NUL user NUL password)")
        try:
            authzid, name = parts[0].decode(), parts[1].decode()
        except UnicodeDecodeError:
            raise AuthenticationFailed("PLAIN user name is not UTF-8") from None
        if not name:
            raise AuthenticationFailed("PLAIN message has no user name")
        if authzid and authzid != name:
            raise AuthenticationFailed("PLAIN authorization id differs from the user name")
        for mechanism in ("SCRAM-SHA-512", "SCRAM-SHA-256"):
            credential = self._lookup(name, mechanism)
            if credential is not None and password_matches(credential, parts[2]):
                self.username = name
                self.complete = True
                return b""
        raise AuthenticationFailed("invalid credentials")


class SaslServerSession:
    def __init__(self, enabled_mechanisms: tuple[str, ...], lookup: CredentialLookup, *, reauth_ms: int = 0) -> None:
        self.enabled_mechanisms = enabled_mechanisms
        self._lookup = lookup
        self.reauth_ms = reauth_ms
        self.state = "handshake"  # handshake → authenticate → done (→ authenticate again)
        self.mechanism: str | None = None
        self.raw_tokens = False  # SaslHandshake v0: tokens come as raw frames
        self.principal: KafkaPrincipal | None = None
        self.expires_ms: int | None = None
        self._server: ScramServer | PlainServer | None = None

    @property
    def authenticated(self) -> bool:
        return self.principal is not None

    def expired(self, now_ms: int) -> bool:
        return self.expires_ms is not None and now_ms >= self.expires_ms

    def handshake(self, mechanism: str, version: int) -> bool:
        """True when the mechanism is enabled; the client then authenticates with it."""
        if self.state == "authenticate":
            raise AuthenticationFailed("SaslHandshake in the middle of an authentication")
        if self.state == "done" and version < 1:
            raise AuthenticationFailed("re-authentication needs SaslHandshake v1")
        if mechanism not in self.enabled_mechanisms:
            return False
        if self.state == "done" and mechanism != self.mechanism:
            raise AuthenticationFailed("re-authentication must use the same mechanism")
        self.mechanism = mechanism
        self.raw_tokens = version == 0
        self._server = PlainServer(self._lookup) if mechanism == "PLAIN" else \
            ScramServer(mechanism, lambda name: self._lookup(name, mechanism))
        self.state = "authenticate"
        return True

    def authenticate(self, token: bytes, now_ms: int) -> bytes:
        """One client token → the broker's reply token; raises AuthenticationFailed."""
        if self.state != "authenticate" or self._server is None:
            raise AuthenticationFailed("SaslAuthenticate before SaslHandshake")
        try:
            reply = self._server.receive(token)
        except AuthenticationFailed:
            self.state = "failed"
            raise
        if self._server.complete:
            assert self._server.username is not None
            principal = user(self._server.username)
            if self.principal is not None and principal != self.principal:
                self.state = "failed"
                raise AuthenticationFailed("re-authentication as a different user")
            self.principal = principal
            self.state = "done"
            self.expires_ms = now_ms + self.reauth_ms if self.reauth_ms > 0 else None
            self._server = None
        return reply

    def session_lifetime_ms(self, now_ms: int) -> int:
        return 0 if self.expires_ms is None else max(0, self.expires_ms - now_ms)
