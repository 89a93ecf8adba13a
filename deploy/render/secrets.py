"""The secret files and variables a topology references, moved to where rendered hosts and
pods find them: every certificate, key and password file (``*.location`` settings,
``${file:PATH:KEY}`` and ``${dir:DIR:FILE}`` references, a schema registry's users file
and keystore) gets a name in one directory, and
the rendered topology points there. Only names and paths are rendered, never contents: the
operator installs the files (systemd) or fills the Secret (Kubernetes).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path

from topology.model import RegistrySpec, Topology

_REF = re.compile(r"\$\{(file|dir|env):([^}]*)\}")


@dataclass
class SecretFiles:
    files: dict[str, Path] = field(default_factory=dict)
    """name in the directory -> the file the topology named on the rendering machine"""
    env: list[str] = field(default_factory=list)
    """${env:VAR} names, in first-use order"""

    def name_for(self, original: Path) -> str:
        for name, path in self.files.items():
            if path == original:
                return name
        name = original.name
        n = 2
        while name in self.files:
            name = f"{n}-{original.name}"
            n += 1
        self.files[name] = original
        return name


def relocate_secrets(topology: Topology, directory: str) -> tuple[Topology, SecretFiles]:
    """The topology with its secret files under `directory`, and what was moved."""
    found = SecretFiles()

    def value(key: str, text: str) -> str:
        if key.endswith(".location") and text and "${" not in text:
            return f"{directory}/{found.name_for(Path(text))}"

        def ref(m: re.Match[str]) -> str:
            provider, arg = m.group(1), m.group(2)
            if provider == "env":
                if arg not in found.env:
                    found.env.append(arg)
                return m.group(0)
            path, _, rest = arg.rpartition(":")
            if provider == "dir":  # a file of the directory: moved on its own
                return f"${{dir:{directory}:{found.name_for(Path(path) / rest)}}}"
            return f"${{file:{directory}/{found.name_for(Path(path))}:{rest}}}"

        return _REF.sub(ref, text)

    def table(settings: dict[str, str]) -> dict[str, str]:
        return {k: value(k, v) for k, v in settings.items()}

    def registry(spec: RegistrySpec | None) -> RegistrySpec | None:
        """The registry's token reference points into `directory`; its users file and keystore move there."""
        if spec is None:
            return None
        def moved(path: str) -> str:
            return f"{directory}/{found.name_for(Path(path))}" if path else ""

        return dataclasses.replace(spec, auth_token=value("auth_token", spec.auth_token),
                                   basic_auth_users=moved(spec.basic_auth_users), keystore=moved(spec.keystore))

    clusters = {name: dataclasses.replace(c, config=table(c.config), client=table(c.client), users=table(c.users),
                                          registry=registry(c.registry))
                for name, c in topology.clusters.items()}
    mirrors = tuple(dataclasses.replace(m, config=table(m.config)) for m in topology.mirrors)
    warehouse = topology.warehouse
    if warehouse is not None:
        warehouse = dataclasses.replace(warehouse, config=table(warehouse.config))
    return dataclasses.replace(topology, clusters=clusters, mirrors=mirrors, warehouse=warehouse), found
