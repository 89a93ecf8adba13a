"""`dcmirror deploy render`: production files generated from a topology.

systemd units (broker@, mirror@, a load service and timer) with one environment file per
instance, and Kubernetes manifests (per cluster a headless Service and a StatefulSet, a
mirror Deployment per flow, a load CronJob running spark-submit). Each format gets its own
copy of the topology with the addresses and paths of where it runs.
"""
