"""A cluster's schema registry: Confluent Schema Registry's REST API (subjects, versions,
schema ids, compatibility, modes, contexts), its state kept in a compacted topic of the
cluster it serves (`_schemas`, Confluent's record format), so it is replicated and survives
restarts.

- `formats`: the sans-IO schema formats: parsing, canonical forms and the compatibility
  checks of Avro, JSON Schema and Protobuf.
- `state`, `store`, `app`: the registry's state machine, its trio shell over the cluster's
  `_schemas` topic, and the HTTP routes.
"""
