"""A small YAML writer for Kubernetes manifests: mappings, sequences, strings, numbers,
booleans and null, block style. Strings that YAML could read as anything else are written
double-quoted; multi-line text becomes a literal block."""

from __future__ import annotations

import re
from typing import Any

# Plain (unquoted) strings: nothing YAML 1.1 or 1.2 would read as a number, boolean, null,
# tag, anchor, comment or flow collection.
_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./-]*")
_SPECIAL = {"y", "n", "yes", "no", "true", "false", "on", "off", "null", "nan", "inf"}
# What YAML lets stand unescaped in a line (NEL, LS and PS are line breaks to YAML 1.1).
_PRINTABLE = re.compile("[\t\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]*")
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r", "\0": "\\0"}


def quoted(text: str) -> str:
    """A double-quoted YAML scalar; whatever YAML would not keep as is goes escaped."""
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif _PRINTABLE.fullmatch(ch):
            out.append(ch)
        elif ord(ch) <= 0xFF:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


def scalar(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            raise ValueError(f"cannot write {v!r} to a manifest")
        text = repr(v)
        return text if "." in text else text.replace("e", ".0e")  # YAML 1.1 floats need a dot
    if isinstance(v, str):
        if _PLAIN.fullmatch(v) and v.lower() not in _SPECIAL:
            return v
        return quoted(v)
    raise TypeError(f"cannot write {type(v).__name__} {v!r} as a YAML scalar")


def _literal_ok(text: str) -> bool:
    """A `|` block keeps `text` exactly: one final newline, no CR, nothing unprintable, and
    no leading space on the first line (that would need an indentation indicator)."""
    return (text.endswith("\n") and not text.endswith("\n\n") and "\r" not in text
            and not text.startswith((" ", "\n")) and _PRINTABLE.fullmatch(text.replace("\n", "")) is not None)


def _lines(v: Any, indent: int) -> list[str]:
    pad = " " * indent
    out: list[str] = []
    if isinstance(v, dict):
        for k, x in v.items():
            name = scalar(str(k))
            if isinstance(x, (dict, list)) and x:
                out.append(f"{pad}{name}:")
                # Sequences inside a mapping at the same indentation, as kubectl writes them.
                out += _lines(x, indent if isinstance(x, list) else indent + 2)
            elif isinstance(x, str) and "\n" in x and _literal_ok(x):
                out.append(f"{pad}{name}: |")
                out += [f"{pad}  {line}" if line else "" for line in x[:-1].split("\n")]
            else:
                out.append(f"{pad}{name}: {_inline(x)}")
    elif isinstance(v, list):
        for x in v:
            if isinstance(x, (dict, list)) and x:
                inner = _lines(x, indent + 2)
                out.append(f"{pad}- {inner[0].lstrip()}")
                out += inner[1:]
            else:
                out.append(f"{pad}- {_inline(x)}")
    else:
        out.append(pad + _inline(v))
    return out


def _inline(v: Any) -> str:
    if isinstance(v, dict):
        return "{}"
    if isinstance(v, list):
        return "[]"
    return scalar(v)


def dump(doc: Any) -> str:
    """One YAML document."""
    return "\n".join(_lines(doc, 0)) + "\n"


def dump_all(docs: list[Any]) -> str:
    """Several documents separated by `---`."""
    return "".join("---\n" + dump(d) for d in docs)
