"""The trio shell of a quorum voter: timers, durable storage and a TCP transport.

One task owns the RaftNode and feeds it inbound messages, proposals and timer ticks; after
each step it fsyncs what changed (in a worker thread) and only then sends the node's
messages. Messages travel as internal Kafka frames (cluster/protocol/internal.py) carrying
orjson over one outbound connection per peer; a bounded queue per peer drops on overflow,
which Raft tolerates like a lossy network. Inbound frames arrive on the broker's own
listener (`deliver`), or on a listener of the driver's own when `serve` is set (tests).
"""

from __future__ import annotations

import base64
import logging
import random
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson
import trio

from cluster.common.backoff import Backoff
from cluster.common.clock import SYSTEM_CLOCK, Clock
from cluster.protocol.errors import ProtocolError
from cluster.protocol.framing import FrameDecoder
from cluster.protocol.internal import QUORUM_API_KEY, internal_frame, internal_payload
from cluster.quorum.raft import (
    BeginQuorumEpoch,
    EndQuorumEpoch,
    Entry,
    FetchRequest,
    FetchResponse,
    Message,
    RaftConfig,
    RaftNode,
    Role,
    Snapshot,
    VoteRequest,
    VoteResponse,
)
from cluster.quorum.storage import QuorumStorage
from cluster.security.connector import PLAINTEXT, LinkSecurity, open_stream
from cluster.security.errors import AuthenticationFailed

log = logging.getLogger(__name__)

MAX_FRAME_BYTES = 64 << 20
PEER_QUEUE_MESSAGES = 1024
_TYPES: dict[str, type] = {t.__name__: t for t in (VoteRequest, VoteResponse, BeginQuorumEpoch, EndQuorumEpoch,
                                                  FetchRequest, FetchResponse)}


class NotLeader(Exception):
    def __init__(self, leader_id: int) -> None:
        super().__init__(f"this voter is not the leader (leader: {leader_id})")
        self.leader_id = leader_id


# ---- wire encoding -----------------------------------------------------------------------


def encode_message(sender: int, msg: Message) -> bytes:
    body = asdict(msg)
    if isinstance(msg, FetchResponse):
        body["entries"] = [[e.epoch, base64.b64encode(e.data).decode()] for e in msg.entries]
        if msg.snapshot is not None:
            s = msg.snapshot
            body["snapshot"] = [s.end_offset, s.last_epoch, base64.b64encode(s.data).decode()]
    payload = orjson.dumps({"from": sender, "type": type(msg).__name__, "body": body})
    return internal_frame(QUORUM_API_KEY, 0, payload)


def decode_message(frame: bytes | bytearray | memoryview) -> tuple[int, Message]:
    """Decode a quorum frame's payload (the part after the internal header)."""
    try:
        doc = orjson.loads(frame)
        cls = _TYPES[doc["type"]]
        body: dict[str, Any] = doc["body"]
        if cls is FetchResponse:
            body["entries"] = tuple(Entry(int(e), base64.b64decode(d)) for e, d in body["entries"])
            if body.get("snapshot") is not None:
                end, epoch, data = body["snapshot"]
                body["snapshot"] = Snapshot(int(end), int(epoch), base64.b64decode(data))
        return int(doc["from"]), cls(**body)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed quorum message: {exc}") from None


# ---- the driver --------------------------------------------------------------------------


