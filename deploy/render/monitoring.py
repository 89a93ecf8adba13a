"""Monitoring files for a topology as deployed: Prometheus scrape jobs, alert rules and a
Grafana dashboard, written by `dcmirror deploy render` under monitoring/.

    monitoring/prometheus.yml        scrape jobs (brokers' and mirror workers' /metrics) and
                                     the rules file; merge into your Prometheus config
    monitoring/dcmirror-rules.yml    alert rules (`promtool check rules` accepts them)
    monitoring/grafana-dashboard.json  one dashboard: clusters, mirror flows, warehouse loads

Targets come from the topology: every broker's admin HTTP (admin.http.listener or
admin.http.port.offset, by the broker's own rule; a cluster without it has no broker metrics) and every mirror
worker's (workers_http or http.port.base). Each target carries the topology's names as
labels: `cluster` and `datacenter` for brokers; `source_cluster`, `source_datacenter` and
`target_cluster` for workers (their own metrics name the `flow` and `worker`). Warehouse
loads are batch jobs: each writes a Prometheus textfile (spark_aggregate/load_metrics.py)
that node_exporter's textfile collector serves; the `dcmirror-load` job scrapes that
node_exporter where `--load-metrics-target` names it.

Every metric an expression here names is one the project exports (tests check them against
real /metrics output and the load textfile); `up` is Prometheus' own per target.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from cluster.broker.config import BrokerConfig, admin_http_address
from deploy.render import yaml_out
from topology.model import ClusterSpec, NodeAddress, Topology

BROKER_JOB = "dcmirror-broker"
MIRROR_JOB = "dcmirror-mirror"
LOAD_JOB = "dcmirror-load"
RULES_FILE = "dcmirror-rules.yml"
DASHBOARD_UID = "dcmirror-overview"


@dataclass(frozen=True)
class MonitoringOptions:
    scrape_interval_s: int = 15
    lag_alert_s: float = 60.0
    """A flow whose oldest unmirrored record is older than this for 2 minutes alerts."""
    source_silent_alert_s: float = 60.0
    """A source partition whose leader has not answered the worker for this long alerts."""
    load_late_intervals: float = 3.0
    """A scheduled load alerts when its last success is older than this many intervals."""
    load_metrics_target: str = ""
    """host:port of the node_exporter serving the loads' textfile ('' : no load job)."""


# ---- targets --------------------------------------------------------------------------------


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def broker_admin_http(spec: ClusterSpec, broker: NodeAddress) -> tuple[str, int] | None:
    """Where a broker's admin HTTP is reached: the broker's own rule (admin.http.listener, or
    its port + admin.http.port.offset), a wildcard bind address read as the broker's host."""
    address = admin_http_address(BrokerConfig.from_overrides(spec.config), broker.host, broker.port)
    if address is None:
        return None
    return (broker.host if address[0] in ("0.0.0.0", "::") else address[0]), address[1]


def broker_targets(topology: Topology) -> list[tuple[str, dict[str, str]]]:
    """(host:port of a broker's admin HTTP, target labels), for brokers that serve it."""
    out = []
    for name, spec in topology.clusters.items():
        for broker in spec.brokers:
            address = broker_admin_http(spec, broker)
            if address is not None:
                out.append((_hostport(*address), {"cluster": name, "datacenter": spec.datacenter}))
    return out


def worker_targets(topology: Topology) -> list[tuple[str, dict[str, str]]]:
    out = []
    for flow in topology.mirrors:
        labels = {"source_cluster": flow.source, "source_datacenter": topology.cluster(flow.source).datacenter,
                  "target_cluster": flow.target}
        for i in range(flow.workers):
            address = flow.http_address(i)
            if address is not None:
                out.append((_hostport(*address), labels))
    return out


def _scheme_and_tls(keystore: str, ca: str) -> dict[str, Any]:
    if not keystore:
        return {}
    return {"scheme": "https", **({"tls_config": {"ca_file": ca}} if ca else {})}


def _credentials(token_ref: str) -> dict[str, Any]:
    """A bearer token Prometheus can read: a `${file:PATH}` reference (the whole file)."""
    if token_ref.startswith("${file:") and token_ref.endswith("}") and ":" not in token_ref[7:-1]:
        return {"authorization": {"type": "Bearer", "credentials_file": token_ref[7:-1]}}
    return {}


