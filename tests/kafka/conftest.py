"""Fixtures that start Apache Kafka (tests/peers/kafka.py) beside dcmirror: one Kafka per
test module (a JVM start costs seconds on two cores), torn down with the module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness import BrokerProcess
from tests.peers.kafka import KafkaCluster


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """One real Kafka broker (KRaft, combined) for the module."""
    cluster = KafkaCluster(tmp_path_factory.mktemp("kafka") / "kafka", size=1).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def dcmirror_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One dcmirror broker for the module."""
    proc = BrokerProcess(tmp_path_factory.mktemp("dcmirror") / "broker").start()
    yield proc
    proc.stop()
