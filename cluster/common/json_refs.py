"""JSON Schema `$ref` resolution as the registry has it (sans-IO, no JSON Schema library): a
reference names a document, one of the schema's registry references by its reference name
(`customer.json#/definitions/Address`), or none (`#/definitions/Address`, the document the
reference is in), then a JSON pointer within it. Shared by the registry's compatibility
checks (cluster/registry/formats.py) and typed warehouse tables (spark_aggregate/typed.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def refs_in(node: Any) -> list[str]:
    """The $ref values in a schema document (every "$ref" key whose value is a string)."""
    found: list[str] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, dict):
            if isinstance(n.get("$ref"), str):
                found.append(n["$ref"])
            stack.extend(n.values())
        elif isinstance(n, list):
            stack.extend(n)
    return found


def resolve(ref: str, doc: str | None, root: Any, docs: Mapping[str, Any]) -> tuple[Any, str | None]:
    """The schema `ref` names from document `doc` (None: `root`, the schema itself; else the
    reference name of one of `docs`), and the document it is in. Raises LookupError."""
    name, _, pointer = ref.partition("#")
    if name:
        if name not in docs:
            raise LookupError(f"{name!r} is not one of the schema's references")
        doc = name
    node = docs[doc] if doc is not None else root
    for token in [t for t in pointer.split("/") if t]:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            raise LookupError(f"no {token!r} at '#{pointer}'")
    return node, doc