def scrape_configs(topology: Topology, o: MonitoringOptions) -> list[dict[str, Any]]:
    """One job per kind of target; one static group per label set (cluster, flow)."""
    jobs = []

    def grouped(targets: list[tuple[str, dict[str, str]]]) -> list[dict[str, Any]]:
        groups: dict[str, dict[str, Any]] = {}
        for address, labels in targets:
            key = json.dumps(labels, sort_keys=True)
            groups.setdefault(key, {"targets": [], "labels": labels})["targets"].append(address)
        return list(groups.values())

    brokers = broker_targets(topology)
    if brokers:
        first = next(iter(topology.clusters.values())).config
        jobs.append({"job_name": BROKER_JOB, "scrape_interval": f"{o.scrape_interval_s}s",
                     **_scheme_and_tls(first.get("admin.http.ssl.keystore.location", ""),
                                       first.get("ssl.truststore.location", "")),
                     **_credentials(first.get("admin.http.auth.token", "")),
                     "static_configs": grouped(brokers)})
    workers = worker_targets(topology)
    if workers:
        first_flow = next(f for f in topology.mirrors if f.http_address(0) is not None).config
        jobs.append({"job_name": MIRROR_JOB, "scrape_interval": f"{o.scrape_interval_s}s",
                     **_scheme_and_tls(first_flow.get("http.ssl.keystore.location", ""),
                                       first_flow.get("http.ssl.ca.location", "")),
                     **_credentials(first_flow.get("http.auth.token", "")),
                     "static_configs": grouped(workers)})
    if o.load_metrics_target and topology.warehouse is not None:
        jobs.append({"job_name": LOAD_JOB, "scrape_interval": f"{o.scrape_interval_s}s",
                     "static_configs": [{"targets": [o.load_metrics_target],
                                         "labels": {"warehouse_source": topology.warehouse.source}}],
                     # node_exporter serves much more; keep only the loads' series
                     "metric_relabel_configs": [{"source_labels": ["__name__"], "regex": "dcmirror_load_.*",
                                                 "action": "keep"}]})
    return jobs


# ---- alert rules ----------------------------------------------------------------------------


def _alert(name: str, expr: str, for_: str, severity: str, summary: str, description: str) -> dict[str, Any]:
    rule: dict[str, Any] = {"alert": name, "expr": expr}
    if for_:
        rule["for"] = for_
    rule["labels"] = {"severity": severity}
    rule["annotations"] = {"summary": summary, "description": description}
    return rule


