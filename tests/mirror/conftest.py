from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.mirror.lab import MirrorLab


@pytest.fixture
def mirror_lab(tmp_path: Path) -> Iterator[Callable[..., MirrorLab]]:
    """mirror_lab({"east": 1, "aggregate": 1}, **broker_config): the clusters started; on
    teardown every mirror process and broker of the lab is killed."""
    made: list[MirrorLab] = []

    def make(sizes: dict[str, int], **broker_config: object) -> MirrorLab:
        lab = MirrorLab(tmp_path / f"lab{len(made)}", sizes, **broker_config)
        made.append(lab)
        return lab.start()

    yield make
    for lab in made:
        lab.teardown()
