"""Dynamic group configs (cluster/groups/group_configs.py): Kafka 4.3.1's keys, defaults and
refusals (the messages are the ones a real Kafka 4.3.1 answered IncrementalAlterConfigs with),
the controller's GroupConfig records and their replay, and what a share group reads back."""

from __future__ import annotations

import random

import orjson
import pytest

from cluster.common.config_def import InvalidConfig
from cluster.controller.controller import ControllerConfig, QuorumController
from cluster.controller.image import MetadataImage, record
from cluster.groups.group_configs import (
    GROUP_CONFIG_DEFS,
    ShareGroupConfig,
    describe_group_configs,
    duration_ms,
    share_group_config,
    validate_group_configs,
)
from cluster.protocol.errors import ErrorCode

SHARE_RESET_MESSAGE = ("Invalid value {v} for configuration share.auto.offset.reset: Invalid value `{v}` for "
                       "configuration share.auto.offset.reset. The value must be either 'earliest', 'latest' or of "
                       "the format 'by_duration:<PnDTnHnMn.nS>'.")


def test_the_keys_are_kafka_4_3_1s() -> None:
    assert sorted(GROUP_CONFIG_DEFS) == [
        "consumer.assignment.interval.ms", "consumer.heartbeat.interval.ms", "consumer.session.timeout.ms",
        "share.assignment.interval.ms", "share.auto.offset.reset", "share.delivery.count.limit",
        "share.heartbeat.interval.ms", "share.isolation.level", "share.partition.max.record.locks",
        "share.record.lock.duration.ms", "share.renew.acknowledge.enable", "share.session.timeout.ms",
        "streams.assignment.interval.ms", "streams.heartbeat.interval.ms", "streams.initial.rebalance.delay.ms",
        "streams.num.standby.replicas", "streams.session.timeout.ms"]


@pytest.mark.parametrize("value", ["latest", "earliest", "EARLIEST", "by_duration:PT1H", "by_duration:P1DT2H30M",
                                   "by_duration:PT0.5S", "by_duration:PT0S"])
def test_auto_offset_reset_accepts_latest_earliest_and_a_duration(value: str) -> None:
    assert validate_group_configs({"share.auto.offset.reset": value}, {}) == {"share.auto.offset.reset": value}


@pytest.mark.parametrize("value", ["bogus", "none", "by_duration:-PT1H", "by_duration:xx", "by_duration:PT",
                                   "by_duration:P", "by_duration:P1DT", "by_duration:PT١H", "by_duration:"])
def test_auto_offset_reset_refuses_anything_else_with_kafkas_message(value: str) -> None:
    with pytest.raises(InvalidConfig) as err:
        validate_group_configs({"share.auto.offset.reset": value}, {})
    assert str(err.value) == SHARE_RESET_MESSAGE.format(v=value)


def test_durations_as_java_parses_them() -> None:
    assert duration_ms("PT1H") == 3_600_000
    assert duration_ms("P2D") == 2 * 86_400_000
    assert duration_ms("pt1m30.25s") == 90_250
    assert duration_ms("PT-1S") is None and duration_ms("-PT1S") is None  # negative: refused
    assert duration_ms("P1Y") is None and duration_ms("") is None


