"""`dcmirror deploy render`: systemd units and Kubernetes manifests of the default topology
(exact files, objects and commands), parsed back (configparser, PyYAML, the topology
loader, systemd-analyze when present); the writers' round trips."""

from __future__ import annotations

import configparser
import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from deploy.dev_secrets import dev_secrets
from deploy.render import kubernetes, systemd
from deploy.render.toml_out import dump_topology
from deploy.render.yaml_out import dump
from mirror.worker import MirrorWorker
from tests.harness import REPO
from topology import default_topology_text, load, load_default, loads

DCMIRROR_BIN = str(Path(sys.executable).parent / "dcmirror")


def render(config: Path, fmt: str, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deploy.cli", "deploy", "render", "--config", str(config),
                           "--format", fmt, "--out", str(out), *extra], cwd=REPO, capture_output=True, text=True,
                          timeout=60)


def without_registries(text: str) -> str:
    """The default topology without its [clusters.NAME.registry] tables."""
    out = re.sub(r'\n\[clusters\.\w+\.registry\][^\n]*\nlisten = "[^"]*"[^\n]*\n', "\n", text)
    assert "registry]" not in out.replace("[clusters.NAME.registry]", "")
    return out


def default_file(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "topology.toml"
    path.write_text((without_registries(default_topology_text()) if "registry]" in extra else default_topology_text())
                    + extra)
    dev_secrets(path)  # the CA, certificates and passwords it references
    return path


def unit(path: Path) -> configparser.ConfigParser:
    """A unit file read strictly: no duplicate sections or keys, keys case-sensitive."""
    parser = configparser.ConfigParser(strict=True, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(path.read_text())
    return parser


def env_file(path: Path) -> dict[str, str]:
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


# ---- systemd -----------------------------------------------------------------------------


def test_systemd_units_of_the_default_topology(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = render(default_file(tmp_path), "systemd", out, "--bin", DCMIRROR_BIN, "--data-root", "/srv/dcm")
    assert proc.returncode == 0, proc.stderr
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    brokers = [f"{c}-{n}" for c in ("aggregate", "east", "west") for n in (1, 2, 3)]
    mirrors = [f"{f}-to-aggregate-{i}" for f in ("east", "west") for i in (0, 1)]
    clusters = ("east", "west", "aggregate")
    assert files == sorted(
        ["README.txt", "etc/dcmirror/topology.toml", "systemd/dcmirror-broker@.service",
         "systemd/dcmirror-mirror@.service", "systemd/dcmirror-load.service", "systemd/dcmirror-load.timer",
         "systemd/dcmirror-registry@.service", "systemd/dcmirror-console.service",
         "systemd/dcmirror-warehouse.service",
         "monitoring/prometheus.yml", "monitoring/dcmirror-rules.yml", "monitoring/grafana-dashboard.json",
         "systemd/dcmirror.target"]
        + [f"etc/dcmirror/broker/{b}.env" for b in brokers] + [f"etc/dcmirror/mirror/{m}.env" for m in mirrors]
        + [f"etc/dcmirror/registry/{c}.env" for c in clusters]
        + [f"systemd/dcmirror-registry@{c}.service.d/brokers.conf" for c in clusters])
    # the whole default product: the web console and the warehouse service, which loads use
    console = unit(out / "systemd/dcmirror-console.service")
    assert console["Service"]["ExecStart"] == f"{DCMIRROR_BIN} console --config /etc/dcmirror/topology.toml"
    assert console["Install"]["WantedBy"] == "dcmirror.target"
    warehouse = unit(out / "systemd/dcmirror-warehouse.service")
    assert warehouse["Service"]["ExecStart"] == (
        f"{DCMIRROR_BIN} warehouse serve --config /etc/dcmirror/topology.toml")
    assert warehouse["Service"]["KillSignal"] == "SIGTERM" and warehouse["Service"]["TimeoutStopSec"] == "600"

    broker = unit(out / "systemd/dcmirror-broker@.service")
    assert broker["Service"]["ExecStart"] == (
        f"{DCMIRROR_BIN} broker --config /etc/dcmirror/topology.toml --cluster ${{DCMIRROR_CLUSTER}} "
        "--node ${DCMIRROR_NODE}")
    assert broker["Service"]["EnvironmentFile"] == "/etc/dcmirror/broker/%i.env"
    assert broker["Service"]["TimeoutStopSec"] == "30"  # controlled.shutdown.timeout.ms 10 s + margin
    assert broker["Install"]["WantedBy"] == "dcmirror.target"
    mirror = unit(out / "systemd/dcmirror-mirror@.service")
    assert mirror["Service"]["ExecStart"] == (
        f"{DCMIRROR_BIN} mirror --config /etc/dcmirror/topology.toml --flow ${{DCMIRROR_FLOW}} "
        "--worker ${DCMIRROR_WORKER}")
    assert mirror["Service"]["EnvironmentFile"] == "/etc/dcmirror/mirror/%i.env"
    load_service = unit(out / "systemd/dcmirror-load.service")
    assert load_service["Unit"]["After"] == "network-online.target dcmirror-warehouse.service"
    assert dict(load_service["Service"]) == {
        "Type": "oneshot", "ExecStart": f"{DCMIRROR_BIN} load --config /etc/dcmirror/topology.toml",
        "User": "dcmirror", "Group": "dcmirror", "Environment": "PYTHONUNBUFFERED=1",
        "StateDirectory": "dcmirror", "LimitNOFILE": "100000"}
    timer = unit(out / "systemd/dcmirror-load.timer")
    assert dict(timer["Timer"]) == {"OnCalendar": "hourly", "Persistent": "true", "Unit": "dcmirror-load.service"}
    unit(out / "systemd/dcmirror.target")

    # `systemctl start dcmirror-broker@east-2` runs node 2 of east.
    assert env_file(out / "etc/dcmirror/broker/east-2.env") == {"DCMIRROR_CLUSTER": "east", "DCMIRROR_NODE": "2"}
    assert env_file(out / "etc/dcmirror/mirror/west-to-aggregate-1.env") == {
        "DCMIRROR_FLOW": "west-to-aggregate", "DCMIRROR_WORKER": "1"}
    # The hosts' topology: the same clusters and flows, data under --data-root.
    hosts = load(out / "etc/dcmirror/topology.toml", check_files=False)
    assert {n: str(c.data_dir) for n, c in hosts.clusters.items()} == {
        "east": "/srv/dcm/data/east", "west": "/srv/dcm/data/west", "aggregate": "/srv/dcm/data/aggregate"}
    assert hosts.warehouse is not None and str(hosts.warehouse.path) == "/srv/dcm/warehouse"
    assert hosts.cluster("east").bootstrap("BROKER") == "127.0.0.1:19092,127.0.0.1:19093,127.0.0.1:19094"
    assert hosts.cluster("east").bootstrap() == "127.0.0.1:19095,127.0.0.1:19096,127.0.0.1:19097"  # EXTERNAL
    assert [(m.name, m.workers) for m in hosts.mirrors] == [("east-to-aggregate", 2), ("west-to-aggregate", 2)]
    readme = (out / "README.txt").read_text()
    # Secrets: the hosts' topology names them under /etc/dcmirror/secrets; the README says which
    # file goes there (only paths, never contents)
    assert hosts.cluster("east").config["ssl.keystore.location"] == "/etc/dcmirror/secrets/broker.pem"
    assert hosts.cluster("east").client["sasl.password"] == "${file:/etc/dcmirror/secrets/passwords.properties:admin}"
    assert (f"install -m 0640 -o root -g dcmirror {tmp_path}/secrets/broker.pem /etc/dcmirror/secrets/broker.pem"
            in readme)
    passwords = (tmp_path / "secrets" / "passwords.properties").read_text().splitlines()
    rendered = "".join(p.read_text() for p in out.rglob("*") if p.is_file())
    assert passwords and all(line.split("=", 1)[1] not in rendered for line in passwords)
    assert all(f"systemctl enable --now dcmirror-broker@{b} " in readme for b in brokers)
    assert "systemctl enable --now dcmirror-console " in readme and "systemctl enable --now dcmirror-warehouse " in readme

    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed: the units were parsed, not verified by systemd")
    units = sorted(str(p) for p in (out / "systemd").iterdir() if p.is_file())  # not the drop-in directories
    check = subprocess.run([analyze, "verify", "--man=no", *units], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and not check.stderr.strip(), check.stderr


def test_load_timer_follows_load_interval(tmp_path: Path) -> None:
    text = default_topology_text().replace('"load.service" = "true"', '"load.interval.ms" = %s\n"load.service" = "true"')
    assert "%s" in text
    every = tmp_path / "every"
    every.mkdir()
    (every / "t.toml").write_text(text % "900000")
    files = systemd.render(load(every / "t.toml", check_files=False), systemd.SystemdOptions())
    timer = files["systemd/dcmirror-load.timer"]
    assert "OnBootSec=900s\nOnUnitActiveSec=900s\n" in timer and "OnCalendar" not in timer
    objects = kubernetes.render(load(every / "t.toml", check_files=False), kubernetes.KubernetesOptions())
    command = objects["deployment-dcmirror-warehouse.yaml"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[-2:] == ["--load-interval-ms", "900000"]
    (every / "plain.toml").write_text((text % "900000").replace('"load.service" = "true"', ""))
    objects = kubernetes.render(load(every / "plain.toml", check_files=False), kubernetes.KubernetesOptions())
    assert objects["cronjob-dcmirror-load.yaml"]["spec"]["schedule"] == "*/15 * * * *"

    never = tmp_path / "never"
    never.mkdir()
    (never / "t.toml").write_text(text % "0")
    files = systemd.render(load(never / "t.toml", check_files=False), systemd.SystemdOptions())
    assert "systemd/dcmirror-load.timer" not in files and "systemd/dcmirror-load.service" in files
    objects = kubernetes.render(load(never / "t.toml", check_files=False), kubernetes.KubernetesOptions())
    assert "cronjob-dcmirror-load.yaml" not in objects
    command = objects["deployment-dcmirror-warehouse.yaml"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--load-interval-ms" not in command  # it serves queries, loads only when asked


def test_cron_schedules() -> None:
    assert [kubernetes.cron_schedule(ms) for ms in (None, 1000, 60_000, 300_000, 420_000, 3_600_000, 7_200_000,
                                                     5 * 3_600_000, 86_400_000)] == [
        "0 * * * *", "* * * * *", "* * * * *", "*/5 * * * *", "*/10 * * * *", "0 * * * *", "0 */2 * * *",
        "0 */6 * * *", "0 0 * * *"]


# ---- Kubernetes --------------------------------------------------------------------------


def objects_in(out: Path) -> dict[str, dict[str, Any]]:
    docs = {}
    for path in sorted(out.glob("*.yaml")):
        loaded = list(yaml.safe_load_all(path.read_text()))
        assert len(loaded) == 1, path
        docs[path.name] = loaded[0]
    return docs


def test_kubernetes_manifests_of_the_default_topology(tmp_path: Path) -> None:
    out = tmp_path / "k8s"
    proc = render(default_file(tmp_path), "kubernetes", out, "--namespace", "dcm", "--image", "reg/dcmirror:1.0")
    assert proc.returncode == 0, proc.stderr
    docs = objects_in(out)
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in docs.values())
    assert kinds == sorted(
        [("ConfigMap", "dcmirror-topology"), ("Deployment", "dcmirror-warehouse"),
         ("PersistentVolumeClaim", "dcmirror-warehouse"),
         ("StatefulSet", "mirror-east-to-aggregate"), ("StatefulSet", "mirror-west-to-aggregate"),
         ("Service", "mirror-east-to-aggregate"), ("Service", "mirror-west-to-aggregate"),
         ("Deployment", "dcmirror-console"), ("Service", "dcmirror-console")]
        + [(k, f"{c}-registry") for c in ("east", "west", "aggregate") for k in ("StatefulSet", "Service")]
        + [(k, c) for c in ("east", "west", "aggregate") for k in ("StatefulSet", "PodDisruptionBudget")]
        + [("Service", f"{c}-svc") for c in ("east", "west", "aggregate")] + [("Secret", "dcmirror-secrets")])
    assert {d["metadata"]["namespace"] for d in docs.values()} == {"dcm"}
    # Secrets: the files the topology references become keys of one Secret, mounted read-only in
    # every pod; the rendered topology points there; no secret content is rendered.
    secret = docs["secret-dcmirror-secrets.yaml"]
    assert secret["stringData"] == {"broker.pem": "", "ca.pem": "", "passwords.properties": ""}
    assert secret["metadata"]["annotations"]["dcmirror/file.broker.pem"] == str(tmp_path / "secrets" / "broker.pem")
    assert "--from-file=passwords.properties=" in secret["metadata"]["annotations"]["dcmirror/fill-with"]
    secured = loads(docs["configmap-dcmirror-topology.yaml"]["data"]["topology.toml"], check_files=False)
    assert secured.cluster("east").config["ssl.keystore.location"] == "/etc/dcmirror-secrets/broker.pem"
    assert secured.cluster("east").users["mirror"] == "${file:/etc/dcmirror-secrets/passwords.properties:mirror}"
    assert secured.mirrors[0].config["source.sasl.password"] == \
        "${file:/etc/dcmirror-secrets/passwords.properties:mirror}"
    for name in ("statefulset-east.yaml", "statefulset-mirror-east-to-aggregate.yaml"):
        pod = docs[name]["spec"]["template"]["spec"]
        assert {"name": "secrets", "secret": {"secretName": "dcmirror-secrets", "defaultMode": 0o440}} in pod["volumes"]
        assert {"name": "secrets", "mountPath": "/etc/dcmirror-secrets", "readOnly": True} in \
            pod["containers"][0]["volumeMounts"]
    passwords = (tmp_path / "secrets" / "passwords.properties").read_text().splitlines()
    rendered = "".join(p.read_text() for p in out.rglob("*") if p.is_file())
    assert passwords and all(line.split("=", 1)[1] not in rendered for line in passwords)

    for cluster in ("east", "west", "aggregate"):
        sts = docs[f"statefulset-{cluster}.yaml"]
        svc = docs[f"service-{cluster}-svc.yaml"]
        spec = sts["spec"]
        assert (spec["replicas"], spec["serviceName"], spec["podManagementPolicy"]) == (3, f"{cluster}-svc",
                                                                                          "Parallel")
        (container,) = spec["template"]["spec"]["containers"]
        assert container["image"] == "reg/dcmirror:1.0"
        assert container["command"] == ["sh", "-c", f"exec dcmirror broker --config /etc/dcmirror/topology.toml "
                                                    f"--cluster {cluster} --node $(( ${{HOSTNAME##*-}} + 1 ))"]
        assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        # EXTERNAL on the next port; LOCAL stays on the pod's loopback, not a container port
        assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"kafka": 9092, "external": 9093,
                                                                                "http": 9644}
        assert [v["metadata"]["name"] for v in spec["volumeClaimTemplates"]] == ["data"]
        assert {m["name"]: m["mountPath"] for m in container["volumeMounts"]} == {
            "data": "/var/lib/dcmirror", "topology": "/etc/dcmirror", "secrets": "/etc/dcmirror-secrets"}
        assert spec["selector"]["matchLabels"] == spec["template"]["metadata"]["labels"]
        assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
        assert set(svc["spec"]["selector"].items()) <= set(spec["template"]["metadata"]["labels"].items())
    # The pod's ordinal picks the node: east-2 is node 3.
    command = docs["statefulset-east.yaml"]["spec"]["template"]["spec"]["containers"][0]["command"]
    shown = subprocess.run(["sh", "-c", command[2].replace("exec dcmirror", "echo")], capture_output=True,
                           text=True, env={"HOSTNAME": "east-2"}, timeout=10)
    assert shown.stdout.split() == ["broker", "--config", "/etc/dcmirror/topology.toml", "--cluster", "east",
                                    "--node", "3"]

    for flow in ("east-to-aggregate", "west-to-aggregate"):
        sts = docs[f"statefulset-mirror-{flow}.yaml"]["spec"]
        assert (sts["replicas"], sts["serviceName"]) == (2, f"mirror-{flow}")
        (container,) = sts["template"]["spec"]["containers"]
        # pod mirror-FLOW-i is worker i (its ordinal), with its admin HTTP at its DNS name
        assert container["command"] == ["dcmirror", "mirror", "--config", "/etc/dcmirror/topology.toml",
                                        "--flow", flow, "--worker", "hostname"]
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        svc = docs[f"service-mirror-{flow}.yaml"]["spec"]
        assert svc["clusterIP"] == "None" and svc["selector"] == sts["template"]["metadata"]["labels"]
        shown = subprocess.run([sys.executable, "-c", "from deploy.mirror_cmd import worker_index; "
                                "print(worker_index('hostname'))"], cwd=REPO, capture_output=True, text=True,
                               env={**os.environ, "HOSTNAME": f"mirror-{flow}-1"}, timeout=30)
        assert shown.stdout.strip() == "1", shown.stderr
    # The default's warehouse service (load.service): one pod on the warehouse volume that
    # loads hourly itself (a CronJob's pod could not reach its socket nor share the volume).
    warehouse = docs["deployment-dcmirror-warehouse.yaml"]["spec"]
    assert (warehouse["replicas"], warehouse["strategy"]) == (1, {"type": "Recreate"})
    pod = warehouse["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["dcmirror", "warehouse", "serve", "--config", "/etc/dcmirror/topology.toml",
                                    "--load-interval-ms", "3600000"]
    assert container["readinessProbe"]["exec"]["command"] == ["test", "-S", "/var/lib/dcmirror/warehouse/warehouse.sock"]
    assert {m["name"]: m["mountPath"] for m in container["volumeMounts"]} == {
        "warehouse": "/var/lib/dcmirror/warehouse", "topology": "/etc/dcmirror", "secrets": "/etc/dcmirror-secrets"}
    assert {"name": "warehouse", "persistentVolumeClaim": {"claimName": "dcmirror-warehouse"}} in pod["volumes"]
    assert pod["terminationGracePeriodSeconds"] == 600
    # Without the service: a CronJob runs each load as its own Spark application.
    without = tmp_path / "without-service.toml"
    without.write_text((tmp_path / "topology.toml").read_text().replace('"load.service" = "true"', ""))
    assert without.read_text() != (tmp_path / "topology.toml").read_text()
    plain = kubernetes.render(load(without, check_files=False), kubernetes.KubernetesOptions())
    assert "deployment-dcmirror-warehouse.yaml" not in plain
    cron = plain["cronjob-dcmirror-load.yaml"]["spec"]
    assert (cron["schedule"], cron["concurrencyPolicy"]) == ("0 * * * *", "Forbid")
    (container,) = cron["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["spark-submit", "--master", "local[2]", "--name", "dcmirror-load",
                                    "/opt/dcmirror/spark_aggregate/job.py", "--config", "/etc/dcmirror/topology.toml"]

    # The topology the pods read: the pods' DNS names, admin HTTP for the probes, data on volumes.
    config_map = docs["configmap-dcmirror-topology.yaml"]
    inside = loads(config_map["data"]["topology.toml"], check_files=False)
    assert inside.cluster("east").bootstrap("BROKER") == ",".join(
        f"east-{i}.east-svc.dcm.svc.cluster.local:9092" for i in range(3))
    assert inside.cluster("east").bootstrap() == ",".join(  # EXTERNAL, the client listener
        f"east-{i}.east-svc.dcm.svc.cluster.local:9093" for i in range(3))
    # the plaintext LOCAL listener stays on each pod's loopback
    assert inside.cluster("west").bootstrap("LOCAL") == "127.2.0.1:9094,127.2.0.2:9094,127.2.0.3:9094"
    assert inside.cluster("aggregate").config["admin.http.listener"] == "0.0.0.0:9644"
    assert str(inside.cluster("west").node_data_dir(2)) == "/var/lib/dcmirror/west/node-2"
    assert inside.warehouse is not None and str(inside.warehouse.path) == "/var/lib/dcmirror/warehouse"
    assert [str(a) for a in inside.mirrors[0].workers_http] == [
        f"mirror-east-to-aggregate-{i}.mirror-east-to-aggregate.dcm.svc.cluster.local:9644" for i in range(2)]
    assert inside.mirrors[0].config["http.host"] == "0.0.0.0"
    assert [(t.cluster, t.name, t.partitions, t.replication_factor) for t in inside.topics] == [
        (t.cluster, t.name, t.partitions, t.replication_factor) for t in load_default().topics]
    console = docs["deployment-dcmirror-console.yaml"]["spec"]
    (container,) = console["template"]["spec"]["containers"]
    assert container["command"] == ["dcmirror", "console", "--config", "/etc/dcmirror/topology.toml",
                                    "--listen", "0.0.0.0:8480"]
    assert {"name": "secrets", "mountPath": "/etc/dcmirror-secrets", "readOnly": True} in container["volumeMounts"]
    assert docs["service-dcmirror-console.yaml"]["spec"]["selector"] == console["template"]["metadata"]["labels"]
    checksum = docs["statefulset-east.yaml"]["spec"]["template"]["metadata"]["annotations"]
    assert checksum == docs["statefulset-mirror-east-to-aggregate.yaml"]["spec"]["template"]["metadata"]["annotations"]


def test_kubernetes_controllers_and_names(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text('[clusters.Edge_1]\ndatacenter = "d"\nbrokers = ["127.0.0.1:9001", "127.0.0.1:9002"]\n'
                    'controllers = ["127.0.0.1:9101", "127.0.0.1:9102", "127.0.0.1:9103"]\n'
                    'config = { "admin.http.port.offset" = 100 }\n')
    objects = kubernetes.render(load(path), kubernetes.KubernetesOptions())
    assert sorted(objects) == ["configmap-dcmirror-topology.yaml", "poddisruptionbudget-edge-1.yaml",
                               "service-edge-1-svc.yaml", "statefulset-edge-1-controller.yaml",
                               "statefulset-edge-1.yaml"]
    ctl = objects["statefulset-edge-1-controller.yaml"]["spec"]
    assert ctl["replicas"] == 3
    assert ctl["template"]["spec"]["containers"][0]["command"][2].endswith(
        "--cluster Edge_1 --node $(( ${HOSTNAME##*-} + 3 ))")  # controllers are nodes 3, 4, 5
    inside = loads(objects["configmap-dcmirror-topology.yaml"]["data"]["topology.toml"])
    spec = inside.cluster("Edge_1")  # no secrets: no Secret
    assert [str(n) for n in spec.controllers] == [
        f"edge-1-controller-{i}.edge-1-svc.dcmirror.svc.cluster.local:9092" for i in range(3)]
    assert spec.config == {"admin.http.listener": "0.0.0.0:9644"}  # the offset would clash with it

    bad = tmp_path / "bad.toml"
    bad.write_text('[clusters.a_b]\ndatacenter = "d"\nbrokers = ["127.0.0.1:9001"]\n'
                   '[clusters."a.b"]\ndatacenter = "d"\nbrokers = ["127.0.0.1:9002"]\n')
    proc = render(bad, "kubernetes", tmp_path / "out")
    assert proc.returncode == 2
    assert "clusters 'a_b' and 'a.b' both become 'a-b' in Kubernetes" in proc.stderr
    digit = tmp_path / "digit.toml"
    digit.write_text('[clusters.1east]\ndatacenter = "d"\nbrokers = ["127.0.0.1:9001"]\n')
    proc = render(digit, "kubernetes", tmp_path / "out")
    assert proc.returncode == 2 and "must start with a letter" in proc.stderr


# ---- schema registries -------------------------------------------------------------------

REGISTRIES = """
[clusters.aggregate.registry]
listen = "127.0.0.1:18083"
auth_token = "${file:secrets/passwords.properties:admin}"
basic_auth_users = "secrets/registry-users.properties"
keystore = "secrets/broker.pem"

[clusters.east.registry]
listen = "127.0.0.1:18081"
auth_token = "${env:EAST_REGISTRY_TOKEN}"
"""


def registry_file(tmp_path: Path) -> Path:
    path = default_file(tmp_path, REGISTRIES)
    (tmp_path / "secrets" / "registry-users.properties").write_text("reader: users-file-secret\n")
    return path


def not_rendered(tmp_path: Path, out: Path) -> None:
    """No secret value (passwords, the users file's) appears in any rendered file."""
    values = [line.split("=", 1)[1] for line in (tmp_path / "secrets" / "passwords.properties").read_text().splitlines()]
    rendered = "".join(p.read_text() for p in out.rglob("*") if p.is_file())
    assert values and all(v not in rendered for v in values)
    assert "users-file-secret" not in rendered


def test_systemd_units_of_schema_registries(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = render(registry_file(tmp_path), "systemd", out, "--bin", DCMIRROR_BIN)
    assert proc.returncode == 0, proc.stderr
    # Two EnvironmentFile= lines (the instance's, then secrets.env for ${env:...}), which systemd
    # reads both of and a strict configparser refuses: checked as lines.
    text = (out / "systemd/dcmirror-registry@.service").read_text()
    assert [line for line in text.splitlines() if line.startswith("EnvironmentFile=")] == [
        "EnvironmentFile=/etc/dcmirror/registry/%i.env", "EnvironmentFile=/etc/dcmirror/secrets.env"]
    registry = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    registry.optionxform = str  # type: ignore[assignment,method-assign]
    registry.read_string(text)
    assert registry["Service"]["ExecStart"] == (
        f"{DCMIRROR_BIN} registry --config /etc/dcmirror/topology.toml --cluster ${{DCMIRROR_CLUSTER}}")
    assert registry["Unit"]["PartOf"] == "dcmirror.target" and registry["Install"]["WantedBy"] == "dcmirror.target"
    assert env_file(out / "etc/dcmirror/registry/east.env") == {"DCMIRROR_CLUSTER": "east"}
    assert env_file(out / "etc/dcmirror/registry/aggregate.env") == {"DCMIRROR_CLUSTER": "aggregate"}
    assert not (out / "etc/dcmirror/registry/west.env").exists()
    # After the cluster's own brokers (those on the same host), so also stopped before them.
    after = unit(out / "systemd/dcmirror-registry@east.service.d/brokers.conf")
    assert after["Unit"]["After"] == " ".join(f"dcmirror-broker@east-{n}.service" for n in (1, 2, 3))
    readme = (out / "README.txt").read_text()
    assert "systemctl enable --now dcmirror-registry@east " in readme and "127.0.0.1:18081" in readme
    assert "EAST_REGISTRY_TOKEN=" in (out / "etc/dcmirror/secrets.env.example").read_text()
    # The hosts' topology: the registries with their references and files under the secrets directory.
    hosts = load(out / "etc/dcmirror/topology.toml", check_files=False)
    east, aggregate = hosts.cluster("east").registry, hosts.cluster("aggregate").registry
    assert east is not None and aggregate is not None and hosts.cluster("west").registry is None
    assert (str(east.listen), east.auth_token) == ("127.0.0.1:18081", "${env:EAST_REGISTRY_TOKEN}")
    assert aggregate.auth_token == "${file:/etc/dcmirror/secrets/passwords.properties:admin}"
    assert aggregate.basic_auth_users == "/etc/dcmirror/secrets/registry-users.properties"
    assert aggregate.keystore == "/etc/dcmirror/secrets/broker.pem"
    assert (f"install -m 0640 -o root -g dcmirror {tmp_path}/secrets/registry-users.properties "
            "/etc/dcmirror/secrets/registry-users.properties") in readme
    not_rendered(tmp_path, out)

    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed: the units were parsed, not verified by systemd")
    units = [str(out / "systemd/dcmirror-registry@.service")]
    check = subprocess.run([analyze, "verify", "--man=no", *units], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and not check.stderr.strip(), check.stderr


def test_kubernetes_manifests_of_schema_registries(tmp_path: Path) -> None:
    out = tmp_path / "k8s"
    proc = render(registry_file(tmp_path), "kubernetes", out, "--namespace", "dcm")
    assert proc.returncode == 0, proc.stderr
    docs = objects_in(out)
    for cluster in ("east", "aggregate"):
        sts, svc = docs[f"statefulset-{cluster}-registry.yaml"], docs[f"service-{cluster}-registry.yaml"]
        assert (sts["spec"]["serviceName"], sts["spec"]["replicas"]) == (f"{cluster}-registry", 2)
        assert "volumeClaimTemplates" not in sts["spec"]  # the schemas are in the cluster's _schemas topic
        pod = sts["spec"]["template"]["spec"]
        container = pod["containers"][0]
        scheme = "https" if cluster == "aggregate" else "http"
        assert container["command"] == ["sh", "-c", (
            f"exec dcmirror registry --config /etc/dcmirror/topology.toml --cluster {cluster} "
            f"--listen 0.0.0.0:8081 --advertised-url {scheme}://${{HOSTNAME}}.{cluster}-registry.dcm.svc.cluster.local:8081")]
        assert container["ports"] == [{"name": "registry", "containerPort": 8081}]
        assert svc["spec"]["clusterIP"] == "None"
        assert svc["spec"]["ports"] == [{"name": "registry", "port": 8081, "targetPort": "registry"}]
        assert svc["spec"]["selector"] == sts["spec"]["template"]["metadata"]["labels"]
        # not selected by the brokers' Service or disruption budget
        broker_selector = docs[f"service-{cluster}-svc.yaml"]["spec"]["selector"].items()
        assert not broker_selector <= sts["spec"]["template"]["metadata"]["labels"].items()
        assert {"name": "secrets", "mountPath": "/etc/dcmirror-secrets", "readOnly": True} in container["volumeMounts"]
        if cluster == "east":
            assert {"name": "EAST_REGISTRY_TOKEN", "valueFrom": {"secretKeyRef": {
                "name": "dcmirror-secrets", "key": "env.EAST_REGISTRY_TOKEN"}}} in container["env"]
    assert "statefulset-west-registry.yaml" not in docs
    secret = docs["secret-dcmirror-secrets.yaml"]
    assert secret["stringData"]["registry-users.properties"] == "" and secret["stringData"]["env.EAST_REGISTRY_TOKEN"] == ""
    inside = loads(docs["configmap-dcmirror-topology.yaml"]["data"]["topology.toml"], check_files=False)
    east, aggregate = inside.cluster("east").registry, inside.cluster("aggregate").registry
    assert east is not None and aggregate is not None
    assert east.url == "http://east-registry.dcm.svc.cluster.local:8081"  # what flows and the load reach
    assert aggregate.url == "https://aggregate-registry.dcm.svc.cluster.local:8081"
    assert aggregate.auth_token == "${file:/etc/dcmirror-secrets/passwords.properties:admin}"
    assert aggregate.basic_auth_users == "/etc/dcmirror-secrets/registry-users.properties"
    not_rendered(tmp_path, out)

    clash = tmp_path / "clash.toml"
    clash.write_text('[clusters.a]\ndatacenter = "d"\nbrokers = ["127.0.0.1:9001"]\n'
                     '[clusters.a.registry]\nlisten = "127.0.0.1:8081"\n'
                     '[clusters.a-registry]\ndatacenter = "d"\nbrokers = ["127.0.0.1:9002"]\n')
    proc = render(clash, "kubernetes", tmp_path / "clash-out")
    assert proc.returncode == 2 and "both become 'a-registry'" in proc.stderr


# ---- writers -----------------------------------------------------------------------------


def test_topology_toml_round_trip(tmp_path: Path) -> None:
    text = '''
[clusters."dc.one"]
datacenter = "east"
brokers = ["[::1]:9001", "host-a.example:9002"]
controllers = ["127.0.0.1:9100"]
data_dir = "/abs/one"
config = { "log.retention.ms" = 1000, "auto.create.topics.enable" = false, "x.y" = "a \\"q\\" \\\\ b" }

[clusters.two]
datacenter = "west"
brokers = ["127.0.0.1:9003"]

[clusters.two.registry]
listen = "127.0.0.1:18081"
auth_token = "${file:/etc/s/registry.properties:token}"
keystore = "/etc/s/registry.pem"

[defaults]
partitions = 2
config = { "retention.ms" = "5" }

[[topics]]
cluster = "dc.one"
name = "t.1"
replication_factor = 1
config = { "cleanup.policy" = "compact,delete" }

[[mirrors]]
name = "flow_1"
source = "dc.one"
target = "two"
topics = "t\\\\..*|x"
exclude = "t\\\\.9"
rename = "{source_dc}-{topic}"
workers = 3
groups = "g.*"
config = { "producer.linger.ms" = "10" }

[warehouse]
source = "two"
path = "wh"
config = { "spark.master" = "local[1]" }

[warehouse.registry_schemas]
"t[.]1" = { poison = "fail", key = true }
"x" = {}
'''
    original = loads(text, base_dir=tmp_path)
    assert original.warehouse is not None and original.cluster("two").registry is not None
    assert len(original.warehouse.registry_schemas) == 2
    again = loads(dump_topology(original, "a header"))
    assert dataclasses.replace(again, path=None) == dataclasses.replace(original, path=None)
    default = load_default(tmp_path)
    assert dataclasses.replace(loads(dump_topology(default), check_files=False), path=None) == default


_text = st.text(st.characters(codec="utf-8"), max_size=12)
_scalars = st.none() | st.booleans() | st.integers(-2**63, 2**63) | _text | st.sampled_from(
    ["true", "No", "null", "~", "1e3", "0x1F", "1:20", "- a", "a: b", "#c", "&x", "*y", "!t", "|", ">", "'q'",
     "line\n", "a\nb\n", "a\n\nb\n", " lead\n", "tab\tin\n", "2001-12-14", ".inf", "NaN", "@", "`", "%"])
_docs = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(_text | st.sampled_from(["app.kubernetes.io/name", "on", "1"]), inner,
                                       max_size=4), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_text, _docs, max_size=5))
def test_yaml_writer_round_trips_through_pyyaml(doc: dict[str, Any]) -> None:
    assert yaml.safe_load(dump(doc)) == (doc or None)


def test_mirror_worker_cluster_view() -> None:
    topology = load_default()
    worker = MirrorWorker(topology, topology.mirrors[0], "w0")
    ctype, body = worker.routes()["/v1/cluster"]()
    assert ctype == "application/json"
    assert yaml.safe_load(body) == {
        "flow": "east-to-aggregate", "worker": "w0", "group": "dcmirror.east.aggregate",
        "source": {"cluster": "east", "datacenter": "east", "bootstrap": topology.cluster("east").bootstrap()},
        "target": {"cluster": "aggregate", "datacenter": "central",
                   "bootstrap": topology.cluster("aggregate").bootstrap()},
        "partitions": 0, "lag_records": 0}


def test_registry_advertised_url_reaches_the_election(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rendered registry pods' --advertised-url is what `dcmirror registry` serves with."""
    import argparse

    from deploy import registry_cmd

    parser = argparse.ArgumentParser()
    registry_cmd.add_parser(parser.add_subparsers())
    args = parser.parse_args(["registry", "--bootstrap", "127.0.0.1:9092", "--listen", "0.0.0.0:8081",
                              "--advertised-url", "http://pod-0.r.ns.svc.cluster.local:8081"])
    runs: list[tuple[Any, ...]] = []
    monkeypatch.setattr(registry_cmd.trio, "run", lambda *a: runs.append(a))
    assert args.func(args) == 0
    [(serve, _client, host, port, _security, advertised)] = runs
    assert serve is registry_cmd._serve and (host, port) == ("0.0.0.0", 8081)
    assert advertised == "http://pod-0.r.ns.svc.cluster.local:8081"
