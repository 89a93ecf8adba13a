"""A secured pipeline in the lab, checked on the wire: east and the aggregate in two datacenters
(network namespaces joined by the lab's WAN), brokers with mutual TLS between them, SASL_SSL
for the mirror, which runs in the aggregate's datacenter and reads east across the WAN.
Records carrying a canary are written into east; once the aggregate holds every one exactly
once, the bytes captured on both routers' WAN interfaces (raw packets, an AF_PACKET socket on
wan0 in each router namespace) must show plenty of traffic and not one canary.

The checker is shown to fail: the same pipeline over PLAINTEXT puts the canary on the WAN, and
the plaintext case asserts that the capture finds it there.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from ipaddress import IPv4Network
from pathlib import Path

import pytest

from deploy.certs import issue, make_ca
from deploy.lab.plan import plan_lab
from deploy.lab.run import free_base_network
from tests.harness import free_port
from tests.lab.lab import LabRun, lab_running, skip_unless_lab_possible
from tests.mirror.lab import wait_for
from topology import loads

PREFERRED_BASE = IPv4Network("10.213.0.0/16")
RECORDS = 300
CANARY = b"PLAINTEXT-CANARY-"
PASSWORD = "admin-lab-secret-1"
MIN_WAN_BYTES = 50_000

CAPTURE = """
import socket, sys, time
sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(3))
sock.bind((sys.argv[1], 0))
sock.settimeout(0.2)
stop_at = time.monotonic() + float(sys.argv[3])
with open(sys.argv[2], "wb") as out:
    print("capturing", flush=True)
    while time.monotonic() < stop_at:
        try:
            out.write(sock.recv(65535))
        except socket.timeout:
            pass
        out.flush()
