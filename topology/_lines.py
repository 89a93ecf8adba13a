"""Line numbers for TOML key paths, found by a light scan of the text.

``tomllib`` reports no positions for values, so error messages would otherwise say only
*what* is wrong. The scan runs only on text ``tomllib`` has already accepted, and it is
best effort: anything it does not follow just has no line.

Key paths are tuples: table keys are strings, array indexes ints, so the second broker of
``[clusters.east]`` is ``("clusters", "east", "brokers", 1)`` and the third ``[[topics]]``
entry is ``("topics", 2)``.
"""

from __future__ import annotations

KeyPath = tuple[str | int, ...]

_BARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


class _Scanner:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.line = 1
        self.lines: dict[KeyPath, int] = {}
        self.aot_count: dict[KeyPath, int] = {}  # array-of-tables path -> entries so far

    # -- characters -------------------------------------------------------------------

    def peek(self, offset: int = 0) -> str:
        i = self.pos + offset
        return self.text[i] if i < len(self.text) else ""

    def advance(self, n: int = 1) -> None:
        for _ in range(n):
            if self.pos < len(self.text):
                if self.text[self.pos] == "\n":
                    self.line += 1
                self.pos += 1

    def skip_spaces(self) -> None:
        while self.peek() in (" ", "\t"):
            self.advance()

    def skip_comment(self) -> None:
        if self.peek() == "#":
            while self.peek() not in ("\n", ""):
                self.advance()

    def skip_blank(self) -> None:
        """Whitespace, newlines and comments (inside arrays)."""
        while True:
            c = self.peek()
            if c in (" ", "\t", "\r", "\n"):
                self.advance()
            elif c == "#":
                self.skip_comment()
            else:
                return

    def skip_line(self) -> None:
        while self.peek() not in ("\n", ""):
            self.advance()
        self.advance()

    # -- TOML pieces ------------------------------------------------------------------

    def string(self) -> str:
        quote = self.peek()
        if self.text.startswith(quote * 3, self.pos):
            self.advance(3)
            end = self.text.find(quote * 3, self.pos)
            while end != -1 and quote == '"' and _escaped(self.text, end):
                end = self.text.find(quote * 3, end + 1)
            if end == -1:
                raise ValueError("unterminated string")
            # up to two quotes may close the string too: """a"""" is 'a"'
            while self.text.startswith(quote, end + 3):
                end += 1
            value = self.text[self.pos : end]
            self.advance(end + 3 - self.pos)
            return value
        self.advance()
        out: list[str] = []
        while True:
            c = self.peek()
            if c in ("", "\n"):
                raise ValueError("unterminated string")
            if c == quote:
                self.advance()
                return "".join(out)
            if c == "\\" and quote == '"':
                out.append(c + self.peek(1))
                self.advance(2)
                continue
            out.append(c)
            self.advance()

    def key(self) -> list[str]:
        """A dotted key; quoted parts are returned unescaped only when simple."""
        parts: list[str] = []
        while True:
            self.skip_spaces()
            c = self.peek()
            if c in ('"', "'"):
                raw = self.string()
                parts.append(_unescape(raw) if c == '"' else raw)
            else:
                start = self.pos
                while self.peek() in _BARE and self.peek() != "":
                    self.advance()
                if self.pos == start:
                    raise ValueError("bad key")
                parts.append(self.text[start : self.pos])
            self.skip_spaces()
            if self.peek() != ".":
                return parts
            self.advance()

    def value(self, path: KeyPath) -> None:
        c = self.peek()
        if c in ('"', "'"):
            self.string()
        elif c == "[":
            self.advance()
            index = 0
            while True:
                self.skip_blank()
                if self.peek() == "]":
                    self.advance()
                    return
                if self.peek() == "":
                    raise ValueError("unterminated array")
                self.lines.setdefault(path + (index,), self.line)
                self.value(path + (index,))
                index += 1
                self.skip_blank()
                if self.peek() == ",":
                    self.advance()
        elif c == "{":
            self.advance()
            while True:
                self.skip_spaces()
                if self.peek() == "}":
                    self.advance()
                    return
                if self.peek() == "":
                    raise ValueError("unterminated inline table")
                self.key_value(path)
                self.skip_spaces()
                if self.peek() == ",":
                    self.advance()
        else:
            while self.peek() not in (",", "]", "}", "\n", "#", ""):
                self.advance()

    def key_value(self, table: KeyPath) -> None:
        line = self.line
        parts = self.key()
        full = table + tuple(parts)
        for i in range(len(table) + 1, len(full) + 1):
            self.lines.setdefault(full[:i], line)
        self.skip_spaces()
        if self.peek() != "=":
            raise ValueError("expected =")
        self.advance()
        self.skip_spaces()
        self.value(full)

    def resolve(self, parts: list[str]) -> KeyPath:
        """A header's key path, with the current index of every array of tables on the way."""
        out: list[str | int] = []
        for part in parts:
            out.append(part)
            count = self.aot_count.get(tuple(out))
            if count:
                out.append(count - 1)
        return tuple(out)

    def document(self) -> dict[KeyPath, int]:
        table: KeyPath = ()
        while self.peek() != "":
            self.skip_blank()
            c = self.peek()
            if c == "":
                break
            line = self.line
            if c == "[" and self.peek(1) == "[":
                self.advance(2)
                parts = self.key()
                base = self.resolve(parts[:-1]) + (parts[-1],)
                index = self.aot_count.get(base, 0)
                self.aot_count[base] = index + 1
                table = base + (index,)
                self.lines.setdefault(base, line)
                self.lines.setdefault(table, line)
                self.skip_line()
            elif c == "[":
                self.advance()
                parts = self.key()
                table = self.resolve(parts)
                for i in range(1, len(table) + 1):
                    self.lines.setdefault(table[:i], line)
                self.skip_line()
            else:
                self.key_value(table)
                self.skip_spaces()
                self.skip_comment()
        return self.lines


def _escaped(text: str, i: int) -> bool:
    backslashes = 0
    while i > 0 and text[i - 1] == "\\":
        backslashes += 1
        i -= 1
    return backslashes % 2 == 1


def _unescape(raw: str) -> str:
    if "\\" not in raw:
        return raw
    try:
        return raw.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError:
        return raw


def line_index(text: str) -> dict[KeyPath, int]:
    """Key path -> the line where it is first defined (a key, a table header, an element)."""
    scanner = _Scanner(text)
    try:
        return scanner.document()
    except (ValueError, IndexError):
        return scanner.lines  # best effort: what was found before the scan lost its way


def line_of(index: dict[KeyPath, int], path: KeyPath) -> int | None:
    """The line of ``path``, else of its nearest ancestor that has one."""
    for end in range(len(path), 0, -1):
        line = index.get(path[:end])
        if line is not None:
            return line
    return None
