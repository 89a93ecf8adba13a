"""The trio shell of the metadata quorum on one node.

Every node applies the committed metadata log to its image (and tells the broker what
changed); the node that leads the quorum is the active controller: it starts from the
committed image, runs operations one at a time, proposes their records and answers once
they commit. Callers anywhere in the cluster reach the active controller through `call`,
which runs the operation here or sends it to the leader over the internal RPC.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import trio

from cluster.common.clock import SYSTEM_CLOCK, Clock
from cluster.common.config_def import ConfigDef
from cluster.controller.controller import (
    BrokerConfigValidator,
    ControllerConfig,
    GroupConfigValidator,
    QuorumController,
    TopicConfigValidator,
)
from cluster.controller.image import MetadataImage
from cluster.controller.rpc import RpcClient, RpcUnavailable
from cluster.protocol.errors import ErrorCode
from cluster.protocol.internal import internal_payload
from cluster.quorum.driver import NotLeader, QuorumDriver
from cluster.quorum.raft import RaftConfig, ReplicaView, Role
from cluster.security.connector import PLAINTEXT, LinkSecurity

log = logging.getLogger(__name__)

# Operations callers may run on the active controller, and whether they take the time.
OPERATIONS: dict[str, bool] = {
    "register_broker": True,
    "broker_heartbeat": True,
    "allocate_producer_ids": False,
    "create_topics": False,
    "delete_topics": False,
    "create_partitions": False,
    "alter_configs": False,
    "alter_broker_configs": False,
    "alter_group_configs": False,
    "elect_leaders": False,
    "alter_partition": False,
    "alter_partitions": False,
    "alter_reassignments": False,
    "list_reassignments": False,
    "alter_scram": False,
    "create_acls": False,
    "delete_acls": False,
    "alter_client_quotas": False,
    "update_features": False,
    "describe_quorum": False,  # a read of the quorum leader's Raft state (DescribeQuorum)
}

# A broker's registration and heartbeats go to a remote controller on a connection of their
# own (Kafka's separate heartbeat channel): a connection carries one call at a time, and each
# ISR change waits there for its commit, so a storm of them would hold a heartbeat back past
# broker.session.timeout.ms and get a live broker fenced.
LIFECYCLE_OPERATIONS = frozenset({"register_broker", "broker_heartbeat"})

# The event loop is watched this often; a wake-up later than PAUSE_MS beyond it was a pause
# (the loop held up), which broker sessions are credited for (QuorumController.excuse_pause).
PAUSE_WATCH_INTERVAL_MS = 100
PAUSE_MS = 500


class ControllerUnavailable(Exception):
    """No active controller answered within the deadline."""


class MetadataService:
    def __init__(self, node_id: int, voters: dict[int, tuple[str, int]], data_dir: Path, *,
                 observers: dict[int, tuple[str, int]] | None = None,
                 raft_config: RaftConfig, controller_config: ControllerConfig,
                 validate_configs: TopicConfigValidator,
                 validate_broker_configs: BrokerConfigValidator | None = None,
                 broker_config_defs: Mapping[str, ConfigDef] | None = None,
                 validate_group_configs: GroupConfigValidator | None = None, commit_timeout_s: float = 10.0,
                 snapshot_bytes: int = 20 << 20, seed: int | None = None, clock: Clock = SYSTEM_CLOCK,
                 link: LinkSecurity = PLAINTEXT, bootstrap_records: Sequence[dict[str, Any]] = ()) -> None:
        self.link = link
        self.bootstrap_records = list(bootstrap_records)
        self.node_id = node_id
        self.voters = voters
        self.clock = clock
        self.driver = QuorumDriver(node_id, voters, data_dir, raft_config, seed=seed, serve=False,
                                   observers=observers, clock=clock, link=link)
        self.controller_config = controller_config
        self.validate_configs = validate_configs
        self.validate_broker_configs = validate_broker_configs
        self.broker_config_defs = broker_config_defs
        self.validate_group_configs = validate_group_configs
        self.commit_timeout_s = commit_timeout_s
        self.snapshot_bytes = snapshot_bytes
        self._bytes_since_snapshot = 0
        self.image = MetadataImage()
        # Called with the records applied and whether a snapshot replaced the image first
        # (then the records are not all that changed).
        self.on_applied: Callable[[list[dict[str, Any]], bool], None] | None = None
        self._rng = random.Random(seed)
        self._controller: QuorumController | None = None
        self._controller_epoch = -1
        self._op_lock = trio.Lock()
        # Which activation of the controller an operation ran under (a commit timeout of an
        # earlier one must not drop a later one), and where its proposals end.
        self._generation = 0
        self._proposed_end = 0
        self._applied = trio.Event()
        self._poke = trio.Event()
        self._clients: dict[tuple[int, bool], RpcClient] = {}  # (node, lifecycle call) → its connection
        self._awake_ms = self.clock.now_ms()  # when the pause watch last saw the loop running

    # ---- state -------------------------------------------------------------------------

    @property
    def leader_id(self) -> int:
        return self.driver.leader_id

    @property
    def is_active_controller(self) -> bool:
        return self._controller is not None

    async def wait_for_offset(self, offset: int) -> None:
        while self.image.offset < offset:
            await self._applied.wait()

    # ---- running -----------------------------------------------------------------------

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.driver.run)
            nursery.start_soon(self._apply_loop)
            nursery.start_soon(self._tick_loop)
            nursery.start_soon(self._pause_watch)
            task_status.started()

    async def deliver(self, frame: bytes | bytearray) -> None:
        await self.driver.deliver(frame)

    async def _apply_loop(self) -> None:
        while True:
            changed = self.driver.change_event()  # taken before reading state: no wake-up is missed
            first, entries = self.driver.committed_since(self.image.offset)
            records: list[dict[str, Any]] = []
            applied = False
            from_snapshot = False
            if first > self.image.offset:
                snap = self.driver.node.state.snapshot if self.driver.node else None
                if snap is not None:
                    self.image = MetadataImage.from_bytes(snap.data)
                    self.image.offset = snap.end_offset
                    applied = from_snapshot = True
                    log.info("loaded the metadata snapshot at offset %d", snap.end_offset)
            for i, entry in enumerate(entries):
                records.extend(self.image.apply_entry(first + i, entry.data))
                self._bytes_since_snapshot += len(entry.data) + 16
                applied = True
            if applied:
                if self.on_applied is not None:
                    self.on_applied(records, from_snapshot)
                self._applied.set()
                self._applied = trio.Event()
                if self._bytes_since_snapshot >= self.snapshot_bytes:
                    # Fold the applied log into a snapshot of the image: restarts and lagging
                    # followers then load the image instead of replaying every record.
                    await self.driver.snapshot(self.image.offset, self.image.to_bytes())
                    self._bytes_since_snapshot = 0
                    log.info("metadata snapshot at offset %d", self.image.offset)
            self._check_leadership()
            await changed.wait()

    def _check_leadership(self) -> None:
        d = self.driver
        leading = d.role is Role.LEADER
        if self._controller is not None and (not leading or d.epoch != self._controller_epoch):
            self._deactivate("the quorum has another leader" if not leading else "a new quorum epoch began")
        if (self._controller is None and leading and d.high_watermark == d.log_end_offset
                and self.image.offset == d.high_watermark):
            # Everything earlier leaders wrote is committed and applied: decide from here.
            self._controller = QuorumController(self.image.copy(), self.controller_config, self.validate_configs,
                                                self._rng, self.clock.now_ms(),
                                                validate_broker_configs=self.validate_broker_configs,
                                                broker_config_defs=self.broker_config_defs,
                                                validate_group_configs=self.validate_group_configs)
            if self._controller.image.is_empty:
                # A new cluster: its first records (proposed with the first operation).
                self._controller.bootstrap(self.bootstrap_records)
                log.info("bootstrapping the metadata log (feature levels and %d record(s))",
                         len(self.bootstrap_records))
            self._controller_epoch = d.epoch
            self._generation += 1
            self._proposed_end = d.log_end_offset
            assert d.node is not None
            previous, last_contact_ms = d.node.last_leader_contact
            if previous != self.node_id and previous in self._controller.last_heartbeat_ms:
                # The old controller's node went silent when we last heard from it, not now.
                self._controller.last_heartbeat_ms[previous] = min(last_contact_ms, self.clock.now_ms())
            log.info("node %d is the active controller (epoch %d, metadata offset %d)",
                     self.node_id, d.epoch, self.image.offset)
            self._poke.set()

    def _deactivate(self, reason: str) -> None:
        if self._controller is not None:
            log.info("node %d is no longer the active controller (epoch %d): %s", self.node_id,
                     self._controller_epoch, reason)
        self._controller = None

    async def _pause_watch(self) -> None:
        while True:
            await trio.sleep(PAUSE_WATCH_INTERVAL_MS / 1000)
            self._note_awake()

    def _note_awake(self) -> None:
        """Credit broker sessions with a pause of the event loop since the last look (the
        tick loop looks too before fencing: after a pause it may run before the watch)."""
        now = self.clock.now_ms()
        paused_ms = now - self._awake_ms - PAUSE_WATCH_INTERVAL_MS
        self._awake_ms = now
        if paused_ms > PAUSE_MS and self._controller is not None:
            log.info("the event loop was held up for %.1f s: broker sessions are credited for it", paused_ms / 1000)
            self._controller.excuse_pause(paused_ms, now)

    async def _tick_loop(self) -> None:
        while True:
            ctrl = self._controller
            poke = self._poke
            if ctrl is None:
                await poke.wait()
                self._poke = trio.Event()
                continue
            delay_s = max(0.0, (ctrl.next_deadline_ms() - self.clock.now_ms()) / 1000)
            with trio.move_on_after(min(delay_s, 1.0)):
                await poke.wait()
                self._poke = trio.Event()
                continue
            await self.execute("tick", {})

    # ---- operations --------------------------------------------------------------------

    async def execute(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """Run an operation if this node is the active controller.

        Operations run one at a time on the working image and propose their records in
        order, but wait for the commit outside the lock: a storm of ISR changes must not
        queue heartbeats behind one commit round trip each (brokers would miss their session
        timeout and be fenced). Every answer still waits until everything proposed before it,
        and its own records, are committed; whatever fails to commit drops the working image.
        """
        if op == "describe_quorum":
            return self.describe_quorum()
        async with self._op_lock:
            ctrl = self._controller
            if ctrl is None:
                return {"error_code": ErrorCode.not_controller, "error_message": "not the active controller",
                        "leader_id": self.driver.leader_id}
            epoch = self._controller_epoch
            generation = self._generation
            try:
                if op == "tick":
                    self._note_awake()
                    ctrl.tick(self.clock.now_ms())
                    result: dict[str, Any] = {"error_code": ErrorCode.none}
                elif OPERATIONS[op]:
                    result = getattr(ctrl, op)(args, self.clock.now_ms())
                else:
                    result = getattr(ctrl, op)(args)
            except Exception as exc:
                # Bad arguments (or a bug) midway: records may already be in the working
                # image. Drop this controller; the next one starts from the committed log.
                self._deactivate(f"{op} failed midway")
                log.warning("controller operation %s failed: %r", op, exc)
                return {"error_code": ErrorCode.invalid_request, "error_message": f"{op} failed: {exc!r}"}
            records = ctrl.take_records()
            offset = -1
            if records:
                try:
                    offset = await self.driver.propose(orjson.dumps(records))
                except NotLeader as exc:
                    self._deactivate("the quorum has another leader")
                    return {"error_code": ErrorCode.not_controller, "error_message": str(exc),
                            "leader_id": exc.leader_id}
                self._proposed_end = offset + 1
            wait_end = max(self._proposed_end, self.image.offset)
        try:
            with trio.fail_after(self.commit_timeout_s):
                await self.wait_for_offset(wait_end)
        except trio.TooSlowError:
            # The working image holds records that may never commit: start over from the log.
            if self._generation == generation:
                self._deactivate("its records did not commit in time")
            return {"error_code": ErrorCode.request_timed_out,
                    "error_message": f"the metadata quorum did not commit within {self.commit_timeout_s} s"}
        if records:
            committed_epoch = self.driver.entry_epoch(offset)
            if committed_epoch is not None and committed_epoch != epoch:
                if self._generation == generation:
                    self._deactivate("another leader's records replaced its own")
                return {"error_code": ErrorCode.not_controller, "error_message": "leadership changed before commit",
                        "leader_id": self.driver.leader_id}
        result["metadata_offset"] = wait_end
        return result

    def describe_quorum(self) -> dict[str, Any]:
        """The quorum as its leader sees it (DescribeQuorum): leader, epoch, high watermark,
        each voter's and observer's log end offset and fetch times; NOT_CONTROLLER elsewhere
        (`call` then asks the leader)."""
        node = self.driver.node
        view = node.quorum_view(self.clock.now_ms()) if node is not None else None
        if view is None:
            return {"error_code": ErrorCode.not_controller, "error_message": "not the quorum leader",
                    "leader_id": self.driver.leader_id}

        def rows(replicas: tuple[ReplicaView, ...]) -> list[dict[str, int]]:
            return [{"replica_id": r.replica_id, "log_end_offset": r.log_end_offset,
                     "last_fetch_timestamp": r.last_fetch_ms, "last_caught_up_timestamp": r.caught_up_ms}
                    for r in replicas]

        return {"error_code": ErrorCode.none, "leader_id": view.leader_id, "leader_epoch": view.epoch,
                "high_watermark": view.high_watermark, "voters": rows(view.voters),
                "observers": rows(view.observers)}

    async def handle_rpc(self, frame: bytes | bytearray) -> dict[str, Any]:
        try:
            doc = orjson.loads(internal_payload(frame))
            op, args = doc["op"], doc["args"]
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            return {"error_code": ErrorCode.invalid_request, "error_message": f"malformed controller call: {exc}"}
        if op not in OPERATIONS or not isinstance(args, dict):
            return {"error_code": ErrorCode.invalid_request, "error_message": f"unknown controller operation {op!r}"}
        return await self.execute(op, args)

    async def call(self, op: str, args: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
        """Run an operation on the active controller wherever it is; retries until `timeout_s`."""
        deadline = trio.current_time() + timeout_s
        last = "no controller is known"
        while True:
            leader = self.driver.leader_id
            result: dict[str, Any] | None = None
            if leader == self.node_id:
                result = await self.execute(op, args)
            elif leader in self.voters:
                lane = (leader, op in LIFECYCLE_OPERATIONS)
                client = self._clients.get(lane)
                if client is None:
                    client = self._clients[lane] = RpcClient(*self.voters[leader], link=self.link)
                try:
                    result = await client.call(op, args, max(0.1, min(5.0, deadline - trio.current_time())))
                except RpcUnavailable as exc:
                    last = str(exc)
            else:
                last = f"no quorum leader is known (node {self.node_id} is {self.driver.role})"
            if result is not None:
                if result.get("error_code") not in (ErrorCode.not_controller, ErrorCode.request_timed_out):
                    return result
                last = str(result.get("error_message"))
            if trio.current_time() >= deadline:
                raise ControllerUnavailable(f"no active controller answered {op} within {timeout_s} s ({last})")
            with trio.move_on_after(0.05):
                await self.driver.wait_changed()

    async def resign(self) -> None:
        """Before this node stops: if it leads the quorum, hand over (see QuorumDriver.resign)."""
        if self.driver.role is Role.LEADER:
            log.info("node %d resigns as quorum leader (epoch %d)", self.node_id, self.driver.epoch)
            await self.driver.resign()

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()
