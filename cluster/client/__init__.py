"""trio client library: connections, admin (producer and consumer to come)."""