@pytest.mark.parametrize(("configs", "message"), [
    ({"nope.key": "1"}, "Unknown group config name: nope.key"),
    ({"share.isolation.level": "READ_COMMITTED"},
     "Invalid value READ_COMMITTED for configuration share.isolation.level: String must be one of: "
     "read_committed, read_uncommitted"),
    ({"share.record.lock.duration.ms": "500"},
     "Invalid value 500 for configuration share.record.lock.duration.ms: Value must be at least 1000"),
    ({"share.record.lock.duration.ms": "abc"},
     "Invalid value abc for configuration share.record.lock.duration.ms: Not a number of type INT"),
    ({"share.record.lock.duration.ms": "٣٠٠٠٠"},  # digits, but not ASCII ones
     "Invalid value ٣٠٠٠٠ for configuration share.record.lock.duration.ms: Not a number of type INT"),
    ({"share.record.lock.duration.ms": "99999999999"},
     "Invalid value 99999999999 for configuration share.record.lock.duration.ms: Not a number of type INT"),
    ({"share.record.lock.duration.ms": "3600001"},
     "share.record.lock.duration.ms must be less than or equal to group.share.max.record.lock.duration.ms"),
    ({"share.session.timeout.ms": "1000"},
     "share.session.timeout.ms must be greater than or equal to group.share.min.session.timeout.ms"),
    ({"share.heartbeat.interval.ms": "60000"},
     "share.heartbeat.interval.ms must be less than or equal to group.share.max.heartbeat.interval.ms"),
    ({"share.session.timeout.ms": ""},
     "Invalid value  for configuration share.session.timeout.ms: Not a number of type INT"),
    ({"share.delivery.count.limit": "1"},
     "Invalid value 1 for configuration share.delivery.count.limit: Value must be at least 2"),
    ({"share.partition.max.record.locks": "50"},
     "Invalid value 50 for configuration share.partition.max.record.locks: Value must be at least 100"),
    ({"share.renew.acknowledge.enable": "maybe"},
     "Invalid value maybe for configuration share.renew.acknowledge.enable: Expected value to be either true or "
     "false"),
    ({"consumer.session.timeout.ms": "45000", "consumer.heartbeat.interval.ms": "15000"}, None),
])
def test_values_are_checked_as_kafka_checks_them(configs: dict[str, str], message: str | None) -> None:
    if message is None:
        validate_group_configs(configs, {})
        return
    with pytest.raises(InvalidConfig) as err:
        validate_group_configs(configs, {})
    assert str(err.value) == message


def test_bounds_come_from_the_broker_and_the_session_must_outlast_the_heartbeat() -> None:
    broker = {"group.share.min.session.timeout.ms": 1_000, "group.share.min.heartbeat.interval.ms": 1_000}
    assert validate_group_configs({"share.session.timeout.ms": "2000", "share.heartbeat.interval.ms": "1000"},
                                  broker)
    with pytest.raises(InvalidConfig, match="^share.session.timeout.ms must be greater than "
                                            "share.heartbeat.interval.ms$"):
        validate_group_configs({"share.session.timeout.ms": "2000", "share.heartbeat.interval.ms": "2000"}, broker)
    # the broker's default heartbeat (5 s) counts when the group sets only its session
    with pytest.raises(InvalidConfig, match="must be greater than share.heartbeat.interval.ms"):
        validate_group_configs({"share.session.timeout.ms": "4000"}, broker)


def test_values_are_stored_trimmed() -> None:
    assert validate_group_configs({"consumer.heartbeat.interval.ms": " 6000 "}, {}) == {
        "consumer.heartbeat.interval.ms": "6000"}


def test_describe_lists_every_key_with_kafkas_sources_and_synonyms() -> None:
    entries = {e["name"]: e for e in describe_group_configs(
        {"share.session.timeout.ms": "50000", "share.auto.offset.reset": "earliest"},
        {"group.share.record.lock.duration.ms": 20_000}, None, True, source_group=8, source_default=5)}
    assert len(entries) == len(GROUP_CONFIG_DEFS)
    session = entries["share.session.timeout.ms"]
    assert (session["value"], session["config_source"]) == ("50000", 8)
    assert [(s["name"], s["value"], s["source"]) for s in session["synonyms"]] == [
        ("share.session.timeout.ms", "50000", 8), ("group.share.session.timeout.ms", "45000", 5)]
    reset = entries["share.auto.offset.reset"]  # no broker synonym: only its default, as Kafka lists it
    assert (reset["value"], reset["config_source"]) == ("earliest", 8)
    assert [(s["name"], s["value"], s["source"]) for s in reset["synonyms"]] == [
        ("share.auto.offset.reset", "latest", 5)]
    lock = entries["share.record.lock.duration.ms"]  # the broker's own default
    assert (lock["value"], lock["config_source"]) == ("20000", 5)
    assert entries["share.renew.acknowledge.enable"]["value"] == "true"
    only = describe_group_configs({}, {}, {"share.isolation.level"}, False, source_group=8, source_default=5)
    assert [(e["name"], e["value"], e["synonyms"]) for e in only] == [("share.isolation.level", "read_uncommitted",
                                                                       [])]


