"""`dcmirror dev-secrets --config FILE`: the secret files a topology references, made up for
a lab, a demo or a first try — never for production.

For every file the topology names that does not exist yet:
- a CA certificate (``ssl.truststore.location`` of brokers, ``ssl.ca.location`` of clients),
  one CA for the whole topology, its key beside it (``ca.key``, mode 0600);
- a broker keystore (``ssl.keystore.location``): key + certificate + CA, subject CN=<file
  stem> (so ``certs/broker.pem`` is User:broker with the usual mapping rule), valid for every
  host the topology gives the cluster's nodes and listeners, plus localhost;
- a random password for every ``${file:PATH:KEY}`` reference (users, client and flow
  settings), added to PATH (a properties file, mode 0600).
Existing files and keys are never changed. Works on the raw TOML, so it runs before
`topology check` (which refuses a topology whose files are missing).
"""

from __future__ import annotations

import argparse
import re
import secrets
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from deploy.certs import Authority, issue, make_ca, write_private

_FILE_REF = re.compile(r"\$\{file:([^}]*):([^:}]+)\}")
_HOST = re.compile(r"^\[?([^\]]+?)\]?:\d+$")


@dataclass
class Made:
    """What dev_secrets created (paths), for the caller to print."""

    files: list[Path] = field(default_factory=list)
    passwords: list[str] = field(default_factory=list)  # "PATH:KEY", never the value


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _hosts(cluster: dict[str, Any]) -> list[str]:
    addresses = list(cluster.get("brokers", [])) + list(cluster.get("controllers", []))
    for more in (cluster.get("listeners") or {}).values():
        addresses += list(more)
    hosts = {"localhost", "127.0.0.1"}
    for a in addresses:
        m = _HOST.match(str(a))
        if m:
            hosts.add(m.group(1))
    return sorted(hosts)


def _authority(path: Path, made: Made) -> Authority:
    key_path = path.with_name("ca.key")
    if path.exists():
        cert = x509.load_pem_x509_certificate(path.read_bytes())
        if not key_path.exists():
            raise ValueError(f"{path} exists but its key {key_path} does not: cannot issue certificates with it")
        key = serialization.load_pem_private_key(key_path.read_bytes(), None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key_path}: not an EC key made by dev-secrets")
        return Authority(path, key, cert)
    ca = make_ca(path.parent, "dcmirror dev CA")
    if ca.cert_path != path:
        ca.cert_path.replace(path)
        ca = Authority(path, ca.key, ca.cert)
    made.files.append(path)
    return ca


def dev_secrets(topology_path: Path) -> Made:
    doc = tomllib.loads(topology_path.read_text(encoding="utf-8"))
    base = topology_path.parent.absolute()
    made = Made()

    def where(text: str) -> Path:
        p = Path(text).expanduser()
        return p if p.is_absolute() else base / p

    clusters: dict[str, Any] = doc.get("clusters", {})
    ca_paths = []
    for c in clusters.values():
        config, client = c.get("config", {}), c.get("client", {})
        ca_paths += [config.get("ssl.truststore.location"), client.get("ssl.ca.location")]
    ca_paths = [where(p) for p in ca_paths if isinstance(p, str) and p]
    ca: Authority | None = None
    for p in ca_paths:
        if ca is None:
            ca = _authority(p, made)
        elif not p.exists():
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(ca.cert.public_bytes(serialization.Encoding.PEM))
            made.files.append(p)
    for c in clusters.values():
        keystore = c.get("config", {}).get("ssl.keystore.location")
        if isinstance(keystore, str) and keystore and not where(keystore).exists():
            if ca is None:
                raise ValueError(f"{keystore}: a keystore needs a CA; set ssl.truststore.location too")
            target = where(keystore)
            issued = issue(ca, target.parent, target.stem, hosts=tuple(_hosts(c)))
            if issued != target:
                issued.replace(target)
            made.files.append(target)
    references = [s for c in clusters.values() for part in ("users", "client", "config") for s in _strings(c.get(part))]
    references += [s for m in doc.get("mirrors", []) for s in _strings(m.get("config"))]
    for text in references:
        for m in _FILE_REF.finditer(text):
            path, key = where(m.group(1)), m.group(2)
            lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
            if any(re.match(rf"\s*{re.escape(key)}\s*[=:]", line) for line in lines):
                continue
            lines.append(f"{key}={secrets.token_urlsafe(18)}")
            write_private(path, ("\n".join(lines) + "\n").encode())
            made.passwords.append(f"{path}:{key}")
    return made


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("dev-secrets", help="make up the CA, certificates and passwords a topology references "
                                           "(labs and demos; never production)")
    p.add_argument("--config", required=True, help="topology file")
    p.set_defaults(func=cmd_dev_secrets)


def cmd_dev_secrets(args: argparse.Namespace) -> int:
    try:
        made = dev_secrets(Path(args.config))
    except (OSError, ValueError, tomllib.TOMLDecodeError) as exc:
        print(f"dcmirror dev-secrets: {exc}", file=sys.stderr)
        return 1
    for f in made.files:
        print(f"created {f}")
    for p in made.passwords:
        print(f"random password {p}")
    if not made.files and not made.passwords:
        print("nothing to create: every file the topology references exists")
    return 0
