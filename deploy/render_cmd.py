"""`dcmirror deploy render`: systemd units and Kubernetes manifests from a topology.

    dcmirror deploy render --config FILE --format systemd|kubernetes --out DIR [options]

Writes DIR/systemd/*, DIR/etc/dcmirror/* and DIR/README.txt (systemd), or one YAML file per
object under DIR (kubernetes: `kubectl apply -f DIR`); both also DIR/monitoring/ (Prometheus
scrape jobs and alert rules, a Grafana dashboard). See deploy/render/ for what is in them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from deploy.render import kubernetes, monitoring, systemd, yaml_out
from deploy.render.secrets import relocate_secrets
from deploy.render.toml_out import dump_topology


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    deploy = sub.add_parser("deploy", help="production files for a topology")
    actions = deploy.add_subparsers(dest="deploy_command", required=True)
    render = actions.add_parser("render", help="render systemd units or Kubernetes manifests")
    render.add_argument("--config", required=True, help="topology file")
    render.add_argument("--format", required=True, choices=["systemd", "kubernetes"], help="systemd units or Kubernetes manifests")
    render.add_argument("--out", required=True, help="directory to write (created; files in it are replaced)")
    s, k = systemd.SystemdOptions(), kubernetes.KubernetesOptions()
    unit = render.add_argument_group("systemd")
    unit.add_argument("--bin", default=s.bin, help=f"the dcmirror executable on the hosts (default {s.bin})")
    unit.add_argument("--etc-dir", default=s.etc_dir, help=f"where the topology and env files go ({s.etc_dir})")
    unit.add_argument("--data-root", default=s.data_root,
                      help=f"data directories given relative to the topology file move under this ({s.data_root})")
    unit.add_argument("--user", default=s.user, help=f"user and group the services run as ({s.user})")
    kube = render.add_argument_group("kubernetes")
    kube.add_argument("--namespace", default=k.namespace, help=f"namespace of every object ({k.namespace})")
    kube.add_argument("--image", default=k.image, help=f"container image with dcmirror and Spark ({k.image})")
    kube.add_argument("--cluster-domain", default=k.cluster_domain, help=f"DNS domain of the cluster ({k.cluster_domain})")
    kube.add_argument("--storage", default=k.storage, help=f"volume size of each broker ({k.storage})")
    kube.add_argument("--warehouse-storage", default=k.warehouse_storage,
                      help=f"volume size of the warehouse ({k.warehouse_storage})")
    kube.add_argument("--load-app", default=k.load_app,
                      help=f"the load's spark-submit application in the image ({k.load_app})")
    m = monitoring.MonitoringOptions()
    mon = render.add_argument_group("monitoring (monitoring/: Prometheus jobs and rules, a Grafana dashboard)")
    mon.add_argument("--scrape-interval-s", type=int, default=m.scrape_interval_s,
                     help=f"Prometheus scrape and rule interval ({m.scrape_interval_s})")
    mon.add_argument("--lag-alert-s", type=float, default=m.lag_alert_s,
                     help=f"alert when a flow's oldest unmirrored record is older ({m.lag_alert_s:g})")
    mon.add_argument("--source-silent-alert-s", type=float, default=m.source_silent_alert_s,
                     help=f"alert when a source leader has not answered a worker this long ({m.source_silent_alert_s:g})")
    mon.add_argument("--load-late-intervals", type=float, default=m.load_late_intervals,
                     help=f"alert when no load succeeded for this many load intervals ({m.load_late_intervals:g})")
    mon.add_argument("--load-metrics-target", default="",
                     help="host:port of the node_exporter serving the loads' textfile (default: no such job)")
    deploy.set_defaults(func=cmd_deploy)


def cmd_deploy(args: argparse.Namespace) -> int:
    from topology import TopologyError, load

    try:
        topology = load(args.config, check_files=False)  # certificates live on the hosts
    except TopologyError as exc:
        print(f"dcmirror deploy render: {exc}", file=sys.stderr)
        return 2
    mopts = monitoring.MonitoringOptions(
        scrape_interval_s=args.scrape_interval_s, lag_alert_s=args.lag_alert_s,
        source_silent_alert_s=args.source_silent_alert_s, load_late_intervals=args.load_late_intervals,
        load_metrics_target=args.load_metrics_target)
    if min(args.scrape_interval_s, args.lag_alert_s, args.source_silent_alert_s, args.load_late_intervals) <= 0:
        print("dcmirror deploy render: the monitoring intervals and thresholds must be positive", file=sys.stderr)
        return 2
    try:
        if args.format == "systemd":
            options = systemd.SystemdOptions(bin=args.bin, etc_dir=args.etc_dir, data_root=args.data_root,
                                             user=args.user)
            hosts, secrets = relocate_secrets(systemd.host_topology(topology, args.data_root),
                                              options.secrets_dir)
            files = systemd.render(topology, options, secrets)
            files["etc/dcmirror/topology.toml"] = dump_topology(
                hosts,
                f"dcmirror topology for {options.topology_path} (rendered from {args.config} by "
                "`dcmirror deploy render --format systemd`)")
            files |= monitoring.render(hosts, mopts)
        else:
            kopts = kubernetes.KubernetesOptions(namespace=args.namespace, image=args.image,
                                                 cluster_domain=args.cluster_domain, storage=args.storage,
                                                 warehouse_storage=args.warehouse_storage, load_app=args.load_app)
            files = {name: yaml_out.dump(obj) for name, obj in kubernetes.render(topology, kopts).items()}
            # under monitoring/: `kubectl apply -f DIR` (not -R) leaves them out
            files |= monitoring.render(kubernetes.cluster_topology(topology, kopts), mopts)
    except ValueError as exc:  # RenderError, a bad load.interval.ms, a bad broker config
        print(f"dcmirror deploy render: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    try:
        for rel, text in sorted(files.items()):
            path = out / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    except OSError as exc:
        print(f"dcmirror deploy render: writing {out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"wrote {len(files)} files to {out}:")
    for rel in sorted(files):
        print(f"  {rel}")
    return 0
