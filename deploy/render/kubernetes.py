"""Kubernetes manifests for a topology.

Per cluster: a headless Service `NAME-svc` and a StatefulSet `NAME` (replicas = brokers;
pod `NAME-i` is node i+1), plus `NAME-controller` for dedicated controllers and a
PodDisruptionBudget; per cluster with a [clusters.NAME.registry] a StatefulSet `NAME-registry`
(REGISTRY_REPLICAS instances, no volumes) and its headless Service; per mirror flow a StatefulSet `mirror-FLOW` (replicas = workers) and
its headless Service; for
the warehouse a CronJob `dcmirror-load` running spark-submit and a PersistentVolumeClaim;
and the ConfigMap `dcmirror-topology` every pod mounts at /etc/dcmirror.

Addresses: the topology's loopback addresses mean nothing inside Kubernetes, so the
ConfigMap holds a copy of the topology in which node i of cluster NAME is
`NAME-(i-1).NAME-svc.NAMESPACE.svc.CLUSTER_DOMAIN:9092` — the stable DNS name the
StatefulSet gives its pod. The Service publishes addresses of pods that are not ready yet
(the quorum must form before any broker is ready), brokers serve admin HTTP on 0.0.0.0:9644
(admin.http.listener) for the readiness probe on /healthz, and data directories sit on each
pod's volume at /var/lib/dcmirror. Brokers are reachable inside the Kubernetes cluster only
(they advertise those names).

The image (--image) needs `dcmirror` on PATH, the project's source at /opt/dcmirror (the
load's spark-submit application is /opt/dcmirror/spark_aggregate/job.py, --load-app), and
Java with pyspark for the load. Pod mirror-FLOW-i runs worker i of its flow (`--worker
hostname`): a stable identity in heartbeats and status, and admin HTTP on 0.0.0.0:9644 at
the pod's DNS name, which the ConfigMap's topology lists as the flow's `workers_http`, so
`dcmirror status` works from any pod; the flow's consumer group splits the partitions.

Schema registries keep their state in the cluster's `_schemas` topic; their instances elect a
primary through the cluster (a consumer group) and forward writes to it. The ConfigMap's
topology gives each registry the address `NAME-registry.NAMESPACE.svc.CLUSTER_DOMAIN:8081`
(the headless Service: its ready pods), which the mirror flows and the load reach it by; pod
NAME-registry-i serves on 0.0.0.0:8081 and advertises its own DNS name to the election. A
registry with a keystore needs a certificate for both names
(`NAME-registry.NAMESPACE.svc...` and `*.NAME-registry.NAMESPACE.svc...`).

A topology with a [console] gets a Deployment `dcmirror-console` (one pod, on 0.0.0.0:8480)
and its Service, reachable inside the Kubernetes cluster (expose it with an Ingress of your
own). With the warehouse service (load.service = "true") the warehouse is a Deployment
`dcmirror-warehouse` instead of the CronJob: one pod on the volume, one Spark session, loading
every load.interval.ms itself (`dcmirror warehouse serve --load-interval-ms`); query it with
`kubectl exec deploy/dcmirror-warehouse -- dcmirror warehouse sql --config
/etc/dcmirror/topology.toml "..."`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.broker.config import BrokerConfig
from deploy.render.secrets import SecretFiles, relocate_secrets
from deploy.render.toml_out import dump_topology
from topology.model import ClusterSpec, NodeAddress, RegistrySpec, Topology

CONFIG_MAP = "dcmirror-topology"
CONFIG_DIR = "/etc/dcmirror"
TOPOLOGY_FILE = f"{CONFIG_DIR}/topology.toml"
SECRET = "dcmirror-secrets"
SECRETS_DIR = "/etc/dcmirror-secrets"  # not inside the ConfigMap's read-only mount
DATA_DIR = "/var/lib/dcmirror"
WAREHOUSE_DIR = f"{DATA_DIR}/warehouse"
WAREHOUSE_CLAIM = "dcmirror-warehouse"
LOAD_JOB = "dcmirror-load"
# A StatefulSet's pods carry a controller-revision-hash label of <name>-<pod>-<hash>; Kubernetes
# advises names of at most 52 characters.
MAX_STATEFULSET_NAME = 52
MAX_NAME = 63
MIRROR_STOP_S = 100
REGISTRY_STOP_S = 30
REGISTRY_REPLICAS = 2  # one primary, one standby that forwards writes and takes over in about 6 s
STOP_MARGIN_S = 20
_DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


class RenderError(ValueError):
    """The topology cannot be rendered as asked (names Kubernetes refuses, ...)."""


@dataclass(frozen=True)
class KubernetesOptions:
    namespace: str = "dcmirror"
    image: str = "dcmirror:latest"
    cluster_domain: str = "cluster.local"
    storage: str = "10Gi"
    warehouse_storage: str = "50Gi"
    kafka_port: int = 9092
    http_port: int = 9644
    registry_port: int = 8081
    console_port: int = 8480
    # The warehouse load as a spark-submit application (spark_aggregate's entry script in
    # the image); `dcmirror load --config FILE` runs the same job without spark-submit.
    load_app: str = "/opt/dcmirror/spark_aggregate/job.py"
    spark_submit: str = "spark-submit"


def k8s_name(name: str, what: str, max_len: int = MAX_NAME) -> str:
    """`name` as a DNS label (lowercase, '.' and '_' turned into '-'); refuses what stays invalid."""
    out = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", name.lower())).strip("-")
    if not _DNS_LABEL.fullmatch(out) or len(out) > max_len:
        raise RenderError(f"{what} {name!r} gives the Kubernetes name {out!r}, which must start with a letter "
                          f"and have at most {max_len} lowercase letters, digits and '-'; rename it")
    return out


@dataclass(frozen=True)
class ClusterNames:
    statefulset: str
    controllers: str
    service: str

    @property
    def registry(self) -> str:
        """The StatefulSet and headless Service of the cluster's schema registry."""
        return f"{self.statefulset}-registry"


