from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import BrokerProcess, ClusterProcesses


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A fresh standalone broker on a free loopback port."""
    proc = BrokerProcess(tmp_path / "broker").start()
    yield proc
    proc.stop()


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[object]:
    """Start brokers with config overrides: broker_factory(**{"log.retention.ms": 1000})."""
    started: list[BrokerProcess] = []

    def make(name: str = "broker", **overrides: object) -> BrokerProcess:
        proc = BrokerProcess(tmp_path / name, **overrides)
        started.append(proc)
        return proc.start()

    yield make
    for proc in started:
        if proc.alive():
            proc.stop()


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[object]:
    """Start topology clusters: cluster_factory(3, **{"broker.session.timeout.ms": 2000})."""
    started: list[ClusterProcesses] = []

    def make(size: int = 3, name: str = "east", controllers: int = 0, **config: object) -> ClusterProcesses:
        cluster = ClusterProcesses(tmp_path / f"cluster-{name}", size, name=name, controllers=controllers, **config)
        started.append(cluster)
        return cluster.start()

    yield make
    for cluster in started:
        cluster.stop()
