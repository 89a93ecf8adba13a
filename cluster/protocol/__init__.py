"""Kafka wire protocol: framing, request dispatch tables, record batch codec."""
