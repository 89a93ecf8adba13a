"""Multi-broker fault tests: real broker processes and real clients under kills, pauses,
leader moves and unflushed-tail crashes (helpers: tests/cluster_helpers.py,
tests/fault_workload.py)."""