class QuorumDriver:
    def __init__(self, node_id: int, voters: dict[int, tuple[str, int]], data_dir: Path,
                 config: RaftConfig | None = None, *, seed: int | None = None, serve: bool = True,
                 observers: dict[int, tuple[str, int]] | None = None, clock: Clock = SYSTEM_CLOCK,
                 link: LinkSecurity = PLAINTEXT) -> None:
        self.node_id = node_id
        self.link = link  # how this node reaches its peers (the inter-broker listener)
        self.clock = clock
        self.voters = voters
        # Everyone this node talks to: voters, and observers (brokers beside dedicated
        # controllers) whose fetches the leader answers.
        self.nodes = {**(observers or {}), **voters}
        self.storage = QuorumStorage(data_dir)
        self.config = config or RaftConfig()
        self._rng = random.Random(seed)
        self.node: RaftNode | None = None
        self._inbound_send, self._inbound = trio.open_memory_channel[tuple[int, Message]](PEER_QUEUE_MESSAGES)
        self._peers: dict[int, trio.MemorySendChannel[bytes]] = {}
        # Frames queued for each peer and not yet written (or dropped): resign waits for 0.
        self._unsent: dict[int, int] = {}
        self._sent = trio.Event()
        self._changed = trio.Event()
        self._step_lock = trio.Lock()  # one step at a time: the node is not thread- or task-safe
        self.serve = serve
        self.started = trio.Event()
        # fsync in a worker thread (default), or inline: a test under trio's MockClock must
        # not see virtual time jump while a thread works.
        self.sync_in_thread = True
        self._last_seen: tuple[Any, ...] = ()  # (role, epoch, leader) last logged

    # ---- public --------------------------------------------------------------------------

    @property
    def role(self) -> Role | None:
        return self.node.role if self.node else None

    @property
    def leader_id(self) -> int:
        return self.node.leader_id if self.node else -1

    @property
    def high_watermark(self) -> int:
        return self.node.high_watermark if self.node else 0

    async def propose(self, data: bytes) -> int:
        """Append on the leader; returns the offset (await `wait_committed` for durability)."""
        assert self.node is not None
        async with self._step_lock:
            offset = self.node.propose(data, self.clock.now_ms())
            if offset is None:
                raise NotLeader(self.node.leader_id)
            await self._after_step()
        return offset

    async def wait_committed(self, offset: int) -> None:
        while self.node is None or self.node.high_watermark <= offset:
            await self._changed.wait()

    def committed_entries(self) -> list[Entry]:
        assert self.node is not None
        start = self.node.state.log_start_offset
        return self.node.state.entries[: self.node.high_watermark - start]

    def committed_since(self, offset: int) -> tuple[int, list[Entry]]:
        """(first offset, committed entries from `offset`); the first offset is above
        `offset` when entries below it are only in the snapshot."""
        assert self.node is not None
        start = self.node.state.log_start_offset
        first = max(offset, start)
        return first, self.node.state.entries[first - start : self.node.high_watermark - start]

    @property
    def epoch(self) -> int:
        return self.node.epoch if self.node else 0

    @property
    def log_end_offset(self) -> int:
        return self.node.log_end_offset if self.node else 0

    def entry_epoch(self, offset: int) -> int | None:
        node = self.node
        if node is None or not node.state.log_start_offset <= offset < node.log_end_offset:
            return None
        return node.entry(offset).epoch

    async def snapshot(self, end_offset: int, data: bytes) -> None:
        """Fold committed entries below `end_offset` into a snapshot (durably)."""
        assert self.node is not None
        async with self._step_lock:
            if end_offset <= self.node.state.log_start_offset or end_offset > self.node.high_watermark:
                return
            self.node.snapshot(end_offset, data)
            await self._after_step()

    async def resign(self, catch_up_timeout_s: float = 1.0) -> None:
        """Leader about to stop: let the voters fetch what is committed (so they apply it
        without waiting for a successor), then step down and tell them."""
        node = self.node
        if node is None or node.role is not Role.LEADER:
            return
        target = node.high_watermark
        with trio.move_on_after(catch_up_timeout_s):
            # A voter learns the high watermark from the answer to its next fetch after it.
            while not node.replicated_to_all(target, self.clock.now_ms()):
                await self.wait_changed()
            await trio.sleep(2 * self.config.fetch_interval_ms / 1000)
        async with self._step_lock:
            node.resign(self.clock.now_ms())
            await self._after_step()
        # Let the senders put EndQuorumEpoch on the wire before this node stops (on a loaded
        # machine a fixed pause was not enough: the voters then waited out an election timeout).
        with trio.move_on_after(catch_up_timeout_s):
            while any(self._unsent.values()):
                await self._sent.wait()

    async def wait_changed(self) -> None:
        await self._changed.wait()

    def change_event(self) -> trio.Event:
        """The event the next step sets (take it before reading state)."""
        return self._changed

    async def deliver(self, frame: bytes | bytearray) -> None:
        """An inbound quorum frame from the broker's listener."""
        sender, msg = decode_message(internal_payload(frame))
        if sender in self.nodes and sender != self.node_id:
            try:
                self._inbound_send.send_nowait((sender, msg))
            except trio.WouldBlock:
                pass  # overloaded: drop, as a lossy network would

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        state = await trio.to_thread.run_sync(self.storage.load) if self.sync_in_thread else self.storage.load()
        self.node = RaftNode(self.node_id, sorted(self.voters), state, self.config, self._rng, self.clock.now_ms())
        host, port = self.nodes[self.node_id]
        try:
            async with trio.open_nursery() as nursery:
                if self.serve:
                    listeners = await trio.open_tcp_listeners(port, host=host)
                    await nursery.start(trio.serve_listeners, self._serve_peer, listeners)
                for peer_id, address in self.nodes.items():
                    if peer_id != self.node_id:
                        send, recv = trio.open_memory_channel[bytes](PEER_QUEUE_MESSAGES)
                        self._peers[peer_id] = send
                        nursery.start_soon(self._sender, peer_id, address, recv)
                log.info("quorum %s %d up at %s:%d (epoch %d, log end %d)",
                         "voter" if self.node.is_voter else "observer", self.node_id, host, port,
                         self.node.epoch, self.node.log_end_offset)
                task_status.started()
                self.started.set()
                await self._loop()
        finally:
            self.storage.close()

    # ---- the node's loop -----------------------------------------------------------------

    async def _loop(self) -> None:
        assert self.node is not None
        while True:
            delay_s = max(0.0, (self.node.next_deadline_ms() - self.clock.now_ms()) / 1000)
            item: tuple[int, Message] | None = None
            with trio.move_on_after(delay_s):
                item = await self._inbound.receive()
            # Only the wait is under the timeout: a step is never cancelled halfway.
            async with self._step_lock:
                if item is not None:
                    self.node.receive(item[0], item[1], self.clock.now_ms())
                else:
                    self.node.tick(self.clock.now_ms())
                await self._after_step()

    async def _after_step(self) -> None:
        node = self.node
        assert node is not None
        if node.dirty:
            # Durable before anything is sent: votes and appended entries must survive a crash.
            if self.sync_in_thread:
                await trio.to_thread.run_sync(self.storage.sync, node.durable_state())
            else:
                self.storage.sync(node.durable_state())
        for to, msg in node.take_outbox():
            queue = self._peers.get(to)
            if queue is None:
                continue
            try:
                queue.send_nowait(encode_message(self.node_id, msg))
                self._unsent[to] = self._unsent.get(to, 0) + 1
            except trio.WouldBlock:
                pass  # a slow peer loses messages, as on a lossy network
        seen = (node.role, node.epoch, node.leader_id)
        if seen != self._last_seen:
            self._last_seen = seen
            log.info("quorum node %d: %s in epoch %d (leader %s)%s", self.node_id, node.role.name.lower(),
                     node.epoch, node.leader_id if node.leader_id >= 0 else "unknown",
                     f": {node.candidacy_cause}" if node.role is Role.PROSPECTIVE else "")
        self._changed.set()
        self._changed = trio.Event()

    # ---- transport -----------------------------------------------------------------------

    async def _serve_peer(self, stream: trio.SocketStream) -> None:
        decoder = FrameDecoder(MAX_FRAME_BYTES)
        try:
            async with stream:
                while True:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    decoder.receive_data(data)
                    while (frame := decoder.next_frame()) is not None:
                        await self.deliver(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return
        except ProtocolError as exc:
            log.warning("dropping a quorum connection: %s", exc)

    def _frame_done(self, peer_id: int) -> None:
        self._unsent[peer_id] = max(0, self._unsent.get(peer_id, 0) - 1)
        self._sent.set()
        self._sent = trio.Event()

    async def _sender(self, peer_id: int, address: tuple[str, int], queue: trio.MemoryReceiveChannel[bytes]) -> None:
        backoff = Backoff(0.05, 1.0)
        while True:
            try:
                stream = await open_stream(*address, self.link, client_id=f"quorum-{self.node_id}".encode())
            except (OSError, AuthenticationFailed) as exc:
                if isinstance(exc, AuthenticationFailed):
                    log.warning("quorum link to node %d: %s", peer_id, exc)
                # Drop what queued while the peer was away: Raft resends what still matters.
                while True:
                    try:
                        queue.receive_nowait()
                    except trio.WouldBlock:
                        break
                    self._frame_done(peer_id)
                await backoff.sleep()
                continue
            backoff.reset()
            try:
                async with stream:
                    async for frame in queue:
                        try:
                            await stream.send_all(frame)
                        finally:
                            self._frame_done(peer_id)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                continue