"""


def topology_text(root: Path, secured: bool) -> str:
    ports = [free_port() for _ in range(4)]
    lines = []
    for name, dc, broker, external in (("east", "east", ports[0], ports[1]), ("aggregate", "central", ports[2], ports[3])):
        lines += [f"[clusters.{name}]", f'datacenter = "{dc}"', f'brokers = ["127.0.0.1:{broker}"]']
        if secured:
            lines += [f'listeners = {{ EXTERNAL = ["127.0.0.1:{external}"] }}', 'client_listener = "EXTERNAL"',
                      f'users = {{ admin = "${{file:{root}/passwords.properties:admin}}" }}',
                      "config = { " + ", ".join(f'"{k}" = "{v}"' for k, v in {
                          "listener.security.protocol.map": "BROKER:SSL,EXTERNAL:SASL_SSL",
                          "inter.broker.listener.name": "BROKER", "ssl.client.auth": "required",
                          "listener.name.external.ssl.client.auth": "none",
                          "ssl.keystore.location": f"{root}/certs/broker.pem",
                          "ssl.truststore.location": f"{root}/ca/ca.pem",
                          "ssl.principal.mapping.rules": "RULE:^CN=([^,]*)(,.*)?$/$1/,DEFAULT",
                          "authorizer.class.name": "StandardAuthorizer", "super.users": "User:broker;User:admin",
                          "offsets.topic.replication.factor": "1"}.items()) + " }",
                      'client = { "security.protocol" = "SASL_SSL", "sasl.mechanism" = "SCRAM-SHA-512", '
                      f'"sasl.username" = "admin", "sasl.password" = "${{file:{root}/passwords.properties:admin}}", '
                      f'"ssl.ca.location" = "{root}/ca/ca.pem" }}']
        else:
            lines += ['config = { "offsets.topic.replication.factor" = "1" }']
        lines.append("")
    lines += ["[[topics]]", 'cluster = "east"', 'name = "pv"', "partitions = 2", "replication_factor = 1", "",
              "[[mirrors]]", 'source = "east"', 'target = "aggregate"', 'topics = "pv"',
              'config = { "topic.refresh.ms" = "1000" }', ""]
    return "\n".join(lines)


def client(lab: LabRun, cluster: str, secured: bool, root: Path) -> dict[str, str]:
    conf = {"bootstrap.servers": lab.bootstrap(cluster)}
    if secured:
        conf |= {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "admin",
                 "sasl.password": PASSWORD, "ssl.ca.location": str(root / "ca" / "ca.pem")}
    return conf


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("secured", [True, False], ids=["sasl_ssl", "plaintext-control"])
def test_no_record_value_crosses_the_wan_in_clear(tmp_path: Path, secured: bool) -> None:
    from confluent_kafka import Consumer, Producer

    skip_unless_lab_possible()
    root = tmp_path / "conf"
    root.mkdir()
    text = topology_text(root, secured)
    (root / "topology.toml").write_text(text)
    # A free base (another lab or a route may hold the preferred one), known before the lab
    # starts: the certificate names the addresses it gives.
    base = str(free_base_network(PREFERRED_BASE))
    if secured:
        # the brokers' certificate names the lab addresses they will have (the plan is a pure function)
        plan = plan_lab(loads(text, check_files=False), prefix="dcm-1", base=IPv4Network(base))
        hosts = ("localhost", "127.0.0.1", *(str(h.address) for h in plan.hosts))
        issue(make_ca(root / "ca"), root / "certs", "broker", hosts=hosts)
        (root / "passwords.properties").write_text(f"admin={PASSWORD}\n")
    print(f"lab at {base}, secured={secured}, {RECORDS} records with {CANARY!r}", flush=True)
    with lab_running(root / "topology.toml", tmp_path / "lab", "--base-network", base) as lab:
        routers = [d["router_netns"] for d in lab.state()["plan"]["datacenters"]]
        captures = []
        for i, ns in enumerate(routers):
            out = tmp_path / f"wan-{i}.raw"
            proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", CAPTURE, "wan0", str(out),
                                     "240"], stdout=subprocess.PIPE, text=True)
            assert proc.stdout is not None and proc.stdout.readline().strip() == "capturing"
            captures.append((proc, out))
        try:
            p = Producer({**client(lab, "east", secured, root), "enable.idempotence": True})
            for i in range(RECORDS):
                p.produce("pv", CANARY + str(i).encode(), key=str(i).encode())
            assert p.flush(60) == 0
            c = Consumer({**client(lab, "aggregate", secured, root), "group.id": "check",
                          "auto.offset.reset": "earliest"})
            c.subscribe(["east.pv"])
            got: list[bytes] = []

            def all_mirrored() -> bool:  # whatever has arrived, not one record per wait_for interval
                got.extend(m.value() for m in c.consume(1000, timeout=0.5)
                           if m.error() is None and m.value() is not None and m.value().startswith(CANARY))
                return len(got) >= RECORDS

            wait_for(all_mirrored, 180, f"{RECORDS} records in the aggregate", on_timeout=lab.log)
            c.close()
            assert sorted(got) == sorted(CANARY + str(i).encode() for i in range(RECORDS))
            time.sleep(1)  # the last replication and commit packets
            # (the mirror's traffic is there by now; a slow capture may still be writing it)
            wait_for(lambda: sum(out.stat().st_size for _, out in captures) >= MIN_WAN_BYTES, 60,
                     f"{MIN_WAN_BYTES} bytes captured on the WAN")
        finally:
            for proc, _ in captures:
                proc.terminate()
                proc.wait(10)
        wire = b"".join(out.read_bytes() for _, out in captures)
        found = wire.count(CANARY)
        print(json.dumps({"secured": secured, "wan_bytes": len(wire), "canaries_on_the_wan": found}), flush=True)
        assert len(wire) >= MIN_WAN_BYTES, f"the capture saw only {len(wire)} bytes: it did not see the mirror"
        if secured:
            assert found == 0, f"{found} record values crossed the WAN in clear text"
        else:
            assert found >= RECORDS, f"the control run should show every record on the WAN, saw {found}"