def cluster_names(topology: Topology) -> dict[str, ClusterNames]:
    names: dict[str, ClusterNames] = {}
    seen: dict[str, str] = {}
    for name in topology.clusters:
        base = k8s_name(name, "cluster name", MAX_STATEFULSET_NAME - len("-controller"))
        if base in seen:
            raise RenderError(f"clusters {seen[base]!r} and {name!r} both become {base!r} in Kubernetes; "
                              "rename one")
        seen[base] = name
        names[name] = ClusterNames(base, f"{base}-controller", f"{base}-svc")
    return names


def pod_address(names: ClusterNames, spec: ClusterSpec, node: NodeAddress, o: KubernetesOptions) -> str:
    if node in spec.controllers:
        pod = f"{names.controllers}-{node.node_id - len(spec.brokers) - 1}"
    else:
        pod = f"{names.statefulset}-{node.node_id - 1}"
    return f"{pod}.{names.service}.{o.namespace}.svc.{o.cluster_domain}"


def listener_ports(spec: ClusterSpec, o: KubernetesOptions) -> dict[str, int]:
    """The container port of each more listener of a cluster's brokers: the Kafka port + 1, + 2, ..."""
    return {listener: o.kafka_port + 1 + i for i, listener in enumerate(spec.listeners)}


def exposed_ports(spec: ClusterSpec, o: KubernetesOptions) -> dict[str, int]:
    """The ports of the listeners other pods reach (not the loopback ones)."""
    return {listener: port for listener, port in listener_ports(spec, o).items() if not spec.is_host_local(listener)}


def _port_name(listener: str) -> str:
    """A Kubernetes port name (at most 15 lowercase letters, digits, '-')."""
    return listener.lower().replace("_", "-")[:15].strip("-") or "listener"


