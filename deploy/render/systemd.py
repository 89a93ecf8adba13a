"""systemd units for hosts running a topology's processes.

    systemd/dcmirror-broker@.service   one broker (or dedicated controller) per instance
    systemd/dcmirror-mirror@.service   one mirror worker per instance
    systemd/dcmirror-registry@.service one cluster's schema registry per instance
    systemd/dcmirror-registry@CLUSTER.service.d/brokers.conf   after that cluster's brokers
    systemd/dcmirror-console.service   the web console (a topology with [console])
    systemd/dcmirror-warehouse.service the warehouse service (warehouse config load.service = "true"):
                                       one Spark session for loads and `warehouse sql`
    systemd/dcmirror-load.service      one warehouse load (oneshot)
    systemd/dcmirror-load.timer        runs it every load.interval.ms (default hourly)
    systemd/dcmirror.target            stops or restarts everything of this host at once
    etc/dcmirror/topology.toml         the topology, data paths under --data-root
    etc/dcmirror/broker/CLUSTER-NODE.env, etc/dcmirror/mirror/FLOW-WORKER.env,
    etc/dcmirror/registry/CLUSTER.env

Instance names are `CLUSTER-NODE` (`dcmirror-broker@east-1`), `FLOW-WORKER`
(`dcmirror-mirror@east-to-aggregate-0`) and `CLUSTER` (`dcmirror-registry@east`, for a
cluster with a [clusters.NAME.registry]); the instance's environment file says which cluster
and node (flow and worker) it is, as cluster and flow names may hold '-' themselves.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from cluster.broker.config import BrokerConfig
from deploy.mirror_cmd import WORKER_FENCED_EXIT
from deploy.render.secrets import SecretFiles
from topology.model import Topology

BROKER_UNIT = "dcmirror-broker@.service"
MIRROR_UNIT = "dcmirror-mirror@.service"
REGISTRY_UNIT = "dcmirror-registry@.service"
CONSOLE_UNIT = "dcmirror-console.service"
WAREHOUSE_UNIT = "dcmirror-warehouse.service"
LOAD_SERVICE = "dcmirror-load.service"
LOAD_TIMER = "dcmirror-load.timer"
TARGET = "dcmirror.target"
# A mirror worker hands its partitions over for up to 90 s on SIGTERM (deploy/mirror_cmd.py).
MIRROR_STOP_S = 100
# A registry holds no state of its own (it is in the cluster's _schemas topic): it only leaves its group.
REGISTRY_STOP_S = 30
# The warehouse service finishes the request under way (a load: minutes) on SIGTERM.
WAREHOUSE_STOP_S = 600
STOP_MARGIN_S = 20


@dataclass(frozen=True)
class SystemdOptions:
    bin: str = "/usr/local/bin/dcmirror"
    etc_dir: str = "/etc/dcmirror"
    data_root: str = "/var/lib/dcmirror"
    user: str = "dcmirror"

    @property
    def topology_path(self) -> str:
        return str(PurePosixPath(self.etc_dir) / "topology.toml")

    @property
    def secrets_dir(self) -> str:
        """Where the certificate, key and password files the topology references go."""
        return str(PurePosixPath(self.etc_dir) / "secrets")

    @property
    def secrets_env(self) -> str:
        """The values of the topology's ${env:VAR} references (mode 0600)."""
        return str(PurePosixPath(self.etc_dir) / "secrets.env")


def host_topology(topology: Topology, data_root: str) -> Topology:
    """The topology with data directories and the warehouse that lay beside the file (relative
    paths in it) moved under `data_root`; absolute paths elsewhere stay."""
    base = topology.path.parent.absolute() if topology.path is not None else Path.cwd()
    root = Path(data_root)

    def moved(path: Path) -> Path:
        return root / path.relative_to(base) if path.is_relative_to(base) else path

    clusters = {name: dataclasses.replace(c, data_dir=moved(c.data_dir)) for name, c in topology.clusters.items()}
    warehouse = topology.warehouse
    if warehouse is not None:
        warehouse = dataclasses.replace(warehouse, path=moved(warehouse.path))
    return dataclasses.replace(topology, clusters=clusters, warehouse=warehouse)


def broker_instances(topology: Topology) -> list[tuple[str, str, int, str]]:
    """(instance, cluster, node id, address) of every broker and dedicated controller."""
    return [(f"{name}-{node.node_id}", name, node.node_id, str(node))
            for name, c in topology.clusters.items() for node in c.nodes]


