"""TLS contexts from Kafka's ssl.* settings, and the certificate checks behind
`topology check` and broker start-up.

Stores are PEM files (Kafka's `ssl.keystore.type=PEM` / `ssl.truststore.type=PEM`): the
keystore holds the private key and the certificate chain, the truststore the CA
certificates. TLS 1.2 is the floor. A context can reload its key and certificate in place
(`ReloadingContext.maybe_reload`), so a renewed certificate takes effect for new
connections without a restart.
"""

from __future__ import annotations

import datetime
import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cluster.security.errors import SecurityConfigError

CLIENT_AUTH = ("none", "requested", "required")
_PROTOCOLS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}


@dataclass(frozen=True, slots=True)
class ServerTls:
    keystore: Path  # PEM: private key + certificate chain
    truststore: Path | None  # PEM CA certificates for client certificates
    client_auth: str = "none"
    key_password: str | None = None
    enabled_protocols: tuple[str, ...] = ("TLSv1.2", "TLSv1.3")
    cipher_suites: str = ""


@dataclass(frozen=True, slots=True)
class ClientTls:
    truststore: Path | None  # None: the system's CAs
    certificate: Path | None = None  # PEM certificate chain (mutual TLS), may also hold the key
    key: Path | None = None
    key_password: str | None = None
    check_hostname: bool = True
    verify: bool = True


def _min_version(protocols: tuple[str, ...]) -> ssl.TLSVersion:
    versions = []
    for p in protocols:
        if p not in _PROTOCOLS:
            raise SecurityConfigError(f"ssl.enabled.protocols: {p!r} is not supported (TLSv1.2, TLSv1.3)")
        versions.append(_PROTOCOLS[p])
    return min(versions)


def _readable(path: Path, setting: str) -> Path:
    if not path.is_file():
        raise SecurityConfigError(f"{setting}: {path} does not exist")
    if not os.access(path, os.R_OK):
        raise SecurityConfigError(f"{setting}: {path} is not readable")
    return path


def server_context(tls: ServerTls) -> ssl.SSLContext:
    if tls.client_auth not in CLIENT_AUTH:
        raise SecurityConfigError(f"ssl.client.auth must be one of {', '.join(CLIENT_AUTH)}, not {tls.client_auth!r}")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = _min_version(tls.enabled_protocols)
    if tls.cipher_suites:
        ctx.set_ciphers(tls.cipher_suites)
    _load_chain(ctx, _readable(tls.keystore, "ssl.keystore.location"), None, tls.key_password, "ssl.keystore.location")
    if tls.client_auth != "none":
        if tls.truststore is None:
            raise SecurityConfigError(f"ssl.client.auth={tls.client_auth} needs ssl.truststore.location")
        _load_cas(ctx, _readable(tls.truststore, "ssl.truststore.location"), "ssl.truststore.location")
        ctx.verify_mode = ssl.CERT_REQUIRED if tls.client_auth == "required" else ssl.CERT_OPTIONAL
    return ctx


def client_context(tls: ClientTls) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if tls.truststore is not None:
        _load_cas(ctx, _readable(tls.truststore, "ssl.ca.location"), "ssl.ca.location")
    else:
        ctx.load_default_certs()
    if tls.certificate is not None:
        _load_chain(ctx, _readable(tls.certificate, "ssl.certificate.location"),
                    None if tls.key is None else _readable(tls.key, "ssl.key.location"),
                    tls.key_password, "ssl.certificate.location")
    ctx.check_hostname = tls.check_hostname and tls.verify
    ctx.verify_mode = ssl.CERT_REQUIRED if tls.verify else ssl.CERT_NONE
    return ctx


def _load_chain(ctx: ssl.SSLContext, cert: Path, key: Path | None, password: str | None, setting: str) -> None:
    try:
        ctx.load_cert_chain(cert, key, password=password)
    except ssl.SSLError as exc:
        raise SecurityConfigError(f"{setting}: {cert}{'' if key is None else ' / ' + str(key)}: "
                                  f"cannot load the key and certificate ({exc.reason or exc}): "
                                  "is the key missing, encrypted or not matching the certificate?") from None
    except OSError as exc:
        raise SecurityConfigError(f"{setting}: {cert}: {exc.strerror or exc}") from None


