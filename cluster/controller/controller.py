"""The active controller's decisions, as a sans-IO object.

Each operation reads the controller's working image, emits metadata records (applying
them to that image at once, so later decisions in the same operation see them) and
returns a result. The trio shell proposes the records to the quorum and answers only after
they commit; if leadership is lost on the way, the shell throws this object away and a new
one starts from the committed image. Time comes in as `now_ms`; randomness from `rng`.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from cluster.common.config_def import ConfigDef, ConfigUpdateRefused
from cluster.controller.assignment import AssignmentError, assign_replicas
from cluster.controller.features import (
    FIXED_LEVELS,
    NEW_CLUSTER_LEVELS,
    SAFE_DOWNGRADE,
    SUPPORTED_FEATURES,
    UNSAFE_DOWNGRADE,
    UPGRADE,
    finalized_levels,
)
from cluster.controller.image import (
    ELR_FEATURE,
    NO_LEADER,
    MetadataImage,
    PartitionState,
    TopicImage,
    record,
)
from cluster.protocol.errors import ErrorCode
from cluster.protocol.sentinels import ELECTION_PREFERRED, ELECTION_UNCLEAN
from cluster.protocol.topic_names import InvalidTopic, validate_topic_name
from cluster.storage.config import altered_list_value

PRODUCER_ID_BLOCK_SIZE = 1000
MIN_ISR = "min.insync.replicas"


class ControllerError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = int(code)
        self.message = message


@dataclass(frozen=True)
class ControllerConfig:
    node_id: int = -1  # this controller's node (its own dynamic broker configs apply to it)
    session_timeout_ms: int = 2000
    num_partitions: int = 1
    default_replication_factor: int = 1
    max_partitions_per_topic: int = 10_000
    max_topics: int = 10_000
    delete_topic_enable: bool = True
    unclean_leader_election_enable: bool = False
    auto_leader_rebalance_enable: bool = True
    leader_imbalance_check_interval_ms: int = 300_000
    leader_imbalance_per_broker_percentage: int = 10
    min_insync_replicas: int = 1  # this controller's static min.insync.replicas (KIP-966's min ISR)


Result = dict[str, Any]


class Election(NamedTuple):
    leader: int
    isr: list[int]
    unclean: bool = False  # a replica that may lack acknowledged records: the ELR is void
TopicConfigValidator = Callable[[dict[str, str]], object]  # raises ValueError with a clear message
# (resource name, the dynamic configs it would hold) → raises ConfigUpdateRefused (INVALID_REQUEST)
# or another ValueError (INVALID_CONFIG)
BrokerConfigValidator = Callable[[str, dict[str, str]], object]
# A group's configs after an alter → the values to store; raises ValueError (INVALID_CONFIG)
GroupConfigValidator = Callable[[dict[str, str]], dict[str, str]]


def _no_group_configs(configs: dict[str, str]) -> dict[str, str]:
    if configs:
        raise ValueError(f"Unknown group config name: {sorted(configs)[0]}")
    return configs


def _no_dynamic_broker_configs(resource_name: str, configs: dict[str, str]) -> None:
    if configs:
        raise ConfigUpdateRefused(f"Cannot update these configs dynamically: [{', '.join(sorted(configs))}]")


def _ok(**fields: Any) -> Result:
    return {"error_code": ErrorCode.none, "error_message": None, **fields}


def _err(code: int, message: str, **fields: Any) -> Result:
    return {"error_code": int(code), "error_message": message, **fields}


class QuorumController:
    def __init__(self, image: MetadataImage, config: ControllerConfig, validate_configs: TopicConfigValidator,
                 rng: random.Random, now_ms: int, *,
                 validate_broker_configs: BrokerConfigValidator | None = None,
                 broker_config_defs: Mapping[str, ConfigDef] | None = None,
                 validate_group_configs: GroupConfigValidator | None = None) -> None:
        self.image = image
        self.config = config
        self.validate_configs = validate_configs
        self.validate_broker_configs = validate_broker_configs or _no_dynamic_broker_configs
        self.broker_config_defs: Mapping[str, ConfigDef] = broker_config_defs or {}
        self.validate_group_configs = validate_group_configs or _no_group_configs
        self.rng = rng
        self._records: list[dict[str, Any]] = []
        # Liveness is the controller's own memory: a new controller gives every broker a
        # full session from its start rather than trusting times it never saw.
        self.last_heartbeat_ms: dict[int, int] = {b: now_ms for b in image.brokers}
        self.next_rebalance_check_ms = now_ms + config.leader_imbalance_check_interval_ms

    # ---- emitting ----------------------------------------------------------------------

    def _emit(self, rec: dict[str, Any]) -> None:
        self.image.apply(rec)
        self._records.append(rec)

    def take_records(self) -> list[dict[str, Any]]:
        out, self._records = self._records, []
        return out

    def _change(self, t: TopicImage, p: PartitionState, *, unclean_shutdown: frozenset[int] = frozenset(),
                clear_elr: bool = False, **fields: Any) -> None:
        """One PartitionChange with the fields that differ. With ELR on (KIP-966) it also
        carries the eligible leader replicas the change leaves: `unclean_shutdown` replicas
        are never eligible, `clear_elr` empties the ELR (min ISR changed, unclean election)."""
        if self.image.elr_enabled:
            fields.update(self._elr_fields(t, p, fields, unclean_shutdown, clear_elr))
        changed = {k: v for k, v in fields.items() if getattr(p, k) != v}
        if changed:
            self._emit(record("PartitionChange", topic_id=t.topic_id, partition=p.partition, **changed))

    def _min_isr(self, t: TopicImage, replica_count: int) -> int:
        """The topic's effective min.insync.replicas as brokers apply it: its own config, else
        the cluster-wide dynamic default, else this controller's static config; never more
        than its replicas (Kafka's effective min ISR)."""
        raw = t.configs.get(MIN_ISR) or self.image.broker_configs.get("", {}).get(MIN_ISR)
        value = int(raw) if raw else self.config.min_insync_replicas
        return max(1, min(value, replica_count))

    def _elr_fields(self, t: TopicImage, p: PartitionState, fields: dict[str, Any],
                    unclean_shutdown: frozenset[int], clear_elr: bool) -> dict[str, Any]:
        """KIP-966 bookkeeping for a change to `fields`. While the ISR is at least min ISR
        the high watermark advances and nothing outside it is eligible. Below it the high
        watermark stands still (strict min ISR), so every replica that was in the ISR or ELR
        holds every record below it and stays eligible when it leaves, unless it lost its
        tail in an unclean shutdown. While the ISR is empty the last leader is remembered
        (last_known_elr), for when nothing better comes back."""
        isr = list(fields.get("isr", p.isr))
        leader = int(fields.get("leader", p.leader))
        replicas, removing = fields.get("replicas", p.replicas), fields.get("removing", p.removing)
        members = [r for r in replicas if r not in removing]
        if len(isr) >= self._min_isr(t, len(members)):
            return {"elr": [], "last_known_elr": []}
        elr = [] if clear_elr else [r for r in dict.fromkeys([*p.elr, *p.isr])
                                    if r not in isr and r in members and r not in unclean_shutdown]
        if isr:
            last_known: list[int] = []
        elif leader != NO_LEADER:
            last_known = [leader]
        elif p.leader != NO_LEADER:
            last_known = [p.leader] if p.leader in members else []
        else:
            last_known = [r for r in p.last_known_elr if r in members]
        return {"elr": elr, "last_known_elr": last_known}

    def _unclean_allowed(self, t: TopicImage) -> bool:
        """The topic's unclean.leader.election.enable, else this controller node's dynamic
        broker config, else the cluster-wide dynamic default, else its static config (Kafka's
        ConfigurationControlManager.uncleanLeaderElectionEnabledForTopic)."""
        key = "unclean.leader.election.enable"
        dynamic = self.image.broker_configs
        for value in (t.configs.get(key), dynamic.get(str(self.config.node_id), {}).get(key),
                      dynamic.get("", {}).get(key)):
            if value is not None:
                return value.strip().lower() == "true"
        return self.config.unclean_leader_election_enable

    def _elect(self, t: TopicImage, p: PartitionState, isr: list[int], *, unclean: bool = False) -> Election:
        """The leader (and ISR) after an election, in replica order: an active ISR member;
        with ELR on (KIP-966) then an active eligible leader replica (it alone forms the ISR),
        then, with the ISR and ELR empty, the last known leader once it is back; then, only
        when allowed, any active replica (an unclean election)."""
        active = self.image.is_active
        for r in p.replicas:
            if r in isr and active(r) and r not in p.removing:
                return Election(r, isr)
        for r in p.replicas:
            if r in isr and active(r):
                return Election(r, isr)
        if self.image.elr_enabled:
            for r in p.replicas:
                if r in p.elr and r not in isr and active(r) and r not in p.removing:
                    return Election(r, [r])
            if not isr and not p.elr:
                for r in p.last_known_elr:
                    if r in p.replicas and active(r):
                        return Election(r, [r])
        if unclean or self._unclean_allowed(t):
            for r in p.replicas:
                if active(r):
                    # data the old ISR (and ELR) had beyond this replica is lost: Kafka's trade
                    return Election(r, [r], unclean=True)
        return Election(NO_LEADER, isr)

    # ---- brokers -----------------------------------------------------------------------

    def register_broker(self, args: dict[str, Any], now_ms: int) -> Result:
        """A broker (re)starting. `previous_broker_epoch` is the epoch its clean-shutdown
        marker names (-1: none): any other than its last registration's means it stopped
        without a clean shutdown and may have lost its unsynced tail, so with ELR on it
        leaves every ISR and ELR (Kafka's clean shutdown detection, KAFKA-15586)."""
        broker_id = int(args["broker_id"])
        current = self.image.brokers.get(broker_id)
        if current is not None and current.incarnation_id == args["incarnation_id"]:
            return _ok(broker_epoch=current.broker_epoch)  # a retried registration
        unclean = current is not None and int(args.get("previous_broker_epoch", -1)) != current.broker_epoch
        if current is not None and not current.fenced:
            # A restarted broker lost its in-memory state: fence the old incarnation first.
            self._fence(broker_id, current.broker_epoch)
        epoch = self.image.next_broker_epoch
        self._emit(record("RegisterBroker", broker_id=broker_id, broker_epoch=epoch,
                          incarnation_id=str(args["incarnation_id"]), host=str(args["host"]),
                          port=int(args["port"]), rack=args.get("rack"),
                          **({"listeners": dict(args["listeners"])} if args.get("listeners") else {})))
        self.last_heartbeat_ms[broker_id] = now_ms
        if unclean and self.image.elr_enabled:
            self._forget_unclean(broker_id)
        return _ok(broker_epoch=epoch)

    def _forget_unclean(self, broker_id: int) -> None:
        """A broker back from an unclean shutdown: out of every ISR and ELR (what it holds
        below the high watermark may be gone); it joins ISRs again by catching up."""
        gone = frozenset({broker_id})
        for t, p in self.image.all_partitions():
            if broker_id not in p.isr and broker_id not in p.elr:
                continue
            isr = [r for r in p.isr if r != broker_id]
            leader = p.leader
            if leader == broker_id or leader == NO_LEADER:
                e = self._elect(t, p, isr)
                leader, isr = (e.leader, e.isr) if e.leader != broker_id else (NO_LEADER, isr)
            self._change(t, p, leader=leader, isr=isr, unclean_shutdown=gone)

    def broker_heartbeat(self, args: dict[str, Any], now_ms: int) -> Result:
        broker_id = int(args["broker_id"])
        reg = self.image.brokers.get(broker_id)
        if reg is None or reg.broker_epoch != int(args["broker_epoch"]):
            return _err(ErrorCode.stale_broker_epoch, f"broker {broker_id} must register again")
        self.last_heartbeat_ms[broker_id] = now_ms
        if args.get("want_shutdown"):
            if not reg.fenced and not reg.in_controlled_shutdown:
                self._emit(record("BrokerShutdown", broker_id=broker_id, broker_epoch=reg.broker_epoch))
                self._move_away(broker_id)
            leads = any(p.leader == broker_id for _, p in self.image.all_partitions())
            return _ok(is_fenced=reg.fenced, should_shut_down=not leads)
        if reg.fenced and args.get("caught_up"):
            self._emit(record("UnfenceBroker", broker_id=broker_id, broker_epoch=reg.broker_epoch))
            self._elect_leaderless()
        return _ok(is_fenced=reg.fenced, should_shut_down=False)

    def _fence(self, broker_id: int, broker_epoch: int) -> None:
        self._emit(record("FenceBroker", broker_id=broker_id, broker_epoch=broker_epoch))
        self._move_away(broker_id)

    def _move_away(self, broker_id: int) -> None:
        """Take a broker that stops (fenced or shutting down) out of ISRs and leadership.
        Without ELR the last ISR member stays (it leads again when back); with ELR the ISR
        may empty: the member moves to the ELR, as eligible as before."""
        for t, p in self.image.all_partitions():
            if broker_id not in p.replicas:
                continue
            isr = [r for r in p.isr if r != broker_id]
            if not isr and not self.image.elr_enabled:
                isr = p.isr
            leader, unclean = p.leader, False
            if leader == broker_id or leader == NO_LEADER:
                leader, isr, unclean = self._elect(t, p, isr)
            self._change(t, p, leader=leader, isr=isr, clear_elr=unclean)

    def _elect_leaderless(self) -> None:
        for t, p in self.image.all_partitions():
            if p.leader == NO_LEADER:
                leader, isr, unclean = self._elect(t, p, p.isr)
                self._change(t, p, leader=leader, isr=isr, clear_elr=unclean)

    def excuse_pause(self, paused_ms: int, now_ms: int) -> None:
        """The controller heard nobody for `paused_ms` (its event loop was held up, say by
        its own broker taking leadership of 10,000 partitions): that time does not count
        toward any broker's session. Kafka hears heartbeats on network threads while its
        controller thread is busy; one event loop cannot, so it credits the pause instead of
        fencing every broker, its own included, the moment it resumes."""
        for broker_id, last in self.last_heartbeat_ms.items():
            self.last_heartbeat_ms[broker_id] = min(now_ms, last + paused_ms)

    def tick(self, now_ms: int) -> None:
        """Fence brokers whose session expired; check leader balance when due."""
        for broker_id, reg in sorted(self.image.brokers.items()):
            if reg.fenced:
                continue
            last = self.last_heartbeat_ms.setdefault(broker_id, now_ms)
            if now_ms - last > self.config.session_timeout_ms:
                self._fence(broker_id, reg.broker_epoch)
        if self.config.auto_leader_rebalance_enable and now_ms >= self.next_rebalance_check_ms:
            self.next_rebalance_check_ms = now_ms + self.config.leader_imbalance_check_interval_ms
            self.rebalance_leaders()

    def next_deadline_ms(self) -> int:
        deadlines = [self.last_heartbeat_ms.get(b, 0) + self.config.session_timeout_ms + 1
                     for b, reg in self.image.brokers.items() if not reg.fenced]
        if self.config.auto_leader_rebalance_enable:
            deadlines.append(self.next_rebalance_check_ms)
        return min(deadlines) if deadlines else self.next_rebalance_check_ms

    def rebalance_leaders(self) -> int:
        """Preferred election for brokers over leader.imbalance.per.broker.percentage."""
        preferred: dict[int, list[tuple[TopicImage, PartitionState]]] = {}
        for t, p in self.image.all_partitions():
            if p.replicas:
                preferred.setdefault(p.preferred_leader, []).append((t, p))
        moved = 0
        for broker_id, parts in sorted(preferred.items()):
            if not self.image.is_active(broker_id):
                continue
            not_leading = [(t, p) for t, p in parts if p.leader != broker_id]
            if 100 * len(not_leading) <= self.config.leader_imbalance_per_broker_percentage * len(parts):
                continue
            for t, p in not_leading:
                if broker_id in p.isr:
                    self._change(t, p, leader=broker_id)
                    moved += 1
        return moved

    # ---- producer ids ------------------------------------------------------------------

    def allocate_producer_ids(self, args: dict[str, Any]) -> Result:
        start = self.image.next_producer_id
        self._emit(record("ProducerIds", broker_id=int(args["broker_id"]),
                          next_producer_id=start + PRODUCER_ID_BLOCK_SIZE))
        return _ok(start=start, length=PRODUCER_ID_BLOCK_SIZE)

    # ---- topics ------------------------------------------------------------------------

    def create_topics(self, args: dict[str, Any]) -> Result:
        results = []
        validate_only = bool(args.get("validate_only"))
        for spec in args["topics"]:
            try:
                results.append(self._create_topic(spec, validate_only))
            except ControllerError as exc:
                results.append(_err(exc.code, exc.message, name=spec["name"]))
        return _ok(topics=results)

    def _create_topic(self, spec: dict[str, Any], validate_only: bool) -> Result:
        name = spec["name"]
        try:
            validate_topic_name(name)
        except InvalidTopic as exc:
            raise ControllerError(ErrorCode.invalid_topic_exception, str(exc)) from None
        if name in self.image.topics_by_name:
            raise ControllerError(ErrorCode.topic_already_exists, f"topic {name!r} already exists")
        collides = self._collision(name)
        if collides is not None:
            # '.' and '_' are one character in metric names (Kafka's Topic.hasCollision)
            raise ControllerError(ErrorCode.invalid_topic_exception,
                                  f"Topic '{name}' collides with existing topic: {collides}")
        if len(self.image.topics) >= self.config.max_topics:
            raise ControllerError(ErrorCode.policy_violation, f"the cluster holds max.topics={self.config.max_topics}")
        raw_configs = spec.get("configs") or {}
        nulls = sorted(str(k) for k, v in raw_configs.items() if v is None)
        if nulls:
            raise ControllerError(ErrorCode.invalid_config, f"Null value not supported for topic configs: "
                                                            f"{', '.join(nulls)}")
        configs = {str(k): str(v) for k, v in raw_configs.items()}
        try:
            self.validate_configs(configs)
        except ValueError as exc:
            raise ControllerError(ErrorCode.invalid_config, str(exc)) from None
        if spec.get("assignments") and (spec.get("num_partitions", -1) != -1
                                        or spec.get("replication_factor", -1) != -1):
            raise ControllerError(ErrorCode.invalid_request,
                                  "Both numPartitions or replicationFactor and replicasAssignments were set. "
                                  "Both cannot be used at the same time.")
        assignments = self._explicit_assignments(spec.get("assignments"))
        if assignments is None:
            partitions = int(spec.get("num_partitions", -1))
            partitions = self.config.num_partitions if partitions == -1 else partitions
            rf = int(spec.get("replication_factor", -1))
            rf = min(self.config.default_replication_factor, len(self.image.active_brokers()) or 1) if rf == -1 else rf
            if not 1 <= partitions <= self.config.max_partitions_per_topic:
                raise ControllerError(ErrorCode.invalid_partitions,
                                      f"partition count {partitions} must be in 1..{self.config.max_partitions_per_topic}")
            assignments = self._assign(partitions, rf)
        self._check_some_active(assignments)
        result = _ok(name=name, num_partitions=len(assignments), replication_factor=len(assignments[0]),
                     topic_id=None, configs=configs)
        if validate_only:
            return result
        topic_id = str(spec.get("topic_id") or uuid.UUID(int=self.rng.getrandbits(128), version=4))
        self._emit(record("Topic", topic_id=topic_id, name=name, configs=configs,
                          internal=bool(spec.get("internal", False))))
        t = self.image.topics[topic_id]
        for index, replicas in enumerate(assignments):
            self._add_partition(t, index, replicas)
        result["topic_id"] = topic_id
        return result

    def _collision(self, name: str) -> str | None:
        """An existing topic whose name differs from `name` only by '.' against '_'."""
        if "." not in name and "_" not in name:
            return None
        key = name.replace(".", "_")
        return next((other for other in self.image.topics_by_name
                     if other != name and other.replace(".", "_") == key), None)

    def _assign(self, partitions: int, rf: int, first_partition: int = 0) -> list[list[int]]:
        try:
            return assign_replicas(self.image.active_brokers(), partitions, rf, self.rng.randrange(1 << 16),
                                   first_partition)
        except AssignmentError as exc:
            raise ControllerError(ErrorCode.invalid_replication_factor, str(exc)) from None

    def _explicit_assignments(self, raw: Any) -> list[list[int]] | None:
        if not raw:
            return None
        out = [[int(b) for b in replicas] for replicas in raw]
        for i, replicas in enumerate(out):
            self._check_replicas(replicas, f"partition {i}")
        if len({len(r) for r in out}) != 1:
            raise ControllerError(ErrorCode.invalid_replica_assignment, "every partition needs the same replica count")
        return out

    def _check_replicas(self, replicas: list[int], what: str) -> None:
        if not replicas:
            raise ControllerError(ErrorCode.invalid_replica_assignment, f"{what}: no replicas given")
        if len(set(replicas)) != len(replicas):
            raise ControllerError(ErrorCode.invalid_replica_assignment, f"{what}: a broker appears twice in {replicas}")
        unknown = [b for b in replicas if b not in self.image.brokers]
        if unknown:
            raise ControllerError(ErrorCode.invalid_replica_assignment,
                                  f"{what}: broker(s) {unknown} are not registered (registered: {sorted(self.image.brokers)})")

    def _check_some_active(self, assignments: list[list[int]]) -> None:
        for i, replicas in enumerate(assignments):
            if not any(self.image.is_active(r) for r in replicas):
                raise ControllerError(ErrorCode.invalid_replica_assignment,
                                      f"partition {i}: every broker of {replicas} is fenced or shutting down")

    def _add_partition(self, t: TopicImage, index: int, replicas: list[int]) -> None:
        isr = [r for r in replicas if self.image.is_active(r)]
        assert isr, "assignments are checked for a live replica first"
        leader = next((r for r in replicas if self.image.is_active(r)), NO_LEADER)
        self._emit(record("Partition", topic_id=t.topic_id, partition=index, replicas=replicas, isr=isr,
                          leader=leader, leader_epoch=0, partition_epoch=0, adding=[], removing=[]))

    def delete_topics(self, args: dict[str, Any]) -> Result:
        results = []
        for name in args["names"]:
            t = self.image.topics_by_name.get(name)
            if not self.config.delete_topic_enable:
                results.append(_err(ErrorCode.topic_deletion_disabled, "delete.topic.enable is false", name=name))
            elif t is None:
                results.append(_err(ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist", name=name))
            elif t.internal and not args.get("allow_internal"):
                results.append(_err(ErrorCode.invalid_topic_exception, f"{name} is internal", name=name))
            else:
                self._emit(record("RemoveTopic", topic_id=t.topic_id))
                results.append(_ok(name=name))
        return _ok(topics=results)

    def create_partitions(self, args: dict[str, Any]) -> Result:
        results = []
        for spec in args["topics"]:
            name = spec["name"]
            try:
                t = self.image.topics_by_name.get(name)
                if t is None:
                    raise ControllerError(ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist")
                count = int(spec["count"])
                current = len(t.partitions)
                if count <= current:
                    raise ControllerError(ErrorCode.invalid_partitions,
                                          f"topic {name} has {current} partitions; the new count {count} must be larger")
                if count > self.config.max_partitions_per_topic:
                    raise ControllerError(ErrorCode.invalid_partitions,
                                          f"partition count {count} exceeds {self.config.max_partitions_per_topic}")
                rf = len(t.partitions[0].target_replicas) if t.partitions else 1
                new = self._explicit_assignments(spec.get("assignments"))
                if new is not None and len(new) != count - current:
                    raise ControllerError(ErrorCode.invalid_replica_assignment,
                                          f"{count - current} new partitions need {count - current} assignments")
                if new is not None and any(len(r) != rf for r in new):
                    raise ControllerError(ErrorCode.invalid_replica_assignment,
                                          f"topic {name} has replication factor {rf}; new partitions must too")
                new = new or self._assign(count - current, rf, current)
                self._check_some_active(new)
                if not args.get("validate_only"):
                    for i, replicas in enumerate(new):
                        self._add_partition(t, current + i, replicas)
                results.append(_ok(name=name))
            except ControllerError as exc:
                results.append(_err(exc.code, exc.message, name=name))
        return _ok(topics=results)

    def alter_configs(self, args: dict[str, Any]) -> Result:
        """Incremental: ops are [key, "set"|"delete"|"append"|"subtract", value]."""
        results = []
        for spec in args["topics"]:
            name = spec["name"]
            t = self.image.topics_by_name.get(name)
            if t is None:
                results.append(_err(ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist", name=name))
                continue
            configs = dict(t.configs) if not spec.get("replace") else {}
            try:
                _apply_config_ops(configs, spec["ops"])
                self.validate_configs(configs)
            except ValueError as exc:
                results.append(_err(ErrorCode.invalid_config, str(exc), name=name))
                continue
            if not args.get("validate_only"):
                for key in sorted(set(t.configs) | set(configs)):
                    if t.configs.get(key) != configs.get(key):
                        self._emit(record("TopicConfig", topic_id=t.topic_id, key=key, value=configs.get(key)))
                if any(op[0] == MIN_ISR for op in spec["ops"]) or (spec.get("replace") and MIN_ISR in t.configs):
                    self._clear_elr([t])  # KIP-966: a topic's min ISR changed
            results.append(_ok(name=name))
        return _ok(topics=results)

    def _clear_elr(self, topics: list[TopicImage]) -> None:
        """Empty the ELR of these topics' partitions (Kafka does on any min ISR update: who
        was eligible under the old one may not be under the new)."""
        if not self.image.elr_enabled:
            return
        for t in topics:
            for p in t.partitions.values():
                if p.elr:
                    self._change(t, p, clear_elr=True)

    def alter_broker_configs(self, args: dict[str, Any]) -> Result:
        """KIP-226 dynamic broker configs: resource name "" (the cluster-wide default) or a
        broker id; ops as alter_configs; `replace` (AlterConfigs) keeps only the configs given."""
        results = []
        for spec in args["resources"]:
            name = str(spec["name"])
            if name and not name.isdigit():  # Kafka's ControllerConfigurationValidator.validateBrokerName
                results.append(_err(ErrorCode.invalid_request, "Unable to parse broker name as a base 10 number.",
                                    name=name))
                continue
            current = self.image.broker_configs.get(name, {})
            configs = dict(current) if not spec.get("replace") else {}
            try:
                _apply_config_ops(configs, spec["ops"], self.broker_config_defs)
                self.validate_broker_configs(name, configs)
            except ConfigUpdateRefused as exc:
                results.append(_err(ErrorCode.invalid_request, str(exc), name=name))
                continue
            except ValueError as exc:
                results.append(_err(ErrorCode.invalid_config, str(exc), name=name))
                continue
            touches_min_isr = any(op[0] == MIN_ISR for op in spec["ops"]) or (
                bool(spec.get("replace")) and MIN_ISR in current)
            if self.image.elr_enabled and touches_min_isr:
                # Kafka's rules with ELR on: one min ISR for the cluster, never a broker's own.
                if name:
                    results.append(_err(ErrorCode.invalid_config, "Broker-level min.insync.replicas cannot be "
                                        "altered while ELR is enabled.", name=name))
                    continue
                if MIN_ISR not in configs:
                    results.append(_err(ErrorCode.invalid_config, "Cluster-level min.insync.replicas cannot be "
                                        "removed while ELR is enabled.", name=name))
                    continue
            if not args.get("validate_only"):
                for key in sorted(set(current) | set(configs)):
                    if current.get(key) != configs.get(key):
                        self._emit(record("BrokerConfig", resource_name=name, key=key, value=configs.get(key)))
                if touches_min_isr and not name:
                    # The cluster's min ISR updated (even to the same value): every topic
                    # without its own loses its ELR.
                    self._clear_elr([t for t in self.image.topics_by_name.values() if MIN_ISR not in t.configs])
            results.append(_ok(name=name))
        return _ok(resources=results)

    def alter_group_configs(self, args: dict[str, Any]) -> Result:
        """Dynamic group configs (KIP-848/KIP-932): `groups` [{name, ops, replace}], ops as
        alter_configs. A group need not exist (Kafka keeps a group's configs apart from the
        group); "" is refused as Kafka refuses a default group resource."""
        results = []
        for spec in args["groups"]:
            name = str(spec["name"])
            if not name:
                results.append(_err(ErrorCode.invalid_request, "Default group resources are not allowed.", name=name))
                continue
            current = self.image.group_configs.get(name, {})
            configs = dict(current) if not spec.get("replace") else {}
            try:
                # APPEND/SUBTRACT: no group config is a LIST (Kafka's "Can't APPEND ..." refusal)
                _apply_config_ops(configs, spec["ops"], {})
                configs = self.validate_group_configs(configs)
            except ValueError as exc:
                results.append(_err(ErrorCode.invalid_config, str(exc), name=name))
                continue
            if not args.get("validate_only"):
                for key in sorted(set(current) | set(configs)):
                    if current.get(key) != configs.get(key):
                        self._emit(record("GroupConfig", group=name, key=key, value=configs.get(key)))
            results.append(_ok(name=name))
        return _ok(groups=results)

    # ---- feature levels (KIP-584) --------------------------------------------------------

    def update_features(self, args: dict[str, Any]) -> Result:
        """UpdateFeatures: `updates` [{feature, level, upgrade_type}] (upgrade_type 1 upgrade,
        2 safe downgrade, 3 unsafe downgrade), `validate_only`. All or nothing, as Kafka's
        QuorumController and FeatureControlManager: a feature named twice takes its last update;
        the first refused update is the answer's error, with Kafka's messages and no results
        (as Kafka's); else one result per update given."""
        current = finalized_levels(self.image)
        given = args.get("updates", [])
        wanted: dict[str, tuple[int, int]] = {}
        for u in given:
            wanted[str(u["feature"])] = (int(u["level"]), int(u.get("upgrade_type", 1)))
        for name, (level, kind) in wanted.items():
            problem = None
            if name not in SUPPORTED_FEATURES:
                problem = f"Invalid update version {level} for feature {name}. The controller does not support " \
                          f"the given feature."
            elif kind not in (UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE):
                problem = f"Invalid update version {level} for feature {name}. The controller does not support " \
                          f"the given upgrade type."
            else:
                low, high = SUPPORTED_FEATURES[name]
                if level != 0 and not low <= level <= high or level < 0:
                    problem = f"Invalid update version {level} for feature {name}. Controller " \
                              f"{self.config.node_id} only supports versions {low}-{high}"
                elif level < current[name] and kind not in (SAFE_DOWNGRADE, UNSAFE_DOWNGRADE):
                    problem = f"Invalid update version {level} for feature {name}. Can't downgrade the version " \
                              f"of this feature without setting the upgrade type to either safe or unsafe " \
                              f"downgrade."
                elif level != current[name] and name in FIXED_LEVELS:
                    problem = f"Invalid update version {level} for feature {name}. This cluster keeps it at " \
                              f"{current[name]}."
            if problem is not None:
                return _err(ErrorCode.invalid_update_version, problem, results=[])
        if not args.get("validate_only"):
            for name, (level, _) in wanted.items():
                if level != current[name]:
                    self._set_feature(name, level)
        return _ok(results=[{"feature": str(u["feature"]), "error_code": ErrorCode.none, "error_message": None}
                            for u in given])

    def _set_feature(self, name: str, level: int) -> None:
        was_on = self.image.elr_enabled
        self._emit(record("FeatureLevel", name=name, level=level))
        if name != ELR_FEATURE or was_on == self.image.elr_enabled:
            return
        if self.image.elr_enabled:
            # Kafka's rules when ELR comes on: the cluster-wide min ISR exists (this controller's
            # static value when none was set), brokers' own are removed. ELR is tracked from
            # changes on: replicas that left ISRs before may lack records (HW was not strict).
            if MIN_ISR not in self.image.broker_configs.get("", {}):
                self._emit(record("BrokerConfig", resource_name="", key=MIN_ISR,
                                  value=str(self.config.min_insync_replicas)))
            for resource, configs in sorted(self.image.broker_configs.items()):
                if resource and MIN_ISR in configs:
                    self._emit(record("BrokerConfig", resource_name=resource, key=MIN_ISR, value=None))
            return
        # Off again: no ELR; an empty ISR takes the replicas that were eligible (every one of
        # them holds what was committed), else the last known leader, as before KIP-966.
        for t, p in self.image.all_partitions():
            if p.elr or p.last_known_elr or not p.isr:
                isr = p.isr or p.elr or p.last_known_elr
                self._change(t, p, isr=list(isr), elr=[], last_known_elr=[])

    # ---- leader elections --------------------------------------------------------------

    def _selected(self, partitions: list[list[Any]] | None) -> list[tuple[str, int, TopicImage | None, PartitionState | None]]:
        if partitions is None:
            return [(t.name, p.partition, t, p) for t, p in self.image.all_partitions()]
        out: list[tuple[str, int, TopicImage | None, PartitionState | None]] = []
        for name, index in partitions:
            t = self.image.topics_by_name.get(name)
            out.append((name, int(index), t, t.partitions.get(int(index)) if t else None))
        return out

    def elect_leaders(self, args: dict[str, Any]) -> Result:
        election = int(args.get("election_type", ELECTION_PREFERRED))
        explicit = args.get("partitions") is not None
        results = []
        for name, index, t, p in self._selected(args.get("partitions")):
            if t is None or p is None:
                results.append(_err(ErrorCode.unknown_topic_or_partition, f"{name}-{index} does not exist",
                                    topic=name, partition=index))
                continue
            if election == ELECTION_PREFERRED:
                preferred = p.preferred_leader
                if p.leader == preferred:
                    code, msg = ErrorCode.election_not_needed, "the preferred replica already leads"
                elif preferred not in p.isr or not self.image.is_active(preferred):
                    code, msg = ErrorCode.preferred_leader_not_available, (
                        f"preferred replica {preferred} is not in the ISR {p.isr} or not alive")
                else:
                    self._change(t, p, leader=preferred)
                    code, msg = ErrorCode.none, ""
            elif election == ELECTION_UNCLEAN:
                if p.leader != NO_LEADER:
                    code, msg = ErrorCode.election_not_needed, "the partition has a leader"
                else:
                    leader, isr, unclean = self._elect(t, p, p.isr, unclean=True)
                    if leader == NO_LEADER:
                        code, msg = ErrorCode.eligible_leaders_not_available, "no replica of the partition is alive"
                    else:
                        self._change(t, p, leader=leader, isr=isr, clear_elr=unclean)
                        code, msg = ErrorCode.none, ""
            else:
                code, msg = ErrorCode.invalid_request, f"election type {election} is unknown"
            if explicit or code != ErrorCode.election_not_needed:
                results.append({"topic": name, "partition": index, "error_code": int(code), "error_message": msg or None})
        # Every partition: Kafka names every topic, with the partitions that needed an election
        return _ok(partitions=results, topics=None if explicit else sorted(self.image.topics_by_name))

    # ---- ISR changes (from partition leaders) -------------------------------------------

    def alter_partition(self, args: dict[str, Any]) -> Result:
        broker_id = int(args["broker_id"])
        reg = self.image.brokers.get(broker_id)
        if reg is None or reg.broker_epoch != int(args["broker_epoch"]):
            return _err(ErrorCode.stale_broker_epoch, f"broker {broker_id} must register again")
        t = self.image.topics.get(args["topic_id"])
        p = t.partitions.get(int(args["partition"])) if t else None
        if t is None or p is None:
            return _err(ErrorCode.unknown_topic_or_partition, "the partition no longer exists")
        if p.leader != broker_id:
            return _err(ErrorCode.not_leader_or_follower, f"broker {broker_id} does not lead {t.name}-{p.partition}")
        if int(args["leader_epoch"]) != p.leader_epoch:
            return _err(ErrorCode.fenced_leader_epoch, f"leader epoch {args['leader_epoch']} is not {p.leader_epoch}")
        if int(args["partition_epoch"]) != p.partition_epoch:
            return _err(ErrorCode.invalid_update_version,
                        f"partition epoch {args['partition_epoch']} is not {p.partition_epoch}")
        new_isr = [int(b) for b in args["isr"]]
        if len(set(new_isr)) != len(new_isr):
            return _err(ErrorCode.invalid_request, f"ISR {new_isr} names a broker twice")
        added = [b for b in new_isr if b not in p.isr]
        bad = [b for b in added if b not in p.replicas or not self.image.is_active(b)]
        if bad or broker_id not in new_isr:
            return _err(ErrorCode.ineligible_replica, f"replicas {bad or [broker_id]} may not join the ISR")
        self._change(t, p, isr=new_isr)
        self._maybe_complete_reassignment(t, p)
        return _ok(**self.partition_state(p))

    def alter_partitions(self, args: dict[str, Any]) -> Result:
        """Every ISR change a leader has pending, in one call (Kafka's AlterPartition request
        carries them all): each is decided as `alter_partition` decides it, and they commit
        together. One by one, each waiting for its commit, a broker that led a hundred
        partitions took tens of seconds to restore their ISRs after a fence, and its
        partitions refused acks=all writes below min.insync.replicas all that while."""
        common = {"broker_id": args["broker_id"], "broker_epoch": args["broker_epoch"]}
        return _ok(partitions=[self.alter_partition({**change, **common}) for change in args["partitions"]])

    @staticmethod
    def partition_state(p: PartitionState) -> dict[str, Any]:
        return {"leader": p.leader, "leader_epoch": p.leader_epoch, "partition_epoch": p.partition_epoch,
                "isr": list(p.isr), "replicas": list(p.replicas)}

    # ---- reassignment (KIP-455) --------------------------------------------------------

    def alter_reassignments(self, args: dict[str, Any]) -> Result:
        results = []
        for spec in args["partitions"]:
            name, index = spec["topic"], int(spec["partition"])
            t = self.image.topics_by_name.get(name)
            p = t.partitions.get(index) if t else None
            try:
                if t is None or p is None:
                    raise ControllerError(ErrorCode.unknown_topic_or_partition, f"{name}-{index} does not exist")
                if spec.get("replicas") is None:
                    self._cancel_reassignment(t, p)
                else:
                    target = [int(b) for b in spec["replicas"]]
                    self._check_replicas(target, f"{name}-{index}")
                    self._start_reassignment(t, p, target)
                results.append({"topic": name, "partition": index, "error_code": 0, "error_message": None})
            except ControllerError as exc:
                results.append({"topic": name, "partition": index, "error_code": exc.code, "error_message": exc.message})
        return _ok(partitions=results)

    def _start_reassignment(self, t: TopicImage, p: PartitionState, target: list[int]) -> None:
        if p.adding or p.removing:
            # A new target replaces the ongoing one, starting from the original replica set.
            self._cancel_reassignment(t, p)
        if target == p.replicas:
            return
        current = p.replicas
        adding = [b for b in target if b not in current]
        removing = [b for b in current if b not in target]
        self._change(t, p, replicas=target + removing, adding=adding, removing=removing)
        self._maybe_complete_reassignment(t, p)

    def _cancel_reassignment(self, t: TopicImage, p: PartitionState) -> None:
        if not p.adding and not p.removing:
            raise ControllerError(ErrorCode.no_reassignment_in_progress, f"{t.name}-{p.partition} is not being moved")
        # The original replicas, in their current order (as Kafka's revert does).
        original = [b for b in p.replicas if b not in p.adding]
        # An ISR never empties: with no original replica in sync, the first one stays, and
        # leads again when it comes back (an unclean election can force another).
        isr = [b for b in p.isr if b in original] or original[:1]
        leader, unclean = p.leader, False
        if leader not in isr:
            leader, isr, unclean = self._elect(t, p, isr)
        self._change(t, p, replicas=original, isr=isr, leader=leader, adding=[], removing=[], clear_elr=unclean)

    def _maybe_complete_reassignment(self, t: TopicImage, p: PartitionState) -> None:
        if not p.adding and not p.removing:
            return
        if any(b not in p.isr for b in p.adding):
            return
        target = p.target_replicas
        isr = [b for b in p.isr if b in target]
        if not isr:
            return  # nothing of the target is in sync yet
        leader = p.leader
        if leader not in target:
            leader = next((b for b in target if b in isr and self.image.is_active(b)), NO_LEADER)
        self._change(t, p, replicas=target, isr=isr, leader=leader, adding=[], removing=[])

    def list_reassignments(self, args: dict[str, Any]) -> Result:
        out = []
        for name, index, _, p in self._selected(args.get("partitions")):
            if p is not None and (p.adding or p.removing):
                out.append({"topic": name, "partition": index, "replicas": p.replicas, "adding": p.adding,
                            "removing": p.removing})
        return _ok(partitions=out)

    # ---- credentials and ACLs (validated by the broker that took the request) -------------

    def alter_scram(self, args: dict[str, Any]) -> Result:
        """Deletions and upsertions of SCRAM credentials: per (user, mechanism) error codes."""
        results = []
        for d in args.get("deletions", []):
            key = (str(d["name"]), str(d["mechanism"]))
            if key not in self.image.scram:
                results.append({"name": key[0], "error_code": ErrorCode.resource_not_found,
                                "error_message": f"user {key[0]} has no {key[1]} credential"})
                continue
            self._emit(record("RemoveScramCredential", name=key[0], mechanism=key[1]))
            results.append({"name": key[0], "error_code": ErrorCode.none, "error_message": None})
        for u in args.get("upsertions", []):
            self._emit(record("ScramCredential", name=str(u["name"]), mechanism=str(u["mechanism"]),
                              salt=str(u["salt"]), iterations=int(u["iterations"]),
                              stored_key=str(u["stored_key"]), server_key=str(u["server_key"])))
            results.append({"name": str(u["name"]), "error_code": ErrorCode.none, "error_message": None})
        return _ok(results=results)

    def alter_client_quotas(self, args: dict[str, Any]) -> Result:
        """Set or remove client quota keys (the broker validated entities, keys and values,
        cluster/broker/quotas.py). Only changes become records, as Kafka's
        ClientQuotaControlManager; `max_entities` bounds how many entities the cluster holds."""
        max_entities = int(args.get("max_entities", 10_000))
        results = []
        for entry in args.get("entries", []):
            entity = tuple(sorted((str(t), None if n is None else str(n)) for t, n in entry["entity"]))
            current = self.image.client_quotas.get(entity, {})
            sets = [(str(k), v) for k, v in entry["ops"] if v is not None]
            if entity not in self.image.client_quotas and sets and len(self.image.client_quotas) >= max_entities:
                results.append({"entity": [list(p) for p in entity], "error_code": ErrorCode.policy_violation,
                                "error_message": f"the cluster holds {len(self.image.client_quotas)} client quota "
                                                 f"entities, the limit; remove unused ones first"})
                continue
            if not args.get("validate_only"):
                for key, value in entry["ops"]:
                    if value is None:
                        if key in current:
                            self._emit(record("ClientQuota", entity=[list(p) for p in entity], key=str(key),
                                              value=None))
                    elif current.get(key) != float(value):
                        self._emit(record("ClientQuota", entity=[list(p) for p in entity], key=str(key),
                                          value=float(value)))
                    current = self.image.client_quotas.get(entity, {})
            results.append({"entity": [list(p) for p in entity], "error_code": ErrorCode.none,
                            "error_message": None})
        return _ok(results=results)

    def bootstrap(self, records: list[dict[str, Any]]) -> None:
        """The records a new cluster starts with, written by the first active controller of
        an empty metadata log: its feature levels (NEW_CLUSTER_LEVELS, unless a FeatureLevel
        record says otherwise, as kafka-storage format --feature) and SCRAM credentials
        (--add-scram)."""
        levels = dict(NEW_CLUSTER_LEVELS)
        for rec in records:
            if rec.get("type") == "FeatureLevel":
                if str(rec["name"]) not in SUPPORTED_FEATURES or str(rec["name"]) in FIXED_LEVELS:
                    raise ValueError(f"feature {rec['name']} cannot be set when formatting")
                levels[str(rec["name"])] = int(rec["level"])
            elif rec.get("type") != "ScramCredential":
                raise ValueError(f"bootstrap records are SCRAM credentials and feature levels, not {rec.get('type')}")
        for name, level in sorted(levels.items()):
            if level > 0:
                self._set_feature(name, level)
        for rec in records:
            if rec.get("type") == "ScramCredential":
                self._emit(rec)

    def create_acls(self, args: dict[str, Any]) -> Result:
        """New ACL bindings (an existing identical binding is kept, not doubled)."""
        existing = {tuple(sorted(a.items())) for a in self.image.acls.values()}
        for binding in args.get("acls", []):
            fields = {k: binding[k] for k in ("resource_type", "resource_name", "pattern_type", "principal", "host",
                                              "operation", "permission")}
            if tuple(sorted(fields.items())) in existing:
                continue
            existing.add(tuple(sorted(fields.items())))
            acl_id = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
            self._emit(record("Acl", id=acl_id, **fields))
        return _ok()

    def delete_acls(self, args: dict[str, Any]) -> Result:
        """Removes the bindings with the given ids (the broker matched the filters)."""
        for acl_id in args.get("ids", []):
            if acl_id in self.image.acls:
                self._emit(record("RemoveAcl", id=str(acl_id)))
        return _ok()


def _apply_config_ops(configs: dict[str, str], ops: list[list[Any]],
                      definitions: Mapping[str, ConfigDef] | None = None) -> None:
    """IncrementalAlterConfigs operations ([key, "set"|"delete"|"append"|"subtract", value])
    on a resource's configs, in order; APPEND/SUBTRACT need a LIST config of `definitions`
    (default: the topic configs)."""
    for key, op, value in ops:
        if op == "set":
            configs[key] = str(value)
        elif op == "delete":
            configs.pop(key, None)
        elif definitions is None:
            configs[key] = altered_list_value(key, configs.get(key), op, str(value))
        else:
            configs[key] = altered_list_value(key, configs.get(key), op, str(value), definitions)
