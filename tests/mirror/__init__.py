"""End-to-end tests of the mirror (issue 7): source clusters, an aggregate cluster and the
mirror supervisor or worker processes, all real processes on loopback; real Kafka clients
(confluent-kafka) produce into the sources and read the targets."""
