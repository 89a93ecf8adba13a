"""Schemas across datacenters (issue 33): flows copy the schemas their topics use into the
aggregate registry under a context per source, ids and versions preserved.

Three clusters of one broker (east, west, aggregate), each with its registry (`dcmirror
registry --config F --cluster C`), two flows into the aggregate, Avro produced with
confluent-kafka's AvroSerializer (auto-registration). East and west register different
schemas that both get id 1 in their own registry: both arrive, each resolvable in its own
context (the aggregate's registry takes basic auth only: the flows log in with a
`user:password` reference); a schema the rounds do not copy (a
RecordNameStrategy subject) is copied by the gate before the first record carrying it is
written; a new version, a soft and a hard delete and a compatibility level at the source follow.
Every wait is for a state, bounded."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import fastavro
import httpx
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from cluster.client.registry import RegistryAuth, RegistryClient
from cluster.common.secrets import Secret
from tests.harness import REPO, free_port
from tests.mirror.lab import Flow, MirrorLab, new_topic, read_topic, wait_for
from tests.registry.common import RegistryProcess

SYNC_MS = 1000
AGG_PASSWORD = "pw-5c2e91"
PAGEVIEW = ('{"type": "record", "name": "PageView", "namespace": "east", "fields": '
            '[{"name": "user", "type": "string"}, {"name": "page", "type": "string"}]}')
PAGEVIEW_V2 = ('{"type": "record", "name": "PageView", "namespace": "east", "fields": '
               '[{"name": "user", "type": "string"}, {"name": "page", "type": "string"}, '
               '{"name": "ms", "type": ["null", "long"], "default": null}]}')
CLICK = ('{"type": "record", "name": "Click", "namespace": "west", "fields": '
         '[{"name": "url", "type": "string"}, {"name": "n", "type": "int"}]}')
AUDIT = ('{"type": "record", "name": "Audit", "namespace": "com.example", "fields": '
         '[{"name": "who", "type": "string"}]}')


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MirrorLab, dict[str, RegistryProcess]]]:
    root = tmp_path_factory.mktemp("schema-sync")
    lab = MirrorLab(root, {"east": 1, "west": 1, "aggregate": 1}, group_initial_rebalance_delay_ms=0).start()
    registries: dict[str, RegistryProcess] = {}
    try:
        # The aggregate's registry takes basic auth only: the flows log in with a reference.
        (root / "registry-users.properties").write_text(f"mirror: {AGG_PASSWORD}\n")
        (root / "secrets.properties").write_text(f"aggregate.registry=mirror:{AGG_PASSWORD}\n")
        config = {"schema.sync.ms": str(SYNC_MS),
                  "schema.target.basic.auth.user.info": f"${{file:{root / 'secrets.properties'}:aggregate.registry}}"}
        path = lab.write_topology([Flow("east", "aggregate", "pageviews", config=config),
                                   Flow("west", "aggregate", "pageviews", config=config)])
        ports = {name: free_port() for name in lab.clusters}
        with path.open("a") as f:
            for name, port in ports.items():
                f.write(f'\n[clusters.{name}.registry]\nlisten = "127.0.0.1:{port}"\n')
                if name == "aggregate":
                    f.write('basic_auth_users = "registry-users.properties"\n')
        for name, port in ports.items():
            registries[name] = RegistryProcess(root / f"registry-{name}.log", config=(path, name), port=port).launch()
        for reg in registries.values():
            reg.wait_ready(60)
        for name in ("east", "west"):
            new_topic(lab.bootstrap(name), "pageviews", 1)
        lab.start_mirror()
        for flow in ("east-to-aggregate", "west-to-aggregate"):
            wait_for(lambda flow=flow: any((d.get("schema_sync") or {}).get("rounds")
                                           for d in lab.worker_status(flow).values()),
                     60, f"{flow}: a first schema sync round", on_timeout=lab.mirror_log_tail)
        yield lab, registries
    finally:
        for reg in registries.values():
            try:
                reg.stop()
            except Exception:  # noqa: BLE001 - teardown goes on
                pass
        lab.teardown()


def _produce(bootstrap: str, url: str, schema: str, rows: list[dict[str, Any]], *,
             strategy: Any = None) -> None:
    conf: dict[str, Any] = {"auto.register.schemas": True}
    if strategy is not None:
        conf["subject.name.strategy"] = strategy
    serializer = AvroSerializer(SchemaRegistryClient({"url": url}), schema, conf=conf)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    ctx = SerializationContext("pageviews", MessageField.VALUE)
    for row in rows:
        producer.produce("pageviews", value=serializer(row, ctx))
    assert producer.flush(30) == 0


def _get(url: str, path: str, **params: str) -> Any:
    r = httpx.get(url + path, params=params, timeout=10, auth=("mirror", AGG_PASSWORD))
    return r.json() if r.status_code == 200 else None


def _mirrored(lab: MirrorLab, topic: str, count: int) -> list[bytes]:
    def values() -> list[bytes] | None:
        try:
            rows = [r.value for rows in read_topic(lab.bootstrap("aggregate"), topic, timeout_s=20).values()
                    for r in rows if r.mirrored]
        except Exception:  # noqa: BLE001 - the target topic may not exist yet
            return None
        return rows if len(rows) >= count else None

    if count == 0:
        found = values()
        if found is None:
            raise AssertionError(f"aggregate {topic} not readable")
        return found
    return wait_for(values, 60, f"{count} records in aggregate {topic}", on_timeout=lab.mirror_log_tail)


def test_same_ids_in_two_sources_both_mirrored_in_their_contexts(lab: tuple[MirrorLab, dict[str, RegistryProcess]]
                                                                 ) -> None:
    lab_, reg = lab
    east, west, agg = reg["east"].url, reg["west"].url, reg["aggregate"].url
    began = time.monotonic()
    _produce(lab_.bootstrap("east"), east, PAGEVIEW, [{"user": f"u{i}", "page": f"/p{i}"} for i in range(5)])
    _produce(lab_.bootstrap("west"), west, CLICK, [{"url": f"/c{i}", "n": i} for i in range(5)])
    east_id = _get(east, "/subjects/pageviews-value/versions/1")["id"]
    west_id = _get(west, "/subjects/pageviews-value/versions/1")["id"]
    assert east_id == west_id == 1, "fresh registries: both schemas get id 1 in their own registry"
    seen = wait_for(lambda: _get(agg, "/schemas/ids/1", subject=":.east:_") and _get(
        agg, "/schemas/ids/1", subject=":.west:_"), 30, "both ids in the aggregate's contexts",
        interval_s=0.05, on_timeout=lab_.mirror_log_tail)
    print(f"schemas of two sources in the aggregate {time.monotonic() - began:.2f} s after producing "
          "(workers running)")
    assert "PageView" in seen["schema"] or "Click" in seen["schema"]
    assert "PageView" in _get(agg, "/schemas/ids/1", subject=":.east:_")["schema"]
    assert "Click" in _get(agg, "/schemas/ids/1", subject=":.west:_")["schema"]
    assert _get(agg, "/subjects/:.east:pageviews-value/versions/1")["id"] == 1
    assert _get(agg, "/mode/:.east:") == {"mode": "IMPORT"}
    # The records decode by their id in their own context, as a loader of the aggregate reads them.
    with RegistryClient(agg, auth=RegistryAuth(basic=Secret(f"mirror:{AGG_PASSWORD}"))) as client:
        for source, rows, field, first in (("east", 5, "user", "u0"), ("west", 5, "url", "/c0")):
            values = _mirrored(lab_, f"{source}.pageviews", rows)
            decoded = []
            for v in values:
                schema_type, text, _ = client.schema_by_id(int.from_bytes(v[1:5], "big"), f".{source}")
                parsed = fastavro.parse_schema(json.loads(text))
                decoded.append(fastavro.schemaless_reader(io.BytesIO(v[5:]), parsed))
            assert sorted(d[field] for d in decoded)[0] == first
    assert _get(agg, "/schemas/ids/1") is None, "nothing lands in the aggregate's own default context"


def test_a_record_is_never_readable_before_its_schema(lab: tuple[MirrorLab, dict[str, RegistryProcess]]) -> None:
    """RecordNameStrategy subjects are not the topic's: only the gate copies them, and it does
    so before the record is written."""
    from confluent_kafka.schema_registry import record_subject_name_strategy

    lab_, reg = lab
    east, agg = reg["east"].url, reg["aggregate"].url
    try:
        before = len(_mirrored(lab_, "east.pageviews", 0))
    except AssertionError:
        before = 0  # run alone: nothing mirrored yet
    began = time.monotonic()
    _produce(lab_.bootstrap("east"), east, AUDIT, [{"who": "alice"}], strategy=record_subject_name_strategy)
    audit_id = _get(east, "/subjects/com.example.Audit/versions/1")["id"]
    values = _mirrored(lab_, "east.pageviews", before + 1)
    # The moment the record is readable, its schema already resolves in the east context.
    assert _get(agg, f"/schemas/ids/{audit_id}", subject=":.east:_") is not None
    print(f"gate: produced to readable in the aggregate with its schema {time.monotonic() - began:.2f} s")
    assert int.from_bytes(values[-1][1:5], "big") == audit_id
    assert _get(agg, "/subjects/:.east:com.example.Audit/versions/1")["id"] == audit_id


def test_new_version_soft_delete_and_compatibility_follow(lab: tuple[MirrorLab, dict[str, RegistryProcess]]) -> None:
    lab_, reg = lab
    east, agg = reg["east"].url, reg["aggregate"].url
    sr = SchemaRegistryClient({"url": east})
    sr.register_schema("pageviews-value", Schema(PAGEVIEW, "AVRO"))  # what the first test registered
    wait_for(lambda: _get(agg, "/subjects/:.east:pageviews-value/versions") == [1], 30, "version 1 copied")
    began = time.monotonic()
    new_id = sr.register_schema("pageviews-value", Schema(PAGEVIEW_V2, "AVRO"))
    wait_for(lambda: _get(agg, "/subjects/:.east:pageviews-value/versions") == [1, 2], 30,
             "version 2 copied", interval_s=0.05, on_timeout=lab_.mirror_log_tail)
    print(f"new version at the source to the aggregate: {time.monotonic() - began:.2f} s "
          f"(schema.sync.ms {SYNC_MS})")
    assert _get(agg, "/subjects/:.east:pageviews-value/versions/2")["id"] == new_id
    sr.set_compatibility("pageviews-value", "FULL")
    sr.delete_version("pageviews-value", 2)
    wait_for(lambda: _get(agg, "/subjects/:.east:pageviews-value/versions") == [1], 30,
             "the soft delete followed", on_timeout=lab_.mirror_log_tail)
    assert _get(agg, "/subjects/:.east:pageviews-value/versions", deleted="true") == [1, 2]
    sr.delete_version("pageviews-value", 2, permanent=True)
    wait_for(lambda: _get(agg, "/subjects/:.east:pageviews-value/versions", deleted="true") == [1], 30,
             "the hard delete followed", on_timeout=lab_.mirror_log_tail)
    wait_for(lambda: _get(agg, "/config/:.east:pageviews-value") == {"compatibilityLevel": "FULL"}, 30,
             "the compatibility level followed")
    status = wait_for(lambda: [d["schema_sync"] for d in lab_.worker_status("east-to-aggregate").values()
                               if d.get("schema_sync") and d["schema_sync"]["deletes_followed"] >= 1], 30,
                      "the worker's status shows the sync")
    assert status[0]["schemas_copied"] >= 2 and status[0]["context"] == ".east"
    assert status[0]["last_sync_ms"] is not None
    # `dcmirror mirror status` (files: the lab's flows declare no admin HTTP) and `dcmirror status`.
    (flow,) = [f for f in lab_.status() if f["flow"] == "east-to-aggregate"]
    assert flow["schema_sync"]["context"] == ".east" and flow["schema_sync"]["deletes_followed"] >= 1
    for args in (["mirror", "status"], ["status"]):
        shown = subprocess.run([sys.executable, "-m", "deploy.cli", *args, "--config", str(lab_.topology_path)],
                               cwd=REPO, capture_output=True, text=True, timeout=60)
        assert "context .east" in shown.stdout or ".east " in shown.stdout, shown.stdout + shown.stderr
        print(shown.stdout)
    assert AGG_PASSWORD not in lab_.mirror_log()
