"""One broker process for the whole tests/registry package (each module starts its own
registries on it; subjects are named per test)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness import BrokerProcess


@pytest.fixture(scope="package")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    # No initial rebalance delay: each registry's first election is at once.
    b = BrokerProcess(tmp_path_factory.mktemp("registry-broker") / "b1", group_initial_rebalance_delay_ms=0).start()
    try:
        yield b
    finally:
        b.stop()
