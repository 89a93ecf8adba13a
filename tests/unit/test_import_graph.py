"""The packages depend in one direction and no module imports itself through others
(tests/import_graph.py; the layers are drawn in docs/architecture.md)."""

from __future__ import annotations

from pathlib import Path

from tests.import_graph import cycles, layer_violations, read_imports

ROOT = Path(__file__).resolve().parents[2]


def test_no_import_cycles() -> None:
    modules, imports = read_imports(ROOT)
    assert len(modules) > 100 and len(imports) > 500  # it really read the tree
    found = cycles(imports)
    assert not found, "import cycles:\n" + "\n".join(" → ".join(c) for c in found)


def test_packages_depend_in_one_direction_and_keep_their_private_names() -> None:
    _, imports = read_imports(ROOT)
    problems = layer_violations(imports)
    assert not problems, "\n".join(problems)


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checker_sees_planted_cycles_layer_breaks_and_private_imports(tmp_path: Path) -> None:
    _write(tmp_path, {
        "cluster/__init__.py": "",
        "cluster/storage/__init__.py": "",
        "cluster/storage/log.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                  "    from cluster.storage.cleaner import Cleaner\n",
        "cluster/storage/cleaner.py": "from cluster.storage.log import Log\n",
        "cluster/storage/index.py": "def f():\n    from cluster.broker.broker import Broker\n",
        "cluster/broker/__init__.py": "",
        "cluster/broker/broker.py": "from cluster.storage import index\n",
        "cluster/client/__init__.py": "",
        "cluster/client/sync.py": "class _Thread: ...\n",
        "mirror/__init__.py": "",
        "mirror/tail.py": "from cluster.client.sync import _Thread\nfrom cluster.storage.log import Log\n",
    })
    _, imports = read_imports(tmp_path, roots=("cluster", "mirror"))
    found = cycles(imports)
    # A TYPE_CHECKING import and an import inside a function count like any other.
    assert ["cluster.storage.cleaner", "cluster.storage.log"] in found
    assert ["cluster.broker.broker", "cluster.storage.index"] in found
    problems = "\n".join(layer_violations(imports))
    assert "cluster.storage.index:2 imports cluster.broker.broker: cluster/storage is below cluster/broker" in problems
    assert "mirror.tail:1 imports cluster.client.sync: takes private name(s) _Thread" in problems
    assert "mirror.tail:2 imports cluster.storage.log: outside cluster/ only the client library" in problems
