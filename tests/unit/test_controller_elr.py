"""KIP-966 eligible leader replicas in the sans-IO controller: who becomes eligible, who is
elected, clean against unclean shutdowns, min ISR rules, the feature level, and a new
controller continuing from the log (each record replayed and snapshotted by `Cluster`)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from cluster.controller.controller import ControllerConfig, QuorumController
from cluster.controller.features import SAFE_DOWNGRADE, UPGRADE
from cluster.controller.image import ELR_FEATURE, NO_LEADER, MetadataImage
from cluster.replication.partition import Partition, PartitionRole
from cluster.storage.config import LogConfig
from cluster.storage.log import Log
from tests.batches import values_batch
from tests.unit.test_controller import (
    INVALID_CONFIG,
    INVALID_UPDATE_VERSION,
    NONE,
    SESSION_MS,
    Cluster,
    _every_record_is_checked,  # noqa: F401  (the autouse checker of every record)
    validate_configs,
)


def elr_cluster(*, elr: bool = True, min_isr: int = 2, brokers: int = 3) -> Cluster:
    """A new cluster (bootstrapped: ELR on unless `elr` is False) with `brokers` live
    brokers and topic t: one partition on every broker, led by broker 1."""
    c = Cluster(ControllerConfig(session_timeout_ms=SESSION_MS, min_insync_replicas=min_isr))
    c.ctrl.validate_broker_configs = lambda name, configs: None  # every dynamic broker config allowed
    c.ctrl.bootstrap([] if elr else [{"type": "FeatureLevel", "v": 1, "name": ELR_FEATURE, "level": 0}])
    c.commit()
    c.start(*range(1, brokers + 1))
    c.create("t", assignments=[list(range(1, brokers + 1))])
    return c


def restart(c: Cluster, broker: int, *, clean: bool) -> None:
    """`broker` registers as a new process: after a clean shutdown (its marker names its last
    epoch) or a crash (no marker), then heartbeats caught up."""
    args = {"broker_id": broker, "incarnation_id": f"inc-{broker}-{c.now}-{clean}", "host": "127.0.0.1",
            "port": 9090 + broker, "rack": None, "previous_broker_epoch": c.epochs[broker] if clean else -1}
    result, _ = c.do("register_broker", args, c.now)
    assert result["error_code"] == NONE
    c.epochs[broker] = result["broker_epoch"]
    result, _ = c.heartbeat(broker)
    assert result["error_code"] == NONE and not result["is_fenced"]


def view(c: Cluster) -> tuple[int, list[int], list[int], list[int]]:
    p = c.p("t")
    return p.leader, p.isr, p.elr, p.last_known_elr


def test_a_new_cluster_starts_with_elr_and_a_cluster_wide_min_isr() -> None:
    c = Cluster(ControllerConfig(session_timeout_ms=SESSION_MS, min_insync_replicas=2))
    c.ctrl.bootstrap([])
    records = c.commit()
    assert [(r["type"], r.get("name") or r.get("key"), r.get("level") or r.get("value")) for r in records] == [
        ("FeatureLevel", ELR_FEATURE, 1), ("BrokerConfig", "min.insync.replicas", "2")]
    assert c.image.elr_enabled and c.image.broker_configs == {"": {"min.insync.replicas": "2"}}


def test_followers_leave_one_by_one_then_the_leader_crashes_and_the_follower_with_every_record_leads() -> None:
    c = elr_cluster()
    c.expire(3)  # the ISR [1, 2] is still min ISR: 3 may lack what is written next
    assert view(c) == (1, [1, 2], [], [])
    c.expire(2)  # below min ISR: the high watermark stands still, 2 holds all below it
    assert view(c) == (1, [1], [2], [])
    c.expire(1)
    assert view(c) == (NO_LEADER, [], [2, 1], [1])
    # The replica that lacks records comes back first: nothing to elect, the partition waits.
    restart(c, 3, clean=True)
    assert view(c) == (NO_LEADER, [], [2, 1], [1])
    # The old leader lost its unsynced tail in a crash: no longer eligible, not elected.
    restart(c, 1, clean=False)
    assert view(c) == (NO_LEADER, [], [2], [1])
    # The follower that held every acknowledged record leads from the ELR.
    restart(c, 2, clean=True)
    assert view(c) == (2, [2], [], [])
    assert c.p("t").leader_epoch > 0


def test_without_elr_the_last_isr_member_leads_again_whatever_it_lost() -> None:
    """The window KIP-966 closes, as it was: broker 1, the last ISR member, crashed and lost
    its tail, yet it is the only replica the controller may elect."""
    c = elr_cluster(elr=False)
    c.expire(3)
    c.expire(2)
    c.expire(1)
    assert view(c) == (NO_LEADER, [1], [], [])
    restart(c, 2, clean=True)
    assert view(c) == (NO_LEADER, [1], [], [])
    restart(c, 1, clean=False)
    assert view(c) == (1, [1], [], [])


def test_a_clean_shutdown_keeps_a_replica_eligible() -> None:
    c = elr_cluster()
    c.expire(3)
    c.expire(2)
    c.expire(1)
    restart(c, 1, clean=True)  # the last leader stopped cleanly: eligible, elected first in replica order
    assert view(c) == (1, [1], [2], [])


def test_with_isr_and_elr_empty_the_last_known_leader_leads_when_it_is_back() -> None:
    c = elr_cluster(min_isr=1, brokers=2)
    c.expire(2)
    assert view(c) == (1, [1], [], [])  # min ISR 1: nothing is eligible outside the ISR
    c.expire(1)
    assert view(c) == (NO_LEADER, [], [1], [1])
    restart(c, 2, clean=True)  # never eligible: the partition waits
    assert view(c) == (NO_LEADER, [], [1], [1])
    restart(c, 1, clean=False)  # it crashed, but nothing better is left: as before KIP-966
    assert view(c) == (1, [1], [], [])


def test_an_unclean_election_voids_the_elr() -> None:
    c = elr_cluster()
    c.expire(3)
    c.expire(2)
    c.expire(1)
    restart(c, 3, clean=True)
    result, _ = c.do("elect_leaders", {"election_type": 1, "partitions": [["t", 0]]})
    assert result["partitions"][0]["error_code"] == NONE
    # 2 and 1 may hold records 3 never had: electing either later would lose 3's new ones
    assert view(c) == (3, [3], [], [])


def test_a_changed_min_isr_clears_the_elr_and_brokers_may_not_have_their_own() -> None:
    c = elr_cluster()
    c.expire(3)
    c.expire(2)
    assert view(c) == (1, [1], [2], [])
    result, _ = c.do("alter_broker_configs", {"resources": [{"name": "", "ops": [["min.insync.replicas", "set", "2"]]}]})
    assert result["resources"][0]["error_code"] == NONE
    assert view(c) == (1, [1], [], [])  # the cluster's min ISR updated, even to the same value, as Kafka
    c.revive(2)  # a follower catches up: ISR [1, 2]; then drops again
    c.alter_isr("t", 0, [1, 2])
    c.expire(2)
    assert view(c) == (1, [1], [2], [])
    result, _ = c.do("alter_configs", {"topics": [{"name": "t", "ops": [["min.insync.replicas", "set", "2"]]}]})
    assert result["topics"][0]["error_code"] == NONE
    assert view(c) == (1, [1], [], [])  # the topic's own
    for name, op in (("1", ["min.insync.replicas", "set", "1"]), ("", ["min.insync.replicas", "delete", None])):
        result, records = c.do("alter_broker_configs", {"resources": [{"name": name, "ops": [op]}]})
        assert result["resources"][0]["error_code"] == INVALID_CONFIG and records == [], result
    result, _ = c.do("alter_broker_configs", {"resources": [{"name": "1", "ops": [["log.retention.ms", "set", "5"]]}]})
    assert result["resources"][0]["error_code"] == NONE  # a broker's other configs stay its own


def test_feature_updates_turn_elr_on_and_off() -> None:
    c = elr_cluster(elr=False, min_isr=2)
    assert not c.image.elr_enabled
    result, records = c.do("update_features", {"updates": [{"feature": ELR_FEATURE, "level": 1,
                                                            "upgrade_type": UPGRADE}]})
    assert result["error_code"] == NONE and c.image.elr_enabled
    assert [r["type"] for r in records] == ["FeatureLevel", "BrokerConfig"]
    c.expire(3)
    c.expire(2)
    c.expire(1)
    assert view(c) == (NO_LEADER, [], [2, 1], [1])
    # A downgrade needs its upgrade type; then the eligible replicas form the ISR again.
    result, records = c.do("update_features", {"updates": [{"feature": ELR_FEATURE, "level": 0,
                                                            "upgrade_type": UPGRADE}]})
    assert result["error_code"] == INVALID_UPDATE_VERSION and records == []
    assert "downgrade" in result["error_message"]
    result, _ = c.do("update_features", {"updates": [{"feature": ELR_FEATURE, "level": 0,
                                                      "upgrade_type": SAFE_DOWNGRADE}]})
    assert result["error_code"] == NONE and not c.image.elr_enabled
    assert view(c) == (NO_LEADER, [2, 1], [], [])
    # Fixed features, unknown ones and levels out of range are refused, all or nothing.
    for updates in ([{"feature": "metadata.version", "level": 22, "upgrade_type": UPGRADE}],
                    [{"feature": "no.such.feature", "level": 1, "upgrade_type": UPGRADE}],
                    [{"feature": ELR_FEATURE, "level": 1, "upgrade_type": UPGRADE},
                     {"feature": ELR_FEATURE, "level": 2, "upgrade_type": UPGRADE}]):
        result, records = c.do("update_features", {"updates": updates})
        assert result["error_code"] == INVALID_UPDATE_VERSION and records == [], updates
    assert not c.image.elr_enabled


@pytest.mark.parametrize("at", ["after the ISR emptied", "after an unclean restart"])
def test_a_new_controller_continues_from_the_logged_elr(at: str) -> None:
    c = elr_cluster()
    c.expire(3)
    c.expire(2)
    c.expire(1)
    if at == "after an unclean restart":
        restart(c, 1, clean=False)
    # Another node becomes the active controller: it starts from the committed log alone.
    image = MetadataImage()
    for offset, data in enumerate(c.entries):
        image.apply_entry(offset, data)
    fresh = QuorumController(image, c.config, validate_configs, random.Random(7), c.now)
    c.ctrl = fresh
    assert c.p("t").elr == ([2, 1] if at == "after the ISR emptied" else [2])
    restart(c, 2, clean=True)
    assert view(c) == (2, [2], [1] if at == "after the ISR emptied" else [], [])



def test_a_follower_that_never_had_the_leaders_epoch_truncates_again_further_back(tmp_path: Path) -> None:
    """An ELR election can hand leadership to a replica whose log still holds an older
    epoch's uncommitted tail while another replica led an epoch in between (the replication
    simulation's seed 1000039, stretch 4). When the leader answers OffsetForLeaderEpoch with
    an epoch the follower never had, the follower cuts where its largest smaller epoch ends
    and asks again with that one (Kafka's intermediate truncation); stopping after the first
    answer kept records the leader does not have: replicas differed for good."""
    now = 1_700_000_000_000
    lg = Log.create(tmp_path / "t-0", "t", 0, LogConfig.build({}), now)
    part = Partition("t", 0, lg, "id", local_id=2)
    part.apply_role(PartitionRole(2, 0, 1, (1, 2), (1, 2)), now)  # led epoch 0: offsets 0..3
    for _ in range(4):
        part.append_as_leader(values_batch([b"old"]), min_isr_checked=False, now_ms=now)
    part.apply_role(PartitionRole(2, 3, 2, (1, 2), (2,)), now)  # led epoch 3 from offset 4: 4, 5
    for _ in range(2):
        part.append_as_leader(values_batch([b"new"]), min_isr_checked=False, now_ms=now)
    part.apply_role(PartitionRole(1, 4, 3, (1, 2), (1,)), now)  # 1 leads epoch 4
    assert part.needs_truncation and lg.leader_epochs.latest_epoch == 3
    # The leader's history: epoch 0 up to offset 2, epoch 1 (never seen here) 2..5, epoch 4.
    # Asked for epoch 3 it answers epoch 1, ending at 6: ours ends where our epoch 0 does, 4.
    cut = part.truncate_to_leader(1, 6, now)
    assert cut is not None and (cut.before, cut.after) == (6, 4)
    assert part.needs_truncation and not part.fetching and lg.leader_epochs.latest_epoch == 0
    # Asked again for epoch 0: it ended at 2 on the leader; offsets 2, 3 diverged.
    cut = part.truncate_to_leader(0, 2, now)
    assert cut is not None and (cut.before, cut.after) == (4, 2)
    assert not part.needs_truncation and part.fetching
