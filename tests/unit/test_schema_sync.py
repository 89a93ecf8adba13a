"""The schema sync's planning functions (mirror/schema_sync.py) and its topology keys: which
source subjects belong to a flow, what is registered, deleted and configured in the target
context, in which order, and the framed schema ids of records."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from cluster.client.registry import SchemaEntry
from mirror.schema_sync import (
    Delete,
    Register,
    SetConfig,
    Version,
    flow_subjects,
    framed_ids,
    plan,
    versions_from,
    with_references,
)
from topology import load
from topology.errors import TopologyError


def v(subject: str, version: int, schema_id: int, *, refs: tuple[tuple[str, str, int], ...] = (),
      deleted: bool = False) -> Version:
    return Version(subject, version, schema_id, "AVRO", f'"{subject}{version}"', refs, deleted)


class Rec(NamedTuple):
    key: bytes | None
    value: bytes | None


def test_subjects_of_the_flow_by_strategy() -> None:
    subjects = {"pageviews-value", "pageviews-key", "clicks-value", "pageviews-com.x.View", "other-value",
                ":.ctx:pageviews-value"}
    assert flow_subjects(subjects, ["pageviews"]) == {"pageviews-value", "pageviews-key"}
    assert flow_subjects(subjects, ["pageviews"], "TopicRecordNameStrategy") == {
        "pageviews-value", "pageviews-key", "pageviews-com.x.View"}
    assert flow_subjects(subjects, [], "RecordNameStrategy") == subjects - {":.ctx:pageviews-value"}


def test_new_versions_are_registered_references_first_with_their_ids() -> None:
    common = v("common", 1, 3)
    page1 = v("pageviews-value", 1, 4, refs=(("Common", "common", 1),))
    page2 = v("pageviews-value", 2, 9, refs=(("Common", "common", 1),))
    other = v("other-value", 1, 5)
    actions = plan([page2, other, page1, common], [], {"pageviews-value"})
    assert actions == [Register(common), Register(page1), Register(page2)]
    # What the target has already is not registered again.
    assert plan([common, page1, page2], [common, page1], {"pageviews-value"}) == [Register(page2)]


def test_soft_deletes_follow_and_hard_deletes_go_soft_then_permanent_referrers_first() -> None:
    common = v("common", 1, 3)
    page1 = v("pageviews-value", 1, 4, refs=(("Common", "common", 1),))
    page2 = v("pageviews-value", 2, 9)
    target = [common, page1, page2]
    # Soft delete of version 2 at the source.
    assert plan([common, page1, v("pageviews-value", 2, 9, deleted=True)], target, {"pageviews-value"}) == [
        Delete("pageviews-value", 2, permanent=False)]
    # Already soft deleted in the target: nothing more.
    assert plan([common, page1, v("pageviews-value", 2, 9, deleted=True)],
                [common, page1, v("pageviews-value", 2, 9, deleted=True)], {"pageviews-value"}) == []
    # Everything hard deleted at the source: the referrer goes before what it references.
    actions = plan([], target, {"pageviews-value"})
    soft = [a for a in actions if isinstance(a, Delete) and not a.permanent]
    hard = [a for a in actions if isinstance(a, Delete) and a.permanent]
    assert len(soft) == len(hard) == 3 and actions == soft + hard
    assert [a.subject for a in soft].index("pageviews-value") < [a.subject for a in soft].index("common")


def test_a_version_deleted_before_it_was_copied_is_copied_then_soft_deleted() -> None:
    gone = v("pageviews-value", 1, 4, deleted=True)
    assert plan([gone], [], {"pageviews-value"}) == [Register(gone), Delete("pageviews-value", 1, permanent=False)]


def test_compatibility_levels_follow_for_copied_subjects() -> None:
    page = v("pageviews-value", 1, 4)
    actions = plan([page], [page], {"pageviews-value"}, {"pageviews-value": "FULL"}, {"pageviews-value": None})
    assert actions == [SetConfig("pageviews-value", "FULL")]
    assert plan([page], [page], {"pageviews-value"}, {"pageviews-value": None}, {"pageviews-value": "FULL"}) == [
        SetConfig("pageviews-value", None)]
    assert plan([page], [page], {"pageviews-value"}, {"pageviews-value": "FULL"}, {"pageviews-value": "FULL"}) == []


def test_reference_closure_skips_what_the_source_lacks() -> None:
    a = v("a", 1, 1, refs=(("B", "b", 1), ("Z", "z", 1)))
    b = v("b", 1, 2)
    assert with_references([("a", 1)], {a.key: a, b.key: b}) == [b, a]


def test_versions_from_listings_mark_soft_deletes_and_strip_the_context() -> None:
    e1 = SchemaEntry(":.east:p-value", 1, 7, "AVRO", '"string"')
    e2 = SchemaEntry(":.east:p-value", 2, 8, "AVRO", '"int"')
    other = SchemaEntry(":.west:p-value", 1, 7, "AVRO", '"long"')
    got = versions_from([e1], [e1, e2, other], ".east")
    assert [(x.subject, x.version, x.schema_id, x.deleted) for x in got] == [("p-value", 1, 7, False),
                                                                              ("p-value", 2, 8, True)]
    plain = SchemaEntry("p-value", 1, 1, "AVRO", '"string"')
    assert [x.subject for x in versions_from([plain], [plain, e1])] == ["p-value"]


def test_framed_ids_of_keys_and_values() -> None:
    records = [Rec(None, b"\x00\x00\x00\x00\x07payload"), Rec(b"\x00\x00\x00\x01\x00k", b"\x00\x00\x00\x00\x07x"),
               Rec(b"plain", b"{}"), Rec(None, None), Rec(None, b"\x00\x01")]
    assert framed_ids(records) == {7, 256}


def _topology(tmp_path: Path, flow: str, *, west_registry: bool = True) -> Path:
    path = tmp_path / "t.toml"
    path.write_text(textwrap.dedent(f"""
        [clusters.east]
        datacenter = "east"
        brokers = ["127.0.0.1:19092"]
        [clusters.east.registry]
        listen = "127.0.0.1:18081"
        [clusters.aggregate]
        datacenter = "central"
        brokers = ["127.0.0.1:39092"]
        {'[clusters.aggregate.registry]' if west_registry else ''}
        {'listen = "127.0.0.1:38081"' if west_registry else ''}
        [[mirrors]]
        source = "east"
        target = "aggregate"
        topics = "p.*"
        """) + flow)
    return path


def test_topology_schema_keys(tmp_path: Path) -> None:
    (flow,) = load(_topology(tmp_path, "")).mirrors
    assert flow.schemas and flow.schema_context == ".east"
    (flow,) = load(_topology(tmp_path, 'schema_context = ".dc-east"\n')).mirrors
    assert flow.schema_context == ".dc-east"
    (flow,) = load(_topology(tmp_path, "schemas = false\n")).mirrors
    assert not flow.schemas
    (flow,) = load(_topology(tmp_path, "", west_registry=False)).mirrors
    assert not flow.schemas
    with pytest.raises(TopologyError, match="has no schema registry"):
        load(_topology(tmp_path, "schemas = true\n", west_registry=False))
    with pytest.raises(TopologyError, match="not a context name"):
        load(_topology(tmp_path, 'schema_context = "east"\n'))
    with pytest.raises(TopologyError, match="schema.subject.name.strategy"):
        load(_topology(tmp_path, 'config = { "schema.subject.name.strategy" = "Topic" }\n'))
    (flow,) = load(_topology(tmp_path, 'config = { "schema.sync.ms" = "1000" }\n')).mirrors
    assert flow.config["schema.sync.ms"] == "1000"


class FakeRegistry:
    """What SchemaSync asks of a registry, in memory: versions by (subject, version)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.versions: dict[tuple[str, int], SchemaEntry] = {}
        self.modes: dict[str, str] = {}
        self.calls: list[str] = []

    async def id_versions(self, schema_id: int, subject: str | None = None, *,
                          deleted: bool = False) -> list[tuple[str, int]]:
        from cluster.client.registry import RegistryClientError

        found = [k for k, e in self.versions.items() if e.schema_id == schema_id]
        if not found:
            raise RegistryClientError(404, 40403, f"Schema {schema_id} not found")
        return found

    async def version(self, subject: str, version: int | str = "latest", *, deleted: bool = False) -> SchemaEntry:
        return self.versions[(subject, int(version))]

    async def schemas(self, *, deleted: bool = False, prefix: str = "") -> list[SchemaEntry]:
        return [e for e in self.versions.values() if e.subject.startswith(prefix)]

    async def register(self, subject: str, text: str, schema_type: str = "AVRO", references: Any = (), *,
                       schema_id: int | None = None, version: int | None = None, normalize: bool = False) -> int:
        assert schema_id is not None and version is not None
        self.calls.append(f"register {subject} {version} {schema_id}")
        self.versions[(subject, version)] = SchemaEntry(subject, version, schema_id, schema_type, text,
                                                        tuple(references))
        return schema_id

    async def mode(self, subject: str | None = None) -> str:
        return self.modes.get(subject or "", "READWRITE")

    async def set_mode(self, mode: str, subject: str | None = None, *, force: bool = False) -> str:
        self.calls.append(f"mode {subject} {mode}")
        self.modes[subject or ""] = mode
        return mode


