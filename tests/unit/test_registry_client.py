"""The registry client (cluster/client/registry.py) against httpx.MockTransport: the requests
it builds (paths quoted, context subjects, bodies, auth header) and Confluent's error bodies
mapped to RegistryClientError."""

from __future__ import annotations

import base64
import json

import httpx
import pytest
import trio

from cluster.client.registry import (
    AsyncRegistryClient,
    RegistryAuth,
    RegistryClient,
    RegistryClientError,
    context_subject,
)
from cluster.common.secrets import Secret


def _transport(seen: list[httpx.Request]) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        path = request.url.path
        if path == "/schemas/ids/7":
            return httpx.Response(200, json={"schema": '"string"', "references": [
                {"name": "C", "subject": "common", "version": 1}]})
        if path.startswith("/subjects/") and request.method == "POST":
            return httpx.Response(200, json={"id": json.loads(request.content).get("id", 1)})
        if path == "/schemas/ids/99":
            return httpx.Response(404, json={"error_code": 40403, "message": "Schema 99 not found"})
        return httpx.Response(500, text="<html>proxy error</html>")

    return httpx.MockTransport(answer)


def test_requests_and_answers() -> None:
    seen: list[httpx.Request] = []
    with RegistryClient("http://reg:8081/", auth=RegistryAuth(token=Secret("tok")), transport=_transport(seen)) as c:
        assert c.schema_by_id(7, ".east") == ("AVRO", '"string"', (("C", "common", 1),))
        assert seen[-1].url.params["subject"] == ":.east:_"
        assert seen[-1].headers["authorization"] == "Bearer tok"
        assert c.register(":.east:a/b-value", '"int"', "AVRO", [("C", "common", 1)], schema_id=5, version=2) == 5
        assert seen[-1].url.raw_path == b"/subjects/%3A.east%3Aa%2Fb-value/versions"
        assert json.loads(seen[-1].content) == {"schema": '"int"', "references": [
            {"name": "C", "subject": "common", "version": 1}], "id": 5, "version": 2}
        with pytest.raises(RegistryClientError) as info:
            c.schema_by_id(99)
        assert info.value.error_code == 40403 and info.value.http_status == 404
        with pytest.raises(RegistryClientError) as info:
            c.subjects()
        assert info.value.error_code == 500 and "proxy error" in info.value.message


def test_async_client_under_trio_with_basic_auth() -> None:
    seen: list[httpx.Request] = []

    async def main() -> None:
        async with AsyncRegistryClient("http://reg", auth=RegistryAuth(basic=Secret("alice:pw")),
                                       transport=_transport(seen)) as c:
            assert (await c.schema_by_id(7))[1] == '"string"'

    trio.run(main)
    assert seen[0].headers["authorization"] == "Basic " + base64.b64encode(b"alice:pw").decode()
    assert "subject" not in seen[0].url.params


def test_context_subject() -> None:
    assert context_subject(".east", "x-value") == ":.east:x-value"
    assert context_subject(".", "x-value") == "x-value"
    assert context_subject(".east", ":.west:x") == ":.west:x"
    assert "s3cr3t" not in repr(RegistryAuth(token=Secret("s3cr3t")))
