"""Who a connection is: Kafka's principals ("User:alice") and the TLS subject mapping.

PLAINTEXT connections are User:ANONYMOUS; SASL ones are User:<authenticated name>; SSL
ones are User:<certificate subject in RFC 2253 form>, mapped by `ssl.principal.mapping.rules`
(Kafka's syntax: `RULE:pattern/replacement/[LU]`, comma separated, `DEFAULT` last) — or
User:ANONYMOUS when the client sent no certificate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cluster.security.errors import SecurityConfigError

USER_TYPE = "User"


@dataclass(frozen=True, slots=True)
class KafkaPrincipal:
    principal_type: str
    name: str

    def __str__(self) -> str:
        return f"{self.principal_type}:{self.name}"

    @classmethod
    def parse(cls, text: str) -> KafkaPrincipal:
        kind, sep, name = text.partition(":")
        if not sep or not kind or not name:
            raise ValueError(f"principal {text!r} must be TYPE:NAME, e.g. User:alice")
        return cls(kind, name)


ANONYMOUS = KafkaPrincipal(USER_TYPE, "ANONYMOUS")


def user(name: str) -> KafkaPrincipal:
    return KafkaPrincipal(USER_TYPE, name)


@dataclass(frozen=True, slots=True)
class _Rule:
    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: str
    case: str  # "", "L" or "U"

    def apply(self, dn: str) -> str | None:
        if self.pattern is None:
            return dn
        m = self.pattern.fullmatch(dn)
        if m is None:
            return None
        out = m.expand(self.replacement)
        return out.lower() if self.case == "L" else out.upper() if self.case == "U" else out


_RULE_RE = re.compile(r"\s*(?:(DEFAULT)|RULE:((?:\\/|[^/])*)/((?:\\/|[^/])*)/([LU]?))\s*(?:,|$)")


class SslPrincipalMapper:
    """`ssl.principal.mapping.rules`: the first rule that matches the subject names the user."""

    def __init__(self, rules: str = "DEFAULT") -> None:
        self.rules: list[_Rule] = []
        text = rules.strip() or "DEFAULT"
        pos = 0
        while pos < len(text):
            m = _RULE_RE.match(text, pos)
            if m is None or m.end() == pos:
                raise SecurityConfigError(f"ssl.principal.mapping.rules: cannot parse {text[pos:]!r} "
                                          "(use RULE:pattern/replacement/[LU] or DEFAULT)")
            if m.group(1):
                self.rules.append(_Rule(None, "", ""))
            else:
                try:
                    pattern = re.compile(m.group(2).replace("\\/", "/"))
                except re.error as exc:
                    raise SecurityConfigError(f"ssl.principal.mapping.rules: bad pattern {m.group(2)!r}: {exc}") from None
                # Java's $1 is Python's \1
                replacement = re.sub(r"\$(\d+)", r"\\g<\1>", m.group(3).replace("\\/", "/"))
                self.rules.append(_Rule(pattern, replacement, m.group(4)))
            pos = m.end()

    def principal_for(self, subject_dn: str) -> KafkaPrincipal:
        for rule in self.rules:
            name = rule.apply(subject_dn)
            if name is not None:
                return user(name)
        raise ValueError(f"no ssl.principal.mapping.rules rule matches the certificate subject {subject_dn!r}")
