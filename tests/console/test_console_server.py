"""`dcmirror console` as a process: HTTPS where the topology gives a keystore (plain HTTP is
then not answered), a console without any login refused on a non-loopback address, and a
clear error for a bad [console] table."""

from __future__ import annotations

import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx

from deploy.certs import issue, make_ca
from tests.harness import REPO, BrokerProcess, free_port


def _topology(root: Path, broker: BrokerProcess, console: str) -> Path:
    path = root / "topology.toml"
    path.write_text(f'[clusters.one]\ndatacenter = "here"\nbrokers = ["{broker.bootstrap}"]\n\n[console]\n{console}\n')
    return path


def _console(config: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "deploy.cli", "console", "--config", str(config), *extra],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_ready(proc: subprocess.Popen[str], timeout_s: float = 60) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if "console ready on" in line:
            return line.strip().rsplit(" ", 1)[1]
    proc.kill()
    raise AssertionError("the console never said it was ready:\n" + "".join(seen))


def test_https_console_and_a_plain_request_is_not_answered(broker: BrokerProcess, tmp_path: Path) -> None:
    ca = make_ca(tmp_path / "ca")
    keystore = issue(ca, tmp_path / "certs", "console")
    port = free_port()
    config = _topology(tmp_path, broker, f'listen = "127.0.0.1:{port}"\nkeystore = "{keystore}"')
    proc = _console(config)
    try:
        url = _wait_ready(proc)
        assert url == f"https://127.0.0.1:{port}/"
        trusted = ssl.create_default_context(cafile=str(ca.cert_path))
        r = httpx.get(url + "healthz", verify=trusted, timeout=10)
        assert r.status_code == 200 and r.text == "ok\n"
        home = httpx.get(url, verify=trusted, timeout=10)
        assert home.status_code == 200 and "Topology map" in home.text  # no login configured: open, loopback
        try:
            plain = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        except httpx.HTTPError:
            pass
        else:
            assert plain.status_code != 200, "plain HTTP answered on the HTTPS port"
    finally:
        proc.terminate()
        proc.wait(30)


def test_an_open_console_is_refused_off_loopback_and_bad_tables_are_named(broker: BrokerProcess,
                                                                          tmp_path: Path) -> None:
    config = _topology(tmp_path, broker, f'listen = "0.0.0.0:{free_port()}"')
    proc = _console(config)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "refusing to serve a console without login on 0.0.0.0" in out, out
    bad = _topology(tmp_path, broker, f'listen = "127.0.0.1:{free_port()}"\nauth_token = "plain-secret"')
    proc = _console(bad)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "console.auth_token" in out and "reference" in out, out
    assert "plain-secret" not in out