def cluster_topology(topology: Topology, o: KubernetesOptions) -> Topology:
    """The topology as the pods see it: DNS names of the StatefulSets' pods, data on the pods'
    volumes, admin HTTP on every broker, the warehouse on its volume."""
    names = cluster_names(topology)
    clusters = {}
    for index, (name, spec) in enumerate(topology.clusters.items()):
        def moved(nodes: tuple[NodeAddress, ...], spec: ClusterSpec = spec, n: ClusterNames = names[name],
                  port: int = o.kafka_port) -> tuple[NodeAddress, ...]:
            return tuple(NodeAddress(a.node_id, pod_address(n, spec, a, o), port) for a in nodes)

        config = {k: v for k, v in spec.config.items() if k != "admin.http.port.offset"}
        config["admin.http.listener"] = f"0.0.0.0:{o.http_port}"
        # More listeners: the pod's DNS name, ports after the Kafka port (listener_ports);
        # host-local ones stay on the pod's loopback (containers of the same pod only), at
        # 127.<cluster>.<node id> so that each broker's address is its own in the file.
        ports = listener_ports(spec, o)
        listeners = {listener: tuple(NodeAddress(a.node_id, f"127.{1 + index}.{a.node_id // 256}.{a.node_id % 256}",
                                                 ports[listener]) for a in addresses)
                     if spec.is_host_local(listener) else moved(addresses, port=ports[listener])
                     for listener, addresses in spec.listeners.items()}
        registry = spec.registry
        if registry is not None:  # clients reach the registry's ready pods through its headless Service
            registry = dataclasses.replace(registry, listen=NodeAddress(
                0, f"{names[name].registry}.{o.namespace}.svc.{o.cluster_domain}", o.registry_port))
        clusters[name] = dataclasses.replace(spec, brokers=moved(spec.brokers), controllers=moved(spec.controllers),
                                             listeners=listeners, data_dir=Path(DATA_DIR) / name, config=config,
                                             registry=registry)
    # Mirror worker i of a flow is pod mirror-FLOW-i of its StatefulSet: its admin HTTP at the
    # pod's DNS name (what `dcmirror status` asks), bound to every interface of the pod.
    mirrors = []
    for flow in topology.mirrors:
        sts = mirror_name(flow.name)
        config = {k: v for k, v in flow.config.items() if k != "http.port.base"} | {"http.host": "0.0.0.0"}
        mirrors.append(dataclasses.replace(flow, config=config, workers_http=tuple(
            NodeAddress(i, f"{sts}-{i}.{sts}.{o.namespace}.svc.{o.cluster_domain}", o.http_port)
            for i in range(flow.workers))))
    warehouse = topology.warehouse
    if warehouse is not None:
        warehouse = dataclasses.replace(warehouse, path=Path(WAREHOUSE_DIR))
    return dataclasses.replace(topology, clusters=clusters, warehouse=warehouse, mirrors=tuple(mirrors))


def mirror_name(flow: str) -> str:
    """The StatefulSet (and headless Service) of a flow's workers."""
    return "mirror-" + k8s_name(flow, "mirror flow name", MAX_NAME - len("mirror-"))


def cron_schedule(interval_ms: int | None) -> str:
    """A cron schedule for load.interval.ms (None: hourly). Cron counts whole minutes; an
    interval that does not divide an hour or a day is rounded to one that does."""
    if interval_ms is None:
        return "0 * * * *"
    minutes = max(1, round(interval_ms / 60_000))
    if minutes < 60:
        step = min((d for d in (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30) if d >= minutes), default=30)
        return "* * * * *" if step == 1 else f"*/{step} * * * *"
    hours = max(1, round(minutes / 60))
    if hours < 24:
        step = min((d for d in (1, 2, 3, 4, 6, 8, 12) if d >= hours), default=12)
        return f"0 */{step} * * *" if step > 1 else "0 * * * *"
    return "0 0 * * *"


def _labels(component: str, instance: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "dcmirror", "app.kubernetes.io/component": component,
            "app.kubernetes.io/instance": instance}


def _meta(name: str, o: KubernetesOptions, labels: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": o.namespace, "labels": labels}


def _security() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000}


def _topology_volume() -> dict[str, Any]:
    return {"name": "topology", "configMap": {"name": CONFIG_MAP}}


def _topology_mount() -> dict[str, Any]:
    return {"name": "topology", "mountPath": CONFIG_DIR, "readOnly": True}