def alert_rules(o: MonitoringOptions) -> dict[str, Any]:
    lag, silent, late = f"{o.lag_alert_s:g}", f"{o.source_silent_alert_s:g}", f"{o.load_late_intervals:g}"
    clusters = [
        _alert("DcmirrorBrokerDown", f'up{{job="{BROKER_JOB}"}} == 0', "1m", "critical",
               "Broker {{ $labels.instance }} of cluster {{ $labels.cluster }} is down",
               "Its admin HTTP has not answered a scrape for a minute ({{ $labels.datacenter }})."),
        _alert("DcmirrorBrokerNotReady", "dcmirror_broker_ready == 0", "2m", "warning",
               "Broker {{ $labels.node_id }} at {{ $labels.instance }} is not ready",
               "It answers but is not registered, still loading logs, or fenced by the controller."),
        _alert("DcmirrorNoController", "max by (cluster) (dcmirror_controller_id) < 0", "1m", "critical",
               "Cluster {{ $labels.cluster }} has no active controller",
               "No broker sees a quorum leader: no topic, leader or ISR change can happen."),
        _alert("DcmirrorOfflinePartitions", "max by (cluster) (dcmirror_cluster_offline_partitions) > 0", "1m",
               "critical", "Cluster {{ $labels.cluster }} has {{ $value }} offline partitions",
               "Partitions without a leader: producers and consumers of them are stopped."),
        _alert("DcmirrorUnderMinIsr", "sum by (cluster) (dcmirror_broker_under_min_isr_partitions) > 0", "1m",
               "critical", "Cluster {{ $labels.cluster }}: {{ $value }} partitions under min.insync.replicas",
               "acks=all producers of these partitions get NOT_ENOUGH_REPLICAS."),
        _alert("DcmirrorUnderReplicatedPartitions",
               "sum by (cluster) (dcmirror_broker_under_replicated_partitions) > 0", "5m", "warning",
               "Cluster {{ $labels.cluster }}: {{ $value }} under-replicated partitions",
               "An ISR lacks replicas for 5 minutes: one more failure may lose availability."),
    ]
    mirror = [
        _alert("DcmirrorMirrorWorkerDown", f'up{{job="{MIRROR_JOB}"}} == 0', "1m", "critical",
               "Mirror worker {{ $labels.instance }} ({{ $labels.source_cluster }} -> {{ $labels.target_cluster }}) "
               "is down", "Its partitions move to the flow's other workers, if it has any."),
        _alert("DcmirrorFlowLagging", f"max by (flow, source_datacenter) (dcmirror_mirror_lag_seconds) > {lag}",
               "2m", "warning", "Flow {{ $labels.flow }} lags {{ $value | humanizeDuration }}",
               f"The oldest record of {{{{ $labels.source_datacenter }}}} not yet in the target is older "
               f"than {lag} s."),
        _alert("DcmirrorSourceSilent",
               f"max by (flow, source_datacenter, topic, partition) (dcmirror_mirror_source_silent_seconds) > {silent}",
               "1m", "warning",
               "Source {{ $labels.source_datacenter }} silent for flow {{ $labels.flow }}",
               "The leader of {{ $labels.topic }}-{{ $labels.partition }} has not answered the worker for "
               "{{ $value | humanizeDuration }} (datacenter cut off or cluster down)."),
        _alert("DcmirrorDataLoss", "increase(dcmirror_mirror_data_loss_records_total[15m]) > 0", "", "critical",
               "Flow {{ $labels.flow }} lost records at the source",
               "Records were deleted by retention before they were mirrored ({{ $value }} in 15 minutes)."),
        _alert("DcmirrorMirrorSourceDiverged", "increase(dcmirror_mirror_diverged_records_total[15m]) > 0", "",
               "critical", "Flow {{ $labels.flow }}: the source no longer holds records it mirrored",
               "{{ $value }} mirrored offsets are gone from the source as they were mirrored (an unclean leader "
               "election, a truncation, a restore): they stay in the target beside the source's new records at "
               "those offsets. `dcmirror mirror status` names the ranges."),
        _alert("DcmirrorMirrorSourceRecreated", "increase(dcmirror_mirror_source_recreations_total[15m]) > 0", "",
               "warning", "Flow {{ $labels.flow }}: a source topic was deleted and created again",
               "The new incarnation is mirrored after the old one into the same target topic (or its partitions "
               "stopped, with on.topic.recreated = stop). `dcmirror mirror status` names the topic."),
        _alert("DcmirrorMirrorTargetRefilled", "increase(dcmirror_mirror_target_refills_total[15m]) > 0", "",
               "warning", "Flow {{ $labels.flow }}: a target partition lost mirrored records",
               "It was refilled from what the source still holds; records the source no longer had are counted "
               "as data loss."),
        _alert("DcmirrorMirrorTopicFailed",
               'max by (flow, topic, partition) (dcmirror_mirror_topic_partition_state{state="FAILED"}) > 0', "1m",
               "critical", "Flow {{ $labels.flow }}: mirror topic partition {{ $labels.topic }}-{{ $labels.partition }} "
               "stopped", "The copy holds more than its source (the source lost what was copied): it is not copied "
               "further until an operator acts (`dcmirror mirror status`)."),
        _alert("DcmirrorMirrorDeadLetter", "increase(dcmirror_mirror_dead_letter_records_total[15m]) > 0", "",
               "critical", "Flow {{ $labels.flow }}: records the target cannot take",
               "{{ $value }} source records could not be written into the target (too large for it even "
               "compressed); their coordinates are in the target's dcmirror.deadletter topic."),
        _alert("DcmirrorMirrorSchemaSyncFailing", "increase(dcmirror_mirror_schema_sync_errors_total[5m]) > 0",
               "10m", "warning",
               "Flow {{ $labels.flow }}: schema sync into context {{ $labels.context }} keeps failing",
               "Requests to a schema registry have failed in every 5 minutes for 10 minutes ({{ $value }} in the "
               "last 5): records whose schema is not in the target registry yet are held back. `dcmirror mirror "
               "status` shows the last errors."),
    ]
    loads = [
        _alert("DcmirrorLoadFailed", "dcmirror_load_last_run_success == 0", "", "critical",
               "The last warehouse load from {{ $labels.source }} failed",
               "See last_load.json in the warehouse path, and the load's log."),
        _alert("DcmirrorLoadLate",
               f"(time() - dcmirror_load_last_success_timestamp_seconds) > {late} * dcmirror_load_interval_seconds"
               " and dcmirror_load_interval_seconds > 0", "5m", "warning",
               "No successful warehouse load from {{ $labels.source }} for {{ $value | humanizeDuration }}",
               f"More than {late} load intervals since the last success."),
    ]
    return {"groups": [{"name": "dcmirror-clusters", "rules": clusters},
                       {"name": "dcmirror-mirror", "rules": mirror},
                       {"name": "dcmirror-warehouse", "rules": loads}]}


# ---- dashboard ------------------------------------------------------------------------------