def mirror_instances(topology: Topology) -> list[tuple[str, str, int]]:
    """(instance, flow, worker index) of every mirror worker."""
    return [(f"{flow.name}-{i}", flow.name, i) for flow in topology.mirrors for i in range(flow.workers)]


def registry_instances(topology: Topology) -> list[tuple[str, str]]:
    """(instance, listen address) of every cluster's schema registry; the instance is the cluster."""
    return [(name, str(c.registry.listen)) for name, c in topology.clusters.items() if c.registry is not None]


def load_interval_ms(topology: Topology) -> int | None:
    """The warehouse's load.interval.ms (0: no timer), None when it is not set (hourly)."""
    if topology.warehouse is None:
        return 0
    raw = topology.warehouse.config.get("load.interval.ms")
    if raw is None:
        return None
    try:
        interval = int(raw)
    except ValueError:
        raise ValueError(f"warehouse config load.interval.ms={raw!r} is not a whole number of milliseconds") from None
    if interval < 0:
        raise ValueError(f"warehouse config load.interval.ms={interval} is negative")
    return interval


def _unit(sections: list[tuple[str, list[tuple[str, str]]]]) -> str:
    out = []
    for name, entries in sections:
        out.append(f"[{name}]")
        out += [f"{k}={v}" for k, v in entries]
        out.append("")
    return "\n".join(out)