def _node_statefulset(name: str, cluster: str, names: ClusterNames, replicas: int, first_node: int,
                      component: str, stop_s: int, checksum: str, o: KubernetesOptions,
                      more_ports: dict[str, int] | None = None) -> dict[str, Any]:
    # The Service selects a cluster's brokers and controllers by dcmirror/cluster.
    labels = _labels(component, names.statefulset) | {"dcmirror/cluster": names.statefulset}
    # The pod's ordinal is the end of its hostname (NAME-0, NAME-1, ...).
    command = (f"exec dcmirror broker --config {TOPOLOGY_FILE} --cluster {cluster} "
               f"--node $(( ${{HOSTNAME##*-}} + {first_node} ))")
    container: dict[str, Any] = {
        "name": component,
        "image": o.image,
        "command": ["sh", "-c", command],
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
        "ports": [{"name": "kafka", "containerPort": o.kafka_port}],
        "volumeMounts": [{"name": "data", "mountPath": DATA_DIR}, _topology_mount()],
        # The listener opens before the logs load: a long recovery is not a dead broker.
        "livenessProbe": {"tcpSocket": {"port": "kafka"}, "initialDelaySeconds": 30, "periodSeconds": 10,
                          "failureThreshold": 6},
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
    }
    if component == "broker":
        container["ports"] += [{"name": _port_name(listener), "containerPort": port}
                               for listener, port in (more_ports or {}).items()]
        container["ports"].append({"name": "http", "containerPort": o.http_port})
        container["readinessProbe"] = {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 5,
                                       "failureThreshold": 3}
    else:
        container["readinessProbe"] = {"tcpSocket": {"port": "kafka"}, "periodSeconds": 5}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(name, o, labels),
        "spec": {
            "serviceName": names.service,
            "replicas": replicas,
            # All at once: no broker is ready before a majority of the quorum runs.
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "RollingUpdate"},
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": {"dcmirror/topology-sha256": checksum}},
                "spec": {
                    # SIGTERM is a controlled shutdown (leadership moves away first).
                    "terminationGracePeriodSeconds": stop_s,
                    "securityContext": _security(),
                    "containers": [container],
                    "volumes": [_topology_volume()],
                },
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": o.storage}}},
            }],
        },
    }


CONSOLE = "dcmirror-console"


def _console_objects(checksum: str, o: KubernetesOptions) -> dict[str, dict[str, Any]]:
    """The web console: one pod (its sessions live in its memory), no volume, and a Service."""
    labels = _labels("console", CONSOLE)
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _meta(CONSOLE, o, labels),
        "spec": {"selector": labels, "ports": [{"name": "http", "port": o.console_port, "targetPort": "http"}]},
    }
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": _meta(CONSOLE, o, labels),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": {"dcmirror/topology-sha256": checksum}},
                "spec": {
                    "securityContext": _security(),
                    "containers": [{
                        "name": "console",
                        "image": o.image,
                        "command": ["dcmirror", "console", "--config", TOPOLOGY_FILE,
                                    "--listen", f"0.0.0.0:{o.console_port}"],
                        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
                        "ports": [{"name": "http", "containerPort": o.console_port}],
                        "readinessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 5},
                        "volumeMounts": [_topology_mount()],
                        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
                    }],
                    "volumes": [_topology_volume()],
                },
            },
        },
    }
    return {f"service-{CONSOLE}.yaml": service, f"deployment-{CONSOLE}.yaml": deployment}