DC = 'datacenter=~"$datacenter"'
SRC = 'source_datacenter=~"$datacenter"'

# (row title, [(panel title, kind, unit, [(expr, legend)])]); kind: "stat" or "timeseries".
PANELS: list[tuple[str, list[tuple[str, str, str, list[tuple[str, str]]]]]] = [
    ("Clusters", [
        ("Brokers up", "stat", "none",
         [(f'sum by (datacenter, cluster) (up{{job="{BROKER_JOB}", {DC}}})', "{{cluster}} ({{datacenter}})")]),
        ("Offline partitions", "stat", "none",
         [(f"max by (cluster) (dcmirror_cluster_offline_partitions{{{DC}}})", "{{cluster}}")]),
        ("Under-replicated partitions", "stat", "none",
         [(f"sum by (cluster) (dcmirror_broker_under_replicated_partitions{{{DC}}})", "{{cluster}}")]),
        ("Under min ISR partitions", "stat", "none",
         [(f"sum by (cluster) (dcmirror_broker_under_min_isr_partitions{{{DC}}})", "{{cluster}}")]),
        ("Produce rate", "timeseries", "rps",
         [(f"sum by (cluster) (rate(dcmirror_broker_records_in_total{{{DC}}}[1m]))", "{{cluster}} records/s")]),
        ("Produce bytes", "timeseries", "Bps",
         [(f"sum by (cluster) (rate(dcmirror_broker_bytes_in_total{{{DC}}}[1m]))", "{{cluster}}")]),
        ("Fetch rate", "timeseries", "rps",
         [(f"sum by (cluster) (rate(dcmirror_broker_records_out_total{{{DC}}}[1m]))", "{{cluster}} records/s")]),
        ("Fetch bytes", "timeseries", "Bps",
         [(f"sum by (cluster) (rate(dcmirror_broker_bytes_out_total{{{DC}}}[1m]))", "{{cluster}} to consumers"),
          (f"sum by (cluster) (rate(dcmirror_broker_replication_bytes_out_total{{{DC}}}[1m]))",
           "{{cluster}} to followers")]),
        ("Request latency p99", "timeseries", "s",
         [(f"histogram_quantile(0.99, sum by (cluster, api, le) "
           f"(rate(dcmirror_broker_request_latency_seconds_bucket{{{DC}}}[5m])))", "{{cluster}} {{api}}")]),
        ("ISR changes", "timeseries", "ops",
         [(f"sum by (cluster) (rate(dcmirror_broker_isr_shrinks_total{{{DC}}}[5m]))", "{{cluster}} shrinks"),
          (f"sum by (cluster) (rate(dcmirror_broker_isr_expands_total{{{DC}}}[5m]))", "{{cluster}} expands")]),
    ]),
    ("Mirror flows", [
        ("Workers up", "stat", "none",
         [(f'sum by (source_cluster, target_cluster) (up{{job="{MIRROR_JOB}", {SRC}}})',
           "{{source_cluster}} -> {{target_cluster}}")]),
        ("Lag (records)", "timeseries", "none",
         [(f"sum by (flow, source_datacenter) (dcmirror_mirror_lag_records{{{SRC}}})",
           "{{flow}} ({{source_datacenter}})")]),
        ("Lag (seconds)", "timeseries", "s",
         [(f"max by (flow, source_datacenter) (dcmirror_mirror_lag_seconds{{{SRC}}})",
           "{{flow}} ({{source_datacenter}})")]),
        ("Record age", "timeseries", "s",
         [(f"max by (flow, source_datacenter) (dcmirror_mirror_record_age_seconds{{{SRC}}})",
           "{{flow}} ({{source_datacenter}})")]),
        ("Mirrored records", "timeseries", "rps",
         [(f"sum by (flow) (rate(dcmirror_mirror_records_total{{{SRC}}}[1m]))", "{{flow}}")]),
        ("Mirrored bytes", "timeseries", "Bps",
         [(f"sum by (flow) (rate(dcmirror_mirror_partition_bytes_total{{{SRC}}}[1m]))", "{{flow}}")]),
        ("Source silent", "timeseries", "s",
         [(f"max by (flow, source_datacenter) (dcmirror_mirror_source_silent_seconds{{{SRC}}})",
           "{{flow}} ({{source_datacenter}})")]),
        ("Data lost at the source", "stat", "none",
         [(f"sum by (flow) (dcmirror_mirror_data_loss_records_total{{{SRC}}})", "{{flow}}")]),
        ("Claims and fencing", "timeseries", "ops",
         [(f"sum by (flow) (rate(dcmirror_mirror_claims_total{{{SRC}}}[5m]))", "{{flow}} claims"),
          (f"sum by (flow) (rate(dcmirror_mirror_fenced_total{{{SRC}}}[5m]))", "{{flow}} fenced")]),
    ]),
    ("Warehouse loads", [
        ("Since the last successful load", "stat", "s",
         [("time() - max by (source) (dcmirror_load_last_success_timestamp_seconds)", "{{source}}")]),
        ("Last load", "stat", "none",
         [("max by (source) (dcmirror_load_last_run_success)", "{{source}} ok (1) / failed (0)")]),
        ("Load duration", "timeseries", "s",
         [("max by (source) (dcmirror_load_last_duration_seconds)", "{{source}}")]),
        ("Loads per hour", "timeseries", "none",
         [("sum by (source, result) (increase(dcmirror_load_runs_total[1h]))", "{{source}} {{result}}")]),
        ("Rows loaded", "timeseries", "rps",
         [("sum by (source) (rate(dcmirror_load_rows_total[1h]))", "{{source}} rows/s")]),
    ]),
]


