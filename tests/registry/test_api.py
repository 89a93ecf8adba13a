"""The registry's REST answers, endpoint by endpoint, against what Confluent Schema Registry
documents (status codes, error codes, bodies): one broker process and one `dcmirror
registry` process for the module."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.harness import BrokerProcess
from tests.registry.common import RegistryProcess

CT = "application/vnd.schemaregistry.v1+json"


def avro_record(*fields: tuple[str, object], name: str = "R", **extra: object) -> str:
    out = []
    for field_name, spec in fields:
        out.append({"name": field_name, **(spec if isinstance(spec, dict) else {"type": spec})})
    return json.dumps({"type": "record", "name": name, "fields": out, **extra})


V1 = avro_record(("a", "int"))
V2 = avro_record(("a", "int"), ("b", {"type": "string", "default": ""}))
BREAKS_V2 = avro_record(("a", "int"), ("c", "string"))  # a new field without a default



@pytest.fixture(scope="module")
def http(broker: BrokerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    reg = RegistryProcess(tmp_path_factory.mktemp("registry-api-log") / "registry.log",
                          bootstrap=broker.bootstrap).start()
    try:
        with httpx.Client(base_url=reg.url, headers={"Content-Type": CT}, timeout=30) as client:
            yield client
    finally:
        reg.stop()


def error(response: httpx.Response, status: int, code: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error_code"] == code, body
    return str(body["message"])


def register(http: httpx.Client, subject: str, schema: str, **body: object) -> httpx.Response:
    return http.post(f"/subjects/{subject}/versions", json={"schema": schema, **body})


def test_root_types_and_empty_lists(http: httpx.Client) -> None:
    r = http.get("/")
    assert r.status_code == 200 and r.json() == {}
    assert r.headers["content-type"].startswith(CT)
    assert sorted(http.get("/schemas/types").json()) == ["AVRO", "JSON", "PROTOBUF"]
    assert isinstance(http.get("/subjects").json(), list)
    assert "." in http.get("/contexts").json()
    error(http.get("/no/such/route"), 404, 404)


def test_register_get_lookup_versions(http: httpx.Client) -> None:
    r = register(http, "api-a-value", V1)
    assert r.status_code == 200, r.text
    id1 = r.json()["id"]
    assert register(http, "api-a-value", V1).json() == {"id": id1}          # idempotent
    id2 = register(http, "api-a-value", V2).json()["id"]
    assert id2 > id1
    assert register(http, "api-b-value", V1).json() == {"id": id1}          # same schema, same id
    assert http.get("/subjects/api-a-value/versions").json() == [1, 2]
    latest = http.get("/subjects/api-a-value/versions/latest").json()
    assert latest == {"subject": "api-a-value", "version": 2, "id": id2, "schema": V2}
    assert http.get("/subjects/api-a-value/versions/-1").json() == latest
    assert http.get("/subjects/api-a-value/versions/1/schema").json() == json.loads(V1)
    assert http.get(f"/schemas/ids/{id1}").json() == {"schema": V1}
    assert http.get(f"/schemas/ids/{id1}/schema").json() == json.loads(V1)
    assert http.get(f"/schemas/ids/{id1}/versions").json() == [
        {"subject": "api-a-value", "version": 1}, {"subject": "api-b-value", "version": 1}]
    assert http.get(f"/schemas/ids/{id1}/subjects").json() == ["api-a-value", "api-b-value"]
    found = http.post("/subjects/api-a-value", json={"schema": V1}).json()
    assert found == {"subject": "api-a-value", "version": 1, "id": id1, "schema": V1}
    assert {"api-a-value", "api-b-value"} <= set(http.get("/subjects").json())
    assert http.get("/subjects", params={"subjectPrefix": "api-a"}).json() == ["api-a-value"]
    listed = http.get("/schemas", params={"subjectPrefix": "api-a", "latestOnly": "true"}).json()
    assert [(s["subject"], s["version"]) for s in listed] == [("api-a-value", 2)]
    # Confluent's errors
    error(http.get("/subjects/api-nobody/versions"), 404, 40401)
    error(http.get("/subjects/api-a-value/versions/9"), 404, 40402)
    error(http.get("/subjects/api-a-value/versions/zero"), 422, 42202)
    error(http.get("/schemas/ids/999999"), 404, 40403)
    error(http.post("/subjects/api-a-value", json={"schema": avro_record(("z", "long"))}), 404, 40403)
    error(http.post("/subjects/api-nobody", json={"schema": V1}), 404, 40401)
    error(register(http, "api-a-value", "{not json"), 422, 42201)
    error(register(http, "api-a-value", json.dumps({"type": "record", "name": "R"})), 422, 42201)
    error(register(http, "api-a-value", V1, schemaType="XML"), 422, 42201)
    error(http.post("/subjects/api-a-value/versions", content=b"{oops"), 400, 400)


def test_compatibility(http: httpx.Client) -> None:
    assert register(http, "api-c-value", V1).status_code == 200
    message = error(register(http, "api-c-value", BREAKS_V2), 409, 409)
    assert "incompatible with an earlier schema" in message
    ok = http.post("/compatibility/subjects/api-c-value/versions/latest", json={"schema": V2})
    assert ok.status_code == 200 and ok.json() == {"is_compatible": True}
    bad = http.post("/compatibility/subjects/api-c-value/versions/latest", params={"verbose": "true"},
                    json={"schema": BREAKS_V2}).json()
    assert bad["is_compatible"] is False and bad["messages"]
    assert "{oldSchemaVersion: 1}" in bad["messages"]
    all_versions = http.post("/compatibility/subjects/api-c-value/versions", json={"schema": BREAKS_V2}).json()
    assert all_versions == {"is_compatible": False}
    error(http.post("/compatibility/subjects/api-c-value/versions/7", json={"schema": V2}), 404, 40402)
    error(http.post("/compatibility/subjects/api-nobody/versions/latest", json={"schema": V2}), 404, 40401)
    # a subject-level NONE lets the change in
    assert http.put("/config/api-c-value", json={"compatibility": "NONE"}).json() == {"compatibility": "NONE"}
    assert register(http, "api-c-value", BREAKS_V2).status_code == 200


def test_config_and_mode(http: httpx.Client) -> None:
    assert http.get("/config").json() == {"compatibilityLevel": "BACKWARD"}
    register(http, "api-cfg-value", V1)
    error(http.get("/config/api-cfg-value"), 404, 40408)
    assert http.get("/config/api-cfg-value", params={"defaultToGlobal": "true"}).json() == {
        "compatibilityLevel": "BACKWARD"}
    assert http.put("/config/api-cfg-value", json={"compatibility": "full_transitive"}).json() == {
        "compatibility": "FULL_TRANSITIVE"}
    assert http.get("/config/api-cfg-value").json() == {"compatibilityLevel": "FULL_TRANSITIVE"}
    error(http.put("/config/api-cfg-value", json={"compatibility": "SOMETIMES"}), 422, 42203)
    assert http.delete("/config/api-cfg-value").json() == {"compatibilityLevel": "FULL_TRANSITIVE"}
    error(http.get("/config/api-cfg-value"), 404, 40408)
    assert http.get("/mode").json() == {"mode": "READWRITE"}
    error(http.put("/mode", json={"mode": "SLEEPY"}), 422, 42204)
    error(http.put("/mode", json={"mode": "IMPORT"}), 422, 42205)          # subjects exist
    assert http.put("/mode/api-cfg-value", json={"mode": "READONLY"}).json() == {"mode": "READONLY"}
    error(register(http, "api-cfg-value", V2), 422, 42205)
    error(http.delete("/subjects/api-cfg-value"), 422, 42205)
    assert http.delete("/mode/api-cfg-value").json() == {"mode": "READONLY"}
    error(http.get("/mode/api-cfg-value"), 404, 40409)
    # IMPORT: a given id and version are kept
    error(register(http, "api-imp-value", V2, id=500, version=3), 422, 42205)
    assert http.put("/mode/api-imp-value", json={"mode": "IMPORT"}).json() == {"mode": "IMPORT"}
    assert register(http, "api-imp-value", V2, id=500, version=3).json() == {"id": 500}
    assert http.get("/subjects/api-imp-value/versions/3").json()["id"] == 500
    assert "not in import mode" in error(register(http, "api-imp2-value", V1, id=500), 422, 42205)
    assert http.put("/mode/api-imp2-value", json={"mode": "IMPORT"}).json() == {"mode": "IMPORT"}
    assert "Overwrite" in error(register(http, "api-imp2-value", V1, id=500), 422, 42205)  # 500 is V2
    assert register(http, "api-imp-value", V2, id=500, version=3).json() == {"id": 500}   # again: same
    error(register(http, "api-imp-value", V2, id=501), 422, 42207)        # V2 is id 500 in this subject
    error(register(http, "", V1), 404, 404)
    error(register(http, "api-bad%01-value", V1), 422, 42208)         # a control character


def test_deletes(http: httpx.Client) -> None:
    for schema in (V1, V2):
        assert register(http, "api-d-value", schema).status_code == 200
    error(http.delete("/subjects/api-d-value/versions/1", params={"permanent": "true"}), 404, 40407)
    assert http.delete("/subjects/api-d-value/versions/1").json() == 1
    error(http.delete("/subjects/api-d-value/versions/1"), 404, 40406)
    assert http.get("/subjects/api-d-value/versions").json() == [2]
    assert http.get("/subjects/api-d-value/versions", params={"deleted": "true"}).json() == [1, 2]
    error(http.get("/subjects/api-d-value/versions/1"), 404, 40402)
    assert http.get("/subjects/api-d-value/versions/1", params={"deleted": "true"}).json()["version"] == 1
    assert http.delete("/subjects/api-d-value/versions/1", params={"permanent": "true"}).json() == 1
    error(http.delete("/subjects/api-d-value", params={"permanent": "true"}), 404, 40405)
    assert http.delete("/subjects/api-d-value").json() == [2]
    assert "api-d-value" not in http.get("/subjects").json()
    assert "api-d-value" in http.get("/subjects", params={"deleted": "true"}).json()
    error(http.delete("/subjects/api-d-value"), 404, 40404)
    error(http.get("/subjects/api-d-value/versions"), 404, 40401)
    assert http.delete("/subjects/api-d-value", params={"permanent": "true"}).json() == [2]
    assert "api-d-value" not in http.get("/subjects", params={"deleted": "true"}).json()
    error(http.delete("/subjects/api-d-value"), 404, 40401)


def test_references_and_contexts(http: httpx.Client) -> None:
    base = avro_record(("street", "string"), name="Address", namespace="com.example")
    assert register(http, "api-address", base).status_code == 200
    user = json.dumps({"type": "record", "name": "User", "namespace": "com.example",
                       "fields": [{"name": "home", "type": "com.example.Address"}]})
    refs = [{"name": "com.example.Address", "subject": "api-address", "version": 1}]
    error(register(http, "api-user-value", user), 422, 42201)              # unresolved name
    error(register(http, "api-user-value", user, references=[{**refs[0], "version": 9}]), 422, 42201)
    user_id = register(http, "api-user-value", user, references=refs).json()["id"]
    got = http.get("/subjects/api-user-value/versions/1").json()
    assert got["references"] == refs
    assert http.get("/subjects/api-address/versions/1/referencedby").json() == [user_id]
    error(http.delete("/subjects/api-address/versions/1"), 422, 42206)
    # contexts: ids per context
    east = register(http, ":.east:api-ctx-value", V2).json()["id"]
    assert east == 1
    assert http.get("/schemas/ids/1", params={"subject": ":.east:api-ctx-value"}).json() == {"schema": V2}
    assert ".east" in http.get("/contexts").json()
    assert http.get("/contexts/.east/subjects").json() == [":.east:api-ctx-value"]
    assert http.get("/contexts/.east/schemas/ids/1").json() == {"schema": V2}
    # A client pointed at the context sends ?subject unqualified (confluent-kafka's deserializer).
    assert http.get("/contexts/.east/schemas/ids/1", params={"subject": "api-ctx-value"}).json() == {"schema": V2}
    assert http.get("/contexts/.east/subjects/api-ctx-value/versions").json() == [1]


def test_limits(http: httpx.Client) -> None:
    huge = avro_record(("a", {"type": "string", "doc": "x" * (2 * 1024 * 1024)}))
    error(register(http, "api-big-value", huge), 422, 42209)
    r = http.post("/subjects/api-big-value/versions", content=b" " * (5 * 1024 * 1024))
    error(r, 413, 413)
    assert r.headers.get("connection") == "close"  # the body was not read: the connection is not reused


def test_a_refused_body_leaves_the_client_able_to_ask_again(http: httpx.Client) -> None:
    """A body over the limit is answered 413 without being read, so the server must close that
    connection and say so: a client that pooled it found it closed under its next request
    ("Server disconnected without sending a response", once in CI)."""
    for _ in range(5):
        r = http.post("/subjects/api-big-value/versions", content=b" " * (5 * 1024 * 1024))
        assert r.status_code == 413
        assert http.get("/subjects").status_code == 200



def test_protobuf_text_is_served_serialized_on_request(http: httpx.Client) -> None:
    """`?format=serialized` (what confluent-kafka's Protobuf deserializer and the typed loads ask
    for): a schema registered as .proto text comes back as a base64 FileDescriptorProto, on
    /schemas/ids/{id} and on /subjects/{s}/versions/{v}; other formats are answered as registered."""
    import base64

    from google.protobuf import descriptor_pb2

    text = 'syntax = "proto3";\npackage fmt;\nmessage Ping {\n  int64 id = 1;\n  Pong pong = 2;\n}\nmessage Pong {\n  string s = 1;\n}\n'
    schema_id = register(http, "fmt-proto-value", text, schemaType="PROTOBUF").json()["id"]
    assert http.get(f"/schemas/ids/{schema_id}").json()["schema"] == text
    for path in (f"/schemas/ids/{schema_id}", "/subjects/fmt-proto-value/versions/1"):
        body = http.get(path, params={"format": "serialized"}).json()
        fdp = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(body["schema"], validate=True))
        assert fdp.package == "fmt" and [m.name for m in fdp.message_type] == ["Ping", "Pong"]
        assert [f.name for f in fdp.message_type[0].field] == ["id", "pong"] and body["schemaType"] == "PROTOBUF"
    avro_id = register(http, "fmt-avro-value", V1).json()["id"]
    assert http.get(f"/schemas/ids/{avro_id}", params={"format": "serialized"}).json()["schema"] == V1


def test_subjects_with_slashes_travel_as_percent_2f(http: httpx.Client) -> None:
    """Confluent's clients quote a subject's "/" as %2F (a RecordNameStrategy over a
    namespaced record does not, but file-like subjects do): it stays one path segment."""
    subject = "team/a/orders-value"
    r = http.post("/subjects/team%2Fa%2Forders-value/versions", json={"schema": avro_record(("slash", "int"))})
    assert r.status_code == 200, r.text
    schema_id = r.json()["id"]
    assert subject in http.get("/subjects").json()
    got = http.get("/subjects/team%2Fa%2Forders-value/versions/latest").json()
    assert (got["subject"], got["id"], got["version"]) == (subject, schema_id, 1)
    assert http.get(f"/schemas/ids/{schema_id}/subjects").json() == [subject]
    assert http.get("/contexts/.team/subjects/team%2Fa%2Forders-value/versions").status_code == 404
    error(http.get("/subjects/team/a/orders-value/versions"), 404, 404)
    from confluent_kafka.schema_registry import SchemaRegistryClient

    assert SchemaRegistryClient({"url": str(http.base_url)}).get_latest_version(subject).schema_id == schema_id


def test_registering_a_soft_deleted_schema_again_tombstones_its_old_version(http: httpx.Client) -> None:
    t1, t2 = avro_record(("a", "int"), name="T"), avro_record(("a", "int"), ("b", {"type": "string", "default": ""}), name="T")
    id1 = register(http, "api-t-value", t1).json()["id"]
    id2 = register(http, "api-t-value", t2).json()["id"]
    assert http.delete("/subjects/api-t-value/versions/2").json() == 2
    assert register(http, "api-t-value", t2).json() == {"id": id2}        # same schema, same id
    # Confluent: version 2 (soft-deleted, the same id) is gone; the schema lives as version 3.
    assert http.get("/subjects/api-t-value/versions", params={"deleted": "true"}).json() == [1, 3]
    assert http.get("/subjects/api-t-value/versions").json() == [1, 3]
    error(http.get("/subjects/api-t-value/versions/2", params={"deleted": "true"}), 404, 40402)
    assert http.get(f"/schemas/ids/{id2}/versions", params={"deleted": "true"}).json() == [
        {"subject": "api-t-value", "version": 3}]
    # A soft-deleted version of another schema stays.
    assert http.delete("/subjects/api-t-value/versions/1").json() == 1
    assert register(http, "api-t-value", t2).json() == {"id": id2}        # live already: nothing new
    assert http.get("/subjects/api-t-value/versions", params={"deleted": "true"}).json() == [1, 3]
    assert register(http, "api-t-value", t1).json() == {"id": id1}
    assert http.get("/subjects/api-t-value/versions", params={"deleted": "true"}).json() == [3, 4]


def test_deleted_only_and_deleted_as_negative(http: httpx.Client) -> None:
    for schema in (V1, V2):
        assert register(http, "api-o-value", schema).status_code == 200
    assert register(http, "api-o-gone", V1).status_code == 200
    assert http.delete("/subjects/api-o-value/versions/1").json() == 1
    versions = "/subjects/api-o-value/versions"
    assert http.get(versions, params={"deletedOnly": "true"}).json() == [1]
    assert http.get(versions, params={"deletedOnly": "true", "deleted": "true"}).json() == [1]
    assert http.get(versions, params={"deletedAsNegative": "true"}).json() == [-1, 2]
    assert http.get(versions, params={"deleted": "true"}).json() == [1, 2]
    assert http.delete("/subjects/api-o-gone").json() == [1]
    subjects = "/subjects"
    prefix = {"subjectPrefix": "api-o-"}
    assert http.get(subjects, params=prefix).json() == ["api-o-value"]
    assert http.get(subjects, params={**prefix, "deleted": "true"}).json() == ["api-o-gone", "api-o-value"]
    # Only subjects whose every version is deleted (a subject with one deleted version is not).
    assert http.get(subjects, params={**prefix, "deletedOnly": "true"}).json() == ["api-o-gone"]
    assert http.get(subjects, params={**prefix, "deletedOnly": "true", "deleted": "true"}).json() == ["api-o-gone"]
    assert http.get("/subjects/api-o-gone/versions", params={"deletedOnly": "true"}).json() == [1]
    error(http.get("/subjects/api-o-gone/versions"), 404, 40401)
    error(http.get("/subjects/api-o-gone/versions", params={"deletedAsNegative": "true"}), 404, 40401)


def test_offset_and_limit_page_the_lists(http: httpx.Client) -> None:
    p1, p2, p3 = (avro_record(*fields, name="P") for fields in (
        [("a", "int")], [("a", "int"), ("b", {"type": "string", "default": ""})], [("a", "int"), ("c", "string")]))
    names = [f"api-p{i}-value" for i in range(5)]
    for name in names:
        assert register(http, name, p1).status_code == 200
    for schema in (p2, p3):
        assert http.put("/config/api-p0-value", json={"compatibility": "NONE"}).status_code == 200
        assert register(http, "api-p0-value", schema).status_code == 200
    prefix = {"subjectPrefix": "api-p"}
    assert http.get("/subjects", params=prefix).json() == names
    assert http.get("/subjects", params={**prefix, "offset": "1", "limit": "2"}).json() == names[1:3]
    assert http.get("/subjects", params={**prefix, "offset": "4", "limit": "10"}).json() == names[4:]
    assert http.get("/subjects", params={**prefix, "offset": "9"}).json() == []
    assert http.get("/subjects", params={**prefix, "limit": "0"}).json() == names     # not positive: all
    assert http.get("/subjects", params={**prefix, "limit": "-1"}).json() == names
    assert http.get("/subjects/api-p0-value/versions", params={"offset": "1", "limit": "1"}).json() == [2]
    page = http.get("/schemas", params={"subjectPrefix": "api-p0", "offset": "1", "limit": "1"}).json()
    assert [(s["subject"], s["version"]) for s in page] == [("api-p0-value", 2)]
    one_id = page[0]["id"]
    assert http.get(f"/schemas/ids/{one_id}/versions", params={"limit": "1"}).json() == [
        {"subject": "api-p0-value", "version": 2}]
    first = http.get("/schemas/ids/1/subjects").json()
    assert http.get("/schemas/ids/1/subjects", params={"offset": "1"}).json() == first[1:]
    assert http.get("/contexts", params={"limit": "1"}).json() == ["."]
    # Numbers are Java ints: anything else is JAX-RS's 404, a negative offset a clear 422.
    for bad in ("x", "1.5", "2147483648", "١", " 1", ""):
        error(http.get("/subjects", params={"offset": bad}), 404, 404)
        error(http.get("/subjects", params={"limit": bad}), 404, 404)
    assert "offset" in error(http.get("/subjects", params={"offset": "-1"}), 422, 422)


def test_bodies_of_other_media_types_are_refused_with_415(http: httpx.Client) -> None:
    body = json.dumps({"schema": V1})
    for media in ("text/plain", "application/xml", "text/plain; charset=utf-8", "multipart/form-data"):
        headers = {"Content-Type": media}
        error(http.post("/subjects/api-m-value/versions", content=body, headers=headers), 415, 415)
        error(http.post("/subjects/api-m-value", content=body, headers=headers), 415, 415)
        error(http.post("/compatibility/subjects/api-m-value/versions/latest", content=body, headers=headers),
              415, 415)
        error(http.put("/config/api-m-value", content=b'{"compatibility":"NONE"}', headers=headers), 415, 415)
        error(http.put("/mode/api-m-value", content=b'{"mode":"READWRITE"}', headers=headers), 415, 415)
    error(http.get("/subjects/api-m-value/versions"), 404, 40401)          # nothing was registered
    for media in ("application/json", "application/vnd.schemaregistry+json", "application/octet-stream",
                  "application/json; charset=utf-8", CT.upper()):
        r = http.post("/subjects/api-m-value/versions", content=body, headers={"Content-Type": media})
        assert r.status_code == 200, (media, r.text)


# Confluent Schema Registry's API reference (docs.confluent.io, "Schema Registry API
# Reference"), every endpoint this registry answers: (method, path, body or None).
DOCUMENTED_ENDPOINTS = [
    ("GET", "/", None), ("GET", "/schemas", None), ("GET", "/schemas/types", None),
    ("GET", "/schemas/ids/{id}", None), ("GET", "/schemas/ids/{id}/schema", None),
    ("GET", "/schemas/ids/{id}/subjects", None), ("GET", "/schemas/ids/{id}/versions", None),
    ("GET", "/subjects", None), ("POST", "/subjects/{s}", {"schema": "{s}"}), ("DELETE", "/subjects/{s}", None),
    ("GET", "/subjects/{s}/versions", None), ("POST", "/subjects/{s}/versions", {"schema": "{s}"}),
    ("GET", "/subjects/{s}/versions/1", None), ("DELETE", "/subjects/{s}/versions/1", None),
    ("GET", "/subjects/{s}/versions/1/schema", None), ("GET", "/subjects/{s}/versions/1/referencedby", None),
    ("POST", "/compatibility/subjects/{s}/versions/1", {"schema": "{s}"}),
    ("POST", "/compatibility/subjects/{s}/versions", {"schema": "{s}"}),
    ("GET", "/config", None), ("PUT", "/config", {"compatibility": "BACKWARD"}), ("GET", "/config/{s}", None),
    ("PUT", "/config/{s}", {"compatibility": "BACKWARD"}), ("DELETE", "/config/{s}", None),
    ("GET", "/mode", None), ("GET", "/mode/{s}", None), ("PUT", "/mode/{s}", {"mode": "READWRITE"}),
    ("DELETE", "/mode/{s}", None), ("GET", "/contexts", None),
]


def test_every_documented_endpoint_is_routed_and_other_methods_are_405(http: httpx.Client) -> None:
    """Each endpoint of Confluent's API reference answers as an endpoint (its own answer or
    its own error code), under the root and under /contexts/{context}; a method a route does
    not take is 405, an unknown path 404, both with Confluent's error body."""
    schema = avro_record(("a", "int"), name="Routed")
    for prefix in ("", "/contexts/.routed"):
        subject = "api-routed-value"
        assert http.post(f"{prefix}/subjects/{subject}/versions", json={"schema": schema}).status_code == 200
        schema_id = http.get(f"{prefix}/subjects/{subject}/versions/1").json()["id"]
        for method, path, body in DOCUMENTED_ENDPOINTS:
            url = prefix + path.replace("{id}", str(schema_id)).replace("{s}", subject)
            content = None if body is None else json.dumps(body).replace('"{s}"', json.dumps(schema))
            r = http.request(method, url, content=content)
            generic = r.status_code in (404, 405) and r.json().get("error_code") in (404, 405)
            assert not generic, (method, url, r.status_code, r.text)
            assert r.headers["content-type"].startswith(CT) or url.endswith("/schema"), (url, r.headers)
    error(http.request("PATCH", "/subjects"), 405, 405)
    error(http.put("/subjects/api-routed-value/versions"), 405, 405)
    assert error(http.get("/subjectz"), 404, 404) == "HTTP 404 Not Found"