def _load_cas(ctx: ssl.SSLContext, path: Path, setting: str) -> None:
    try:
        ctx.load_verify_locations(cafile=path)
    except (ssl.SSLError, OSError) as exc:
        raise SecurityConfigError(f"{setting}: {path}: not a PEM CA certificate file ({exc})") from None


class ReloadingContext:
    """A server context whose keystore is loaded again when its file changes."""

    def __init__(self, tls: ServerTls) -> None:
        self.tls = tls
        self.context = server_context(tls)
        self._mtime_ns = _mtime_ns(tls.keystore)

    def maybe_reload(self) -> bool:
        mtime = _mtime_ns(self.tls.keystore)
        if mtime == self._mtime_ns:
            return False
        self._mtime_ns = mtime
        check_keystore(self.tls.keystore, self.tls.key_password)
        _load_chain(self.context, self.tls.keystore, None, self.tls.key_password, "ssl.keystore.location")
        return True


def _mtime_ns(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return -1


def check_keystore(path: Path, password: str | None = None, *, now: datetime.datetime | None = None,
                   setting: str = "ssl.keystore.location") -> list[str]:
    """Problems with a PEM keystore (key + certificate): missing, unreadable, expired, not
    yet valid, key not matching. Raises SecurityConfigError for the first hard problem;
    returns warnings (expires within 14 days)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    data = _readable(path, setting).read_bytes()
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise SecurityConfigError(f"{setting}: {path} holds no PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(data, password.encode() if password else None)
    except (ValueError, TypeError) as exc:
        raise SecurityConfigError(f"{setting}: {path}: cannot read its private key ({exc})") from None
    leaf = certs[0]
    if key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo) != \
            leaf.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo):
        raise SecurityConfigError(f"{setting}: {path}: the private key does not match the certificate "
                                  f"({leaf.subject.rfc4514_string()})")
    return check_certificates(path, setting=setting, now=now, certs=certs)


def check_certificates(path: Path, *, setting: str = "ssl.truststore.location", now: datetime.datetime | None = None,
                       certs: Sequence[object] | None = None) -> list[str]:
    from cryptography import x509

    if certs is None:
        data = _readable(path, setting).read_bytes()
        try:
            certs = list(x509.load_pem_x509_certificates(data))
        except ValueError:
            raise SecurityConfigError(f"{setting}: {path} holds no PEM certificate") from None
    now = now or datetime.datetime.now(datetime.UTC)
    warnings = []
    for cert in certs:
        assert isinstance(cert, x509.Certificate)
        subject = cert.subject.rfc4514_string()
        if cert.not_valid_before_utc > now:
            raise SecurityConfigError(f"{setting}: {path}: certificate {subject} is not valid before "
                                      f"{cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC")
        if cert.not_valid_after_utc < now:
            raise SecurityConfigError(f"{setting}: {path}: certificate {subject} expired on "
                                      f"{cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
        if cert.not_valid_after_utc - now < datetime.timedelta(days=14):
            warnings.append(f"{setting}: {path}: certificate {subject} expires on "
                            f"{cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
    return warnings


def peer_subject(ssl_object: ssl.SSLObject) -> str | None:
    """The client certificate's subject in RFC 2253 form (Kafka's principal name), or None."""
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        return None
    from cryptography import x509

    return x509.load_der_x509_certificate(der).subject.rfc4514_string()


def https_context(keystore: Path, setting: str) -> ssl.SSLContext:
    """A server context for HTTPS (the admin HTTP servers) from a PEM keystore, checked first
    (clear errors naming `setting`)."""
    check_keystore(keystore, setting=setting)
    return server_context(ServerTls(keystore, None))
