"""Replica assignment for new topics and partitions (the seeds' rule).

Brokers sorted; partition i's j-th replica goes to broker (i + j + s) mod n, s a start
index; the first replica is the preferred leader. Replicas of one partition never share a
broker because j < n.
"""

from __future__ import annotations


class AssignmentError(ValueError):
    pass


def assign_replicas(brokers: list[int], partitions: int, replication_factor: int, start_index: int,
                    first_partition: int = 0) -> list[list[int]]:
    ordered = sorted(brokers)
    n = len(ordered)
    if replication_factor < 1:
        raise AssignmentError(f"replication factor {replication_factor} must be at least 1")
    if replication_factor > n:
        raise AssignmentError(f"replication factor {replication_factor} is larger than the {n} available broker(s)")
    s = start_index % n
    return [
        [ordered[(i + j + s) % n] for j in range(replication_factor)]
        for i in range(first_partition, first_partition + partitions)
    ]
