"""A broker process: builds its parts, wires them, and runs them (Kafka's BrokerServer).

    MetadataService   the metadata quorum member and, when it leads, the controller (cluster/controller)
    DynamicBrokerConfig  the configs in force: static ones under dynamic broker configs (dynamic_config.py)
    BrokerLifecycle   registration, heartbeats, controlled shutdown (lifecycle.py)
    LogManager        the partition logs on disk, their background work (cluster/storage)
    ReplicaManager    the partition replicas: appends, reads, ISR, followers (cluster/replication)
    GroupService      the consumer-group coordinator's shell (cluster/groups)
    ShareStateService the share coordinator's shell and the share-partition leaders' way to it
    RequestRouter     every Kafka API this broker answers, from one table (apis.py)

Network I/O lives in server.py; each handler module gets only the parts it uses.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from cluster.broker.admin_handlers import AdminHandlers
from cluster.broker.apis import Api, Legacy, RequestRouter
from cluster.broker.auto_topics import AutoTopicCreation
from cluster.broker.config import BrokerConfig
from cluster.broker.controller_channel import ControllerChannel
from cluster.broker.dynamic_config import DynamicBrokerConfig
from cluster.broker.group_handlers import GroupHandlers
from cluster.broker.lifecycle import BrokerLifecycle, Registration
from cluster.broker.metadata_cache import MetadataCache
from cluster.broker.metadata_handlers import MetadataHandlers
from cluster.broker.metadata_quorum import build_metadata_service
from cluster.broker.metrics import BrokerMetrics, RequestMetrics
from cluster.broker.mirror_handlers import MirrorHandlers
from cluster.broker.producer_ids import ProducerIdManager
from cluster.broker.quorum_handlers import QuorumHandlers
from cluster.broker.quota_handlers import ClientQuotaHandlers
from cluster.broker.quotas import ClientQuotas, QuotaWindow
from cluster.broker.replica_handlers import LIST_OFFSETS_MAX_VERSION, ReplicaHandlers
from cluster.broker.security import BrokerSecurity
from cluster.broker.security_handlers import AclHandlers, SaslHandlers, ScramUserHandlers
from cluster.broker.share_offsets_handlers import ShareOffsetsHandlers
from cluster.broker.share_state_handlers import ShareStateHandlers
from cluster.broker.txn_handlers import TxnHandlers
from cluster.common.clock import SYSTEM_CLOCK, Clock
from cluster.groups.consumer_group import ConsumerGroupConfig
from cluster.groups.coordinator import GroupConfig, GroupCoordinator
from cluster.groups.service import GroupService, OffsetsTopicSettings
from cluster.groups.share_coordinator import ShareCoordinator
from cluster.groups.share_state_service import ShareStateService, ShareStateTopicSettings
from cluster.protocol.api_keys import ApiKey
from cluster.protocol.legacy import decode_legacy_produce, encode_legacy_produce_response
from cluster.replication.fetcher import FetcherSettings
from cluster.replication.replica_manager import ReplicaManager, ReplicaSettings, changed_topic_ids
from cluster.security.connector import LinkSecurity
from cluster.storage.cleaner import CleanerConfig
from cluster.storage.config import LogConfig
from cluster.storage.log_manager import METADATA_LOG_DIR, LogManager
from cluster.storage.log_tasks import LogTasks, LogTaskSettings
from cluster.storage.meta_properties import write_meta_properties
from cluster.transactions.coordinator import TransactionConfig, TransactionCoordinator
from cluster.transactions.service import TransactionService, TransactionStateSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClusterMembership:
    """Who this node is and who votes in the metadata quorum."""

    node_id: int
    voters: dict[int, tuple[str, int]]
    cluster_id: str
    brokers: dict[int, tuple[str, int]] = field(default_factory=dict)  # every broker (observers of dedicated controllers)
    bootstrap_records: tuple[dict[str, Any], ...] = ()
    """What a new cluster's metadata log starts with (the topology's SCRAM users)."""


class Broker:
    def __init__(self, data_dir: Path, config: BrokerConfig, advertised_host: str, advertised_port: int,
                 membership: ClusterMembership | None = None, *, clock: Clock = SYSTEM_CLOCK,
                 listen_host: str | None = None) -> None:
        if membership is None:
            # A standalone broker: node 1 (or node.id), its own single-voter quorum.
            node_id = int(config["node.id"])
            membership = ClusterMembership(node_id, {node_id: (advertised_host, advertised_port)}, "")
        self.data_dir = data_dir
        self.config = config
        self.clock = clock
        self.membership = membership
        self.node_id = node_id = membership.node_id
        self.ready = trio.Event()
        self._logs_loaded = False
        self.security = BrokerSecurity(config, listen_host or advertised_host, advertised_port, advertised_host,
                                       lambda: self.metadata.image)

        self.metadata = build_metadata_service(
            node_id, membership.voters, data_dir / METADATA_LOG_DIR, config, clock=clock, link=self.security.link,
            bootstrap_records=membership.bootstrap_records, observers={b: a for b, a in membership.brokers.items() if b not in membership.voters})
        self.metadata.on_applied = self._on_metadata_applied
        # The configs in force: the static ones under the metadata log's dynamic broker configs.
        self.dynamic_config = DynamicBrokerConfig(config, node_id, lambda: self.metadata.image)
        self.cache = MetadataCache(self.metadata, node_id, membership.cluster_id)
        self.lifecycle = BrokerLifecycle(
            self.metadata, Registration(node_id, advertised_host, advertised_port, config["broker.rack"] or None,
                                        self.security.advertised_listeners()),
            heartbeat_interval_ms=int(config["broker.heartbeat.interval.ms"]))
        self.controller = ControllerChannel(self.metadata, node_id, lambda: self.lifecycle.broker_epoch)

        self.logs = LogManager(data_dir)
        self.log_tasks = LogTasks(self.logs, _log_task_settings(config), clock,
                                  current=lambda: _log_task_settings(self.dynamic_config.current))
        self.replicas = ReplicaManager(node_id, data_dir, self.logs, _replica_settings(config, self.security.link),
                                       clock=clock,
                                       image=lambda: self.metadata.image, log_config=self.dynamic_config.log_config,
                                       isr_channel=self.controller)
        self.groups = GroupService(
            GroupCoordinator(_group_config(config), _consumer_group_config(config)), self.replicas, OffsetsTopicSettings(
                num_partitions=int(config["offsets.topic.num.partitions"]),
                replication_factor=int(config["offsets.topic.replication.factor"]),
                segment_bytes=int(config["offsets.topic.segment.bytes"]),
                commit_timeout_ms=int(config["offsets.commit.timeout.ms"])),
            clock=clock, image=lambda: self.metadata.image, cluster_size=lambda: self.cluster_size,
            create_topics=self.controller.create_topics)
        self.replicas.on_partitions_changed.append(self.groups.on_partitions_changed)
        self.share_state = ShareStateService(
            ShareCoordinator(), self.replicas, ShareStateTopicSettings(
                num_partitions=int(config["share.coordinator.state.topic.num.partitions"]),
                replication_factor=int(config["share.coordinator.state.topic.replication.factor"]),
                min_isr=int(config["share.coordinator.state.topic.min.isr"]),
                segment_bytes=int(config["share.coordinator.state.topic.segment.bytes"]),
                write_timeout_ms=int(config["share.coordinator.write.timeout.ms"])),
            clock=clock, image=lambda: self.metadata.image, cluster_size=lambda: self.cluster_size,
            create_topics=self.controller.create_topics)
        self.replicas.on_partitions_changed.append(self.share_state.on_partitions_changed)
        self.producer_ids = ProducerIdManager(self.controller.allocate_producer_ids)
        self.transactions = TransactionService(
            TransactionCoordinator(TransactionConfig(
                max_timeout_ms=int(config["transaction.max.timeout.ms"]),
                id_expiration_ms=int(config["transactional.id.expiration.ms"]))),
            self.replicas, TransactionStateSettings(
                num_partitions=int(config["transaction.state.log.num.partitions"]),
                replication_factor=int(config["transaction.state.log.replication.factor"]),
                min_isr=int(config["transaction.state.log.min.isr"]),
                segment_bytes=int(config["transaction.state.log.segment.bytes"]),
                abort_check_interval_ms=int(config["transaction.abort.timed.out.transaction.cleanup.interval.ms"])),
            clock=clock, image=lambda: self.metadata.image, cluster_size=lambda: self.cluster_size,
            create_topics=self.controller.create_topics, next_producer_id=self.producer_ids.next_id)
        self.transactions.marker_listeners.append(self.groups.complete_txn)
        self.replicas.on_partitions_changed.append(self.transactions.on_partitions_changed)
        txns = TxnHandlers(self.transactions, self.groups, self.producer_ids)

        auto_topics = AutoTopicCreation(self.cache, self.controller, enabled=bool(config["auto.create.topics.enable"]))
        replica_handlers = ReplicaHandlers(self.replicas, self.transactions.verify, self.share_state, config.values)
        self.shares = replica_handlers.shares  # share sessions end with their connection (server.py)
        group_handlers = GroupHandlers(self.groups, txns.find_coordinator, self.share_state)
        apis = api_table(replica_handlers, MetadataHandlers(self.cache, auto_topics, self.dynamic_config),
                         AdminHandlers(self.controller,
                                       lambda configs: self.dynamic_config.describe_topic(configs, None, False)),
                         group_handlers, txns,
                         ScramUserHandlers(self.security, self.controller), AclHandlers(self.security, self.controller),
                         ClientQuotaHandlers(lambda: self.metadata.image, self.controller),
                         QuorumHandlers(self.controller, membership.voters, self.security.inter_broker),
                         ShareStateHandlers(self.share_state),
                         ShareOffsetsHandlers(group_handlers, self.share_state, self.replicas))
        self.request_metrics = RequestMetrics([api.key for api in apis], clock.now_ms())
        self.quotas = ClientQuotas(QuotaWindow(int(config["quota.window.num"]),
                                               int(config["quota.window.size.seconds"]) * 1000))
        self.router = RequestRouter(apis, ready=self.ready, metadata=self.metadata,
                                    observe=self.request_metrics.observe_request, security=self.security,
                                    sasl=SaslHandlers(self.security, clock), quotas=self.quotas,
                                    mirror_append=MirrorHandlers(self.replicas).handle_mirror_append,
                                    fetch_sessions=self.replicas.fetch_sessions)
        self.metrics = BrokerMetrics(self.replicas, self.cache, self.request_metrics, self.ready, clock, self.security,
                                     self.quotas)

    @property
    def cluster_id(self) -> str:
        return self.cache.cluster_id

    @property
    def cluster_size(self) -> int:
        """Brokers the cluster is declared with (the topology), or 1 standalone."""
        return len(self.membership.brokers) or len(self.membership.voters)

    # ---- running -----------------------------------------------------------------------

    async def start(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Register with the controller, load the logs, heartbeat; `ready` once unfenced."""
        write_meta_properties(self.data_dir, self.node_id, self.cluster_id)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.metadata.run)
            await nursery.start(self.replicas.run)
            task_status.started()
            await self.lifecycle.register(previous_broker_epoch=self.logs.clean_shutdown_epoch())
            start_s = trio.current_time()
            self.logs.load_all(self._log_config_for, self.clock.now_ms())
            self.replicas.load()
            self._logs_loaded = True
            self.replicas.reconcile()
            self.groups.open()
            self.share_state.open()
            await nursery.start(self.transactions.run)
            self.transactions.open()
            log.info("broker %d loaded %d partition(s) in %.3f s", self.node_id, len(self.replicas.partitions),
                     trio.current_time() - start_s)
            nursery.start_soon(self.lifecycle.heartbeat_loop)
            self.replicas.start_background(nursery)
            await self.lifecycle.wait_unfenced()
            self.ready.set()
            nursery.start_soon(self.groups.offsets_topic_loop)
            log.info("broker %d is ready (broker epoch %d, controller %d)", self.node_id, self.lifecycle.broker_epoch,
                     self.metadata.leader_id)

    async def run_background(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The broker's periodic work beside its requests: log flushes, retention,
        compaction, high-watermark checkpoints, group timers."""
        async with trio.open_nursery() as nursery:
            self.log_tasks.start(nursery)
            interval_s = int(self.config["replica.high.watermark.checkpoint.interval.ms"]) / 1000
            nursery.start_soon(self.replicas.high_watermark_checkpoint_loop, interval_s, self.ready)
            nursery.start_soon(self.groups.timer_loop)
            nursery.start_soon(self.shares.writer_loop)
            task_status.started()

    async def controlled_shutdown(self, timeout_s: float) -> bool:
        """Ask the controller to move leadership away; True when it confirmed."""
        if not self.ready.is_set():
            return False
        return await self.lifecycle.controlled_shutdown(timeout_s)

    def close(self) -> None:
        if not self._logs_loaded:
            # Nothing was opened (say, the listener's port was taken): leave the data directory
            # as it is, without an empty recovery-point file and a clean-shutdown marker.
            return
        self.replicas.close()
        self.logs.close(self.lifecycle.broker_epoch)

    # ---- acting on metadata ------------------------------------------------------------

    def _log_config_for(self, topic: str) -> LogConfig:
        t = self.metadata.image.topic(topic)
        return self.dynamic_config.log_config(t.configs if t else {})

    def _on_metadata_applied(self, records: list[dict[str, Any]], from_snapshot: bool) -> None:
        if self._logs_loaded:
            self.replicas.reconcile(None if from_snapshot else changed_topic_ids(records))


def api_table(replicas: ReplicaHandlers, meta: MetadataHandlers, admin: AdminHandlers, groups: GroupHandlers,
              txns: TxnHandlers, users: ScramUserHandlers, acls: AclHandlers,
              quotas: ClientQuotaHandlers, quorum: QuorumHandlers, share_state: ShareStateHandlers,
              share_offsets: ShareOffsetsHandlers) -> list[Api]:
    """Every API this broker answers, the versions it advertises, and who answers (see
    docs/protocol.md for why these versions)."""
    return [
        Api(ApiKey.PRODUCE, 0, 8, replicas.handle_produce, legacy_below=3,
            legacy=Legacy(3, decode_legacy_produce, encode_legacy_produce_response)),
        Api(ApiKey.FETCH, 4, 13, replicas.handle_fetch),
        Api(ApiKey.LIST_OFFSETS, 1, LIST_OFFSETS_MAX_VERSION, replicas.handle_list_offsets),
        Api(ApiKey.DELETE_RECORDS, 0, 2, replicas.handle_delete_records),
        Api(ApiKey.DESCRIBE_LOG_DIRS, 1, 4, replicas.handle_describe_log_dirs),  # v0 is not in kio
        Api(ApiKey.ALTER_REPLICA_LOG_DIRS, 1, 2, replicas.handle_alter_replica_log_dirs),  # as Kafka 4
        Api(ApiKey.METADATA, 0, 12, meta.handle_metadata),
        Api(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, 0, meta.handle_describe_topic_partitions),
        Api(ApiKey.OFFSET_COMMIT, 2, 7, groups.handle_offset_commit),
        Api(ApiKey.OFFSET_FETCH, 1, 7, groups.handle_offset_fetch),  # v7: require_stable (KIP-447)
        Api(ApiKey.FIND_COORDINATOR, 0, 6, groups.handle_find_coordinator),  # v4+: batched; v6: key type SHARE
        Api(ApiKey.JOIN_GROUP, 0, 5, groups.handle_join_group),
        Api(ApiKey.HEARTBEAT, 0, 3, groups.handle_heartbeat),
        Api(ApiKey.LEAVE_GROUP, 0, 3, groups.handle_leave_group),
        Api(ApiKey.SYNC_GROUP, 0, 3, groups.handle_sync_group),
        Api(ApiKey.DESCRIBE_GROUPS, 0, 6, groups.handle_describe_groups),
        Api(ApiKey.LIST_GROUPS, 0, 5, groups.handle_list_groups),
        Api(ApiKey.OFFSET_DELETE, 0, 0, groups.handle_offset_delete),
        Api(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, 1, groups.handle_consumer_group_heartbeat),  # flexible only
        Api(ApiKey.CONSUMER_GROUP_DESCRIBE, 0, 1, groups.handle_consumer_group_describe),  # flexible only
        # KIP-932 share groups, a preview (docs/share_groups.md); v0 was Kafka 4.0's early access
        Api(ApiKey.SHARE_GROUP_HEARTBEAT, 1, 1, groups.handle_share_group_heartbeat),
        Api(ApiKey.SHARE_GROUP_DESCRIBE, 1, 1, groups.handle_share_group_describe),
        Api(ApiKey.SHARE_FETCH, 1, 2, replicas.handle_share_fetch),  # v2: acquire modes, RENEW
        Api(ApiKey.SHARE_ACKNOWLEDGE, 1, 2, replicas.handle_share_acknowledge),  # v2: RENEW
        Api(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 0, 1, share_offsets.handle_describe_share_group_offsets),  # v1: lag
        Api(ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, 0, share_offsets.handle_alter_share_group_offsets),
        Api(ApiKey.DELETE_SHARE_GROUP_OFFSETS, 0, 0, share_offsets.handle_delete_share_group_offsets),
        # the share coordinator's inter-broker calls (share-partition leaders send them)
        Api(ApiKey.INITIALIZE_SHARE_GROUP_STATE, 0, 0, share_state.handle_initialize_share_group_state),
        Api(ApiKey.READ_SHARE_GROUP_STATE, 0, 0, share_state.handle_read_share_group_state),
        Api(ApiKey.WRITE_SHARE_GROUP_STATE, 0, 1, share_state.handle_write_share_group_state),
        Api(ApiKey.DELETE_SHARE_GROUP_STATE, 0, 0, share_state.handle_delete_share_group_state),
        Api(ApiKey.READ_SHARE_GROUP_STATE_SUMMARY, 0, 1, share_state.handle_read_share_group_state_summary),
        Api(ApiKey.API_VERSIONS, 0, 3, None),
        Api(ApiKey.CREATE_TOPICS, 2, 7, admin.handle_create_topics),  # v5: the created topic's configs
        Api(ApiKey.DELETE_TOPICS, 1, 3, admin.handle_delete_topics),
        Api(ApiKey.INIT_PRODUCER_ID, 0, 4, txns.handle_init_producer_id),
        Api(ApiKey.ADD_PARTITIONS_TO_TXN, 0, 4, txns.handle_add_partitions_to_txn),
        Api(ApiKey.ADD_OFFSETS_TO_TXN, 0, 3, txns.handle_add_offsets_to_txn),
        Api(ApiKey.END_TXN, 0, 3, txns.handle_end_txn),
        Api(ApiKey.WRITE_TXN_MARKERS, 1, 1, txns.handle_write_txn_markers),  # v0 is not in kio
        Api(ApiKey.TXN_OFFSET_COMMIT, 0, 3, txns.handle_txn_offset_commit),
        Api(ApiKey.DESCRIBE_PRODUCERS, 0, 0, txns.handle_describe_producers),  # flexible only
        Api(ApiKey.DESCRIBE_TRANSACTIONS, 0, 0, txns.handle_describe_transactions),  # flexible only
        Api(ApiKey.LIST_TRANSACTIONS, 0, 1, txns.handle_list_transactions),  # flexible only
        Api(ApiKey.OFFSET_FOR_LEADER_EPOCH, 2, 3, replicas.handle_offset_for_leader_epoch),
        Api(ApiKey.DESCRIBE_CONFIGS, 1, 4, meta.handle_describe_configs),  # v3: config types
        Api(ApiKey.ALTER_CONFIGS, 0, 1, admin.handle_alter_configs),
        Api(ApiKey.CREATE_PARTITIONS, 0, 1, admin.handle_create_partitions),
        Api(ApiKey.DELETE_GROUPS, 0, 1, groups.handle_delete_groups),
        Api(ApiKey.ELECT_LEADERS, 0, 1, admin.handle_elect_leaders),
        Api(ApiKey.UPDATE_FEATURES, 0, 1, admin.handle_update_features),
        Api(ApiKey.INCREMENTAL_ALTER_CONFIGS, 0, 0, admin.handle_incremental_alter_configs),
        Api(ApiKey.ALTER_PARTITION_REASSIGNMENTS, 0, 0, admin.handle_alter_partition_reassignments),  # flexible only
        Api(ApiKey.LIST_PARTITION_REASSIGNMENTS, 0, 0, admin.handle_list_partition_reassignments),  # flexible only
        Api(ApiKey.DESCRIBE_CLUSTER, 0, 0, meta.handle_describe_cluster),  # flexible only
        Api(ApiKey.SASL_HANDSHAKE, 0, 1, None),  # answered by the router: they change the session
        Api(ApiKey.SASL_AUTHENTICATE, 0, 2, None),
        Api(ApiKey.DESCRIBE_ACLS, 1, 3, acls.handle_describe_acls),
        Api(ApiKey.CREATE_ACLS, 1, 3, acls.handle_create_acls),
        Api(ApiKey.DELETE_ACLS, 1, 3, acls.handle_delete_acls),
        Api(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, 0, users.handle_describe_user_scram_credentials),
        Api(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, 0, users.handle_alter_user_scram_credentials),
        Api(ApiKey.DESCRIBE_CLIENT_QUOTAS, 0, 1, quotas.handle_describe_client_quotas),
        Api(ApiKey.ALTER_CLIENT_QUOTAS, 0, 1, quotas.handle_alter_client_quotas),
        Api(ApiKey.DESCRIBE_QUORUM, 0, 2, quorum.handle_describe_quorum),  # flexible only
    ]


class _Unwired:
    """Stands in for every handler object when only the table's versions are wanted."""

    def __getattr__(self, name: str) -> Any:
        return None


def advertised_versions() -> dict[int, tuple[int, int]]:
    """API key → (min, max) version, as every broker advertises them in ApiVersions."""
    nothing: Any = _Unwired()
    return {api.key: (api.min_version, api.max_version)
            for api in api_table(nothing, nothing, nothing, nothing, nothing, nothing, nothing, nothing, nothing, nothing,
                                 nothing)}


SUPPORTED_APIS = advertised_versions()


def _replica_settings(config: BrokerConfig, link: LinkSecurity) -> ReplicaSettings:
    return ReplicaSettings(
        replica_lag_time_max_ms=int(config["replica.lag.time.max.ms"]),
        fetch_max_bytes=int(config["fetch.max.bytes"]),
        fetch_session_cache_slots=int(config["max.incremental.fetch.session.cache.slots"]),
        replica_selector=str(config["replica.selector.class"]),
        fetcher=FetcherSettings(
            max_bytes=int(config["replica.fetch.max.bytes"]),
            response_max_bytes=int(config["replica.fetch.response.max.bytes"]),
            wait_max_ms=int(config["replica.fetch.wait.max.ms"]),
            link=link,
        ),
    )


def _log_task_settings(config: BrokerConfig) -> LogTaskSettings:
    return LogTaskSettings(
        flush_scheduler_interval_ms=int(config["log.flush.scheduler.interval.ms"]),
        flush_offset_checkpoint_interval_ms=int(config["log.flush.offset.checkpoint.interval.ms"]),
        retention_check_interval_ms=int(config["log.retention.check.interval.ms"]),
        cleaner_enable=bool(config["log.cleaner.enable"]),
        cleaner_backoff_ms=int(config["log.cleaner.backoff.ms"]),
        cleaner=CleanerConfig(
            dedupe_buffer_bytes=int(config["log.cleaner.dedupe.buffer.size"]),
            io_max_bytes_per_second=float(config["log.cleaner.io.max.bytes.per.second"]),
        ),
    )


def _consumer_group_config(config: BrokerConfig) -> ConsumerGroupConfig:
    return ConsumerGroupConfig(
        session_timeout_ms=int(config["group.consumer.session.timeout.ms"]),
        heartbeat_interval_ms=int(config["group.consumer.heartbeat.interval.ms"]),
        assignors=tuple(a.strip() for a in str(config["group.consumer.assignors"]).split(",") if a.strip()),
        max_size=int(config["group.consumer.max.size"]),
    )


def _group_config(config: BrokerConfig) -> GroupConfig:
    return GroupConfig(
        min_session_timeout_ms=int(config["group.min.session.timeout.ms"]),
        max_session_timeout_ms=int(config["group.max.session.timeout.ms"]),
        initial_rebalance_delay_ms=int(config["group.initial.rebalance.delay.ms"]),
        max_size=int(config["group.max.size"]),
        offsets_retention_ms=int(config["offsets.retention.minutes"]) * 60_000,
        offset_metadata_max_bytes=int(config["offset.metadata.max.bytes"]),
    )
