"""Who sent a request, as the handlers and (later) the authorizer see it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestContext:
    """What JoinGroup / DescribeGroups report as client id and host."""

    client_id: str
    client_host: str