def test_share_group_config_reads_the_image_with_defaults_where_unset() -> None:
    image = MetadataImage()
    assert share_group_config(image, "g") == ShareGroupConfig()
    for key, value in [("share.auto.offset.reset", "by_duration:PT2M"), ("share.isolation.level", "read_committed"),
                       ("share.record.lock.duration.ms", "16000"), ("share.session.timeout.ms", "50000"),
                       ("share.heartbeat.interval.ms", "6000"), ("consumer.session.timeout.ms", "50000")]:
        image.apply(record("GroupConfig", group="g", key=key, value=value))
    config = share_group_config(MetadataImage.from_bytes(image.to_bytes()), "g")
    assert config == ShareGroupConfig("by_duration:PT2M", "read_committed", 16_000, 50_000, 6_000)
    assert config.reset_duration_ms == 120_000
    assert share_group_config(image, "other") == ShareGroupConfig()
    image.apply(record("GroupConfig", group="g", key="share.auto.offset.reset", value="EARLIEST"))
    assert share_group_config(image, "g").auto_offset_reset == "earliest"
    # a value this broker cannot read (a newer writer) falls back to the default
    image.apply(record("GroupConfig", group="g", key="share.record.lock.duration.ms", value="soon"))
    assert share_group_config(image, "g").record_lock_duration_ms is None


def _controller() -> QuorumController:
    return QuorumController(MetadataImage(), ControllerConfig(), lambda configs: None, random.Random(1), 0,
                            validate_group_configs=lambda configs: validate_group_configs(configs, {}))


def test_the_controller_records_group_configs_and_a_follower_replays_them() -> None:
    ctrl = _controller()
    ops = [["share.auto.offset.reset", "set", "earliest"], ["share.session.timeout.ms", "set", " 50000"]]
    result = ctrl.alter_group_configs({"groups": [{"name": "g", "ops": ops}]})
    assert result["groups"] == [{"error_code": 0, "error_message": None, "name": "g"}]
    records = ctrl.take_records()
    follower = MetadataImage()
    follower.apply_entry(0, orjson.dumps(records))
    assert follower.group_configs == {"g": {"share.auto.offset.reset": "earliest", "share.session.timeout.ms": "50000"}}
    # delete one, refuse a bad one (nothing recorded), validate-only records nothing
    ctrl.alter_group_configs({"groups": [{"name": "g", "ops": [["share.auto.offset.reset", "delete", None]]}]})
    bad = ctrl.alter_group_configs({"groups": [
        {"name": "g", "ops": [["share.record.lock.duration.ms", "set", "10"]]},
        {"name": "", "ops": [["share.session.timeout.ms", "set", "50000"]]},
        {"name": "g", "ops": [["share.isolation.level", "append", "read_committed"]]}]})["groups"]
    assert [(r["error_code"], r["error_message"]) for r in bad] == [
        (ErrorCode.invalid_config, "Invalid value 10 for configuration share.record.lock.duration.ms: Value must be "
                                   "at least 1000"),
        (ErrorCode.invalid_request, "Default group resources are not allowed."),
        (ErrorCode.invalid_config, "Can't APPEND to key share.isolation.level because its type is not LIST.")]
    ctrl.alter_group_configs({"groups": [{"name": "g", "ops": [["share.isolation.level", "set", "read_committed"]]}],
                              "validate_only": True})
    follower.apply_entry(1, orjson.dumps(ctrl.take_records()))
    assert follower.group_configs == {"g": {"share.session.timeout.ms": "50000"}}
    ctrl.alter_group_configs({"groups": [{"name": "g", "ops": [["share.session.timeout.ms", "delete", None]]}]})
    follower.apply_entry(2, orjson.dumps(ctrl.take_records()))
    assert follower.group_configs == {} and follower.to_bytes() == MetadataImage.from_bytes(follower.to_bytes()).to_bytes()
