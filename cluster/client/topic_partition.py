"""A (topic, partition) pair: how the client library names a partition."""

from __future__ import annotations

TopicPartition = tuple[str, int]
