"""cluster/registry/formats.py: parsing, canonical forms and compatibility of Avro, JSON
Schema and Protobuf schemas, on a corpus of schema pairs (sans-IO, fast)."""

from __future__ import annotations

import json

import pytest

from cluster.registry import formats as F


def avro(text: object, **kw: object) -> F.ParsedSchema:
    return F.parse(F.AVRO, text if isinstance(text, str) else json.dumps(text), **kw)  # type: ignore[arg-type]


def record(*fields: dict, name: str = "User", **extra: object) -> dict:
    return {"type": "record", "name": name, "fields": list(fields), **extra}


# --- Avro: parsing and canonical forms ----------------------------------------------------

def test_avro_canonical_ignores_whitespace_key_order_and_namespace_spelling() -> None:
    a = avro('{"type": "record", "name": "com.acme.User",\n "fields": [{"name": "id", "type": "long"}]}')
    b = avro('{"fields":[{"type":"long","name":"id"}],"namespace":"com.acme","name":"User","type":"record"}')
    c = avro(record({"name": "id", "type": {"type": "long"}}, name="User", namespace="com.acme"))
    assert a.canonical == b.canonical == c.canonical
    assert a.canonical == ('{"type":"record","name":"User","namespace":"com.acme",'
                           '"fields":[{"name":"id","type":"long"}]}')
    assert a.text != b.text  # what was registered is kept as it was


def test_avro_canonical_keeps_docs_and_properties_so_they_make_a_new_schema() -> None:
    plain = avro(record({"name": "id", "type": "long"}))
    with_doc = avro(record({"name": "id", "type": "long", "doc": "the id"}))
    with_prop = avro(record({"name": "id", "type": "long"}, owner="team-a"))
    assert len({plain.canonical, with_doc.canonical, with_prop.canonical}) == 3


def test_avro_primitive_schemas() -> None:
    assert avro('"string"').canonical == '"string"'
    assert avro('{"type": "string"}').canonical == '"string"'
    assert avro('{"type":"int","logicalType":"date"}').canonical == '{"type":"int","logicalType":"date"}'


def test_avro_normalized_form_uses_full_names_and_sorts_properties() -> None:
    a = avro(record({"name": "id", "type": "long"}, {"name": "next", "type": ["null", "User"], "default": None},
                    name="User", namespace="com.acme", zz=1, aa=2), normalize=True)
    b = avro(record({"name": "id", "type": "long"}, {"name": "next", "type": ["null", "com.acme.User"], "default": None},
                    name="com.acme.User", aa=2, zz=1), normalize=True)
    assert a.canonical == b.canonical
    assert a.canonical == ('{"name":"com.acme.User","type":"record","fields":[{"name":"id","type":"long"},'
                           '{"name":"next","type":["null","com.acme.User"],"default":null}],"aa":2,"zz":1}')
    # without normalize the property order is kept, as Confluent's canonicalString does
    assert avro(record({"name": "id", "type": "long"}, zz=1, aa=2)).canonical != \
        avro(record({"name": "id", "type": "long"}, aa=2, zz=1)).canonical
    # the normalized form is itself a valid schema with the same normalized form
    assert avro(a.canonical, normalize=True).canonical == a.canonical