def test_the_gate_copies_unknown_ids_before_records_pass_and_lets_unframed_ids_through() -> None:
    import trio

    from mirror.schema_sync import SchemaSync

    source, target = FakeRegistry("http://east"), FakeRegistry("http://aggregate")
    source.versions[("common", 1)] = SchemaEntry("common", 1, 3, "AVRO", '"string"')
    source.versions[("com.x.Audit", 2)] = SchemaEntry("com.x.Audit", 2, 7, "AVRO", '"x"', (("C", "common", 1),))
    sync = SchemaSync(source, target, ".east", flow_name="east-to-aggregate")  # type: ignore[arg-type]

    async def main() -> None:
        await sync.admit([Rec(None, b"\x00\x00\x00\x00\x07a"), Rec(None, b"\x00\x00\x00\x01\x00b")])
        assert target.calls == ["mode :.east: IMPORT", "register :.east:common 1 3",
                                "register :.east:com.x.Audit 2 7"]
        calls = len(target.calls)
        await sync.admit([Rec(None, b"\x00\x00\x00\x00\x07c")] * 3)   # known now: no request
        assert len(target.calls) == calls

    trio.run(main)
    assert 7 in sync.known_ids and 256 in sync.unknown_ids
    st = sync.status()
    assert st["schemas_copied"] == 2 and st["ids_unknown_at_source"] == 1 and st["context"] == ".east"
    metrics = sync.prometheus({"flow": "east-to-aggregate"})
    assert metrics["dcmirror_mirror_schemas_copied_total"][2] == [({"flow": "east-to-aggregate",
                                                                     "context": ".east"}, 2.0)]


def test_basic_auth_credentials_of_a_flow_are_references(tmp_path: Path) -> None:
    key = "schema.target.basic.auth.user.info"
    (flow,) = load(_topology(tmp_path, f'config = {{ "{key}" = "${{env:AGG_REGISTRY_USER}}" }}\n')).mirrors
    assert flow.config[key] == "${env:AGG_REGISTRY_USER}"
    with pytest.raises(TopologyError, match="must be a reference"):
        load(_topology(tmp_path, f'config = {{ "{key}" = "alice:pw" }}\n'))