def dashboard(topology: Topology) -> dict[str, Any]:
    """A Grafana dashboard (schema 39, Prometheus datasource chosen on import)."""
    panels: list[dict[str, Any]] = []
    next_id = iter(range(1, 1000))
    x = y = line_h = 0
    for row, items in PANELS:
        y += line_h
        x = line_h = 0
        panels.append({"id": next(next_id), "type": "row", "title": row, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        y += 1
        for title, kind, unit, queries in items:
            width, height = (6, 4) if kind == "stat" else (12, 8)
            if x + width > 24:  # next line
                x, y, line_h = 0, y + line_h, 0
            panels.append({
                "id": next(next_id), "type": kind, "title": title,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": height, "w": width, "x": x, "y": y},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "targets": [{"refId": chr(ord("A") + j), "expr": expr, "legendFormat": legend,
                             "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                            for j, (expr, legend) in enumerate(queries)],
            })
            x += width
            line_h = max(line_h, height)
    datacenters = sorted({c.datacenter for c in topology.clusters.values()})
    return {
        "uid": DASHBOARD_UID, "title": "dcmirror", "tags": ["dcmirror", "kafka"], "schemaVersion": 39,
        "version": 1, "editable": True, "refresh": "30s", "time": {"from": "now-3h", "to": "now"},
        "description": "Datacenters " + ", ".join(datacenters) + ": brokers, mirror flows, warehouse loads",
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
            {"name": "datacenter", "type": "query", "label": "Datacenter", "includeAll": True, "multi": True,
             "current": {"text": "All", "value": "$__all"}, "allValue": ".*",
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": {"query": f'label_values(up{{job="{BROKER_JOB}"}}, datacenter)', "refId": "datacenters"},
             "refresh": 2},
        ]},
        "panels": panels,
    }


def dashboard_exprs(doc: dict[str, Any]) -> list[str]:
    """Every query of a dashboard, its variables replaced by match-all values (valid PromQL)."""
    return [t["expr"].replace("$datacenter", ".*") for p in doc["panels"] for t in p.get("targets", [])]


# ---- files ----------------------------------------------------------------------------------


def render(topology: Topology, o: MonitoringOptions) -> dict[str, str]:
    """Relative path (under monitoring/) -> file text."""
    prometheus = {"global": {"scrape_interval": f"{o.scrape_interval_s}s",
                             "evaluation_interval": f"{o.scrape_interval_s}s"},
                  "rule_files": [RULES_FILE], "scrape_configs": scrape_configs(topology, o)}
    missing = [name for name, spec in topology.clusters.items()
               if spec.brokers and broker_admin_http(spec, spec.brokers[0]) is None]
    header = ["# Prometheus scrape jobs for dcmirror (rendered by `dcmirror deploy render`)."]
    if missing:
        header.append(f"# No broker metrics for cluster(s) {', '.join(missing)}: set admin.http.port.offset "
                      "or admin.http.listener in their config.")
    if not o.load_metrics_target and topology.warehouse is not None:
        header.append("# Warehouse loads write dcmirror_load.prom (load.metrics.textfile.dir): serve it with "
                      "node_exporter's textfile collector and add a job for it (--load-metrics-target).")
    return {
        "monitoring/prometheus.yml": "\n".join(header) + "\n" + yaml_out.dump(prometheus),
        f"monitoring/{RULES_FILE}": "# dcmirror alert rules (rendered by `dcmirror deploy render`)\n"
                                    + yaml_out.dump(alert_rules(o)),
        "monitoring/grafana-dashboard.json": json.dumps(dashboard(topology), indent=2) + "\n",
    }
