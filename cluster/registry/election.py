"""Which registry instance writes: a primary elected through a group on the cluster (as
Confluent's and Karapace's instances do), the others forward writes to it.

Every instance joins the group `schema-registry` (protocol type "sr") with its URL as
member metadata; the group leader picks the primary (`choose_primary`: the current one
while it is still a member, else the eligible member with the lowest URL) and tells every
member in its SyncGroup assignment. A primary that dies stops heartbeating, the group
rebalances after its session timeout and another instance takes over.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from cluster.client.config import consumer_config
from cluster.client.connection import KafkaConnectionError
from cluster.client.errors import KafkaError
from cluster.client.group import GroupCoordinatorChannel
from cluster.client.metadata import ClientCluster
from cluster.common.backoff import Backoff
from cluster.protocol.api_keys import ApiKey
from cluster.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

GROUP_ID = "schema-registry"
PROTOCOL_TYPE = "sr"
PROTOCOL_NAME = "v0"
SESSION_TIMEOUT_MS = 6_000
HEARTBEAT_S = 1.0
METADATA_BYTES_MAX = 4096
_REJOIN = frozenset({ErrorCode.rebalance_in_progress, ErrorCode.illegal_generation, ErrorCode.unknown_member_id})


@dataclass(frozen=True)
class Candidate:
    member_id: str
    url: str
    eligible: bool
    following: str | None
    """The primary this member follows now (keeps the primary stable across rebalances)."""


def member_metadata(url: str, eligible: bool, following: str | None) -> bytes:
    return json.dumps({"url": url, "eligible": eligible, "following": following}).encode()


def parse_member(member_id: str, metadata: bytes) -> Candidate | None:
    if len(metadata) > METADATA_BYTES_MAX:
        return None
    try:
        doc = json.loads(metadata)
        return Candidate(member_id, str(doc["url"]), bool(doc.get("eligible", True)), doc.get("following"))
    except (ValueError, KeyError, TypeError):
        return None


def choose_primary(candidates: Sequence[Candidate]) -> str | None:
    """The current primary while it is an eligible member, else the lowest eligible URL."""
    eligible = sorted({c.url for c in candidates if c.eligible})
    if not eligible:
        return None
    followed: dict[str, int] = {}
    for c in candidates:
        if c.following in eligible:
            followed[c.following] = followed.get(c.following, 0) + 1
    if followed:
        return max(sorted(followed), key=lambda url: followed[url])
    return eligible[0]


class PrimaryElection:
    """One instance's membership of the election group."""

    def __init__(self, client_config: Mapping[str, Any], url: str, *, eligible: bool = True,
                 group_id: str = GROUP_ID, session_timeout_ms: int = SESSION_TIMEOUT_MS) -> None:
        settings = {**client_config, "group.id": group_id, "client.id": "dcmirror-registry-election"}
        self.config = consumer_config(settings)
        self.url = url
        self.eligible = eligible
        self.group_id = group_id
        self.session_timeout_ms = session_timeout_ms
        self.primary_url: str | None = None
        self.generation = -1
        self.member_id = ""
        self.decided = trio.Event()     # set once a primary is known (replaced when one is lost)
        self.heartbeats_ok = 0          # heartbeats the coordinator accepted in this generation
        self._heartbeat_seen = trio.Event()
        self._heartbeat_now = trio.Event()  # confirm() wants a heartbeat sent at once

    @property
    def is_primary(self) -> bool:
        return self.primary_url == self.url

    async def wait_decided(self, timeout_s: float) -> bool:
        with trio.move_on_after(timeout_s):
            await self.decided.wait()
        return self.decided.is_set()

    async def confirm(self, timeout_s: float) -> bool:
        """Whether this instance is still primary in the group's current generation: true once
        a heartbeat sent after this call was accepted in the same generation (two accepted
        heartbeats from now: the first may have been sent before)."""
        generation, start = self.generation, self.heartbeats_ok
        with trio.move_on_after(timeout_s):
            while self.generation == generation and self.is_primary and self.heartbeats_ok < start + 2:
                self._heartbeat_now.set()
                await self._heartbeat_seen.wait()
        return self.generation == generation and self.is_primary and self.heartbeats_ok >= start + 2

    def _heartbeat_done(self) -> None:
        self._heartbeat_seen.set()
        self._heartbeat_seen = trio.Event()

    def _set_primary(self, url: str | None) -> None:
        if url != self.primary_url:
            log.info("schema registry primary: %s%s", url, " (this instance)" if url == self.url else "")
        self.primary_url = url
        if url is None:
            if self.decided.is_set():
                self.decided = trio.Event()
        else:
            self.decided.set()

    async def run(self) -> None:
        cluster = ClientCluster(self.config)
        channel = GroupCoordinatorChannel(cluster, self.group_id, self.config)
        backoff = Backoff(0.1, 2.0)
        try:
            while True:
                try:
                    await self._join_and_sync(channel)
                    backoff.reset()
                    await self._heartbeat(channel)
                except (KafkaConnectionError, KafkaError) as exc:
                    self._set_primary(None)
                    channel.forget()
                    delay_s = backoff.next_delay_s()
                    log.info("registry election: %s; retrying in %.2f s", exc, delay_s)
                    await trio.sleep(delay_s)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                await self._leave(channel)
            await cluster.aclose()

    async def _join_and_sync(self, channel: GroupCoordinatorChannel) -> None:
        timeout_s = self.session_timeout_ms / 1000 + channel.request_timeout_s
        while True:
            resp = await channel.request(ApiKey.JOIN_GROUP, {
                "group_id": self.group_id, "session_timeout": self.session_timeout_ms,
                "rebalance_timeout": self.session_timeout_ms, "member_id": self.member_id,
                "group_instance_id": None, "protocol_type": PROTOCOL_TYPE,
                "protocols": [{"name": PROTOCOL_NAME,
                               "metadata": member_metadata(self.url, self.eligible, self.primary_url)}]},
                timeout_s=timeout_s)
            if resp.error_code == ErrorCode.member_id_required:
                self.member_id = resp.member_id
                continue
            if resp.error_code == ErrorCode.unknown_member_id:
                self.member_id = ""
                continue
            if resp.error_code == ErrorCode.rebalance_in_progress:
                continue
            if resp.error_code != 0:
                raise KafkaError(f"joining group {self.group_id!r}", resp.error_code)
            break
        self.member_id, self.generation = resp.member_id, resp.generation_id
        self.heartbeats_ok = 0
        self._heartbeat_done()
        assignments: list[dict[str, Any]] = []
        if resp.leader == resp.member_id:
            candidates = [c for m in resp.members if (c := parse_member(m.member_id, bytes(m.metadata))) is not None]
            primary = choose_primary(candidates)
            payload = json.dumps({"primary": primary, "generation": self.generation}).encode()
            assignments = [{"member_id": m.member_id, "assignment": payload} for m in resp.members]
        sync = await channel.request(ApiKey.SYNC_GROUP, {
            "group_id": self.group_id, "generation_id": self.generation, "member_id": self.member_id,
            "group_instance_id": None, "protocol_type": PROTOCOL_TYPE, "protocol_name": PROTOCOL_NAME,
            "assignments": assignments}, timeout_s=timeout_s)
        if sync.error_code in _REJOIN:
            if sync.error_code == ErrorCode.unknown_member_id:
                self.member_id = ""
            self._set_primary(None)
            return
        if sync.error_code != 0:
            raise KafkaError(f"syncing group {self.group_id!r}", sync.error_code)
        try:
            primary = json.loads(bytes(sync.assignment) or b"{}").get("primary")
        except ValueError:
            primary = None
        self._set_primary(primary if isinstance(primary, str) else None)

    async def _heartbeat(self, channel: GroupCoordinatorChannel) -> None:
        while self.member_id:
            with trio.move_on_after(HEARTBEAT_S):
                await self._heartbeat_now.wait()
            self._heartbeat_now = trio.Event()
            resp = await channel.request(ApiKey.HEARTBEAT, {
                "group_id": self.group_id, "generation_id": self.generation, "member_id": self.member_id,
                "group_instance_id": None})
            if resp.error_code in _REJOIN:
                if resp.error_code == ErrorCode.unknown_member_id:
                    self.member_id = ""
                self._heartbeat_done()
                return
            if resp.error_code != 0:
                raise KafkaError(f"heartbeat in group {self.group_id!r}", resp.error_code)
            self.heartbeats_ok += 1
            self._heartbeat_done()

    async def _leave(self, channel: GroupCoordinatorChannel) -> None:
        if not self.member_id:
            return
        try:
            await channel.request(ApiKey.LEAVE_GROUP, {
                "group_id": self.group_id, "member_id": self.member_id,
                "members": [{"member_id": self.member_id, "group_instance_id": None}]})
        except (KafkaConnectionError, KafkaError):
            pass
