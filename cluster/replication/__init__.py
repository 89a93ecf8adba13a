"""Partition replication: one replica's state as a sans-IO `Partition` (ISR, high watermark,
truncation), the `ReplicaManager` trio shell that owns them, replica fetchers, fetch sessions."""
