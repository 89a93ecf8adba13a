"""Which topics a flow mirrors and how their targets are made, with the mirror running under
its supervisor (`dcmirror mirror --config FILE`, two workers, topic.refresh.ms 1000):

- a topic that matched before the start gets a target topic with the source's partition
  count and the configs set on the source topic (retention.ms; max.message.bytes with room
  for the provenance headers, also where the source topic has the broker's default);
- a matching topic created after the start is mirrored within 30 s, configs included;
- topics the flow's `exclude` regex matches are never mirrored, whether they existed at
  the start or came later;
- partitions added to a source topic appear in the target within 30 s, and their records
  are mirrored;
- in the end every record of every mirrored topic is in its target exactly once, in order.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.mirror.lab import (
    Flow,
    MirrorLab,
    add_partitions,
    mirrored_count,
    new_topic,
    topic_config,
    topics_of,
    wait_for,
    write,
)

FLOW = "east-to-aggregate"
DYNAMIC_TOPIC_CONFIG = 1  # DescribeConfigs config_source: set on the topic itself
DEFAULT_MAX_MESSAGE_BYTES = 1_048_588
PROVENANCE_BYTES_MAX = 1024
WITHIN_S = 30.0
MAIN_CONFIGS = {"retention.ms": "3600000", "max.message.bytes": "500000"}


def assert_target_configs(bootstrap: str, topic: str, want: dict[str, str]) -> None:
    """`want` set on the target topic; max.message.bytes is the source's plus what the flow's
    provenance headers add (at most PROVENANCE_BYTES_MAX), whether the source set it or not."""
    entries = topic_config(bootstrap, topic)
    got = {name: (entries[name].value, getattr(entries[name].source, "value", entries[name].source))
           for name in [*want, "max.message.bytes"]}
    limit = int(want.get("max.message.bytes", DEFAULT_MAX_MESSAGE_BYTES))
    headroom = int(got["max.message.bytes"][0]) - limit
    assert 0 < headroom <= PROVENANCE_BYTES_MAX and got["max.message.bytes"][1] == DYNAMIC_TOPIC_CONFIG, \
        f"{topic}: max.message.bytes {got['max.message.bytes']} for a source limit of {limit}"
    got.pop("max.message.bytes")
    want = {k: v for k, v in want.items() if k != "max.message.bytes"}
    assert got == {name: (value, DYNAMIC_TOPIC_CONFIG) for name, value in want.items()}, \
        f"{topic}: configs {got}, want {want} set on the topic"


def mirror_pv_main(mirror_lab: Callable[..., MirrorLab], *, with_secret: bool = False) -> MirrorLab:
    """east/pv-main (3 partitions, 3000 records, MAIN_CONFIGS) mirrored by flow pv-.* (except
    pv-secret.*) into the aggregate, checked exactly once."""
    lab = mirror_lab({"east": 1, "aggregate": 1})
    east, aggregate = lab.bootstrap("east"), lab.bootstrap("aggregate")
    new_topic(east, "pv-main", 3, config=MAIN_CONFIGS)
    write(east, "pv-main", 3, 3000, "main")
    if with_secret:
        new_topic(east, "pv-secret", 2)
        write(east, "pv-secret", 2, 100, "secret")
    lab.write_topology([Flow("east", "aggregate", "pv-.*", exclude="pv-secret.*", workers=2,
                             config={"topic.refresh.ms": "1000"})])
    lab.start_mirror()
    lab.check_exactly_once(FLOW, ["pv-main"], timeout_s=60)
    assert topics_of(aggregate)["east.pv-main"] == 3
    assert_target_configs(aggregate, "east.pv-main", MAIN_CONFIGS)
    return lab


@pytest.mark.timeout(240)
def test_new_matching_topic_is_mirrored_with_its_configs_and_excluded_topics_never(
        mirror_lab: Callable[..., MirrorLab]) -> None:
    lab = mirror_pv_main(mirror_lab, with_secret=True)
    east, aggregate = lab.bootstrap("east"), lab.bootstrap("aggregate")

    # A matching topic created while the mirror runs; an excluded one too.
    new_configs = {"retention.ms": "7200000"}
    created_at = time.monotonic()
    new_topic(east, "pv-new", 4, config=new_configs)
    new_topic(east, "pv-secret-late", 2)
    write(east, "pv-new", 4, 400, "new")
    write(east, "pv-secret-late", 2, 100, "late")
    wait_for(lambda: mirrored_count(aggregate, "east.pv-new") == 400, WITHIN_S - (time.monotonic() - created_at),
             "east.pv-new holds the new topic's 400 records", interval_s=0.5, on_timeout=lab.mirror_log_tail)
    print(f"new topic mirrored {time.monotonic() - created_at:.1f} s after its creation", flush=True)
    assert topics_of(aggregate)["east.pv-new"] == 4
    assert_target_configs(aggregate, "east.pv-new", new_configs)

    # More records into both; every record exactly once, in order; the excluded topics
    # nowhere in the aggregate.
    write(east, "pv-main", 3, 600, "main", start=3000)
    write(east, "pv-new", 4, 400, "new", start=400)
    lab.check_exactly_once(FLOW, ["pv-main", "pv-new"], timeout_s=60)
    mirrored = sorted(t for t in topics_of(aggregate) if t.startswith("east."))
    assert mirrored == ["east.pv-main", "east.pv-new"], f"aggregate topics from east: {mirrored}"
    assert lab.supervisor is not None and lab.supervisor.poll() is None
    assert "exited with" not in lab.mirror_log(), "a worker exited:\n" + lab.mirror_log_tail()


@pytest.mark.timeout(240)
def test_partitions_added_at_the_source_appear_in_the_target_and_are_mirrored(
        mirror_lab: Callable[..., MirrorLab]) -> None:
    lab = mirror_pv_main(mirror_lab)
    east, aggregate = lab.bootstrap("east"), lab.bootstrap("aggregate")
    added_at = time.monotonic()
    add_partitions(east, "pv-main", 5)
    write(east, "pv-main", 5, 1000, "main", start=3000)  # record i into partition i % 5: old and new ones
    wait_for(lambda: topics_of(aggregate).get("east.pv-main") == 5, WITHIN_S - (time.monotonic() - added_at),
             "east.pv-main has 5 partitions", interval_s=0.5, on_timeout=lab.mirror_log_tail)
    wait_for(lambda: mirrored_count(aggregate, "east.pv-main") == 4000, WITHIN_S - (time.monotonic() - added_at),
             "east.pv-main holds all 4000 records", interval_s=0.5, on_timeout=lab.mirror_log_tail)
    print(f"added partitions mirrored {time.monotonic() - added_at:.1f} s after they were added", flush=True)
    lab.check_exactly_once(FLOW, ["pv-main"], timeout_s=60)
    assert_target_configs(aggregate, "east.pv-main", MAIN_CONFIGS)