def test_avro_normalized_decimal_and_aliases() -> None:
    s = avro({"type": "record", "name": "n.R", "aliases": ["Old", "a.B"],
              "fields": [{"name": "amount", "aliases": ["z", "b"],
                          "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}}]},
             normalize=True)
    assert s.canonical == ('{"name":"n.R","type":"record","fields":[{"name":"amount","type":{"type":"bytes",'
                           '"logicalType":"decimal","precision":9,"scale":2},"aliases":["b","z"]}],'
                           '"aliases":["a.B","n.Old"]}')


def test_avro_references_are_resolved_and_not_inlined() -> None:
    address = json.dumps(record({"name": "street", "type": "string"}, name="com.acme.Address"))
    user = json.dumps(record({"name": "home", "type": "com.acme.Address"}, name="com.acme.User"))
    refs = [F.Reference("com.acme.Address", "address-value", 1)]
    parsed = F.parse(F.AVRO, user, {"com.acme.Address": address}, references=refs)
    assert parsed.references == tuple(refs)
    assert parsed.canonical == ('{"type":"record","name":"User","namespace":"com.acme",'
                                '"fields":[{"name":"home","type":"Address"}]}')
    assert F.parse(F.AVRO, user, {"com.acme.Address": address}, normalize=True).canonical == \
        '{"name":"com.acme.User","type":"record","fields":[{"name":"home","type":"com.acme.Address"}]}'
    with pytest.raises(F.InvalidSchema, match="Address"):
        F.parse(F.AVRO, user)


def test_avro_references_of_references_in_any_order() -> None:
    street = json.dumps({"type": "enum", "name": "k.Kind", "symbols": ["ROAD", "LANE"]})
    address = json.dumps(record({"name": "kind", "type": "k.Kind"}, name="k.Address"))
    user = json.dumps(record({"name": "home", "type": "k.Address"}, name="k.User"))
    parsed = F.parse(F.AVRO, user, {"k.Address": address, "k.Kind": street})
    assert "Kind" not in parsed.canonical
    with pytest.raises(F.InvalidSchema, match="reference 'bad'"):
        F.parse(F.AVRO, user, {"k.Address": address, "k.Kind": street, "bad": "{"})


@pytest.mark.parametrize("text, why", [
    ("", "not valid JSON"),
    ("{", "not valid JSON"),
    ('{"type": "record", "name": "R", "fields": [{"name": "a", "type": "int", "default": "x"}]}',
     "Invalid default for field a"),
    ('{"type": "record", "name": "R", "fields": [{"name": "a", "type": ["null", "int"], "default": "x"}]}',
     "Invalid default for field a"),
    ('{"type": "record", "name": "R", "fields": [{"name": "a", "type": "int", "default": 3000000000}]}',
     "Invalid default"),
    ('{"type": "record", "name": "R", "fields": [{"name": "a", "type": {"type": "array", "items": "int"},'
     ' "default": [1, "2"]}]}', "Invalid default"),
    ('{"type": "enum", "name": "E", "symbols": ["A"], "default": "B"}', "Enum default .B."),
    ('{"type": "record", "name": "R", "fields": [{"name": "a", "type": "Nope"}]}', "Nope"),
    ('{"type": "record", "name": "1R", "fields": []}', "1R"),
    ('{"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}, {"name": "a", "type": "int"}]}',
     "already in use"),
    ('["int", "int"]', "already in Union"),
    ('["null", ["int"]]', "Unions cannot contain other unions"),
    ('{"type": "enum", "name": "E", "symbols": ["A", "A"]}', "Duplicate symbol"),
    ('{"type": "fixed", "name": "F"}', "size"),
    ('{"type": "strin"}', "strin"),
    ("42", "Invalid AVRO schema"),
])
def test_avro_invalid_schemas(text: str, why: str) -> None:
    with pytest.raises(F.InvalidSchema, match=why):
        avro(text)


def test_avro_valid_defaults() -> None:
    avro(record({"name": "a", "type": ["null", "int"], "default": None},
                {"name": "b", "type": ["int", "null"], "default": 1},
                {"name": "c", "type": "double", "default": 1},
                {"name": "d", "type": {"type": "map", "values": "long"}, "default": {"x": 1}},
                {"name": "e", "type": record({"name": "x", "type": "int", "default": 0}, name="Inner"),
                 "default": {}},
                {"name": "f", "type": {"type": "fixed", "name": "F", "size": 2}, "default": "ab"}))


def test_unknown_schema_type() -> None:
    with pytest.raises(F.InvalidSchema, match="Invalid schema type 'XML'"):
        F.parse("XML", "<a/>")
