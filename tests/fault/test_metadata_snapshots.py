"""The metadata log folds into snapshots of the image; restarts and lagging nodes load them."""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from tests.harness import BrokerProcess, ClusterProcesses

SNAPSHOT_BYTES = 2048


def create_topics(bootstrap: str, names: list[str], rf: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(n, 2, rf) for n in names], operation_timeout=30).values():
        future.result(60)


def topic_names(bootstrap: str) -> set[str]:
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30)
    return {t for t in md.topics if not t.startswith("__")}


def test_standalone_restart_loads_the_snapshot(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "b", metadata_log_max_record_bytes_between_snapshots=SNAPSHOT_BYTES).start()
    # (underscores become dots: metadata.log.max.record.bytes.between.snapshots)
    try:
        names = [f"topic-{i:02d}" for i in range(25)]
        create_topics(broker.bootstrap, names)
        assert topic_names(broker.bootstrap) == set(names)
        snapshot = broker.data_dir / "__cluster_metadata-0" / "metadata.snapshot"
        assert snapshot.exists(), broker.log_text()[-3000:]
        assert "metadata snapshot at offset" in broker.log_text()
        mark = len(broker.log_text())
        broker.restart()
        assert "loaded the metadata snapshot at offset" in broker.log_text()[mark:]
        assert topic_names(broker.bootstrap) == set(names)
        # The partitions are still there and writable after the restart.
        create_topics(broker.bootstrap, ["after-restart"])
        assert topic_names(broker.bootstrap) == {*names, "after-restart"}
    finally:
        broker.stop()


def test_lagging_node_catches_up_from_the_leaders_snapshot(cluster_factory: object) -> None:
    cluster: ClusterProcesses = cluster_factory(  # type: ignore[operator]
        3, metadata_log_max_record_bytes_between_snapshots=SNAPSHOT_BYTES)
    lagging = 3
    cluster[lagging].stop()
    names = [f"while-away-{i:02d}" for i in range(25)]
    create_topics(cluster.bootstrap_of(1, 2), names, rf=2)
    mark = len(cluster[lagging].log_text())
    cluster[lagging].start()
    text = cluster[lagging].log_text()[mark:]
    assert "loaded the metadata snapshot at offset" in text, text[-3000:]
    deadline = time.monotonic() + 30
    while topic_names(cluster[lagging].bootstrap) != set(names) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert topic_names(cluster[lagging].bootstrap) == set(names)
    # It registered again: every node lists three brokers. (The topics created while it was
    # fenced were assigned to the two live brokers, so it hosts none of them.)
    md = AdminClient({"bootstrap.servers": cluster[lagging].bootstrap}).list_topics(timeout=30)
    assert sorted(md.brokers) == [1, 2, 3]
    assert not any(p.name.startswith("while-away") for p in cluster[lagging].data_dir.iterdir())
