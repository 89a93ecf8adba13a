"""docs/protocol.md's table of advertised versions is the router's table (`api_table`), row
for row: an API added, dropped or given new versions without the docs fails here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from cluster.broker.broker import api_table

DOCS = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


class _AnyHandlers:
    def __getattr__(self, name: str) -> Any:
        return lambda *args: None


def documented() -> dict[int, tuple[int, int]]:
    out: dict[int, tuple[int, int]] = {}
    section = DOCS.read_text().split("## Versions advertised", 1)[1].split("\n## ", 1)[0]
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not (m := re.fullmatch(r"(\d+)(?:–(\d+))?", cells[1])):
            continue
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        for key in re.findall(r"\((\d+)\)", cells[0]):
            assert int(key) not in out, f"API key {key} documented twice"
            out[int(key)] = (lo, hi)
    return out


def test_docs_name_every_api_and_version_the_broker_advertises() -> None:
    routed = {int(a.key): (a.min_version, a.max_version) for a in api_table(*[_AnyHandlers()] * 11)}  # type: ignore[arg-type]
    assert documented() == routed
