"""The broker process: the request router and the Kafka API handlers, the lifecycle towards
the controller, the wiring of storage, replication and groups, the TCP and admin HTTP
listeners; and the process of a dedicated controller node."""
