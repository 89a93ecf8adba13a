"""topology.plan: the topology file against observed cluster states, without I/O."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from topology import Topology, loads
from topology.plan import (
    AddPartitions,
    AlterConfigs,
    ClusterPlan,
    ConfigChange,
    CreateTopic,
    CreateUser,
    ObservedCluster,
    ObservedTopic,
    Problem,
    UnreachableCluster,
    config_values_equal,
    format_plan,
    plan,
    plan_cluster,
    plan_document,
    plan_exit_code,
    summary_counts,
    summary_line,
)

TEXT = """\
[clusters.east]
datacenter = "east"
brokers = ["127.0.0.1:19092", "127.0.0.1:19093", "127.0.0.1:19094"]

[clusters.aggregate]
datacenter = "central"
brokers = ["127.0.0.1:39092"]

[clusters.idle]
datacenter = "idle"
brokers = ["127.0.0.1:49092"]

[[topics]]
cluster = "east"
name = "pageviews"
partitions = 6
replication_factor = 3
config = { "min.insync.replicas" = "2", "retention.ms" = 86400000 }

[[topics]]
cluster = "east"
name = "clicks"
partitions = 3
replication_factor = 3

[[topics]]
cluster = "aggregate"
name = "east.pageviews"
partitions = 4
config = { "cleanup.policy" = "compact", "unclean.leader.election.enable" = false }
"""


@pytest.fixture
def topology() -> Topology:
    return loads(TEXT, path=Path("topo.toml"), base_dir=Path("/base"))


def live(name: str, partitions: int, rf: int, configs: dict[str, str] | None = None,
         overrides: tuple[str, ...] = ()) -> ObservedTopic:
    return ObservedTopic(name, partitions, (rf,) * partitions, configs or {}, frozenset(overrides))


def east(*topics: ObservedTopic, brokers: tuple[int, ...] = (1, 2, 3)) -> ObservedCluster:
    return ObservedCluster("east", "127.0.0.1:19092,127.0.0.1:19093,127.0.0.1:19094", brokers,
                           {t.name: t for t in topics})


def aggregate(*topics: ObservedTopic) -> ObservedCluster:
    return ObservedCluster("aggregate", "127.0.0.1:39092", (1,), {t.name: t for t in topics})


PAGEVIEWS_OK = {"min.insync.replicas": "2", "retention.ms": "86400000"}
AGGREGATE_OK = {"cleanup.policy": "compact", "unclean.leader.election.enable": "false"}


def in_sync() -> dict[str, ObservedCluster | UnreachableCluster]:
    return {"east": east(live("pageviews", 6, 3, PAGEVIEWS_OK, tuple(PAGEVIEWS_OK)), live("clicks", 3, 3)),
            "aggregate": aggregate(live("east.pageviews", 4, 1, AGGREGATE_OK, ("cleanup.policy",)))}


# ---- the cases ------------------------------------------------------------------------------


def test_empty_clusters_get_every_topic_created_with_the_files_configs(topology):
    changes = plan(topology, {"east": east(), "aggregate": aggregate()})
    assert changes == [
        CreateTopic("east", "pageviews", 6, 3, {"min.insync.replicas": "2", "retention.ms": "86400000"}),
        CreateTopic("east", "clicks", 3, 3, {}),
        # replication_factor left out: the default 3, capped by the cluster's one broker
        CreateTopic("aggregate", "east.pageviews", 4, 1,
                    {"cleanup.policy": "compact", "unclean.leader.election.enable": "false"}),
    ]
    assert summary_counts(changes) == (3, 0, 0)
    assert plan_exit_code(changes) == 2
    assert changes[0].describe() == ("create topic east/pageviews partitions=6 rf=3 min.insync.replicas=2 "
                                     "retention.ms=86400000")


def test_nothing_to_do_when_the_clusters_match(topology):
    changes = plan(topology, in_sync())
    assert changes == []
    assert plan_exit_code(changes) == 0
    assert summary_line(changes) == "Plan: 0 to create, 0 to change, 0 problems."


def test_more_partitions_in_the_file_are_added(topology):
    observed = in_sync()
    observed["east"] = east(live("pageviews", 4, 3, PAGEVIEWS_OK), live("clicks", 3, 3))
    changes = plan(topology, observed)
    assert changes == [AddPartitions("east", "pageviews", 4, 6)]
    assert changes[0].describe() == "add partitions to east/pageviews: 4 -> 6"
    assert plan_exit_code(changes) == 2


def test_config_changes_name_old_and_new_values_only_for_keys_the_file_sets(topology):
    observed = in_sync()
    # retention.ms is at the broker default; segment.bytes is overridden on the topic but the
    # file does not mention it: it is left alone.
    observed["east"] = east(
        live("pageviews", 6, 3, {"min.insync.replicas": "1", "retention.ms": "604800000", "segment.bytes": "1024"},
             overrides=("min.insync.replicas", "segment.bytes")),
        live("clicks", 3, 3, {"retention.ms": "1"}, overrides=("retention.ms",)))
    changes = plan(topology, observed)
    assert changes == [AlterConfigs("east", "pageviews", (
        ConfigChange("min.insync.replicas", "1", "2"),
        ConfigChange("retention.ms", "604800000", "86400000", old_is_default=True),
    ))]
    (alter,) = changes
    assert isinstance(alter, AlterConfigs)
    assert alter.set_configs == {"min.insync.replicas": "2", "retention.ms": "86400000"}
    assert alter.describe() == ("alter topic east/pageviews min.insync.replicas 1 -> 2, "
                                "retention.ms 604800000 (default) -> 86400000")
    assert summary_counts(changes) == (0, 1, 0)


def test_a_config_the_cluster_does_not_report_is_set(topology):
    observed = in_sync()
    observed["aggregate"] = aggregate(live("east.pageviews", 4, 1, {"cleanup.policy": "compact"}))
    (change,) = plan(topology, observed)
    assert change == AlterConfigs("aggregate", "east.pageviews",
                                  (ConfigChange("unclean.leader.election.enable", None, "false"),))
    assert "unclean.leader.election.enable (unset) -> false" in change.describe()


def test_fewer_partitions_in_the_file_is_a_problem_not_a_change(topology):
    observed = in_sync()
    observed["east"] = east(live("pageviews", 8, 3, PAGEVIEWS_OK), live("clicks", 3, 3))
    changes = plan(topology, observed)
    assert len(changes) == 1
    problem = changes[0]
    assert isinstance(problem, Problem) and problem.kind == "shrink"
    assert (problem.cluster, problem.topic) == ("east", "pageviews")
    assert "cannot shrink topic east/pageviews from 8 to 6 partitions" in problem.describe()
    assert "partitions = 8" in problem.hint
    assert plan_exit_code(changes) == 1
    assert summary_counts(changes) == (0, 0, 1)


def test_a_different_replication_factor_is_reported_with_the_reassign_command(topology):
    observed = in_sync()
    observed["east"] = east(live("pageviews", 6, 3, PAGEVIEWS_OK), live("clicks", 3, 1))
    (problem,) = plan(topology, observed)
    assert isinstance(problem, Problem) and problem.kind == "replication-factor"
    assert "replication factor of topic east/clicks from 1 to 3" in problem.message
    assert "dcmirror reassign generate --topics clicks --brokers 1,2,3 --replication-factor 3" in problem.hint
    # Mixed replica counts (e.g. a reassignment half done) show as a range.
    mixed = ObservedTopic("clicks", 3, (3, 2, 3))
    (problem,) = plan_cluster(topology.topics_of("east"), east(live("pageviews", 6, 3, PAGEVIEWS_OK), mixed))
    assert isinstance(problem, Problem) and "from 2-3 to 3" in problem.message


def test_problems_do_not_hide_the_changes_that_can_be_made(topology):
    observed = in_sync()
    # pageviews: RF differs and a config differs; clicks: more partitions wanted.
    observed["east"] = east(live("pageviews", 6, 2, {**PAGEVIEWS_OK, "min.insync.replicas": "1"}),
                            live("clicks", 2, 3))
    changes = plan(topology, observed)
    assert [type(c) for c in changes] == [Problem, AlterConfigs, AddPartitions]
    assert summary_counts(changes) == (0, 2, 1)
    assert plan_exit_code(changes) == 1


def test_an_unreachable_cluster_is_a_problem_naming_it_and_its_addresses(topology):
    observed = in_sync()
    observed["east"] = UnreachableCluster("east", "127.0.0.1:19092,127.0.0.1:19093", "connection refused")
    changes = plan(topology, observed)
    (problem,) = changes
    assert isinstance(problem, Problem) and problem.kind == "unreachable"
    assert problem.message == "cannot reach cluster east at 127.0.0.1:19092,127.0.0.1:19093: connection refused"
    assert plan_exit_code(changes) == 1


def test_creation_with_more_replicas_than_live_brokers_is_a_problem(topology):
    changes = plan(topology, {"east": east(live("clicks", 3, 3), brokers=(1, 3))})
    assert [c.kind for c in changes if isinstance(c, Problem)] == ["too-few-brokers"]
    assert "cluster east has 2 live broker(s) (1, 3)" in changes[0].describe()


def test_a_topic_in_error_is_a_problem(topology):
    broken = ObservedTopic("pageviews", 0, (), error="the cluster answers LEADER_NOT_AVAILABLE for it")
    (problem,) = plan_cluster(topology.topics_of("east"), east(broken, live("clicks", 3, 3)))
    assert isinstance(problem, Problem) and problem.kind == "topic-error"


def test_only_observed_clusters_are_planned(topology):
    assert plan(topology, {"aggregate": aggregate()}) == [
        CreateTopic("aggregate", "east.pageviews", 4, 1, AGGREGATE_OK)]
    # A cluster without declared topics plans nothing.
    assert plan(topology, {"idle": ObservedCluster("idle", "127.0.0.1:49092", (1,))}) == []


# ---- config values ---------------------------------------------------------------------------


@pytest.mark.parametrize(("desired", "live", "equal"), [
    ("2", "2", True),
    ("2", "3", False),
    ("007", "7", True),
    ("+5", "5", True),
    (" 60000 ", "60000", True),
    ("TRUE", "true", True),
    ("False", "false", True),
    ("yes", "true", True),  # only because the live value is a boolean
    ("1", "true", True),
    ("0", "true", False),
    ("no", "false", True),
    ("maybe", "false", False),
    ("0.50", "0.5", True),
    ("1", "1.0", True),
    ("compact, delete", "compact,delete", True),
    ("delete,compact", "compact,delete", False),
    ("CreateTime", "createtime", False),
    ("2", None, False),
    ("NaN", "NaN", True),
    ("Infinity", "inf", False),
])
def test_config_values_compare_as_the_broker_reports_them(desired, live, equal):
    assert config_values_equal(desired, live) is equal


# ---- what the command prints ------------------------------------------------------------------


def test_text_and_json_renderings(topology):
    observed: dict[str, ObservedCluster | UnreachableCluster] = {
        "east": east(live("pageviews", 4, 3, {"min.insync.replicas": "1", "retention.ms": "86400000"})),
        "aggregate": UnreachableCluster("aggregate", "127.0.0.1:39092", "no answer within 5 s"),
    }
    plans = [ClusterPlan(topology.cluster(name), observed[name], plan_cluster(topology.topics_of(name), observed[name]))
             for name in ("east", "aggregate")]
    text = format_plan(plans, topology)
    assert text.splitlines() == [
        "cluster east at 127.0.0.1:19092,127.0.0.1:19093,127.0.0.1:19094: brokers 1,2,3; "
        "1 of 2 declared topic(s) exist",
        "cluster aggregate at 127.0.0.1:39092: unreachable",
        "",
        "~ add partitions to east/pageviews: 4 -> 6",
        "~ alter topic east/pageviews min.insync.replicas 1 (default) -> 2",
        "+ create topic east/clicks partitions=3 rf=3",
        "! cannot reach cluster aggregate at 127.0.0.1:39092: no answer within 5 s; "
        "start its brokers or fix `brokers` in the file",
        "",
        "Plan: 1 to create, 2 to change, 1 problems.",
    ]
    doc = json.loads(json.dumps(plan_document(plans, topology)))
    assert doc["summary"] == {"create": 1, "change": 2, "problems": 1}
    assert doc["exit_code"] == 1
    assert doc["clusters"][1] == {"name": "aggregate", "bootstrap": "127.0.0.1:39092", "reachable": False,
                                  "error": "no answer within 5 s", "brokers": [], "existing_topics": []}
    assert [c["action"] for c in doc["changes"]] == ["add-partitions", "alter-configs", "create", "problem"]
    assert doc["changes"][1]["configs"] == {"min.insync.replicas": {"from": "1", "to": "2", "from_default": True}}


def test_no_changes_says_so(topology):
    names = ("east", "aggregate")
    observed = in_sync()
    plans = [ClusterPlan(topology.cluster(n), observed[n], []) for n in names]
    text = format_plan(plans, topology)
    assert "No changes. The clusters match the topology file." in text
    assert text.splitlines()[-1] == "Plan: 0 to create, 0 to change, 0 problems."


def test_users_the_cluster_lacks_are_planned_and_unknown_users_are_a_problem() -> None:
    wanted = {"admin": "${env:A}", "carol": "${env:C}"}
    seen = ObservedCluster("east", "b:1", (1,), {}, frozenset({"admin"}))
    (change,) = plan_cluster([], seen, wanted)
    assert isinstance(change, CreateUser) and (change.cluster, change.user) == ("east", "carol")
    assert change.describe() == "create SCRAM user east/carol (SCRAM-SHA-256, SCRAM-SHA-512)"
    assert change.to_json() == {"action": "create-user", "cluster": "east", "user": "carol"}  # no reference
    assert summary_counts([change]) == (1, 0, 0)
    assert plan_cluster([], ObservedCluster("east", "b:1", (1,), {}, frozenset({"admin", "carol"})), wanted) == []
    (problem,) = plan_cluster([], ObservedCluster("east", "b:1", (1,), {}, None, "CLUSTER_AUTHORIZATION_FAILED"),
                              wanted)
    assert isinstance(problem, Problem) and "CLUSTER_AUTHORIZATION_FAILED" in problem.message
