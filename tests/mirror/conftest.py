from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.mirror.lab import MirrorLab


@pytest.fixture
def mirror_lab(tmp_path: Path) -> Iterator[Callable[..., MirrorLab]]:
    """mirror_lab({"east": 1, "aggregate": 1}, controllers={"east": 3}, cluster_config={"aggregate":
    {...}}, **broker_config): the clusters (with dedicated controller nodes, and broker configs
    of their own, where asked) started; on
    teardown every mirror process and broker of the lab is killed."""
    made: list[MirrorLab] = []

    def make(sizes: dict[str, int], *, controllers: dict[str, int] | None = None,
             cluster_config: dict[str, dict[str, object]] | None = None, **broker_config: object) -> MirrorLab:
        lab = MirrorLab(tmp_path / f"lab{len(made)}", sizes, controllers=controllers, cluster_config=cluster_config,
                        **broker_config)
        made.append(lab)
        return lab.start()

    yield make
    for lab in made:
        lab.teardown()
