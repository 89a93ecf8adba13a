"""Warehouse loads: the PySpark Data Source over a cluster, the load job (plan, stage in
Spark tasks, publish, commit) and its offset ledger, exactly once across crashes."""
