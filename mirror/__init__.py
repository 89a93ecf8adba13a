"""Mirror workers: a consumer group on each source cluster, an idempotent producer into the
target, provenance headers, fencing and resume from the target's tail, checkpoints for
consumer-offset translation, lag metrics."""
