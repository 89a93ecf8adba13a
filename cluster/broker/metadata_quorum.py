"""A node's metadata quorum member (cluster/controller/service.py), configured from broker
configs under Kafka's names; brokers and dedicated controllers build theirs here."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cluster.broker.config import (
    ALTERABLE_BROKER_CONFIG_DEFS,
    BrokerConfig,
    validate_dynamic_configs,
)
from cluster.common.clock import SYSTEM_CLOCK, Clock
from cluster.controller.controller import ControllerConfig
from cluster.controller.service import MetadataService
from cluster.groups.group_configs import validate_group_configs
from cluster.quorum.raft import RaftConfig
from cluster.security.connector import PLAINTEXT, LinkSecurity


def build_metadata_service(node_id: int, voters: dict[int, tuple[str, int]], data_dir: Path, config: BrokerConfig,
                           observers: dict[int, tuple[str, int]] | None = None, *,
                           clock: Clock = SYSTEM_CLOCK, link: LinkSecurity = PLAINTEXT,
                           bootstrap_records: Sequence[dict[str, Any]] = ()) -> MetadataService:
    return MetadataService(
        node_id, voters, data_dir, observers=observers, clock=clock, link=link, bootstrap_records=bootstrap_records,
        raft_config=RaftConfig(
            election_timeout_ms=int(config["controller.quorum.election.timeout.ms"]),
            fetch_timeout_ms=int(config["controller.quorum.fetch.timeout.ms"]),
            fetch_interval_ms=int(config["controller.quorum.fetch.interval.ms"]),
            request_timeout_ms=int(config["controller.quorum.request.timeout.ms"]),
        ),
        controller_config=ControllerConfig(
            node_id=node_id,
            session_timeout_ms=int(config["broker.session.timeout.ms"]),
            num_partitions=int(config["num.partitions"]),
            default_replication_factor=int(config["default.replication.factor"]),
            max_partitions_per_topic=int(config["max.topic.partitions"]),
            max_topics=int(config["max.topics"]),
            delete_topic_enable=bool(config["delete.topic.enable"]),
            unclean_leader_election_enable=bool(config.log_config({})["unclean.leader.election.enable"]),
            auto_leader_rebalance_enable=bool(config["auto.leader.rebalance.enable"]),
            leader_imbalance_check_interval_ms=int(config["leader.imbalance.check.interval.seconds"]) * 1000,
            leader_imbalance_per_broker_percentage=int(config["leader.imbalance.per.broker.percentage"]),
            min_insync_replicas=int(config.log_config({})["min.insync.replicas"]),
        ),
        validate_configs=config.log_config,  # InvalidConfig is a ValueError
        validate_broker_configs=validate_dynamic_configs, broker_config_defs=ALTERABLE_BROKER_CONFIG_DEFS,
        # the group configs' bounds are the broker's group.* settings (read-only, as in Kafka)
        validate_group_configs=lambda configs: validate_group_configs(configs, config.values),
        snapshot_bytes=int(config["metadata.log.max.record.bytes.between.snapshots"]),
    )
