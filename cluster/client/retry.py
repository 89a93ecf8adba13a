"""Retries for client requests: exponential backoff with jitter (retry.backoff.ms doubling up
to retry.backoff.max.ms), bounded by a deadline, retrying only what can succeed later:
a broken or unreachable connection, or an error code Kafka marks retriable."""

from __future__ import annotations

from tenacity import AsyncRetrying

from cluster.client.connection import KafkaConnectionError
from cluster.client.errors import KafkaError, is_retriable
from cluster.common import backoff
from cluster.protocol.errors import ErrorCode

# Retriable for a client even though the broker's error table says otherwise: the request
# went to a node that is not (or no longer) the one in charge.
ALSO_RETRIABLE = frozenset({ErrorCode.not_controller, ErrorCode.not_coordinator,
                            ErrorCode.coordinator_not_available, ErrorCode.coordinator_load_in_progress})


def retriable_exception(exc: BaseException) -> bool:
    if isinstance(exc, KafkaConnectionError):
        return True
    return isinstance(exc, KafkaError) and (is_retriable(exc.code) or exc.code in ALSO_RETRIABLE)


def retrying(deadline_s: float, backoff_ms: int, backoff_max_ms: int, *,
             final_codes: frozenset[int] = frozenset()) -> AsyncRetrying:
    """`async for attempt in retrying(...): with attempt: ...` — the last error is re-raised
    once the deadline has passed. `final_codes` are answers for this caller, not transients."""

    def retry_on(exc: BaseException) -> bool:
        return retriable_exception(exc) and not (isinstance(exc, KafkaError) and exc.code in final_codes)

    return backoff.retrying(deadline_s, backoff_ms / 1000, backoff_max_ms / 1000, retry_on=retry_on)
