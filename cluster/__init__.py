"""Broker clusters: Kafka-protocol brokers, storage, quorum, replication, groups, client."""
