"""Building blocks every layer of the cluster may use and none of them owns: the clock,
retry backoff, Kafka-style config definitions and the small admin HTTP server. Nothing here
imports another part of `cluster`."""
