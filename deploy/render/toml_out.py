"""A Topology back to TOML text that `topology.loads` reads into an equal Topology.

Field names are the file's keys (docs/design.md, "The topology file"), so every spec dataclass is
written field by field; values that equal the field's default are left out.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from topology.model import NodeAddress, Topology

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def key(name: str) -> str:
    return name if _BARE_KEY.fullmatch(name) else string(name)


def string(text: str) -> str:
    # JSON's escapes are TOML's; TOML also forbids a literal DEL in basic strings.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return string(v)
    if isinstance(v, (Path, NodeAddress)):
        return string(str(v))
    if isinstance(v, tuple) and v and all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str)
                                          for x in v):
        return value(dict(v))  # ordered pairs (the warehouse's schemas) are a table in the file
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{key(str(k))} = {value(x)}" for k, x in v.items()) + " }" if v else "{}"
    raise TypeError(f"cannot write {type(v).__name__} {v!r} as TOML")


def _fields(spec: Any, skip: tuple[str, ...] = ()) -> list[str]:
    lines = []
    for f in dataclasses.fields(spec):
        if f.name in skip:
            continue
        v = getattr(spec, f.name)
        if v is None or v == {} or v == ():
            continue
        if f.default is not dataclasses.MISSING and v == f.default:
            continue
        lines.append(f"{key(f.name)} = {value(v)}")
    return lines


def dump_topology(topology: Topology, header: str = "") -> str:
    """TOML for `topology` (absolute paths, defaults applied), with `header` as comment lines."""
    out = [f"# {line}".rstrip() for line in header.splitlines()]
    if out:
        out.append("")
    for name, cluster in topology.clusters.items():
        out += [f"[clusters.{key(name)}]", *_fields(cluster, skip=("name", "registry")), ""]
        if cluster.registry is not None:  # auth_token stays the reference the topology gave
            out += [f"[clusters.{key(name)}.registry]", *_fields(cluster.registry), ""]
    defaults = _fields(topology.defaults)
    if defaults:
        out += ["[defaults]", *defaults, ""]
    for topic in topology.topics:
        out += ["[[topics]]", *_fields(topic), ""]
    for flow in topology.mirrors:
        out += ["[[mirrors]]", f"name = {string(flow.name)}", *_fields(flow, skip=("name",)), ""]
    if topology.warehouse is not None:
        out += ["[warehouse]", *_fields(topology.warehouse, skip=("registry_schemas",)), ""]
        if topology.warehouse.registry_schemas:
            out += ["[warehouse.registry_schemas]"]
            out += [f"{key(t.topics)} = {{ {', '.join(_fields(t, skip=('topics',)))} }}"
                    if _fields(t, skip=("topics",)) else f"{key(t.topics)} = {{}}"
                    for t in topology.warehouse.registry_schemas]
            out.append("")
    if topology.console is not None:  # auth_token stays the reference the topology gave
        out += ["[console]", *_fields(topology.console), ""]
    return "\n".join(out)
