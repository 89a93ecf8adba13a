"""SCRAM (RFC 5802, RFC 7677) as Kafka uses it: credentials and both sides of the exchange.

A credential is what the cluster stores per user and mechanism: a random salt, the
iteration count, StoredKey = H(HMAC(SaltedPassword, "Client Key")) and
ServerKey = HMAC(SaltedPassword, "Server Key"). The password itself is never stored, and
neither is anything a client could replay: proving knowledge of the password needs
ClientKey, which only the password yields.

Both sides are sans-IO: `ScramServer.receive(message) -> reply` and
`ScramClient.first()/final(server_first)/verify(server_final)` work on bytes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cluster.security.errors import AuthenticationFailed

# Kafka's names, hash and bounds (ScramMechanism.java: min 4096 iterations; KIP-554: max 16384).
MECHANISMS: dict[str, str] = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MECHANISM_TYPES: dict[str, int] = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}  # Describe/AlterUserScramCredentials
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
DEFAULT_ITERATIONS = 8192
MAX_MESSAGE_BYTES = 4096  # a client message longer than this is refused before parsing
NONCE_BYTES = 24


@dataclass(frozen=True, slots=True)
class ScramCredential:
    mechanism: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def record_fields(self) -> dict[str, Any]:
        """The fields of a ScramCredential metadata record (base64; never the password)."""
        return {"mechanism": self.mechanism, "salt": _b64(self.salt), "iterations": self.iterations,
                "stored_key": _b64(self.stored_key), "server_key": _b64(self.server_key)}


def check_mechanism(mechanism: str) -> str:
    if mechanism not in MECHANISMS:
        raise ValueError(f"unknown SCRAM mechanism {mechanism!r} (use {', '.join(MECHANISMS)})")
    return MECHANISMS[mechanism]


def check_iterations(iterations: int) -> None:
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"SCRAM iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}, not {iterations}")


def salted_password(mechanism: str, password: bytes, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(check_mechanism(mechanism), password, salt, iterations)


def credential_from_salted(mechanism: str, salted: bytes, salt: bytes, iterations: int) -> ScramCredential:
    """What AlterUserScramCredentials carries: the salted password (never the password)."""
    algo = check_mechanism(mechanism)
    client_key = hmac.digest(salted, b"Client Key", algo)
    return ScramCredential(mechanism, salt, iterations, hashlib.new(algo, client_key).digest(),
                           hmac.digest(salted, b"Server Key", algo))


def make_credential(mechanism: str, password: bytes, *, iterations: int = DEFAULT_ITERATIONS,
                    salt: bytes | None = None) -> ScramCredential:
    check_iterations(iterations)
    salt = salt if salt is not None else secrets.token_bytes(32)
    return credential_from_salted(mechanism, salted_password(mechanism, password, salt, iterations), salt, iterations)


def password_matches(credential: ScramCredential, password: bytes) -> bool:
    """For SASL/PLAIN against the same store: recompute StoredKey from the password."""
    again = credential_from_salted(credential.mechanism,
                                   salted_password(credential.mechanism, password, credential.salt,
                                                   credential.iterations),
                                   credential.salt, credential.iterations)
    return hmac.compare_digest(again.stored_key, credential.stored_key)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise AuthenticationFailed(f"malformed SCRAM {what}") from None


def _attributes(message: str, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in message.split(","):
        key, sep, value = part.partition("=")
        if not sep or len(key) != 1:
            raise AuthenticationFailed(f"malformed SCRAM {what}")
        out.setdefault(key, value)
    return out


def _saslname_decode(name: str) -> str:
    if "=" in name.replace("=2C", "").replace("=3D", ""):
        raise AuthenticationFailed("malformed SCRAM user name")
    return name.replace("=2C", ",").replace("=3D", "=")


def _saslname_encode(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def _alphanumeric_nonce() -> str:
    """Letters and digits only, as Kafka's own nonces: some clients (older librdkafka) do
    not carry a nonce holding '+' or '/' through unchanged."""
    return "".join(secrets.choice(_NONCE_ALPHABET) for _ in range(NONCE_BYTES + 8))


_NONCE_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


class ScramServer:
    """The broker's side of one SCRAM exchange: client-first → server-first,
    client-final → server-final. `lookup(user)` gives the stored credential or None; an
    unknown user gets a made-up salt so the exchange fails at the proof, like a wrong
    password (no user enumeration)."""

    def __init__(self, mechanism: str, lookup: Callable[[str], ScramCredential | None], *,
                 nonce: Callable[[], str] | None = None) -> None:
        self.mechanism = mechanism
        self.algo = check_mechanism(mechanism)
        self._lookup = lookup
        self._nonce = nonce or _alphanumeric_nonce
        self._state = "first"
        self.username: str | None = None
        self._credential: ScramCredential | None = None
        self._client_first_bare = ""
        self._server_first = ""
        self._gs2 = ""
        self._nonce_value = ""

    @property
    def complete(self) -> bool:
        return self._state == "done"

    def receive(self, message: bytes) -> bytes:
        if len(message) > MAX_MESSAGE_BYTES:
            raise AuthenticationFailed(f"SCRAM message of {len(message)} bytes is over {MAX_MESSAGE_BYTES}")
        try:
            text = message.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthenticationFailed("SCRAM message is not UTF-8") from None
        if self._state == "first":
            return self._client_first(text)
        if self._state == "final":
            return self._client_final(text)
        raise AuthenticationFailed("SCRAM exchange already complete")

    def _client_first(self, text: str) -> bytes:
        # gs2-header: "n,," or "y,," (no channel binding), optional authzid "a=..."
        parts = text.split(",", 2)
        if len(parts) != 3 or parts[0] not in ("n", "y") or (parts[1] and not parts[1].startswith("a=")):
            raise AuthenticationFailed("malformed SCRAM client-first message (channel binding is not supported)")
        self._gs2 = f"{parts[0]},{parts[1]},"
        self._client_first_bare = parts[2]
        attrs = _attributes(parts[2], "client-first message")
        if "n" not in attrs or "r" not in attrs or not attrs["r"]:
            raise AuthenticationFailed("SCRAM client-first message lacks a user name or nonce")
        if "m" in attrs:
            raise AuthenticationFailed("SCRAM extensions are not supported")
        self.username = _saslname_decode(attrs["n"])
        authzid = parts[1][2:]
        if authzid and _saslname_decode(authzid) != self.username:
            raise AuthenticationFailed("SCRAM authorization id differs from the user name")
        found = self._lookup(self.username)
        self._credential = found if found is not None and found.mechanism == self.mechanism else None
        if self._credential is None:
            # The same shape of answer as for a real user: the exchange fails at the proof.
            salt, iterations = hashlib.sha256(b"dcmirror" + self.username.encode()).digest(), DEFAULT_ITERATIONS
        else:
            salt, iterations = self._credential.salt, self._credential.iterations
        self._nonce_value = attrs["r"] + self._nonce()
        self._server_first = f"r={self._nonce_value},s={_b64(salt)},i={iterations}"
        self._state = "final"
        return self._server_first.encode()

    def _client_final(self, text: str) -> bytes:
        self._state = "failed"
        without_proof, sep, proof_part = text.rpartition(",p=")
        if not sep:
            raise AuthenticationFailed("SCRAM client-final message lacks a proof")
        attrs = _attributes(without_proof, "client-final message")
        if attrs.get("c") != _b64(self._gs2.encode()):
            raise AuthenticationFailed("SCRAM channel binding does not match")
        # Kafka's check (ScramSaslServer): the client's nonce ends with the server's. Older
        # librdkafka (Debian's kcat) sends the client part twice; Kafka accepts that too.
        if not attrs.get("r", "").endswith(self._nonce_value):
            raise AuthenticationFailed("SCRAM nonce does not match")
        proof = _unb64(proof_part, "client proof")
        credential = self._credential
        if credential is None:
            raise AuthenticationFailed("invalid credentials")
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        signature = hmac.digest(credential.stored_key, auth_message, self.algo)
        if len(proof) != len(signature):
            raise AuthenticationFailed("invalid credentials")
        client_key = _xor(proof, signature)
        if not hmac.compare_digest(hashlib.new(self.algo, client_key).digest(), credential.stored_key):
            raise AuthenticationFailed("invalid credentials")
        self._state = "done"
        return f"v={_b64(hmac.digest(credential.server_key, auth_message, self.algo))}".encode()


class ScramClient:
    """The client's side: `first()`, then `final(server_first)`, then `verify(server_final)`
    (which checks the broker knew the credential, so a fake broker is caught too)."""

    def __init__(self, mechanism: str, username: str, password: bytes, *, nonce: str | None = None) -> None:
        self.mechanism = mechanism
        self.algo = check_mechanism(mechanism)
        self.username = username
        self._password = password
        self._nonce = nonce or _alphanumeric_nonce()
        self._first_bare = f"n={_saslname_encode(username)},r={self._nonce}"
        self._server_signature = b""

    def first(self) -> bytes:
        return f"n,,{self._first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        text = server_first.decode("utf-8", "replace")
        attrs = _attributes(text, "server-first message")
        if "e" in attrs:
            raise AuthenticationFailed(f"broker refused SCRAM: {attrs['e']}")
        nonce, salt_text, iterations_text = attrs.get("r", ""), attrs.get("s", ""), attrs.get("i", "")
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise AuthenticationFailed("broker's SCRAM nonce does not extend the client's")
        if not iterations_text.isdigit():
            raise AuthenticationFailed("malformed SCRAM iteration count")
        iterations = int(iterations_text)
        check_iterations(iterations)
        salted = salted_password(self.mechanism, self._password, _unb64(salt_text, "salt"), iterations)
        client_key = hmac.digest(salted, b"Client Key", self.algo)
        stored_key = hashlib.new(self.algo, client_key).digest()
        without_proof = f"c=biws,r={nonce}"
        auth_message = f"{self._first_bare},{text},{without_proof}".encode()
        proof = _xor(client_key, hmac.digest(stored_key, auth_message, self.algo))
        server_key = hmac.digest(salted, b"Server Key", self.algo)
        self._server_signature = hmac.digest(server_key, auth_message, self.algo)
        return f"{without_proof},p={_b64(proof)}".encode()

    def verify(self, server_final: bytes) -> None:
        attrs = _attributes(server_final.decode("utf-8", "replace"), "server-final message")
        if "e" in attrs:
            raise AuthenticationFailed(f"broker refused SCRAM: {attrs['e']}")
        if not hmac.compare_digest(_unb64(attrs.get("v", ""), "server signature"), self._server_signature):
            raise AuthenticationFailed("the broker's SCRAM signature is wrong: it does not know this credential")
