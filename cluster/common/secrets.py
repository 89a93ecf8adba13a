"""Secrets by reference, with Kafka's config providers (KIP-297, KIP-887):

    ${file:/etc/dcmirror/client.properties:sasl.password}   a key of a properties file
    ${dir:/run/secrets:mirror-password}                      a whole file (Kubernetes secrets)
    ${env:DCMIRROR_SASL_PASSWORD}                            an environment variable

A value that holds a reference is resolved when the config is read; an error names the
setting and the file or variable, never the value. `Secret` wraps a resolved value so
that printing a config (logs, errors, status pages) shows `[hidden]`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from cluster.common.config_def import InvalidConfig

_REF = re.compile(r"\$\{(file|dir|env):([^}]*)\}")
MAX_SECRET_BYTES = 64 * 1024


class Secret:
    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret([hidden])"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def is_reference(value: str) -> bool:
    return _REF.fullmatch(value.strip()) is not None


def absolute_references(value: str, base_dir: Path) -> str:
    """`value` with the relative paths of its ${file:...} / ${dir:...} references made
    absolute against `base_dir` (a topology's references are relative to its file)."""

    def one(m: re.Match[str]) -> str:
        provider, arg = m.group(1), m.group(2)
        if provider == "env":
            return m.group(0)
        path_text, sep, key = arg.rpartition(":")
        if not sep or not path_text or Path(path_text).expanduser().is_absolute():
            return m.group(0)
        return f"${{{provider}:{base_dir / path_text}:{key}}}"

    return _REF.sub(one, value)


def _read(path: Path, setting: str) -> str:
    try:
        if path.stat().st_size > MAX_SECRET_BYTES:
            raise InvalidConfig(f"{setting}: {path} is larger than {MAX_SECRET_BYTES} bytes")
        return path.read_text()
    except OSError as exc:
        raise InvalidConfig(f"{setting}: cannot read {path}: {exc.strerror or exc}") from None


def resolve(value: str, setting: str) -> str:
    """Replace every ${provider:...} reference in `value`."""

    def one(m: re.Match[str]) -> str:
        provider, arg = m.group(1), m.group(2)
        if provider == "env":
            if arg not in os.environ:
                raise InvalidConfig(f"{setting}: environment variable {arg} is not set")
            return os.environ[arg]
        path_text, sep, key = arg.rpartition(":")
        if not sep:
            raise InvalidConfig(f"{setting}: ${{{provider}:PATH:KEY}} needs a path and a key")
        if provider == "dir":
            if "/" in key or key in ("", ".", ".."):
                raise InvalidConfig(f"{setting}: ${{dir:...}} names a file in the directory, not {key!r}")
            return _read(Path(path_text) / key, setting).rstrip("\r\n")
        properties = parse_properties(_read(Path(path_text), setting), f"{setting}: {path_text}")
        if key not in properties:
            raise InvalidConfig(f"{setting}: {path_text} has no key {key!r}")
        return properties[key]

    return _REF.sub(one, value)


def parse_properties(text: str, where: str) -> dict[str, str]:
    """A Java properties file as Kafka's tools read them: `key=value` or `key: value`,
    `#`/`!` comments. A line without a separator is an error naming `where` and the line."""
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        m = re.match(r"([^=:\s]+)\s*[=:]\s*(.*)", line)
        if m is None:
            raise InvalidConfig(f"{where}:{n}: expected key=value")
        out[m.group(1)] = m.group(2).strip()
    return out


def read_properties_file(path: Path, setting: str) -> dict[str, str]:
    """A properties file of at most MAX_SECRET_BYTES (checked before reading)."""
    return parse_properties(_read(path, setting), f"{setting} {path}")


def secret(value: str | Secret, setting: str) -> Secret:
    return value if isinstance(value, Secret) else Secret(resolve(value, setting))