def render(topology: Topology, options: KubernetesOptions) -> dict[str, dict[str, Any]]:
    """File name -> one Kubernetes object."""
    from deploy.render.systemd import load_interval_ms, warehouse_service

    o = options
    names = cluster_names(topology)
    inside, secrets = relocate_secrets(cluster_topology(topology, o), SECRETS_DIR)
    text = dump_topology(inside, "dcmirror topology as the Kubernetes pods see it (rendered by "
                                 "`dcmirror deploy render --format kubernetes`)")
    checksum = hashlib.sha256(text.encode()).hexdigest()
    objects: dict[str, dict[str, Any]] = {
        f"configmap-{CONFIG_MAP}.yaml": {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _meta(CONFIG_MAP, o, _labels("config", "topology")),
            "data": {"topology.toml": text},
        },
    }
    for cluster, spec in topology.clusters.items():
        n = names[cluster]
        stop_s = int(BrokerConfig.from_overrides(spec.config)["controlled.shutdown.timeout.ms"]) // 1000 + STOP_MARGIN_S
        selector = {"app.kubernetes.io/name": "dcmirror", "dcmirror/cluster": n.statefulset}
        objects[f"service-{n.service}.yaml"] = {
            "apiVersion": "v1", "kind": "Service",
            "metadata": _meta(n.service, o, _labels("cluster", n.statefulset)),
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": selector,
                "ports": [{"name": "kafka", "port": o.kafka_port, "targetPort": "kafka"},
                          *({"name": _port_name(listener), "port": port, "targetPort": port}
                            for listener, port in exposed_ports(spec, o).items()),
                          {"name": "http", "port": o.http_port, "targetPort": o.http_port}],
            },
        }
        objects[f"statefulset-{n.statefulset}.yaml"] = _node_statefulset(
            n.statefulset, cluster, n, len(spec.brokers), 1, "broker", stop_s, checksum, o, exposed_ports(spec, o))
        if spec.controllers:
            objects[f"statefulset-{n.controllers}.yaml"] = _node_statefulset(
                n.controllers, cluster, n, len(spec.controllers), len(spec.brokers) + 1, "controller", stop_s,
                checksum, o)
        objects[f"poddisruptionbudget-{n.statefulset}.yaml"] = {
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": _meta(n.statefulset, o, _labels("cluster", n.statefulset)),
            # One node of a cluster down at a time keeps a 3-voter quorum and min.insync.replicas=2.
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector}},
        }
        if spec.registry is not None:
            taken = {m.statefulset: c for c, m in names.items()} | {m.controllers: c for c, m in names.items()} | {
                mirror_name(f.name): f"flow {f.name!r}" for f in topology.mirrors}
            if n.registry in taken:
                raise RenderError(f"the schema registry of cluster {cluster!r} and {taken[n.registry]!r} both "
                                  f"become {n.registry!r} in Kubernetes; rename one")
            objects |= _registry_objects(cluster, n, spec.registry, checksum, o)
    seen: dict[str, str] = {}
    for flow in topology.mirrors:
        name = mirror_name(flow.name)
        if name in seen:
            raise RenderError(f"flows {seen[name]!r} and {flow.name!r} both become {name!r} in Kubernetes; rename one")
        seen[name] = flow.name
        labels = _labels("mirror", name)
        objects[f"service-{name}.yaml"] = {
            "apiVersion": "v1", "kind": "Service",
            "metadata": _meta(name, o, labels),
            # Headless: each worker's admin HTTP by its pod's DNS name (workers_http in the ConfigMap).
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": labels,
                     "ports": [{"name": "http", "port": o.http_port, "targetPort": "http"}]},
        }
        objects[f"statefulset-{name}.yaml"] = {
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": _meta(name, o, labels),
            "spec": {
                "serviceName": name,
                "replicas": flow.workers,
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels, "annotations": {"dcmirror/topology-sha256": checksum}},
                    "spec": {
                        # SIGTERM hands the worker's partitions over (up to 90 s).
                        "terminationGracePeriodSeconds": MIRROR_STOP_S,
                        "securityContext": _security(),
                        "containers": [{
                            "name": "mirror",
                            "image": o.image,
                            # Pod mirror-FLOW-i is worker i: its name in heartbeats and status, its
                            # admin HTTP address. The consumer group splits the partitions.
                            "command": ["dcmirror", "mirror", "--config", TOPOLOGY_FILE, "--flow", flow.name,
                                        "--worker", "hostname"],
                            "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
                            "ports": [{"name": "http", "containerPort": o.http_port}],
                            "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"},
                                              "periodSeconds": 10, "failureThreshold": 6},
                            "volumeMounts": [{"name": "state", "mountPath": DATA_DIR}, _topology_mount()],
                            "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}},
                        }],
                        "volumes": [{"name": "state", "emptyDir": {}}, _topology_volume()],
                    },
                },
            },
        }
    if topology.console is not None:
        objects |= _console_objects(checksum, o)
    interval = load_interval_ms(topology)
    if topology.warehouse is not None and warehouse_service(topology):
        objects |= _warehouse_service_objects(interval, o)
    elif topology.warehouse is not None and interval != 0:
        master = topology.warehouse.config.get("spark.master", "local[2]")
        labels = _labels("load", LOAD_JOB)
        objects[f"persistentvolumeclaim-{WAREHOUSE_CLAIM}.yaml"] = _warehouse_claim(o, labels)
        objects[f"cronjob-{LOAD_JOB}.yaml"] = {
            "apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": _meta(LOAD_JOB, o, labels),
            "spec": {
                "schedule": cron_schedule(interval),
                # Loads never overlap (one writer of the ledger and the metastore at a time).
                "concurrencyPolicy": "Forbid",
                "successfulJobsHistoryLimit": 3,
                "failedJobsHistoryLimit": 3,
                "jobTemplate": {"spec": {"backoffLimit": 2, "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "restartPolicy": "Never",
                        "securityContext": _security(),
                        "containers": [{
                            "name": "load",
                            "image": o.image,
                            "command": [o.spark_submit, "--master", master, "--name", LOAD_JOB, o.load_app,
                                        "--config", TOPOLOGY_FILE],
                            "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
                            "volumeMounts": [{"name": "warehouse", "mountPath": WAREHOUSE_DIR}, _topology_mount()],
                            "resources": {"requests": {"cpu": "1", "memory": "2Gi"}},
                        }],
                        "volumes": [{"name": "warehouse", "persistentVolumeClaim": {"claimName": WAREHOUSE_CLAIM}},
                                    _topology_volume()],
                    },
                }}},
            },
        }
    if secrets.files or secrets.env:
        objects[f"secret-{SECRET}.yaml"] = secret_object(secrets, o)
        for obj in objects.values():
            _with_secrets(obj, secrets)
    return objects