def render(topology: Topology, options: SystemdOptions, secrets: SecretFiles | None = None) -> dict[str, str]:
    """Relative path -> file text. `secrets`: the files and variables the hosts' topology
    references (relocate_secrets): named in the README, never their contents."""
    o = options
    secrets = secrets or SecretFiles()
    files: dict[str, str] = {}
    stop_s = max((int(BrokerConfig.from_overrides(c.config)["controlled.shutdown.timeout.ms"]) // 1000
                  for c in topology.clusters.values()), default=10) + STOP_MARGIN_S
    service_common = [("User", o.user), ("Group", o.user), ("Environment", "PYTHONUNBUFFERED=1"),
                      ("StateDirectory", "dcmirror"), ("LimitNOFILE", "100000")]
    if secrets.env:  # the ${env:VAR} values, readable by root only (systemd reads it before dropping to User)
        service_common.append(("EnvironmentFile", o.secrets_env))
        files[f"etc/dcmirror/{PurePosixPath(o.secrets_env).name}.example"] = (
            f"# copy to {o.secrets_env} (mode 0600, root) and fill in; the topology reads these variables\n"
            + "".join(f"{var}=\n" for var in secrets.env))
    files[f"systemd/{BROKER_UNIT}"] = _unit([
        ("Unit", [("Description", "dcmirror broker %i"),
                  ("Documentation", f"file:{o.etc_dir}/broker/%i.env"),
                  ("After", "network-online.target"), ("Wants", "network-online.target"), ("PartOf", TARGET)]),
        ("Service", [("Type", "simple"), ("EnvironmentFile", f"{o.etc_dir}/broker/%i.env"),
                     ("ExecStart", f"{o.bin} broker --config {o.topology_path} "
                                   "--cluster ${DCMIRROR_CLUSTER} --node ${DCMIRROR_NODE}"),
                     # SIGTERM is a controlled shutdown: leadership moves away first.
                     ("KillSignal", "SIGTERM"), ("TimeoutStopSec", str(stop_s)),
                     ("Restart", "on-failure"), ("RestartSec", "5"), *service_common]),
        ("Install", [("WantedBy", TARGET)]),
    ])
    files[f"systemd/{MIRROR_UNIT}"] = _unit([
        ("Unit", [("Description", "dcmirror mirror worker %i"),
                  ("Documentation", f"file:{o.etc_dir}/mirror/%i.env"),
                  ("After", "network-online.target"), ("Wants", "network-online.target"), ("PartOf", TARGET)]),
        ("Service", [("Type", "simple"), ("EnvironmentFile", f"{o.etc_dir}/mirror/%i.env"),
                     ("ExecStart", f"{o.bin} mirror --config {o.topology_path} "
                                   "--flow ${DCMIRROR_FLOW} --worker ${DCMIRROR_WORKER}"),
                     # SIGTERM hands the worker's partitions over to the others.
                     ("KillSignal", "SIGTERM"), ("TimeoutStopSec", str(MIRROR_STOP_S)),
                     ("Restart", "always"), ("RestartSec", "5"),
                     # Fenced: another worker runs under this name; restarting would fence it in turn.
                     ("RestartPreventExitStatus", str(WORKER_FENCED_EXIT)), *service_common]),
        ("Install", [("WantedBy", TARGET)]),
    ])
    registries = registry_instances(topology)
    if registries:
        files[f"systemd/{REGISTRY_UNIT}"] = _unit([
            ("Unit", [("Description", "dcmirror schema registry of cluster %i"),
                      ("Documentation", f"file:{o.etc_dir}/registry/%i.env"),
                      ("After", "network-online.target"), ("Wants", "network-online.target"), ("PartOf", TARGET)]),
            ("Service", [("Type", "simple"), ("EnvironmentFile", f"{o.etc_dir}/registry/%i.env"),
                         ("ExecStart", f"{o.bin} registry --config {o.topology_path} --cluster ${{DCMIRROR_CLUSTER}}"),
                         # SIGTERM leaves the primary election; the schemas are in the cluster's _schemas topic.
                         ("KillSignal", "SIGTERM"), ("TimeoutStopSec", str(REGISTRY_STOP_S)),
                         ("Restart", "always"), ("RestartSec", "5"), *service_common]),
            ("Install", [("WantedBy", TARGET)]),
        ])
    for instance, _listen in registries:
        # Started after (and stopped before) the cluster's brokers that run on the same host.
        brokers = " ".join(f"dcmirror-broker@{b}.service" for b, cluster, _, _ in broker_instances(topology)
                           if cluster == instance)
        files[f"systemd/dcmirror-registry@{instance}.service.d/brokers.conf"] = _unit([("Unit", [("After", brokers)])])
    if topology.console is not None:
        files[f"systemd/{CONSOLE_UNIT}"] = _unit([
            ("Unit", [("Description", f"dcmirror web console ({topology.console.listen})"),
                      ("After", "network-online.target"), ("Wants", "network-online.target"), ("PartOf", TARGET)]),
            ("Service", [("Type", "simple"), ("ExecStart", f"{o.bin} console --config {o.topology_path}"),
                         ("KillSignal", "SIGTERM"), ("TimeoutStopSec", str(REGISTRY_STOP_S)),
                         ("Restart", "always"), ("RestartSec", "5"), *service_common]),
            ("Install", [("WantedBy", TARGET)]),
        ])
    if warehouse_service(topology):
        files[f"systemd/{WAREHOUSE_UNIT}"] = _unit([
            ("Unit", [("Description", "dcmirror warehouse service: one Spark session for loads and warehouse sql"),
                      ("After", "network-online.target"), ("Wants", "network-online.target"), ("PartOf", TARGET)]),
            ("Service", [("Type", "simple"), ("ExecStart", f"{o.bin} warehouse serve --config {o.topology_path}"),
                         ("KillSignal", "SIGTERM"), ("TimeoutStopSec", str(WAREHOUSE_STOP_S)),
                         ("Restart", "always"), ("RestartSec", "10"), *service_common]),
            ("Install", [("WantedBy", TARGET)]),
        ])
    files[f"systemd/{TARGET}"] = _unit([
        ("Unit", [("Description", "dcmirror: the brokers, mirror workers, schema registries, console and loads of "
                                  "this host"),
                  ("Wants", "network-online.target"), ("After", "network-online.target")]),
        ("Install", [("WantedBy", "multi-user.target")]),
    ])
    interval = load_interval_ms(topology)
    if topology.warehouse is not None:
        after = "network-online.target" + (f" {WAREHOUSE_UNIT}" if warehouse_service(topology) else "")
        files[f"systemd/{LOAD_SERVICE}"] = _unit([
            # With the warehouse service on this host, the load runs in its Spark session.
            ("Unit", [("Description", "dcmirror warehouse load"), ("After", after),
                      ("Wants", "network-online.target")]),
            ("Service", [("Type", "oneshot"), ("ExecStart", f"{o.bin} load --config {o.topology_path}"),
                         *service_common]),
        ])
    if interval is None or interval > 0:
        if interval is None:
            timer = [("OnCalendar", "hourly"), ("Persistent", "true")]
        else:
            seconds = f"{max(1, interval // 1000)}s"
            timer = [("OnBootSec", seconds), ("OnUnitActiveSec", seconds), ("AccuracySec", "1s")]
        files[f"systemd/{LOAD_TIMER}"] = _unit([
            ("Unit", [("Description", "dcmirror warehouse load, "
                                      + ("hourly" if interval is None else f"every {interval} ms")),
                      ("PartOf", TARGET)]),
            ("Timer", [*timer, ("Unit", LOAD_SERVICE)]),
            ("Install", [("WantedBy", TARGET)]),
        ])
    for instance, cluster, node, address in broker_instances(topology):
        role = "dedicated controller" if topology.cluster(cluster).is_controller(node) else "broker"
        files[f"etc/dcmirror/broker/{instance}.env"] = (
            f"# dcmirror-broker@{instance}: {role} {node} of cluster {cluster} ({address})\n"
            f"DCMIRROR_CLUSTER={cluster}\nDCMIRROR_NODE={node}\n")
    for instance, flow, worker in mirror_instances(topology):
        files[f"etc/dcmirror/mirror/{instance}.env"] = (
            f"# dcmirror-mirror@{instance}: worker {worker} of flow {flow}\n"
            f"DCMIRROR_FLOW={flow}\nDCMIRROR_WORKER={worker}\n")
    for instance, listen in registries:
        files[f"etc/dcmirror/registry/{instance}.env"] = (
            f"# dcmirror-registry@{instance}: the schema registry of cluster {instance} ({listen})\n"
            f"DCMIRROR_CLUSTER={instance}\n")
    files["README.txt"] = _readme(topology, o, interval, secrets)
    return files


