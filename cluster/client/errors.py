"""Errors the client raises: a Kafka error code answered by a broker, or the cluster
being out of reach. Every message names what the request was about."""

from __future__ import annotations

from cluster.client.connection import KafkaConnectionError
from cluster.protocol.errors import ErrorCode

__all__ = ["KafkaError", "KafkaConnectionError", "KafkaTimeoutError", "ProducerFenced",
           "error_name", "is_retriable"]


def error_name(code: int) -> str:
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return str(code)


def is_retriable(code: int) -> bool:
    try:
        return bool(ErrorCode(code).retriable)
    except ValueError:
        return False


class KafkaError(Exception):
    """A Kafka error answer, with its name and what it was about."""

    def __init__(self, what: str, code: int) -> None:
        super().__init__(f"{what}: {error_name(code)} ({code})")
        self.code = code

    @property
    def retriable(self) -> bool:
        return is_retriable(self.code)


class KafkaTimeoutError(Exception):
    """A deadline (delivery.timeout.ms, max.block.ms, a caller's timeout) passed; says what was pending."""


class ProducerFenced(KafkaError):
    """A newer producer took over this producer id (INVALID_PRODUCER_EPOCH / PRODUCER_FENCED)."""


# Errors after which the partition's leader may have moved: refresh metadata before retrying.
METADATA_ERRORS = frozenset({
    ErrorCode.unknown_topic_or_partition, ErrorCode.leader_not_available, ErrorCode.not_leader_or_follower,
    ErrorCode.fenced_leader_epoch, ErrorCode.unknown_leader_epoch, ErrorCode.kafka_storage_error,
    ErrorCode.replica_not_available,
})
