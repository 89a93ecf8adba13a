"""Column lists in Spark DDL ("user STRING, url STRING, ts TIMESTAMP"), checked without
Spark: the warehouse's per-topic schemas are validated with the rest of the topology file.

The accepted subset: name TYPE pairs, names plain identifiers or `backquoted`; types
BOOLEAN, TINYINT, SMALLINT, INT, BIGINT, FLOAT, DOUBLE, DECIMAL(p, s), STRING, BINARY,
DATE, TIMESTAMP, TIMESTAMP_NTZ, ARRAY<T>, MAP<K, V>, STRUCT<name: T, ...> (and Spark's
aliases BYTE, SHORT, INTEGER, LONG, REAL, DEC, NUMERIC, VARCHAR(n), CHAR(n)).
"""

from __future__ import annotations

import re

SIMPLE_TYPES = frozenset({
    "BOOLEAN", "TINYINT", "BYTE", "SMALLINT", "SHORT", "INT", "INTEGER", "BIGINT", "LONG", "FLOAT", "REAL",
    "DOUBLE", "STRING", "BINARY", "DATE", "TIMESTAMP", "TIMESTAMP_NTZ", "TIMESTAMP_LTZ",
})
MAX_DECIMAL_PRECISION = 38
MAX_DEPTH = 16
_TOKEN = re.compile(r"\s*(`(?:[^`]|``)+`|[A-Za-z_][A-Za-z0-9_]*|\d+|[<>(),:])")


class DdlError(ValueError):
    pass


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[str] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            m = _TOKEN.match(text, pos)
            if m is None:
                raise DdlError(f"unexpected {text[pos:].strip()[:20]!r} in {text!r}")
            self.tokens.append(m.group(1))
            pos = m.end()
        self.i = 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, what: str) -> str:
        token = self.peek()
        if token is None:
            raise DdlError(f"{self.text!r} ends where {what} was expected")
        self.i += 1
        return token

    def expect(self, symbol: str) -> None:
        token = self.take(repr(symbol))
        if token != symbol:
            raise DdlError(f"expected {symbol!r}, found {token!r} in {self.text!r}")

    def name(self) -> str:
        token = self.take("a column name")
        if token.startswith("`"):
            return token[1:-1].replace("``", "`")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", token):
            raise DdlError(f"{token!r} is not a column name in {self.text!r}")
        return token

    def data_type(self, depth: int = 0) -> None:
        if depth > MAX_DEPTH:
            raise DdlError(f"types nest deeper than {MAX_DEPTH} levels in {self.text!r}")
        token = self.take("a type").upper()
        if token in SIMPLE_TYPES:
            return
        if token in ("DECIMAL", "DEC", "NUMERIC"):
            if self.peek() == "(":
                self.expect("(")
                precision = self.number()
                scale = 0
                if self.peek() == ",":
                    self.expect(",")
                    scale = self.number()
                self.expect(")")
                if not 1 <= precision <= MAX_DECIMAL_PRECISION or scale > precision:
                    raise DdlError(f"DECIMAL({precision}, {scale}) needs 1 <= precision <= {MAX_DECIMAL_PRECISION} "
                                   f"and scale <= precision")
            return
        if token in ("VARCHAR", "CHAR"):
            self.expect("(")
            self.number()
            self.expect(")")
            return
        if token == "ARRAY":
            self.expect("<")
            self.data_type(depth + 1)
            self.expect(">")
            return
        if token == "MAP":
            self.expect("<")
            self.data_type(depth + 1)
            self.expect(",")
            self.data_type(depth + 1)
            self.expect(">")
            return
        if token == "STRUCT":
            self.expect("<")
            seen: set[str] = set()
            while True:
                field = self.name()
                if field.lower() in seen:
                    raise DdlError(f"STRUCT field {field!r} appears twice in {self.text!r}")
                seen.add(field.lower())
                if self.peek() == ":":
                    self.expect(":")
                self.data_type(depth + 1)
                if self.peek() != ",":
                    break
                self.expect(",")
            self.expect(">")
            return
        raise DdlError(f"unknown type {token!r} in {self.text!r}; types: {', '.join(sorted(SIMPLE_TYPES))}, "
                       "DECIMAL(p, s), ARRAY<T>, MAP<K, V>, STRUCT<name: T, ...>")

    def number(self) -> int:
        token = self.take("a number")
        if not token.isdigit():
            raise DdlError(f"expected a number, found {token!r} in {self.text!r}")
        return int(token)


def column_names(ddl: str) -> list[str]:
    """The column names of a DDL column list; raises DdlError naming the problem."""
    parser = _Parser(ddl)
    if parser.peek() is None:
        raise DdlError("the column list is empty")
    names: list[str] = []
    while True:
        name = parser.name()
        if name.lower() in (n.lower() for n in names):
            raise DdlError(f"column {name!r} appears twice in {ddl!r}")
        names.append(name)
        parser.data_type()
        token = parser.peek()
        if token is None:
            return names
        if token != ",":
            raise DdlError(f"expected ',' between columns, found {token!r} in {ddl!r} "
                           "(NOT NULL, COMMENT and defaults are not supported)")
        parser.expect(",")
