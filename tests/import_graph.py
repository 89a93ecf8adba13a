"""The project's import graph, read from the source text: modules, the imports between them
(module level, inside functions and under TYPE_CHECKING alike), cycles, and the layer rules
of docs/architecture.md. Used by tests/unit/test_import_graph.py; runnable alone:

    python -m tests.import_graph          # prints cycles and layer violations, exit 1 if any
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOTS = ("cluster", "mirror", "topology", "spark_aggregate", "deploy")

# Layers of `cluster/`, lowest first: a package may import its own layer and those below.
CLUSTER_LAYERS = ("common", "protocol", "security", "storage", "quorum", "controller", "replication", "groups",
                  "transactions", "broker", "registry")
# The client library stands beside the layers and uses only these.
CLIENT_MAY_IMPORT = frozenset({"common", "protocol", "security", "client"})
# Top-level packages, lowest first: each may import those before it.
PROJECT_LAYERS = ("cluster", "topology", "mirror", "spark_aggregate", "deploy")
# What the packages above `cluster/` may use of it: the client library and the shared
# definitions; only deploy (which starts brokers and controllers) reaches further.
ABOVE_CLUSTER_MAY_IMPORT = frozenset({"common", "protocol", "security", "client"})


@dataclass(frozen=True, slots=True)
class Import:
    source: str  # importing module
    target: str  # imported module
    names: tuple[str, ...]  # names taken with `from target import ...` (empty for `import`)
    line: int
    target_is_package: bool = False


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def read_imports(root: Path, roots: Iterable[str] = ROOTS) -> tuple[set[str], list[Import]]:
    """Every project module under `root` and every import of a project module."""
    files = [p for r in roots for p in sorted((root / r).rglob("*.py"))]
    modules = {module_name(root, p) for p in files}
    packages = {module_name(root, p) for p in files if p.name == "__init__.py"}
    imports: list[Import] = []
    for path in files:
        source = module_name(root, path)
        package = source if path.name == "__init__.py" else source.rpartition(".")[0]
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = _project_module(alias.name, modules)
                    if target is not None:
                        imports.append(Import(source, target, (), node.lineno, target in packages))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in node.names:
                    # `from pkg import mod` imports the submodule; `from mod import name` the module.
                    sub = f"{base}.{alias.name}"
                    target = sub if sub in modules else _project_module(base, modules)
                    if target is not None:
                        names = () if target == sub else (alias.name,)
                        imports.append(Import(source, target, names, node.lineno, target in packages))
    return modules, imports


def _project_module(name: str, modules: set[str]) -> str | None:
    """The project module `name` refers to (itself or its closest enclosing package)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def cycles(imports: Iterable[Import]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if imp.source != imp.target and not _is_parent(imp.target, imp.source):
            graph.setdefault(imp.source, set()).add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _is_parent(package: str, module: str) -> bool:
    """A module importing its own package's __init__ (re-exports) is not a dependency edge."""
    return module.startswith(package + ".")


def _cluster_layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "cluster" and len(parts) > 1 else None


def layer_violations(imports: Iterable[Import]) -> list[str]:
    """Imports that point up the layers, or into a package's private names."""
    out = []
    for imp in imports:
        src_top, dst_top = imp.source.split(".")[0], imp.target.split(".")[0]
        where = f"{imp.source}:{imp.line} imports {imp.target}"
        if src_top != dst_top:
            if PROJECT_LAYERS.index(dst_top) > PROJECT_LAYERS.index(src_top):
                out.append(f"{where}: {src_top} is below {dst_top}")
            elif dst_top == "cluster" and src_top != "deploy" and _cluster_layer(imp.target) not in ABOVE_CLUSTER_MAY_IMPORT:
                out.append(f"{where}: outside cluster/ only the client library and shared definitions are public")
        elif src_top == "cluster":
            src, dst = _cluster_layer(imp.source), _cluster_layer(imp.target)
            if src is None or dst is None or src == dst:
                pass
            elif src == "client" or dst == "client":
                if src == "client" and dst not in CLIENT_MAY_IMPORT:
                    out.append(f"{where}: the client library may only use {sorted(CLIENT_MAY_IMPORT - {'client'})}")
                elif dst == "client" and src not in ("replication", "transactions", "broker", "registry", "groups"):
                    out.append(f"{where}: only the replica fetchers, the transaction coordinator (markers), "
                               "the schema registry (its _schemas topic) and the share-state service (share "
                               "coordinators' calls) talk to brokers as a client")
            elif dst not in CLUSTER_LAYERS or src not in CLUSTER_LAYERS:
                out.append(f"{where}: cluster/{src or dst} is not in the layer list of tests/import_graph.py")
            elif CLUSTER_LAYERS.index(dst) > CLUSTER_LAYERS.index(src):
                out.append(f"{where}: cluster/{src} is below cluster/{dst}")
        # Private names and modules belong to their own package.
        # `from pkg import _x`: _x belongs to pkg; `from pkg.mod import _x`: to pkg.mod's package.
        owner = imp.target if imp.target_is_package else imp.target.rpartition(".")[0]
        if not (imp.source == owner or imp.source.startswith(owner + ".")):
            private = [n for n in imp.names if n.startswith("_")]
            if private:
                out.append(f"{where}: takes private name(s) {', '.join(private)}")
            if imp.target.rpartition(".")[2].startswith("_") and not imp.target_is_package:
                out.append(f"{where}: a private module of {owner}")
    return sorted(set(out))


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    _, imports = read_imports(root)
    problems = [" → ".join(c) for c in cycles(imports)] + layer_violations(imports)
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
