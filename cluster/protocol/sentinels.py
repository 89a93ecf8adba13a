"""The protocol's sentinel values, under Kafka's names (one definition each)."""

from __future__ import annotations

# A partition without a leader (Kafka's LeaderAndIsr.NoLeader); a broker id that is none.
NO_LEADER = -1
# Leader epochs and offsets that are not known (RecordBatch.NO_PARTITION_LEADER_EPOCH,
# OffsetForLeaderEpoch's UNDEFINED_EPOCH / UNDEFINED_EPOCH_OFFSET).
UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1

# Fetch / ListOffsets replica_id: a consumer, or kafka-replica-verification's debugging
# consumer (reads any replica, leader or follower, up to its log end, without counting as
# a follower). Followers send their broker id (≥ 0).
CONSUMER_REPLICA_ID = -1
DEBUGGING_REPLICA_ID = -2

# ListOffsets timestamps that are not timestamps.
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL_TIMESTAMP = -4  # KIP-405: the local log's start (ListOffsets v8+)
LATEST_TIERED_TIMESTAMP = -5  # KIP-405: the last offset in tiered storage (v9+)

# Fetch / ListOffsets isolation levels.
READ_UNCOMMITTED = 0
READ_COMMITTED = 1

# Producer ids, epochs and sequences of batches written without idempotence.
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1

# Authorized operations fields when the client did not ask for them (INT32 min).
AUTHORIZED_OPERATIONS_OMITTED = -2147483648

# FindCoordinator key types.
COORDINATOR_GROUP = 0
COORDINATOR_TRANSACTION = 1
COORDINATOR_SHARE = 2  # KIP-932: the share coordinator of "group:topicId:partition" (v6+)

# Resource types (ACLs and DescribeConfigs / AlterConfigs; a config BROKER resource is 4,
# the same number as the ACL CLUSTER resource).
RESOURCE_TOPIC = 2
RESOURCE_GROUP = 3
RESOURCE_BROKER = 4
RESOURCE_CLUSTER = 4
RESOURCE_TRANSACTIONAL_ID = 5
# DescribeConfigs / IncrementalAlterConfigs resource type of a group's configs (Kafka's
# ConfigResource.Type.GROUP; ACLs number their GROUP resource 3)
CONFIG_RESOURCE_GROUP = 32

# DescribeConfigs config sources.
CONFIG_SOURCE_TOPIC = 1
CONFIG_SOURCE_DYNAMIC_BROKER = 2
CONFIG_SOURCE_DYNAMIC_DEFAULT_BROKER = 3
CONFIG_SOURCE_STATIC_BROKER = 4
CONFIG_SOURCE_DEFAULT = 5
CONFIG_SOURCE_GROUP = 8  # a group's own config (KIP-848 group configs)

# IncrementalAlterConfigs operations.
CONFIG_OP_SET = 0
CONFIG_OP_DELETE = 1
CONFIG_OP_APPEND = 2
CONFIG_OP_SUBTRACT = 3

# ElectLeaders election types.
ELECTION_PREFERRED = 0
ELECTION_UNCLEAN = 1
