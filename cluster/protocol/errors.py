"""Protocol-level errors. Kafka error codes come from kio's ErrorCode."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

__all__ = ["ErrorCode", "FrameTooLarge", "ProtocolError"]


class ProtocolError(Exception):
    """A request that cannot be understood; the connection is closed, the broker goes on."""


class FrameTooLarge(ProtocolError):
    """A frame whose declared size exceeds socket.request.max.bytes (checked before allocating)."""
