"""Warehouse loads (to come): PySpark Data Source over a cluster, load job, offset ledger."""
