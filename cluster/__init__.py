"""Broker clusters, in layers each of which only uses those below it (docs/architecture.md):
common → protocol → storage → quorum → controller → replication → groups → broker, and the
client library beside them on common and protocol only."""
