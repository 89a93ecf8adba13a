"""Mirror workers: a consumer group on each source cluster, an idempotent producer into the
target, provenance headers, fencing and resume from the target's tail, checkpoints for
consumer-offset translation, lag metrics.

Exactly once, and nothing but source records in a target topic:
- Source consumers read committed: an aborted source transaction is never copied, and a
  worker's position moves past markers (they count as mirrored: lag 0).
- Each source partition is written by one worker at a time into one target partition with
  an idempotent producer; every record carries its source offset (provenance headers).
- Taking a partition (worker.py `claim`, tail.py): the worker reads the target partition's
  last producer id and epoch, writes an ABORT transaction marker under that producer id
  with a bumped epoch (WriteTxnMarkers to the leader, replicated before it answers), so the
  previous writer's later batches are refused, then reads the tail up to the high
  watermark and resumes after the last source offset it holds. The marker is a control
  batch: no consumer of any isolation level is given it.
- Why markers rather than transactions: a transaction per batch would cost a coordinator
  round trip and a marker per partition per commit, and read_uncommitted consumers would
  see the aborted duplicates of a fenced writer; the marker keeps the guarantee they have
  (a fenced writer's batches never land) at one control batch per takeover.
- A target that refuses markers (a foreign Kafka, or no ClusterAction) gets the older fence
  record (no key or value, `dcmirror.fence` header) with a warning; readers skip those.
"""
