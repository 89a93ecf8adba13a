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


# --- Avro: compatibility corpus ------------------------------------------------------------
#
# (change, old, new, backward, forward): backward = the new schema reads the old one's data,
# forward = the old schema reads the new one's data; FULL is both, NONE always passes.

def fields(*fs: dict, name: str = "User") -> dict:
    return record(*fs, name=name)


ID = {"name": "id", "type": "long"}
ENUM_ABC = {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN", "BLUE"]}
LIST = {"type": "record", "name": "Node", "fields": [
    {"name": "value", "type": "int"}, {"name": "next", "type": ["null", "Node"], "default": None}]}

AVRO_CORPUS = [
    ("field added with a default", fields(ID), fields(ID, {"name": "n", "type": "string", "default": ""}),
     True, True),
    ("field added without a default", fields(ID), fields(ID, {"name": "n", "type": "string"}), False, True),
    ("field with a default removed", fields(ID, {"name": "n", "type": "string", "default": ""}), fields(ID),
     True, True),
    ("field without a default removed", fields(ID, {"name": "n", "type": "string"}), fields(ID), True, False),
    ("optional field added", fields(ID), fields(ID, {"name": "n", "type": ["null", "string"], "default": None}),
     True, True),
    ("int widened to long", fields({"name": "id", "type": "int"}), fields(ID), True, False),
    ("long narrowed to int", fields(ID), fields({"name": "id", "type": "int"}), False, True),
    ("int widened to double", fields({"name": "id", "type": "int"}), fields({"name": "id", "type": "double"}),
     True, False),
    ("float widened to double", fields({"name": "x", "type": "float"}), fields({"name": "x", "type": "double"}),
     True, False),
    ("long widened to float", fields({"name": "x", "type": "long"}), fields({"name": "x", "type": "float"}),
     True, False),
    ("string to bytes", fields({"name": "x", "type": "string"}), fields({"name": "x", "type": "bytes"}),
     True, True),
    ("int to string", fields({"name": "x", "type": "int"}), fields({"name": "x", "type": "string"}),
     False, False),
    ("boolean to int", fields({"name": "x", "type": "boolean"}), fields({"name": "x", "type": "int"}),
     False, False),
    ("enum symbol added", fields({"name": "c", "type": {**ENUM_ABC, "symbols": ["RED", "GREEN"]}}),
     fields({"name": "c", "type": ENUM_ABC}), True, False),
    ("enum symbol added, old enum has a default", fields({"name": "c", "type": {
        **ENUM_ABC, "symbols": ["RED", "GREEN"], "default": "RED"}}),
     fields({"name": "c", "type": ENUM_ABC}), True, True),
    ("enum symbol removed", fields({"name": "c", "type": ENUM_ABC}),
     fields({"name": "c", "type": {**ENUM_ABC, "symbols": ["RED", "GREEN"]}}), False, True),
    ("enum renamed", fields({"name": "c", "type": ENUM_ABC}),
     fields({"name": "c", "type": {**ENUM_ABC, "name": "Colour"}}), False, False),
    ("int made nullable", fields({"name": "x", "type": "int"}), fields({"name": "x", "type": ["null", "int"]}),
     True, False),
    ("nullable made required", fields({"name": "x", "type": ["null", "string"]}),
     fields({"name": "x", "type": "string"}), False, True),
    ("union branch added", fields({"name": "x", "type": ["null", "int"]}),
     fields({"name": "x", "type": ["null", "int", "string"]}), True, False),
    ("union branches reordered", fields({"name": "x", "type": ["null", "int"], "default": None}),
     fields({"name": "x", "type": ["int", "null"], "default": 0}), True, True),
    ("union branch widened", fields({"name": "x", "type": ["null", "int"]}),
     fields({"name": "x", "type": ["null", "long"]}), True, False),
    ("record renamed", fields(ID, name="User"), fields(ID, name="Person"), False, False),
    ("record renamed, new one aliases the old name", fields(ID, name="User"),
     {**fields(ID, name="Person"), "aliases": ["User"]}, True, False),
    ("namespace added (Avro Java compares unqualified names)", fields(ID, name="User"),
     fields(ID, name="com.acme.User"), True, True),
    ("field renamed, new one aliases the old name", fields({"name": "a", "type": "int"}),
     fields({"name": "b", "type": "int", "aliases": ["a"]}), True, False),
    ("fixed resized", fields({"name": "h", "type": {"type": "fixed", "name": "Hash", "size": 16}}),
     fields({"name": "h", "type": {"type": "fixed", "name": "Hash", "size": 32}}), False, False),
    ("array items widened", fields({"name": "xs", "type": {"type": "array", "items": "int"}}),
     fields({"name": "xs", "type": {"type": "array", "items": "long"}}), True, False),
    ("map values changed", fields({"name": "m", "type": {"type": "map", "values": "string"}}),
     fields({"name": "m", "type": {"type": "map", "values": "int"}}), False, False),
    ("array to map", fields({"name": "m", "type": {"type": "array", "items": "string"}}),
     fields({"name": "m", "type": {"type": "map", "values": "string"}}), False, False),
    ("nested record field added without a default",
     fields({"name": "home", "type": record({"name": "street", "type": "string"}, name="Address")}),
     fields({"name": "home", "type": record({"name": "street", "type": "string"},
                                             {"name": "zip", "type": "string"}, name="Address")}), False, True),
    ("recursive record: optional field added", LIST,
     {**LIST, "fields": [*LIST["fields"], {"name": "label", "type": ["null", "string"], "default": None}]},
     True, True),
    ("recursive record: value widened", LIST,
     {**LIST, "fields": [{"name": "value", "type": "long"}, LIST["fields"][1]]}, True, False),
    ("doc and custom property changed", fields(ID), {**fields({**ID, "doc": "key"}), "owner": "x"}, True, True),
    ("primitive to record", '"string"', fields(ID), False, False),
    ("primitive widened", '"int"', '{"type": "long"}', True, False),
    ("same schema", fields(ID, {"name": "c", "type": ENUM_ABC}), fields(ID, {"name": "c", "type": ENUM_ABC}),
     True, True),
]


def expected(level: str, backward: bool, forward: bool) -> bool:
    return {"NONE": True, "BACKWARD": backward, "FORWARD": forward,
            "FULL": backward and forward}[level.removesuffix("_TRANSITIVE")]


def assert_levels(new: F.ParsedSchema, old: F.ParsedSchema, backward: bool, forward: bool) -> None:
    for level in F.COMPATIBILITY_LEVELS:
        messages = F.check(level, new, [old])
        assert (messages == []) == expected(level, backward, forward), (level, messages)


@pytest.mark.parametrize("change, old, new, backward, forward", AVRO_CORPUS,
                         ids=[c[0] for c in AVRO_CORPUS])
def test_avro_compatibility_corpus(change: str, old: object, new: object, backward: bool,
                                   forward: bool) -> None:
    assert_levels(avro(new), avro(old), backward, forward)


def test_avro_messages_are_confluents() -> None:
    v1 = avro(fields(ID))
    v2 = avro(fields(ID, {"name": "x", "type": "string"}))
    assert F.check("BACKWARD", v2, [v1]) == [
        "{errorType:'READER_FIELD_MISSING_DEFAULT_VALUE', description:'The field 'x' at path '/fields/1' "
        "in the new schema has no default value and is missing in the old schema', additionalInfo:'x'}"]
    assert F.check("FORWARD", v1, [v2]) == [
        "{errorType:'READER_FIELD_MISSING_DEFAULT_VALUE', description:'The field 'x' at path '/fields/1' "
        "in the old schema has no default value and is missing in the new schema', additionalInfo:'x'}"]
    v3 = avro(fields({"name": "id", "type": "string"}))
    assert F.check("BACKWARD", v3, [v1]) == [
        "{errorType:'TYPE_MISMATCH', description:'The type (path '/fields/0/type') of a field in the new "
        "schema does not match with the old schema', additionalInfo:'reader type: STRING not compatible "
        "with writer type: LONG'}"]
    e1 = avro(fields({"name": "c", "type": ENUM_ABC}))
    e2 = avro(fields({"name": "c", "type": {**ENUM_ABC, "symbols": ["RED"]}}))
    assert F.check("BACKWARD", e2, [e1]) == [
        "{errorType:'MISSING_ENUM_SYMBOLS', description:'The new schema is missing enum symbols "
        "'[BLUE, GREEN]' at path '/fields/0/type/symbols' in the old schema', additionalInfo:'[BLUE, GREEN]'}"]
    u1 = avro(fields({"name": "x", "type": ["null", "int", "string"]}))
    u2 = avro(fields({"name": "x", "type": ["null", "int"]}))
    assert F.check("BACKWARD", u2, [u1]) == [
        "{errorType:'MISSING_UNION_BRANCH', description:'The new schema is missing a type inside a union "
        "field at path '/fields/0/type/2' in the old schema', additionalInfo:'reader union lacking writer "
        "type: STRING'}"]
    n1, n2 = avro(fields(ID, name="A")), avro(fields(ID, name="B"))
    assert F.check("BACKWARD", n2, [n1]) == [
        "{errorType:'NAME_MISMATCH', description:'The name of the schema has changed (path '/name')', "
        "additionalInfo:'expected: A'}"]
    f1 = avro({"type": "fixed", "name": "F", "size": 4})
    f2 = avro({"type": "fixed", "name": "F", "size": 8})
    assert F.check("BACKWARD", f2, [f1]) == [
        "{errorType:'FIXED_SIZE_MISMATCH', description:'The size of FIXED type field at path '/size' in the "
        "new schema does not match with the old schema', additionalInfo:'expected: 4, found: 8'}"]


def test_avro_full_reports_both_directions() -> None:
    v1 = avro(fields({"name": "a", "type": "int"}))
    v2 = avro(fields({"name": "b", "type": "int"}))
    messages = F.check("FULL", v2, [v1])
    assert len(messages) == 2
    assert "'a'" in messages[0] and "in the old schema has no default" in messages[0]
    assert "'b'" in messages[1] and "in the new schema has no default" in messages[1]


def test_avro_transitive_levels_check_every_version() -> None:
    v1 = avro(fields(ID))
    v2 = avro(fields(ID, {"name": "n", "type": "string", "default": "x"}))
    v3 = avro(fields(ID, {"name": "n", "type": "string"}))
    assert F.check("BACKWARD", v3, [v1, v2]) == []
    assert F.check("BACKWARD_TRANSITIVE", v3, [v1, v2]) != []
    w1 = avro(fields({"name": "a", "type": "int"}))
    w2 = avro(fields({"name": "a", "type": "int", "default": 0}))
    w3 = avro(fields(ID))
    assert F.check("FORWARD", w3, [w1, w2]) == []
    assert F.check("FORWARD_TRANSITIVE", w3, [w1, w2]) != []
    assert F.check("FULL_TRANSITIVE", w3, [w1, w2]) != []
    assert F.check("NONE", w3, [w1, w2]) == []
    assert F.check("BACKWARD", w3, []) == []


def test_avro_checks_types_from_references() -> None:
    a1 = json.dumps(record({"name": "street", "type": "string"}, name="k.Address"))
    a2 = json.dumps(record({"name": "street", "type": "string"}, {"name": "zip", "type": "string"},
                           name="k.Address"))
    user = json.dumps(record({"name": "home", "type": "k.Address"}, name="k.User"))
    old = F.parse(F.AVRO, user, {"k.Address": a1})
    new = F.parse(F.AVRO, user, {"k.Address": a2})
    assert old.canonical == new.canonical  # same text, same references by name...
    assert "zip" in F.check("BACKWARD", new, [old])[0]  # ...but the referenced type changed


def test_different_schema_types_are_incompatible() -> None:
    class Fake:  # a ParsedSchema of another type, whatever its content
        pass
    other = F.ParsedSchema(F.JSON, "{}", "{}", parsed=Fake())
    assert F.check("BACKWARD", avro(fields(ID)), [other]) == ["Incompatible because of different schema type"]
    assert F.check("NONE", avro(fields(ID)), [other]) == []


# --- JSON Schema ----------------------------------------------------------------------------

def js(schema: object, **kw: object) -> F.ParsedSchema:
    return F.parse(F.JSON, schema if isinstance(schema, str) else json.dumps(schema), **kw)  # type: ignore[arg-type]


def obj(closed: bool = False, required: tuple[str, ...] = (), **properties: object) -> dict:
    out: dict = {"type": "object", "properties": properties}
    if required:
        out["required"] = list(required)
    if closed:
        out["additionalProperties"] = False
    return out


def test_json_canonical_forms() -> None:
    a = js('{"type": "object",\n  "properties": {"a": {"type": "string"}}}')
    b = js('{"type":"object","properties":{"a":{"type":"string"}}}')
    c = js('{"properties":{"a":{"type":"string"}},"type":"object"}')
    assert a.canonical == b.canonical == '{"type":"object","properties":{"a":{"type":"string"}}}'
    assert c.canonical != a.canonical  # Confluent keeps key order unless normalizing
    assert js(c.text, normalize=True).canonical == js(a.text, normalize=True).canonical == \
        '{"properties":{"a":{"type":"string"}},"type":"object"}'
    assert js("true").canonical == "true"


def test_json_references() -> None:
    address = json.dumps(obj(street={"type": "string"}))
    user = json.dumps(obj(home={"$ref": "address.json"}, zip={"$ref": "address.json#/properties/street"}))
    parsed = F.parse(F.JSON, user, {"address.json": address},
                     references=[F.Reference("address.json", "address", 1)])
    assert parsed.parsed.referenced["address.json"]["properties"]["street"] == {"type": "string"}
    with pytest.raises(F.InvalidSchema, match="'address.json' is not one of the schema's references"):
        F.parse(F.JSON, user)
    # a change in the referenced schema is seen by the check
    address2 = json.dumps(obj(street={"type": "integer"}))
    new = F.parse(F.JSON, user, {"address.json": address2})
    assert F.check("BACKWARD", new, [parsed]) != []
    assert F.check("BACKWARD", F.parse(F.JSON, user, {"address.json": address}), [parsed]) == []


@pytest.mark.parametrize("text, why", [
    ("{", "not valid JSON"),
    ("42", "an object or a boolean"),
    ('{"type": "strin"}', r"at \$.type"),
    ('{"type": "object", "properties": {"a": {"minLength": -1}}}', "minLength"),
    ('{"$schema": "http://example.com/my-draft", "type": "string"}', "unknown \\$schema"),
    ('{"properties": {"a": {"$ref": "#/definitions/missing"}}}', "does not resolve: no 'definitions'"),
    ('{"definitions": {}, "properties": {"a": {"$ref": "#/definitions/missing"}}}', "no 'missing'"),
    ('{"properties": {"a": {"$ref": "other.json"}}}', "not one of the schema's references"),
])
def test_json_invalid_schemas(text: str, why: str) -> None:
    with pytest.raises(F.InvalidSchema, match=why):
        js(text)


def test_json_drafts() -> None:
    js({"$schema": "https://json-schema.org/draft/2020-12/schema", "$defs": {"a": {"type": "string"}},
        "properties": {"x": {"$ref": "#/$defs/a"}}})
    js({"$schema": "http://json-schema.org/draft-04/schema#", "type": "object"})
    with pytest.raises(F.InvalidSchema):  # draft 4's exclusiveMinimum is a boolean
        js({"$schema": "http://json-schema.org/draft-04/schema#", "type": "number", "exclusiveMinimum": 3})


TREE = {"type": "object", "properties": {"value": {"type": "integer"},
                                         "children": {"type": "array", "items": {"$ref": "#"}}}}

JSON_CORPUS = [
    ("open model: optional property added", obj(a={"type": "string"}),
     obj(a={"type": "string"}, b={"type": "integer"}), False, True),
    ("open model: property with an empty schema added", obj(a={"type": "string"}),
     obj(a={"type": "string"}, b={}), True, True),
    ("closed model: optional property added", obj(True, a={"type": "string"}),
     obj(True, a={"type": "string"}, b={"type": "integer"}), True, False),
    ("closed model: required property added", obj(True, a={"type": "string"}),
     obj(True, ("b",), a={"type": "string"}, b={"type": "integer"}), False, False),
    ("closed model: required property with a default added", obj(True, a={"type": "string"}),
     obj(True, ("b",), a={"type": "string"}, b={"type": "integer", "default": 0}), True, False),
    ("open model: property removed", obj(a={"type": "string"}, b={"type": "integer"}),
     obj(a={"type": "string"}), True, False),
    ("closed model: property removed", obj(True, a={"type": "string"}, b={"type": "integer"}),
     obj(True, a={"type": "string"}), False, True),
    ("partially open model covers the removed property",
     obj(a={"type": "string"}, b={"type": "integer"}) | {"additionalProperties": {"type": "integer"}},
     obj(a={"type": "string"}) | {"additionalProperties": {"type": "integer"}}, True, True),
    ("partially open model does not cover the removed property",
     obj(a={"type": "string"}, b={"type": "string"}) | {"additionalProperties": {"type": "integer"}},
     obj(a={"type": "string"}) | {"additionalProperties": {"type": "integer"}}, False, False),
    ("required removed", obj(False, ("a",), a={"type": "string"}), obj(a={"type": "string"}), True, False),
    ("open model closed", obj(a={"type": "string"}), obj(True, a={"type": "string"}), False, True),
    ("integer widened to number", obj(a={"type": "integer"}), obj(a={"type": "number"}), True, False),
    ("string to integer", obj(a={"type": "string"}), obj(a={"type": "integer"}), False, False),
    ("type made nullable", obj(a={"type": "string"}), obj(a={"type": ["string", "null"]}), True, False),
    ("enum value added", {"enum": ["a", "b"]}, {"enum": ["a", "b", "c"]}, True, False),
    ("enum value removed", {"enum": ["a", "b"]}, {"enum": ["a"]}, False, True),
    ("enum value changed", {"enum": ["a", "b"]}, {"enum": ["a", "c"]}, False, False),
    ("string enum value added", {"type": "string", "enum": ["a"]}, {"type": "string", "enum": ["a", "b"]},
     True, False),
    ("maxLength tightened", {"type": "string", "maxLength": 10}, {"type": "string", "maxLength": 5},
     False, True),
    ("maxLength added", {"type": "string"}, {"type": "string", "maxLength": 5}, False, True),
    ("minimum relaxed", {"type": "number", "minimum": 5}, {"type": "number", "minimum": 0}, True, False),
    ("exclusiveMaximum tightened", {"type": "number", "exclusiveMaximum": 5},
     {"type": "number", "exclusiveMaximum": 3}, False, True),
    ("multipleOf reduced", {"type": "integer", "multipleOf": 4}, {"type": "integer", "multipleOf": 2},
     True, False),
    ("pattern added", {"type": "string"}, {"type": "string", "pattern": "^a"}, False, True),
    ("pattern changed", {"type": "string", "pattern": "^a"}, {"type": "string", "pattern": "^b"},
     False, False),
    ("array items widened", {"type": "array", "items": {"type": "integer"}},
     {"type": "array", "items": {"type": "number"}}, True, False),
    ("array items constrained", {"type": "array"}, {"type": "array", "items": {"type": "string"}},
     False, True),
    ("uniqueItems added", {"type": "array"}, {"type": "array", "uniqueItems": True}, False, True),
    ("maxItems raised", {"type": "array", "maxItems": 3}, {"type": "array", "maxItems": 5}, True, False),
    ("oneOf sub-schema added", {"oneOf": [{"type": "string"}, {"type": "integer"}]},
     {"oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]}, True, False),
    ("oneOf sub-schema changed", {"oneOf": [{"type": "string"}, {"type": "integer"}]},
     {"oneOf": [{"type": "string"}, {"type": "boolean"}]}, False, False),
    ("oneOf to anyOf", {"oneOf": [{"type": "string"}, {"type": "integer"}]},
     {"anyOf": [{"type": "string"}, {"type": "integer"}]}, True, False),
    ("anything to string", {}, {"type": "string"}, False, True),
    ("definitions through $ref widened",
     {"definitions": {"n": {"type": "integer"}}, "properties": {"a": {"$ref": "#/definitions/n"}}},
     {"definitions": {"n": {"type": "number"}}, "properties": {"a": {"$ref": "#/definitions/n"}}},
     True, False),
    ("title and description changed", obj(a={"type": "string"}),
     obj(a={"type": "string", "description": "the a"}) | {"title": "A"}, True, True),
    ("recursive schema: description added", TREE, TREE | {"description": "a tree"}, True, True),
    ("recursive schema: value widened", TREE,
     {**TREE, "properties": {**TREE["properties"], "value": {"type": "number"}}}, True, False),
]


@pytest.mark.parametrize("change, old, new, backward, forward", JSON_CORPUS,
                         ids=[c[0] for c in JSON_CORPUS])
def test_json_compatibility_corpus(change: str, old: object, new: object, backward: bool,
                                   forward: bool) -> None:
    assert_levels(js(new), js(old), backward, forward)


def test_json_messages_are_confluents() -> None:
    old, new = js(obj(a={"type": "string"})), js(obj(a={"type": "string"}, b={"type": "integer"}))
    assert F.check("BACKWARD", new, [old]) == [
        '{errorType:"OPTIONAL_PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL", description:"The new schema has an '
        "open content model and has a property or item at path '#/properties/b' which is missing in the "
        'old schema"}']
    old, new = js({"type": "string", "maxLength": 10}), js({"type": "string", "maxLength": 5})
    assert F.check("BACKWARD", new, [old]) == [
        '{errorType:"MAX_LENGTH_DECREASED", description:"The value at path \'#/maxLength\' in the new '
        'schema is less than its value in the old schema"}']
    old, new = js(obj(a={"type": "string"})), js(obj(a={"type": "integer"}))
    assert F.check("FORWARD", new, [old]) == [
        '{errorType:"TYPE_CHANGED", description:"A type at path \'#/properties/a\' is different between '
        'the old schema and the new schema"}']


# --- Protobuf -------------------------------------------------------------------------------

def pb(body: str, header: str = 'syntax = "proto3";\npackage acme.v1;\n', **kw: object) -> F.ParsedSchema:
    return F.parse(F.PROTOBUF, header + body, **kw)  # type: ignore[arg-type]


USER_PROTO = """
import "google/protobuf/timestamp.proto";
message User {
  reserved 4, 6 to 8;
  reserved "old";
  string name = 1;
  repeated int64 ids = 2;
  map<string, Address> homes = 3;
  oneof contact { string email = 5; string phone = 9; }
  message Address { string street = 1; }
  enum Kind { KIND_UNKNOWN = 0; ADMIN = 1; }
  Kind kind = 10;
  optional int32 age = 11;
  google.protobuf.Timestamp at = 12;
}
service Users { rpc Get(User) returns (User); }
"""


def test_protobuf_text_and_serialized_forms_have_one_canonical_form() -> None:
    text = pb(USER_PROTO)
    serialized = F.parse(F.PROTOBUF, text.parsed.serialized)
    assert serialized.canonical == text.canonical
    assert pb(USER_PROTO.replace("\n", "\n\n  ")).canonical == text.canonical  # layout
    assert "User" in text.canonical and "Timestamp" in text.canonical
    user = text.parsed.pool.FindMessageTypeByName("acme.v1.User")
    assert [f.name for f in user.fields] == ["name", "ids", "homes", "email", "phone", "kind", "age", "at"]
    assert user.fields_by_name["homes"].message_type.GetOptions().map_entry
    assert F.check("FULL", serialized, [text]) == []


def test_protobuf_serialized_by_protoc() -> None:
    from google.protobuf import descriptor_pb2, timestamp_pb2
    fdp = descriptor_pb2.FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(fdp)  # what confluent-kafka's serializer encodes
    parsed = F.parse(F.PROTOBUF, __import__("base64").b64encode(fdp.SerializeToString()).decode())
    assert parsed.parsed.pool.FindMessageTypeByName("google.protobuf.Timestamp")
    header = 'syntax = "proto3";\npackage google.protobuf;\n'
    text = pb("message Timestamp { int64 seconds = 1; int32 nanos = 2; }", header=header)
    assert text.canonical == parsed.canonical


def test_protobuf_references() -> None:
    address = 'syntax = "proto3";\npackage acme.v1;\nmessage Address { string street = 1; }\n'
    user = 'syntax = "proto3";\npackage acme.v1;\nimport "acme/address.proto";\n' \
           "message User { Address home = 1; }\n"
    parsed = F.parse(F.PROTOBUF, user, {"acme/address.proto": address})
    assert parsed.parsed.pool.FindMessageTypeByName("acme.v1.User").fields[0].message_type.name == "Address"
    with pytest.raises(F.InvalidSchema, match="imports 'acme/address.proto', which is not one of"):
        F.parse(F.PROTOBUF, user)
    address2 = address.replace("string street", "int32 street")
    assert F.check("BACKWARD", F.parse(F.PROTOBUF, user, {"acme/address.proto": address2}), [parsed]) != []


@pytest.mark.parametrize("text, why", [
    ("", "empty"),
    ("message A { string x = 1 }", r"line 1:26: mismatched input '}'"),
    ("messag A {}", "mismatched input 'messag'"),
    ('syntax = "proto3"; message A { string x = 1; int32 y = 1; }', "duplicate field number"),
    ('syntax = "proto3"; message A { Foo x = 1; }', "couldn't resolve name 'Foo'"),
    ('syntax = "proto3"; import "other.proto"; message A {}', "not one of the schema's references"),
    ('syntax = "proto4"; message A {}', "unknown syntax"),
    ("AAAA", "neither .proto text nor a base64 FileDescriptorProto"),
])
def test_protobuf_invalid_schemas(text: str, why: str) -> None:
    with pytest.raises(F.InvalidSchema, match=why):
        F.parse(F.PROTOBUF, text)


PROTO_CORPUS = [
    ("field added", "message M { string a = 1; }", "message M { string a = 1; int32 b = 2; }", True, True),
    ("field removed", "message M { string a = 1; int32 b = 2; }", "message M { string a = 1; }", True, True),
    ("field renamed", "message M { string a = 1; }", "message M { string b = 1; }", True, True),
    ("int32 to int64", "message M { int32 a = 1; }", "message M { int64 a = 1; }", True, True),
    ("int32 to sint32", "message M { int32 a = 1; }", "message M { sint32 a = 1; }", False, False),
    ("string to bytes", "message M { string a = 1; }", "message M { bytes a = 1; }", True, True),
    ("field number reused with another type", "message M { string a = 1; }", "message M { int32 a = 1; }",
     False, False),
    ("enum to int32", "message M { E a = 1; } enum E { Z = 0; }", "message M { int32 a = 1; } enum E { Z = 0; }",
     True, True),
    ("scalar to message", "message M { string a = 1; } message N { string s = 1; }",
     "message M { N a = 1; } message N { string s = 1; }", False, False),
    ("message removed", "message M { string a = 1; } message N { string s = 1; }",
     "message M { string a = 1; }", False, True),
    ("messages reordered", "message M { string a = 1; } message N { string s = 1; }",
     "message N { string s = 1; } message M { string a = 1; }", True, True),
    ("field's message type renamed", "message M { N a = 1; } message N { string s = 1; }",
     "message M { O a = 1; } message O { string s = 1; }", False, False),
    ("field's message type changed incompatibly", "message M { N a = 1; } message N { string s = 1; }",
     "message M { N a = 1; } message N { int32 s = 1; }", False, False),
    ("nested message: field added", "message M { message N { string s = 1; } N a = 1; }",
     "message M { message N { string s = 1; int32 t = 2; } N a = 1; }", True, True),
    ("enum value added", "message M { E a = 1; } enum E { Z = 0; }",
     "message M { E a = 1; } enum E { Z = 0; ONE = 1; }", True, True),
    ("field moved into a new oneof", "message M { string a = 1; }",
     "message M { oneof o { string a = 1; } }", True, True),
    ("two fields moved into one oneof", "message M { string a = 1; int32 b = 2; }",
     "message M { oneof o { string a = 1; int32 b = 2; } }", False, True),
    ("oneof field removed", "message M { oneof o { string a = 1; int32 b = 2; } }",
     "message M { oneof o { string a = 1; } }", False, True),
    ("repeated int32 made singular", "message M { repeated int32 a = 1; }", "message M { int32 a = 1; }",
     False, False),
    ("repeated string made singular", "message M { repeated string a = 1; }", "message M { string a = 1; }",
     True, True),
    ("map value type changed", "message M { map<string, string> a = 1; }",
     "message M { map<string, int32> a = 1; }", False, False),
    ("map to message", "message M { map<string, string> a = 1; } message N { string s = 1; }",
     "message M { repeated N a = 1; } message N { string s = 1; }", False, False),
    ("recursive message: field added", "message T { int32 v = 1; repeated T children = 2; }",
     "message T { int32 v = 1; repeated T children = 2; string label = 3; }", True, True),
    ("proto3 optional added", "message M { string a = 1; }", "message M { string a = 1; optional int32 b = 2; }",
     True, True),
]


@pytest.mark.parametrize("change, old, new, backward, forward", PROTO_CORPUS,
                         ids=[c[0] for c in PROTO_CORPUS])
def test_protobuf_compatibility_corpus(change: str, old: str, new: str, backward: bool,
                                       forward: bool) -> None:
    assert_levels(pb(new), pb(old), backward, forward)


def test_protobuf_package_and_required_fields() -> None:
    v1 = pb("message M { string a = 1; }")
    other = pb("message M { string a = 1; }", header='syntax = "proto3";\npackage acme.v2;\n')
    assert F.check("BACKWARD", other, [v1]) == ["Difference{fullPath='#/', type=PACKAGE_CHANGED}"]
    proto2 = 'syntax = "proto2";\n'
    old = pb("message M { optional string a = 1; }", header=proto2)
    new = pb("message M { optional string a = 1; required int32 b = 2; }", header=proto2)
    assert F.check("BACKWARD", new, [old]) == ["Difference{fullPath='#/M/2', type=REQUIRED_FIELD_ADDED}"]
    assert F.check("FORWARD", new, [old]) == ["Difference{fullPath='#/M/2', type=REQUIRED_FIELD_REMOVED}"]


def test_protobuf_messages() -> None:
    old, new = pb("message M { string a = 1; }"), pb("message M { int32 a = 1; }")
    assert F.check("BACKWARD", new, [old]) == ["Difference{fullPath='#/M/1', type=FIELD_SCALAR_KIND_CHANGED}"]
    old, new = pb("message M { N a = 1; } message N { string s = 1; }"), pb("message M { string a = 1; }")
    assert F.check("BACKWARD", new, [old]) == ["Difference{fullPath='#/M/1', type=FIELD_KIND_CHANGED}",
                                               "Difference{fullPath='#/N', type=MESSAGE_REMOVED}"]


def test_json_messages_with_braces_in_property_names() -> None:
    old, new = js(obj(**{"a{b}": {"type": "string"}})), js(obj(**{"a{b}": {"type": "integer"}}))
    assert F.check("BACKWARD", new, [old]) == [
        '{errorType:"TYPE_CHANGED", description:"A type at path \'#/properties/a{b}\' is different between '
        'the new schema and the old schema"}']


@pytest.mark.parametrize("schema_type, text", [
    (F.AVRO, json.dumps(record({"name": "x", "type": ["null", "int"], "default": None},
                               {"name": "m", "type": {"type": "map", "values": {"type": "array", "items": "User"}}}))),
    (F.JSON, json.dumps({"type": "object", "properties": {"b": {"oneOf": [{"type": "integer"}, {"enum": [1, 2]}]},
                                                          "c": {"type": "array", "items": [{"type": "string"}],
                                                                "additionalItems": False},
                                                          "d": {"$ref": "#/definitions/x"}},
                         "definitions": {"x": {"not": {"const": 3}}}, "patternProperties": {"^z": {}},
                         "dependencies": {"a": ["b"], "b": {"required": ["c"]}}})),
    (F.PROTOBUF, 'syntax = "proto3"; package p; message M { map<int32, M> m = 1; oneof o { string a = 2; M b = 3; }'
                 ' repeated E e = 4; enum E { Z = 0; } reserved 10 to max; }'),
])
def test_a_schema_is_compatible_with_itself(schema_type: str, text: str) -> None:
    assert F.check("FULL_TRANSITIVE", F.parse(schema_type, text), [F.parse(schema_type, text)]) == []


def test_avro_invalid_logical_types_are_ignored_as_avro_java_does(recwarn: pytest.WarningsRecorder) -> None:
    for t in ({"type": "bytes", "logicalType": "decimal", "precision": 0}, {"type": "int", "logicalType": "nonsense"}):
        assert avro(t).canonical == json.dumps(t, separators=(",", ":"))
    assert not recwarn.list
    assert F.check("FULL", avro({"type": "int", "logicalType": "date"}), [avro('"int"')]) == []


def test_protobuf_built_in_imports_need_no_reference() -> None:
    # confluent-kafka's ProtobufSerializer sends no reference for these (its _is_builtin)
    for path, type_name in [("google/protobuf/wrappers.proto", "google.protobuf.StringValue"),
                            ("google/type/date.proto", "google.type.Date"),
                            ("confluent/type/decimal.proto", "confluent.type.Decimal")]:
        pytest.importorskip("google.type.date_pb2" if path.startswith("google/type") else "google.protobuf")
        if path.startswith("confluent/"):
            pytest.importorskip("confluent_kafka.schema_registry.confluent.type.decimal_pb2")
        parsed = pb(f'import "{path}";\nmessage M {{ {type_name} v = 1; }}')
        assert parsed.parsed.pool.FindMessageTypeByName("acme.v1.M").fields[0].message_type.full_name == type_name
