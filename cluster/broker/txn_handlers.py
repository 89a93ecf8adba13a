"""The Kafka APIs of transactions: InitProducerId (with a transactional id),
AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit, WriteTxnMarkers,
DescribeTransactions, ListTransactions and DescribeProducers.

They check the principal, translate the request for the transaction coordinator
(cluster/transactions) or the group service, and its decisions back into answers.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

from cluster.broker.context import RequestContext
from cluster.broker.group_handlers import GroupHandlers, offset_commit_answer
from cluster.broker.producer_ids import ProducerIdManager
from cluster.groups.records import OFFSETS_TOPIC, partition_for
from cluster.groups.service import GroupService
from cluster.protocol.api_keys import ApiKey
from cluster.protocol.errors import ErrorCode
from cluster.security.acl import AclOperation, ResourceType
from cluster.storage.config import MIRROR_SOURCE
from cluster.transactions.service import TransactionService
from cluster.transactions.state import TxnState

# -1 on the wire (no transaction open): a non-nullable timestamp field.
_NO_TIME = datetime.fromtimestamp(-0.001, tz=UTC)
_ZERO_TIME = datetime.fromtimestamp(0, tz=UTC)


def _ms(value: Any) -> int:
    """A duration field in milliseconds (kio decodes them as timedelta; exact, no float)."""
    if isinstance(value, timedelta):
        return value // _ONE_MS
    return int(value)


_ONE_MS = timedelta(milliseconds=1)
# KIP-588: the first version of each API that may carry PRODUCER_FENCED; older ones are
# told INVALID_PRODUCER_EPOCH, as Kafka does.
_FENCED_SINCE = {ApiKey.INIT_PRODUCER_ID: 4, ApiKey.ADD_PARTITIONS_TO_TXN: 2, ApiKey.ADD_OFFSETS_TO_TXN: 2,
                 ApiKey.END_TXN: 2, ApiKey.TXN_OFFSET_COMMIT: 3}


# How a TxnOffsetCommit reports a failed verification (Kafka's AddPartitionsToTxnManager and
# group coordinator): fenced is INVALID_PRODUCER_EPOCH; a coordinator that cannot be asked
# is COORDINATOR_NOT_AVAILABLE, which producers retry.
_VERIFICATION_ANSWERS: dict[int, int] = {ErrorCode.producer_fenced: ErrorCode.invalid_producer_epoch,
                                         ErrorCode.not_enough_replicas: ErrorCode.coordinator_not_available}


def _for_version(api: ApiKey, version: int, code: int) -> int:
    if code == ErrorCode.producer_fenced and version < _FENCED_SINCE[api]:
        return ErrorCode.invalid_producer_epoch
    return code


class TxnHandlers:
    def __init__(self, service: TransactionService, groups: GroupService, producer_ids: ProducerIdManager) -> None:
        self.service = service
        self.groups = groups
        self.group_handlers = GroupHandlers(groups)  # TxnOffsetCommit screens as OffsetCommit does
        self.producer_ids = producer_ids

    async def find_coordinator(self, txn_id: str, ctx: RequestContext) -> tuple[int, int | None, str]:
        """FindCoordinator with key type TRANSACTION: (error, node, message)."""
        if not ctx.allowed(AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, txn_id):
            return ErrorCode.transactional_id_authorization_failed, None, f"{ctx.principal} may not use {txn_id}"
        node = await self.service.find_coordinator(txn_id)
        if node is None:
            return ErrorCode.coordinator_not_available, None, "the transaction coordinator is not available yet"
        return ErrorCode.none, node, ""

    async def handle_init_producer_id(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        if req.transactional_id is None:
            return await self.producer_ids.handle_init_producer_id(version, req, ctx)
        return await self.init_producer_id(version, req, ctx)

    def _owner_error(self, txn_id: str, ctx: RequestContext) -> int:
        if not txn_id:
            return ErrorCode.invalid_request  # an empty transactional id, as Kafka answers
        if not ctx.allowed(AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, txn_id):
            return ErrorCode.transactional_id_authorization_failed
        if not self.service.owns(txn_id):
            return ErrorCode.not_coordinator
        return ErrorCode.none

    # ---- InitProducerId (transactional) -----------------------------------------------

    async def init_producer_id(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        txn_id = req.transactional_id
        out = {"throttle_time": 0, "producer_id": -1, "producer_epoch": -1}
        code = self._owner_error(txn_id, ctx)
        expected = (getattr(req, "producer_id", -1), getattr(req, "producer_epoch", -1))
        if code == ErrorCode.none and (expected[0] == -1) != (expected[1] == -1):
            code = ErrorCode.invalid_request  # a producer id without its epoch, or the reverse
        if code != ErrorCode.none:
            return {**out, "error_code": _for_version(ApiKey.INIT_PRODUCER_ID, version, code)}
        fresh = await self.service.new_producer_id(txn_id)
        now = self.service.clock.now_ms()
        decision = self.service.coordinator.init_producer_id(
            txn_id, _ms(req.transaction_timeout), getattr(req, "producer_id", -1), getattr(req, "producer_epoch", -1),
            fresh, now)
        code = await self.service.decide(txn_id, decision)
        if code != ErrorCode.none:
            return {**out, "error_code": _for_version(ApiKey.INIT_PRODUCER_ID, version, code)}
        meta = self.service.coordinator.txns[txn_id]
        return {**out, "error_code": ErrorCode.none, "producer_id": meta.producer_id,
                "producer_epoch": meta.producer_epoch}

    # ---- AddPartitionsToTxn / AddOffsetsToTxn -------------------------------------------

    async def handle_add_partitions_to_txn(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        if version >= 4:
            return await self._broker_add_partitions(req, ctx)
        wanted = [(t.name, p) for t in req.v3_and_below_topics for p in t.partitions]
        errors = await self._add_partitions(req.v3_and_below_transactional_id, req.v3_and_below_producer_id,
                                            req.v3_and_below_producer_epoch, wanted, ctx)
        errors = {tp: _for_version(ApiKey.ADD_PARTITIONS_TO_TXN, version, c) for tp, c in errors.items()}
        return {"throttle_time": 0, "results_by_topic_v3_and_below": _by_topic(errors)}

    async def _broker_add_partitions(self, req: Any, ctx: RequestContext) -> dict[str, Any]:
        """v4+, broker to broker (ClusterAction), batched: with verify_only, a partition
        leader asks whether partitions are in a producer's ongoing transaction (KIP-890)."""
        if not ctx.allowed_on_cluster(AclOperation.CLUSTER_ACTION):
            return {"throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed,
                    "results_by_transaction": []}
        results = []
        for txn in req.transactions:
            wanted = [(t.name, p) for t in txn.topics for p in t.partitions]
            if not txn.verify_only:
                errors = await self._add_partitions(txn.transactional_id, txn.producer_id, txn.producer_epoch,
                                                    wanted, ctx)
            elif not self.service.owns(txn.transactional_id):
                errors = dict.fromkeys(wanted, ErrorCode.not_coordinator)
            else:
                errors = self.service.coordinator.verify(txn.transactional_id, txn.producer_id,
                                                         txn.producer_epoch, wanted)
            results.append({"transactional_id": txn.transactional_id, "topic_results": _by_topic(errors)})
        return {"throttle_time": 0, "error_code": ErrorCode.none, "results_by_transaction": results}

    async def _add_partitions(self, txn_id: str, producer_id: int, producer_epoch: int,
                              wanted: list[tuple[str, int]], ctx: RequestContext) -> dict[tuple[str, int], int]:
        # Kafka's order: the transactional id's ACL, then the topics, then the coordinator
        # (an empty id, not the coordinator).
        if txn_id and not ctx.allowed(AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, txn_id):
            return dict.fromkeys(wanted, ErrorCode.transactional_id_authorization_failed)
        errors: dict[tuple[str, int], int] = {}
        for t, p in wanted:
            if not ctx.allowed(AclOperation.WRITE, ResourceType.TOPIC, t):
                errors[(t, p)] = ErrorCode.topic_authorization_failed
            elif t.startswith("__"):
                errors[(t, p)] = ErrorCode.invalid_topic_exception
            elif self.service.image.partition(t, p) is None:
                errors[(t, p)] = ErrorCode.unknown_topic_or_partition
            elif _is_mirror_topic(self.service.image.topic(t)):
                # A read-only mirror topic (docs/design.md): its produce would be refused.
                errors[(t, p)] = ErrorCode.invalid_topic_exception
        if errors:
            # As Kafka: the partitions that were fine are not attempted.
            return {tp: errors.get(tp, ErrorCode.operation_not_attempted) for tp in wanted}
        code = self._owner_error(txn_id, ctx)
        if code != ErrorCode.none:
            return dict.fromkeys(wanted, code)
        decision = self.service.coordinator.add_partitions(txn_id, producer_id, producer_epoch, wanted,
                                                           self.service.clock.now_ms())
        return dict.fromkeys(wanted, await self.service.decide(txn_id, decision))

    async def handle_add_offsets_to_txn(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        code = self._owner_error(req.transactional_id, ctx)
        if code == ErrorCode.none and not ctx.allowed(AclOperation.READ, ResourceType.GROUP, req.group_id):
            code = ErrorCode.group_authorization_failed
        if code == ErrorCode.none:
            index = partition_for(req.group_id, self.groups.num_partitions)
            decision = self.service.coordinator.add_offsets(req.transactional_id, req.producer_id,
                                                            req.producer_epoch, index, self.service.clock.now_ms())
            code = await self.service.decide(req.transactional_id, decision)
        return {"throttle_time": 0, "error_code": _for_version(ApiKey.ADD_OFFSETS_TO_TXN, version, code)}

    # ---- EndTxn -------------------------------------------------------------------------

    async def handle_end_txn(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        code = self._owner_error(req.transactional_id, ctx)
        if code == ErrorCode.none:
            decision = self.service.coordinator.end_txn(req.transactional_id, req.producer_id, req.producer_epoch,
                                                        bool(req.committed), self.service.clock.now_ms())
            code = await self.service.decide(req.transactional_id, decision)
        return {"throttle_time": 0, "error_code": _for_version(ApiKey.END_TXN, version, code)}

    # ---- TxnOffsetCommit ----------------------------------------------------------------

    async def handle_txn_offset_commit(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        first_error = ErrorCode.none
        if not ctx.allowed(AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, req.transactional_id):
            first_error = ErrorCode.transactional_id_authorization_failed
        results, known = self.group_handlers.screen_offset_commit(req, ctx, first_error)
        if known:
            # KIP-890, as Kafka's group coordinator: the offsets partition must be in the
            # producer's ongoing transaction (AddOffsetsToTxn), under its current epoch; a
            # fenced producer's offsets would otherwise open a transaction nothing ends. (An
            # empty group id is INVALID_GROUP_ID before that.)
            verdict = await self._verify_offsets_partition(req) if req.group_id else ErrorCode.none
            if verdict != ErrorCode.none:
                code = _VERIFICATION_ANSWERS.get(verdict, verdict)
                results.update({(t, p): code for t, p, *_ in known})
                return offset_commit_answer(req, results)
            results.update(await self.groups.txn_commit_offsets(
                group_id=req.group_id, producer_id=req.producer_id, producer_epoch=req.producer_epoch,
                member_id=getattr(req, "member_id", "") or "", generation_id=getattr(req, "generation_id", -1),
                group_instance_id=getattr(req, "group_instance_id", None), offsets=known))
        return offset_commit_answer(req, results)

    async def _verify_offsets_partition(self, req: Any) -> int:
        index = partition_for(req.group_id, self.groups.num_partitions)
        codes = await self.service.verify(req.transactional_id, req.producer_id, req.producer_epoch,
                                          [(OFFSETS_TOPIC, index)])
        return codes.get((OFFSETS_TOPIC, index), ErrorCode.not_enough_replicas)

    # ---- WriteTxnMarkers (broker to broker) -------------------------------------------

    async def handle_write_txn_markers(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        allowed = ctx.allowed_on_cluster(AclOperation.CLUSTER_ACTION)
        markers = []
        for m in req.markers:
            wanted = [(t.name, p) for t in m.topics for p in t.partition_indexes]
            if allowed:
                codes = await self.service.write_local_markers(m.producer_id, m.producer_epoch,
                                                               bool(m.transaction_result), m.coordinator_epoch, wanted)
            else:
                codes = dict.fromkeys(wanted, ErrorCode.cluster_authorization_failed)
            by_topic: dict[str, list[dict[str, Any]]] = defaultdict(list)
            for (t, p), c in codes.items():
                by_topic[t].append({"partition_index": p, "error_code": c})
            markers.append({"producer_id": m.producer_id, "topics": [
                {"name": t, "partitions": ps} for t, ps in by_topic.items()]})
        return {"markers": markers}

    # ---- Describe / List ----------------------------------------------------------------

    async def handle_describe_transactions(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        states = []
        for txn_id in req.transactional_ids:
            # an error leaves every other field at its default (zero), as Kafka's answers
            base = {"transactional_id": txn_id, "transaction_state": "", "transaction_timeout": 0,
                    "transaction_start_time": _ZERO_TIME, "producer_id": 0, "producer_epoch": 0, "topics": []}
            if not txn_id:
                states.append({**base, "error_code": ErrorCode.invalid_request})
                continue
            if not ctx.allowed(AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, txn_id):
                states.append({**base, "error_code": ErrorCode.transactional_id_authorization_failed})
                continue
            if not self.service.owns(txn_id):
                states.append({**base, "error_code": ErrorCode.not_coordinator})
                continue
            meta = self.service.coordinator.txns.get(txn_id)
            if meta is None:
                states.append({**base, "error_code": ErrorCode.transactional_id_not_found})
                continue
            topics: dict[str, list[int]] = defaultdict(list)
            for t, p in sorted(meta.partitions):
                topics[t].append(p)
            states.append({**base, "error_code": ErrorCode.none, "transaction_state": meta.state.value,
                           "transaction_timeout": meta.timeout_ms,
                           "transaction_start_time": meta.start_ms if meta.start_ms >= 0 else _NO_TIME,
                           "producer_id": meta.producer_id, "producer_epoch": meta.producer_epoch,
                           "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()]})
        return {"throttle_time": 0, "transaction_states": states}

    async def handle_list_transactions(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        names = {s.value for s in TxnState} | {"PrepareEpochFence"}  # Kafka's, never held here
        state_filters = set(req.state_filters or ())
        pid_filters = set(req.producer_id_filters or ())
        min_duration_ms = _ms(getattr(req, "duration_filter", -1))
        now = self.service.clock.now_ms()
        out = []
        for txn_id, meta in sorted(self.service.coordinator.txns.items()):
            if state_filters and meta.state.value not in state_filters:
                continue
            if pid_filters and meta.producer_id not in pid_filters:
                continue
            if min_duration_ms >= 0 and (meta.start_ms < 0 or now - meta.start_ms < min_duration_ms):
                continue
            if not ctx.allowed(AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, txn_id):
                continue
            out.append({"transactional_id": txn_id, "producer_id": meta.producer_id,
                        "transaction_state": meta.state.value})
        return {"throttle_time": 0, "error_code": ErrorCode.none,
                "unknown_state_filters": sorted(state_filters - names), "transaction_states": out}

    async def handle_describe_producers(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        topics = []
        for t in req.topics:
            parts = []
            for index in t.partition_indexes:
                base = {"partition_index": index, "error_message": None, "active_producers": []}
                if not ctx.allowed(AclOperation.READ, ResourceType.TOPIC, t.name):
                    parts.append({**base, "error_code": ErrorCode.topic_authorization_failed})
                    continue
                # Any replica answers, as in Kafka (KIP-664: kafka-transactions find-hanging
                # asks each broker about every partition it holds).
                part, code = self.service.replicas.local_partition(t.name, index)
                if part is None:
                    parts.append({**base, "error_code": code})
                    continue
                state = part.log.producer_state
                parts.append({**base, "error_code": ErrorCode.none, "active_producers": [
                    {"producer_id": e.producer_id, "producer_epoch": e.epoch, "last_sequence": e.last_seq,
                     "last_timestamp": e.last_timestamp_ms, "coordinator_epoch": e.coordinator_epoch,
                     "current_txn_start_offset": state.ongoing.get(e.producer_id, -1)}
                    for e in state.producers.values()]})
            topics.append({"name": t.name, "partitions": parts})
        return {"throttle_time": 0, "topics": topics}


def _by_topic(errors: dict[tuple[str, int], int]) -> list[dict[str, Any]]:
    by_topic: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for (t, p), c in errors.items():
        by_topic[t].append({"partition_index": p, "partition_error_code": c})
    return [{"name": t, "results_by_partition": rs} for t, rs in by_topic.items()]


def _is_mirror_topic(topic: Any) -> bool:
    return bool(topic is not None and topic.configs.get(MIRROR_SOURCE))
