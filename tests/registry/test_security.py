"""`dcmirror registry --config FILE --cluster NAME` with the topology's
[clusters.NAME.registry]: a bearer token and basic-auth users (Confluent's clients'
`basic.auth.user.info`), secrets from the environment and a file, never in the log."""

from __future__ import annotations

import ssl
import textwrap
from pathlib import Path

import httpx
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from deploy.certs import issue, make_ca
from tests.harness import BrokerProcess, free_port
from tests.registry.common import RegistryProcess

TOKEN = "tok-3f9a1c77e2"
PASSWORD = "pw-81d0b6c4"



def test_token_and_basic_auth_from_the_topology(broker: BrokerProcess, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    users = tmp_path / "registry-users.properties"
    users.write_text(f"# registry users\nalice: {PASSWORD},admin\n")
    port = free_port()
    topology = tmp_path / "topology.toml"
    topology.write_text(textwrap.dedent(f"""
        [clusters.east]
        datacenter = "east"
        brokers = ["{broker.bootstrap}"]
        data_dir = "{tmp_path / 'data-east'}"

        [clusters.east.registry]
        listen = "127.0.0.1:{port}"
        auth_token = "${{env:REGISTRY_TOKEN}}"
        basic_auth_users = "{users.name}"
        """))
    reg = RegistryProcess(tmp_path / "registry.log", config=(topology, "east"), port=port,
                          env={"REGISTRY_TOKEN": TOKEN}).start()
    try:
        url = f"http://127.0.0.1:{port}"
        r = httpx.get(f"{url}/subjects")
        assert r.status_code == 401 and r.json()["error_code"] == 401
        assert httpx.get(f"{url}/subjects", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(f"{url}/subjects", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        assert httpx.get(f"{url}/subjects", auth=("alice", "nope")).status_code == 401
        assert httpx.get(f"{url}/subjects", auth=("alice", PASSWORD)).status_code == 200
        sr = SchemaRegistryClient({"url": url, "basic.auth.user.info": f"alice:{PASSWORD}"})
        schema_id = sr.register_schema("sec-value", Schema('{"type": "string"}', "AVRO"))
        assert sr.get_schema(schema_id).schema_str == '{"type": "string"}'
        with pytest.raises(SchemaRegistryError) as info:
            SchemaRegistryClient({"url": url, "basic.auth.user.info": "alice:bad"}).get_subjects()
        assert info.value.http_status_code == 401
        _the_warehouse_loader_authenticates(topology, schema_id, monkeypatch)
    finally:
        reg.stop()
    log = reg.log_text()
    assert TOKEN not in log and PASSWORD not in log


def _the_warehouse_loader_authenticates(topology: Path, schema_id: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The typed loads' registry reader (spark_aggregate/typed.py) with the topology's token,
    then with the warehouse's `registry.basic.auth.user.info` reference, and refused without."""
    from spark_aggregate.settings import WarehouseSettings
    from spark_aggregate.typed import NO_ACCESS, RegistryReader, SchemaError
    from topology import load

    base = topology.read_text()
    monkeypatch.setenv("REGISTRY_TOKEN", TOKEN)
    monkeypatch.setenv("WAREHOUSE_REGISTRY_USER", f"alice:{PASSWORD}")
    for config in ("", '\n[warehouse.config]\n"registry.basic.auth.user.info" = "${env:WAREHOUSE_REGISTRY_USER}"\n'):
        topology.write_text(base + '\n[warehouse]\nsource = "east"\n' + config)
        settings = WarehouseSettings.from_topology(load(topology))
        assert settings.registry_url is not None
        assert PASSWORD not in repr(settings) and TOKEN not in repr(settings)
        reader = RegistryReader(settings.registry_url, settings.registry_access)
        assert reader.schema_by_id(schema_id, "") == ("AVRO", '{"type": "string"}')
        assert reader.latest("sec-value", "") == (schema_id, "AVRO", '{"type": "string"}')
    with pytest.raises(SchemaError, match="HTTP 401") as refused:
        RegistryReader(settings.registry_url, NO_ACCESS).schema_by_id(schema_id, "")
    assert PASSWORD not in str(refused.value) and TOKEN not in str(refused.value)
    topology.write_text(base)


def test_https_from_the_topology_keystore(broker: BrokerProcess, tmp_path: Path) -> None:
    ca = make_ca(tmp_path / "ca")
    keystore = issue(ca, tmp_path / "certs", "registry")
    port = free_port()
    topology = tmp_path / "topology.toml"
    topology.write_text(textwrap.dedent(f"""
        [clusters.east]
        datacenter = "east"
        brokers = ["{broker.bootstrap}"]
        data_dir = "{tmp_path / 'data-east'}"

        [clusters.east.registry]
        listen = "127.0.0.1:{port}"
        keystore = "{keystore}"
        """))
    reg = RegistryProcess(tmp_path / "registry.log", config=(topology, "east"), port=port).start()
    try:
        ctx = ssl.create_default_context(cafile=str(ca.cert_path))
        assert httpx.get(f"https://127.0.0.1:{port}/", verify=ctx, timeout=10).json() == {}
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/", timeout=5)       # plaintext: no answer
        sr = SchemaRegistryClient({"url": f"https://127.0.0.1:{port}", "ssl.ca.location": str(ca.cert_path)})
        assert sr.register_schema("tls-value", Schema('{"type": "long"}', "AVRO")) >= 1
    finally:
        reg.stop()


def test_up_runs_a_registry_per_declared_cluster(tmp_path: Path) -> None:
    from deploy.up_cmd import registry_specs
    from topology import load

    topology = tmp_path / "topology.toml"
    topology.write_text(textwrap.dedent("""
        [clusters.east]
        datacenter = "east"
        brokers = ["127.0.0.1:19092"]
        [clusters.east.registry]
        listen = "127.0.0.1:18081"
        [clusters.west]
        datacenter = "west"
        brokers = ["127.0.0.1:29092"]
        """))
    specs = registry_specs(load(topology), str(topology))
    assert [s.name for s in specs] == ["registry east"]
    assert list(specs[0].argv[-5:]) == ["registry", "--config", str(topology), "--cluster", "east"]
