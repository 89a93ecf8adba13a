"""Every third-party module the product imports (cluster/, mirror/, topology/,
spark_aggregate/, deploy/) comes with the package itself (issue 41): `dcmirror demo` from a
plain `pip install` failed at once on confluent-kafka's schema-registry extras, which only
the test extras installed, and typed loads needed fastavro the same way. Read from the
installed package's metadata (its requirements, their requirements, extras followed) and
the import statements of the source."""

from __future__ import annotations

import ast
import sys
from importlib.metadata import packages_distributions, requires
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("cluster", "mirror", "topology", "spark_aggregate", "deploy")


def closure(name: str, extras: frozenset[str] = frozenset(), seen: dict[str, frozenset[str]] | None = None
            ) -> dict[str, frozenset[str]]:
    """Distributions a plain install of `name` (with `extras`) brings, by canonical name."""
    seen = {} if seen is None else seen
    key = canonicalize_name(name)
    if key in seen and extras <= seen[key]:
        return seen
    seen[key] = seen.get(key, frozenset()) | extras
    for text in requires(name) or []:
        req = Requirement(text)
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras | {""}):
            continue
        closure(req.name, frozenset(req.extras), seen)
    return seen


def third_party_imports() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for root in PRODUCT:
        for path in (ROOT / root).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in PRODUCT and top not in sys.stdlib_module_names and top != "__future__":
                        found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_module_the_product_imports_is_a_dependency_of_the_package() -> None:
    installed = closure("dcmirror")
    owners = packages_distributions()
    missing = {module: sorted(files)[:3] for module, files in third_party_imports().items()
               if not any(canonicalize_name(d) in installed for d in owners.get(module, []))}
    assert not missing, f"imported by the product, not brought by `pip install dcmirror`: {missing}"
    # What the demo's orders need: Confluent's serializers and their registry client.
    assert {"confluent-kafka", "fastavro", "authlib", "jsonschema"} <= set(installed)
