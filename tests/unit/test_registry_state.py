"""The registry's state machine (cluster/registry/state.py) with a stand-in format: a
schema is a JSON object, its canonical form the sorted JSON, and a schema with
"breaks": true is incompatible with any earlier one. Every plan's records are applied
back, and a second state rebuilt from the same records must answer the same."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import pytest

from cluster.registry.formats import InvalidSchema, ParsedSchema, Reference
from cluster.registry.state import Record, RegistryError, RegistryState


def fake_parse(schema_type: str, text: str, referenced: Mapping[str, str] | None = None, *,
               normalize: bool = False, references: Sequence[Reference] = ()) -> ParsedSchema:
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise InvalidSchema(f"Invalid schema {text!r}: {exc}") from None
    if not isinstance(obj, dict):
        raise InvalidSchema("Invalid schema: not an object")
    for name in obj.get("uses", []):
        if name not in (referenced or {}):
            raise InvalidSchema(f"Invalid schema: unknown name {name}")
    canonical = json.dumps(obj, sort_keys=True)
    return ParsedSchema(schema_type, canonical if normalize else text, canonical, tuple(references), obj)


def fake_check(level: str, new: ParsedSchema, previous: Sequence[ParsedSchema]) -> list[str]:
    return ["breaks"] if new.parsed.get("breaks") and previous else []


class Registry:
    """The state plus the log its records would be in."""

    def __init__(self) -> None:
        self.state = RegistryState(parse=fake_parse, check=fake_check)
        self.log: list[Record] = []

    def write(self, planned: tuple[list[Record], object]) -> object:
        records, answer = planned
        for key, value in records:
            self.log.append((key, value))
            self.state.apply(key, value, len(self.log) - 1)
        return answer

    def rebuilt(self) -> RegistryState:
        state = RegistryState(parse=fake_parse, check=fake_check)
        for offset, (key, value) in enumerate(self.log):
            state.apply(key, value, offset)
        return state


def schema(n: int, **extra: object) -> str:
    return json.dumps({"n": n, **extra})


def error_of(fn: object, *args: object, **kwargs: object) -> tuple[int, int]:
    with pytest.raises(RegistryError) as info:
        fn(*args, **kwargs)  # type: ignore[operator]
    return info.value.http_status, info.value.error_code


def test_register_versions_and_ids() -> None:
    r = Registry()
    s = r.state
    assert r.write(s.plan_register("a", None, schema(1))) == 1
    assert r.write(s.plan_register("a", None, schema(2))) == 2
    # the same schema again: same id, nothing written
    records, answer = s.plan_register("a", None, schema(1))
    assert records == [] and answer == 1
    # the same schema (other key order) under another subject: same id, version 1 there
    assert r.write(s.plan_register("b", "AVRO", '{"n": 2}')) == 2
    assert s.versions("a") == [1, 2]
    assert s.version("b", "latest").schema_id == 2
    assert s.version("b", 1).version == 1
    assert s.subjects() == ["a", "b"]
    assert s.id_versions(2) == [("a", 2), ("b", 1)]
    assert s.schema_by_id(1).text == schema(1)
    key, value = r.log[0]
    assert json.loads(key) == {"keytype": "SCHEMA", "subject": "a", "version": 1, "magic": 1}
    assert value is not None
    assert json.loads(value) == {"subject": "a", "version": 1, "id": 1, "schema": schema(1),
                                 "references": [], "deleted": False}
    assert error_of(s.version, "zz", 1) == (404, 40401)
    assert error_of(s.version, "a", 9) == (404, 40402)
    assert error_of(s.version, "a", "x") == (422, 42202)
    assert error_of(s.version, "a", 0) == (422, 42202)
    assert error_of(s.schema_by_id, 99) == (404, 40403)
    assert error_of(s.plan_register, "a", None, "not json") == (422, 42201)
    assert error_of(s.plan_register, "a", "XML", schema(1)) == (422, 42201)
    assert s.lookup("b", "AVRO", schema(2)).version == 1
    assert error_of(s.lookup, "b", "AVRO", schema(7)) == (404, 40403)
    assert error_of(s.lookup, "nope", "AVRO", schema(7)) == (404, 40401)


def test_compatibility_and_config() -> None:
    r = Registry()
    s = r.state
    r.write(s.plan_register("a", None, schema(1)))
    assert error_of(s.plan_register, "a", None, schema(2, breaks=True)) == (409, 409)
    assert s.compatibility("a", "latest", "AVRO", schema(2, breaks=True))[:2] == ["breaks", "{oldSchemaVersion: 1}"]
    assert s.compatibility("a", None, "AVRO", schema(2)) == []
    assert s.config() == "BACKWARD"
    assert error_of(s.config, "a") == (404, 40408)
    assert s.config("a", default_to_global=True) == "BACKWARD"
    assert r.write(s.plan_config("none", "a")) == "NONE"
    assert s.config("a") == "NONE"
    assert r.write(s.plan_register("a", None, schema(2, breaks=True))) == 2
    assert error_of(s.plan_config, "SOMETIMES") == (422, 42203)
    assert r.write(s.plan_delete_config("a")) == "NONE"
    assert error_of(s.config, "a") == (404, 40408)
    r.write(s.plan_config("FULL"))
    assert s.config() == "FULL" and s.effective_config("a") == "FULL"
    assert r.write(s.plan_delete_config()) == "FULL"
    assert s.config() == "BACKWARD"


def test_modes_and_import() -> None:
    r = Registry()
    s = r.state
    assert s.mode() == "READWRITE"
    assert error_of(s.plan_register, "a", None, schema(1), schema_id=10) == (422, 42205)
    r.write(s.plan_mode("IMPORT"))
    assert r.write(s.plan_register("a", None, schema(1), schema_id=10, version=3)) == 10
    assert s.version("a", 3).schema_id == 10
    # another schema cannot take id 10
    assert error_of(s.plan_register, "b", None, schema(2), schema_id=10) == (422, 42205)
    r.write(s.plan_mode("READWRITE"))
    # ids go on after the largest one seen
    assert r.write(s.plan_register("b", None, schema(2))) == 11
    assert error_of(s.plan_mode, "IMPORT") == (422, 42205)      # subjects exist
    r.write(s.plan_mode("IMPORT", force=True))
    r.write(s.plan_mode("READONLY", "b"))
    assert s.mode("b") == "READONLY"
    assert error_of(s.plan_register, "b", None, schema(3)) == (422, 42205)
    assert error_of(s.plan_delete_subject, "b") == (422, 42205)
    assert error_of(s.plan_mode, "SLEEPY") == (422, 42204)
    r.write(s.plan_delete_mode("b"))
    assert error_of(s.mode, "b") == (404, 40409)
    assert s.mode("b", default_to_global=True) == "IMPORT"


def test_soft_and_hard_deletes() -> None:
    r = Registry()
    s = r.state
    for n in (1, 2, 3):
        r.write(s.plan_register("a", None, schema(n)))
    assert error_of(s.plan_delete_version, "a", 2, permanent=True) == (404, 40407)
    assert r.write(s.plan_delete_version("a", 2)) == 2
    assert error_of(s.plan_delete_version, "a", 2) == (404, 40406)
    assert s.versions("a") == [1, 3] and s.versions("a", deleted=True) == [1, 2, 3]
    assert error_of(s.version, "a", 2) == (404, 40402)
    assert s.version("a", 2, deleted=True).deleted
    assert s.schema_by_id(2).schema_id == 2          # ids still answer after a soft delete
    assert r.write(s.plan_delete_version("a", 2, permanent=True)) == 2
    assert s.versions("a", deleted=True) == [1, 3]
    assert error_of(s.schema_by_id, 2) == (404, 40403)
    assert error_of(s.plan_delete_subject, "a", permanent=True) == (404, 40405)
    assert r.write(s.plan_delete_subject("a")) == [1, 3]
    assert s.subjects() == [] and s.subjects(deleted=True) == ["a"]
    assert error_of(s.versions, "a") == (404, 40401)
    assert error_of(s.plan_delete_subject, "a") == (404, 40404)
    # registering again continues the version numbers; the id of schema 1 is reused
    assert r.write(s.plan_register("a", None, schema(1))) == 1
    assert s.versions("a") == [4]
    assert s.versions("a", deleted=True) == [3, 4]      # version 1 (the same id) tombstoned, as Confluent
    r.write(s.plan_delete_subject("a"))
    assert r.write(s.plan_delete_subject("a", permanent=True)) == [3, 4]
    assert s.subjects(deleted=True) == []
    assert error_of(s.schema_by_id, 1) == (404, 40403)
    # ids are never reused while the log holds their records' history
    assert r.write(s.plan_register("c", None, schema(9))) == 4


def test_references() -> None:
    r = Registry()
    s = r.state
    r.write(s.plan_register("base", None, schema(1)))
    ref = Reference("Base", "base", 1)
    assert error_of(s.plan_register, "user", None, schema(2, uses=["Base"])) == (422, 42201)
    assert error_of(s.plan_register, "user", None, schema(2, uses=["Base"]),
                    [Reference("Base", "base", 7)]) == (422, 42201)
    assert r.write(s.plan_register("user", None, schema(2, uses=["Base"]), [ref])) == 2
    assert s.referenced_by("base", 1) == [2]
    assert s.version("user", 1).body()["references"] == [{"name": "Base", "subject": "base", "version": 1}]
    assert error_of(s.plan_delete_version, "base", 1) == (422, 42206)
    assert error_of(s.plan_delete_subject, "base") == (422, 42206)
    r.write(s.plan_delete_subject("user"))
    assert s.referenced_by("base", 1) == []
    r.write(s.plan_delete_version("base", 1))


def test_contexts() -> None:
    r = Registry()
    s = r.state
    assert r.write(s.plan_register(":.east:orders", None, schema(5))) == 1
    assert r.write(s.plan_register(":.west:orders", None, schema(6))) == 1   # ids per context
    assert r.write(s.plan_register("orders", None, schema(5))) == 1
    assert r.write(s.plan_register(":.east:more", None, schema(6))) == 2
    assert s.contexts() == [".", ".east", ".west"]
    assert s.schema_by_id(1, subject=":.west:orders").text == schema(6)
    assert s.schema_by_id(1).text == schema(5)
    assert error_of(s.schema_by_id, 2) == (404, 40403)
    assert s.subjects(prefix=":.east:") == [":.east:more", ":.east:orders"]
    r.write(s.plan_config("NONE", ":.east:"))
    assert s.effective_config(":.east:orders") == "NONE"
    assert s.effective_config("orders") == "BACKWARD"


def test_rebuild_from_log_answers_the_same() -> None:
    r = Registry()
    s = r.state
    for subject in ("a", "b", ":.x:a"):
        for n in (1, 2, 3):
            r.write(s.plan_register(subject, None, schema(n)))
    r.write(s.plan_delete_version("a", 1))
    r.write(s.plan_delete_version("a", 1, permanent=True))
    r.write(s.plan_delete_subject("b"))
    r.write(s.plan_config("FULL", "a"))
    r.write(s.plan_mode("READONLY", "b"))
    again = r.rebuilt()
    for state in (s, again):
        assert state.subjects() == [":.x:a", "a"]
        assert state.subjects(deleted=True) == [":.x:a", "a", "b"]
        assert state.versions("a") == [2, 3]
        assert state.config("a") == "FULL" and state.mode("b") == "READONLY"
    assert again.plan_register("c", None, schema(4))[1] == 4
    assert again.records_skipped == 0 and again.applied_offset == len(r.log) - 1
    again.apply(b"not json", b"{}", len(r.log))
    again.apply(b'{"keytype":"WHATEVER"}', b"{}", len(r.log) + 1)
    assert again.records_skipped == 2


def compacted(log: list[Record]) -> list[Record]:
    """What a compacted `_schemas` keeps once tombstones expire: the last record of each
    key, tombstones dropped."""
    last: dict[bytes, int] = {}
    for offset, (key, _) in enumerate(log):
        last[key] = offset
    return [log[o] for o in sorted(last.values()) if log[o][1] is not None]


def test_ids_are_not_reused_after_compaction() -> None:
    r = Registry()
    s = r.state
    for n in (1, 2, 3):
        r.write(s.plan_register(f"s{n}", None, schema(n)))
    r.write(s.plan_register(":.x:t", None, schema(7)))
    r.write(s.plan_delete_subject("s3"))
    r.write(s.plan_delete_subject("s3", permanent=True))        # id 3, the largest, is gone
    r.write(s.plan_delete_version(":.x:t", 1))
    r.write(s.plan_delete_version(":.x:t", 1, permanent=True))  # id 1 of context .x too
    state = RegistryState(parse=fake_parse, check=fake_check)
    for offset, (key, value) in enumerate(compacted(r.log)):
        state.apply(key, value, offset)
    assert state.subjects(deleted=True) == ["s1", "s2"]
    assert state.records_skipped == 0
    assert state.plan_register("s4", None, schema(4))[1] == 4
    assert state.plan_register(":.x:u", None, schema(8))[1] == 2
    # a hard delete that leaves the largest id held elsewhere writes no NOOP record
    r.write(s.plan_register("s5", None, schema(1)))             # id 1 again, held by s1 too
    r.write(s.plan_delete_subject("s5"))
    records, _ = s.plan_delete_subject("s5", permanent=True)
    assert all(b'"NOOP"' not in key for key, _ in records)


def test_a_stale_primarys_records_after_a_newer_primarys_marker_are_fenced_alike_on_replay() -> None:
    """Fencing between primaries: a record tagged with an older generation than the newest
    primary_record before it in the log is skipped, on every instance and on every replay."""
    from cluster.registry.state import PRIMARY_HEADER, generation_of, primary_record

    assert generation_of(((PRIMARY_HEADER, b"7"),)) == 7
    assert generation_of((("x", b"1"),)) is None and generation_of(((PRIMARY_HEADER, b"?"),)) is None
    old = RegistryState(parse=fake_parse, check=fake_check)
    log: list[tuple[bytes | None, bytes | None, int | None]] = []
    for key, value in [primary_record(3, "http://a")]:
        log.append((key, value, 3))
    planned, _ = old.plan_register("s", "AVRO", schema(1), ())  # planned by A, generation 3
    for key, value in planned:
        log.append((key, value, 3))
        old.apply(key, value)
    log.append((*primary_record(5, "http://b"), 5))                 # B is elected and announces itself
    stale, _ = old.plan_register("s", "AVRO", schema(2), ())      # A, not knowing, writes again
    for key, value in stale:
        log.append((key, value, 3))
    for replay in range(2):
        state = RegistryState(parse=fake_parse, check=fake_check)
        for offset, (key, value, generation) in enumerate(log):
            state.apply(key, value, offset, generation)
        assert state.primary_generation == 5, replay
        assert state.versions("s") == [1], replay
        assert state.records_fenced == len(stale)
        assert [state.fenced(o) for o in range(len(log))] == [False] * (len(log) - len(stale)) + [True] * len(stale)
    untagged = RegistryState(parse=fake_parse, check=fake_check)
    for offset, (key, value, _) in enumerate(log):
        untagged.apply(key, value, offset)                           # records without the header: not fenced
    assert untagged.versions("s") == [1, 2]