def warehouse_service(topology: Topology) -> bool:
    """The warehouse config asks for the warehouse service (as `dcmirror up` runs it)."""
    return topology.warehouse is not None and topology.warehouse.service


def _readme(topology: Topology, o: SystemdOptions, interval: int | None, secrets: SecretFiles) -> str:
    lines = [
        "dcmirror systemd units, rendered by `dcmirror deploy render --format systemd`.",
        "",
        "Install on every host (as root):",
        f"  cp -r etc/dcmirror/. {o.etc_dir}/ && cp systemd/* /etc/systemd/system/ && systemctl daemon-reload",
        f"  useradd --system --home-dir {o.data_root} {o.user}   # once; data lives under {o.data_root}",
        "",
        f"  systemctl enable {TARGET}   # starts the enabled instances below at boot",
        "",
        "Then enable the instances that run on that host:",
    ]
    for instance, cluster, node, address in broker_instances(topology):
        lines.append(f"  systemctl enable --now dcmirror-broker@{instance}   # {cluster} node {node}, {address}")
    for instance, flow, worker in mirror_instances(topology):
        lines.append(f"  systemctl enable --now dcmirror-mirror@{instance}   # flow {flow}, worker {worker}")
    for instance, listen in registry_instances(topology):
        lines.append(f"  systemctl enable --now dcmirror-registry@{instance}   # schema registry of {instance}, "
                     f"{listen} (on the host of that address)")
    if topology.console is not None:
        lines.append(f"  systemctl enable --now dcmirror-console   # the web console, {topology.console.listen} "
                     "(on the host of that address)")
    if warehouse_service(topology):
        lines.append("  systemctl enable --now dcmirror-warehouse   # the warehouse service, on the host of the loads "
                     "(the warehouse path)")
    if topology.warehouse is not None:
        if interval == 0:
            lines.append("  (load.interval.ms = 0: no timer; run `systemctl start dcmirror-load` by hand)")
        else:
            lines.append(f"  systemctl enable --now {LOAD_TIMER}   # on one host only")
    if secrets.files or secrets.env:
        lines += ["", f"Secrets (never rendered: install them from where the topology named them). Files go to "
                      f"{o.secrets_dir}, readable by the service group only:",
                  f"  install -d -m 0750 -o root -g {o.user} {o.secrets_dir}"]
        lines += [f"  install -m 0640 -o root -g {o.user} {path} {o.secrets_dir}/{name}"
                  for name, path in secrets.files.items()]
        if secrets.env:
            lines += [f"  install -m 0600 -o root etc/dcmirror/{PurePosixPath(o.secrets_env).name}.example "
                      f"{o.secrets_env}   # then fill in {', '.join(secrets.env)}"]
    lines += ["", f"`systemctl stop {TARGET}` stops everything of a host (brokers with a controlled shutdown)."]
    return "\n".join(lines) + "\n"