def _warehouse_claim(o: KubernetesOptions, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": _meta(WAREHOUSE_CLAIM, o, labels),
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": o.warehouse_storage}}},
    }


WAREHOUSE_SERVICE = "dcmirror-warehouse"
WAREHOUSE_STOP_S = 600  # SIGTERM lets the load under way finish (as the systemd unit's TimeoutStopSec)
HOURLY_MS = 3_600_000


def _warehouse_service_objects(interval: int | None, o: KubernetesOptions) -> dict[str, dict[str, Any]]:
    """The warehouse service (load.service): one pod holding the warehouse volume and one Spark
    session, loading every load.interval.ms itself (no CronJob: another pod could not reach
    its Unix socket, nor hold the volume beside it). Queries: `kubectl exec` into it."""
    labels = _labels("warehouse", WAREHOUSE_SERVICE)
    command = ["dcmirror", "warehouse", "serve", "--config", TOPOLOGY_FILE]
    if interval != 0:
        command += ["--load-interval-ms", str(HOURLY_MS if interval is None else interval)]
    return {
        f"persistentvolumeclaim-{WAREHOUSE_CLAIM}.yaml": _warehouse_claim(o, labels),
        f"deployment-{WAREHOUSE_SERVICE}.yaml": {
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": _meta(WAREHOUSE_SERVICE, o, labels),
            "spec": {
                "replicas": 1,
                # Never two pods on the volume: the old one stops before the new one starts.
                "strategy": {"type": "Recreate"},
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "terminationGracePeriodSeconds": WAREHOUSE_STOP_S,
                        "securityContext": _security(),
                        "containers": [{
                            "name": "warehouse",
                            "image": o.image,
                            "command": command,
                            "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
                            "readinessProbe": {"exec": {"command": ["test", "-S", f"{WAREHOUSE_DIR}/warehouse.sock"]},
                                               "periodSeconds": 10},
                            "volumeMounts": [{"name": "warehouse", "mountPath": WAREHOUSE_DIR}, _topology_mount()],
                            "resources": {"requests": {"cpu": "1", "memory": "2Gi"}},
                        }],
                        "volumes": [{"name": "warehouse", "persistentVolumeClaim": {"claimName": WAREHOUSE_CLAIM}},
                                    _topology_volume()],
                    },
                },
            },
        },
    }


