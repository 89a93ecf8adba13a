"""The admin HTTP servers (brokers: admin.http.*, mirror workers: a flow's http.*) bind where
told and can require a bearer token and TLS: /healthz stays open for liveness probes, every
other page answers 401 without the token (which never reaches a log or an answer); with a
keystore they speak HTTPS only, a plaintext request fails and the server goes on; a bad
keystore stops the start with an error naming the setting."""

from __future__ import annotations

import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from deploy.certs import issue, make_ca
from tests.harness import REPO, BrokerProcess, free_port

TOKEN = "tok-0123456789-secret"


def _broker(tmp_path: Path, **extra: object) -> tuple[BrokerProcess, int]:
    http_port = free_port()
    proc = BrokerProcess(tmp_path / "b", free_port(), **{"admin.http.listener": f"127.0.0.1:{http_port}", **extra})
    return proc.start(), http_port


def test_bearer_token_guards_every_page_but_healthz(tmp_path: Path) -> None:
    (tmp_path / "admin.properties").write_text(f"token={TOKEN}\n")
    broker, port = _broker(tmp_path, **{"admin.http.auth.token": f"${{file:{tmp_path}/admin.properties:token}}"})
    try:
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
            answer = httpx.get(f"{base}/metrics", headers=headers, timeout=10)
            assert answer.status_code == 401 and answer.headers["www-authenticate"].startswith("Bearer")
            assert TOKEN not in answer.text
        ok = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
        assert ok.status_code == 200 and "dcmirror_broker" in ok.text
        assert TOKEN not in broker.log_text()
    finally:
        broker.stop()


def test_https_only_and_a_bad_keystore_stops_the_start(tmp_path: Path) -> None:
    ca = make_ca(tmp_path / "ca")
    keystore = issue(ca, tmp_path / "certs", "admin-http")
    broker, port = _broker(tmp_path, **{"admin.http.ssl.keystore.location": str(keystore)})
    try:
        ctx = ssl.create_default_context(cafile=str(ca.cert_path))
        assert httpx.get(f"https://127.0.0.1:{port}/healthz", verify=ctx, timeout=10).status_code == 200
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)  # plaintext: no answer
        assert httpx.get(f"https://127.0.0.1:{port}/metrics", verify=ctx, timeout=10).status_code == 200
    finally:
        broker.stop()
    other = make_ca(tmp_path / "other")
    wrong = issue(other, tmp_path / "wrong", "x").read_text()
    bad = tmp_path / "bad.pem"  # the key of one certificate, the certificate of another
    right = keystore.read_text()
    cut = right.index("-----END PRIVATE KEY-----") + len("-----END PRIVATE KEY-----\n")
    bad.write_text(right[:cut] + wrong[wrong.index("-----END PRIVATE KEY-----") + 26:])
    done = subprocess.run([sys.executable, "-m", "deploy.cli", "broker", "--data-dir", str(tmp_path / "c"), "--listen",
                           f"127.0.0.1:{free_port()}", "--set", f"admin.http.listener=127.0.0.1:{free_port()}",
                           "--set", f"admin.http.ssl.keystore.location={bad}"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0 and "admin.http.ssl.keystore.location" in done.stderr, done.stderr[-2000:]
