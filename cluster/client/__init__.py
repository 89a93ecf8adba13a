"""The trio client library: connections, cluster metadata and leader requests, producer
(idempotent), consumer (classic groups), admin, cluster description, a synchronous facade."""
