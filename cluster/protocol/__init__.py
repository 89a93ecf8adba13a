"""The Kafka wire protocol: API keys and sentinels, framing, request and response codec on
kio's schemas, record batches (header walk, CRC, patching) and records, legacy refusals,
the cluster's internal frames, legal topic names."""