def _registry_objects(cluster: str, n: ClusterNames, spec: RegistrySpec, checksum: str,
                      o: KubernetesOptions) -> dict[str, dict[str, Any]]:
    """A cluster's schema registry: a StatefulSet without volumes (the schemas are in the
    cluster's `_schemas` topic) for its pods' stable DNS names, which the instances advertise to
    the primary election, and the headless Service that names them and their ready set."""
    name = n.registry
    labels = _labels("registry", name)  # not dcmirror/cluster: the brokers' Service and budget select by it
    scheme = "https" if spec.keystore else "http"
    command = (f"exec dcmirror registry --config {TOPOLOGY_FILE} --cluster {shlex.quote(cluster)} "
               f"--listen 0.0.0.0:{o.registry_port} "
               f"--advertised-url {scheme}://${{HOSTNAME}}.{name}.{o.namespace}.svc.{o.cluster_domain}:{o.registry_port}")
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _meta(name, o, labels),
        # Headless: the registry's address resolves to its ready pods; each pod has its own name.
        "spec": {"clusterIP": "None", "selector": labels,
                 "ports": [{"name": "registry", "port": o.registry_port, "targetPort": "registry"}]},
    }
    statefulset = {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": _meta(name, o, labels),
        "spec": {
            "serviceName": name,
            "replicas": REGISTRY_REPLICAS,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": {"dcmirror/topology-sha256": checksum}},
                "spec": {
                    # SIGTERM leaves the election; a standby becomes primary.
                    "terminationGracePeriodSeconds": REGISTRY_STOP_S,
                    "securityContext": _security(),
                    "containers": [{
                        "name": "registry",
                        "image": o.image,
                        "command": ["sh", "-c", command],
                        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
                        "ports": [{"name": "registry", "containerPort": o.registry_port}],
                        # The port opens once `_schemas` is replayed.
                        "readinessProbe": {"tcpSocket": {"port": "registry"}, "periodSeconds": 5},
                        "livenessProbe": {"tcpSocket": {"port": "registry"}, "initialDelaySeconds": 60,
                                          "periodSeconds": 10, "failureThreshold": 6},
                        "volumeMounts": [_topology_mount()],
                        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
                    }],
                    "volumes": [_topology_volume()],
                },
            },
        },
    }
    return {f"service-{name}.yaml": service, f"statefulset-{name}.yaml": statefulset}


def secret_object(secrets: SecretFiles, o: KubernetesOptions) -> dict[str, Any]:
    """The Secret every pod mounts: one key per file the topology references, one per
    ${env:VAR}. Rendered with empty values (contents are never rendered); fill it with
    kubectl create secret generic dcmirror-secrets --from-file=NAME=PATH ... --from-literal=env.VAR=...
    (the annotations name each key's source on the machine that rendered it)."""
    annotations = {f"dcmirror/file.{name}": str(path) for name, path in secrets.files.items()}
    annotations |= {f"dcmirror/env.{var}": f"the value of ${{env:{var}}}" for var in secrets.env}
    command = " ".join(["kubectl", "-n", o.namespace, "create", "secret", "generic", SECRET,
                        *(f"--from-file={n}={p}" for n, p in secrets.files.items()),
                        *(f"--from-literal=env.{v}=..." for v in secrets.env),
                        "--dry-run=client", "-o", "yaml", "|", "kubectl", "apply", "-f", "-"])
    annotations["dcmirror/fill-with"] = command
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {**_meta(SECRET, o, _labels("config", "secrets")), "annotations": annotations},
            "stringData": {**{name: "" for name in secrets.files}, **{f"env.{v}": "" for v in secrets.env}}}


def _with_secrets(obj: dict[str, Any], secrets: SecretFiles) -> None:
    """Every pod template: the Secret mounted read-only at SECRETS_DIR, ${env:VAR} from it."""
    spec = obj.get("spec", {})
    template = spec.get("template") or spec.get("jobTemplate", {}).get("spec", {}).get("template")
    if template is None:
        return
    pod = template["spec"]
    pod["volumes"].append({"name": "secrets", "secret": {"secretName": SECRET, "defaultMode": 0o440}})
    for container in pod["containers"]:
        container["volumeMounts"].append({"name": "secrets", "mountPath": SECRETS_DIR, "readOnly": True})
        container.setdefault("env", []).extend(
            {"name": var, "valueFrom": {"secretKeyRef": {"name": SECRET, "key": f"env.{var}"}}} for var in secrets.env)

