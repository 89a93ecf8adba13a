"""A small certificate authority for labs, demos and tests (the `cryptography` package):
a CA, then keystores (private key + certificate chain, PEM: Kafka's ssl.keystore.type=PEM)
for brokers and clients, and the CA file as truststore.

Not for production CAs: keys are written unencrypted (mode 0600) next to the certificates.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Authority:
    cert_path: Path  # the truststore (ssl.truststore.location / ssl.ca.location)
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate


def write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_ca(directory: Path, name: str = "dcmirror CA", *, days: int = 365) -> Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "ca.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    write_private(directory / "ca.key", _key_pem(key))
    return Authority(path, key, cert)


def issue(ca: Authority, directory: Path, name: str, *, hosts: tuple[str, ...] = ("localhost", "127.0.0.1"),
          organizational_unit: str | None = None, not_before: datetime.datetime | None = None,
          not_after: datetime.datetime | None = None, days: int = 365) -> Path:
    """A keystore `<directory>/<name>.pem` (key + certificate + CA) with subject CN=<name>,
    usable by a server (for `hosts`) and as a client certificate."""
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, name)]
    if organizational_unit:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, organizational_unit))
    now = datetime.datetime.now(datetime.UTC)
    sans: list[x509.GeneralName] = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    cert = (x509.CertificateBuilder().subject_name(x509.Name(attrs)).issuer_name(ca.cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(not_before or now - datetime.timedelta(minutes=5))
            .not_valid_after(not_after or now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca.key, hashes.SHA256()))
    path = directory / f"{name}.pem"
    write_private(path, _key_pem(key) + cert.public_bytes(serialization.Encoding.PEM)
                   + ca.cert.public_bytes(serialization.Encoding.PEM))
    return path


def split_keystore(keystore: Path) -> tuple[Path, Path]:
    """The key and the certificate chain as two files (clients that want them apart:
    librdkafka's ssl.key.location / ssl.certificate.location, kcat, aiokafka)."""
    data = keystore.read_text()
    key_end = data.index("-----END PRIVATE KEY-----") + len("-----END PRIVATE KEY-----\n")
    key_path = keystore.with_suffix(".key")
    cert_path = keystore.with_suffix(".crt")
    write_private(key_path, data[:key_end].encode())
    cert_path.write_text(data[key_end:])
    return key_path, cert_path
