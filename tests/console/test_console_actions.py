"""The console's background actions (deploy/console/actions.py) without any cluster: one
action per flow at a time, bounded progress and report, failures and a stopping console as
outcomes, and the failover's known source ends gathered from the workers' reports."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from deploy.console.actions import (
    LINES_MAX,
    REPORT_LINES_MAX,
    ActionRefused,
    ActionRunner,
    Say,
    worker_views,
)
from mirror.failover import FailoverError


def test_one_action_per_flow_bounded_lines_and_outcomes() -> None:
    async def main() -> None:
        runner = ActionRunner()
        with pytest.raises(ActionRefused, match="no background actions"):
            runner.start("f", "promote", "admin", lambda say: trio.sleep(0))  # type: ignore[arg-type,return-value]
        release = trio.Event()

        async def slow(say: Say) -> list[str]:
            for i in range(LINES_MAX + 30):
                say(f"line {i} " + "x" * 1000)
            await release.wait()
            return [f"p{i}" for i in range(REPORT_LINES_MAX + 5)]

        async def broken(say: Say) -> list[str]:
            say("started")
            raise FailoverError("neither side is a mirror topic of the other")

        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            assert runner.serving
            run = runner.start("f", "promote", "admin (token)", slow)
            await trio.testing.wait_all_tasks_blocked()
            assert run.running and runner.last("f") is run
            with pytest.raises(ActionRefused, match="promote started by admin \\(token\\) still runs"):
                runner.start("f", "failback", "alice", broken)
            other = runner.start("g", "failback", "alice", broken)  # another flow: its own action
            await trio.testing.wait_all_tasks_blocked()
            assert other.outcome == "error" and other.error == "neither side is a mirror topic of the other"
            assert list(other.lines) == ["started"] and other.finished_s is not None
            assert len(run.lines) == LINES_MAX and run.lines[0].startswith("line 30 ")
            assert all(len(line) <= 500 for line in run.lines)
            release.set()
            await trio.testing.wait_all_tasks_blocked()
            assert run.outcome == "ok" and run.error is None
            assert len(run.report) == REPORT_LINES_MAX + 1 and run.report[-1].startswith("… and 5 more")
            doc = run.as_json()
            assert doc["running"] is False and doc["principal"] == "admin (token)" and len(doc["lines"]) == LINES_MAX
            # Ended: the flow takes the next action.
            async def forever(say: Say) -> list[str]:
                await trio.sleep_forever()
                return []

            again = runner.start("f", "promote", "admin (token)", forever)
            await trio.testing.wait_all_tasks_blocked()
            assert again.running
            nursery.cancel_scope.cancel()
        assert again.outcome == "error" and "console stopped" in (again.error or "")
        assert not runner.serving

    trio.run(main)


def test_worker_views_are_the_latest_any_worker_saw_and_when() -> None:
    """The latest view, not the highest: a topic created again (a failback) starts low, and a
    high view of its old history would claim records lost that never were (issue 40's soak)."""
    report = {"workers": [
        {"worker": "w0", "source_known_ends": [{"topic": "orders", "partition": 0, "high_watermark": 10, "seen_ms": 5},
                                               {"topic": "orders", "partition": 1, "high_watermark": 7,
                                                "seen_ms": 6}],
         "refused_topics": {"gone": "SOURCE_DELETED: east:gone was deleted", "mine": "FAILED_OVER: ..."}},
        {"worker": "w1", "reachable": False},
        {"worker": "w2", "source_known_ends": [{"topic": "orders", "partition": 0, "high_watermark": 12,
                                                "seen_ms": 4}]},
    ]}
    known, deleted = worker_views(report)
    assert {k: (v.high_watermark, v.seen_ms) for k, v in known.items()} == {("orders", 0): (10, 5),
                                                                            ("orders", 1): (7, 6)}
    assert deleted == {"gone": "SOURCE_DELETED: east:gone was deleted"}
    assert worker_views(None) == ({}, {})


def test_dr_actions_act_as_the_session_and_the_topology_identity_takes_the_flows_principal(tmp_path: Path) -> None:
    """A SCRAM user acts as themself on both sides (the brokers' ACLs decide); the token's
    admin and an open console act with the topology's identity and the flow's source.* /
    target.* principal over it, as `dcmirror mirror promote` connects."""
    from cluster.common.secrets import Secret
    from deploy.console.app import _flow_settings
    from deploy.console.auth import ROLE_ADMIN, ROLE_USER, Session
    from deploy.console.server import make_console
    from topology import load

    path = tmp_path / "topology.toml"
    path.write_text("""
[clusters.east]
datacenter = "east"
brokers = ["127.0.0.1:19092"]
client = { "security.protocol" = "SASL_PLAINTEXT", "sasl.mechanism" = "SCRAM-SHA-256", "sasl.username" = "ops", "sasl.password" = "${env:DCMIRROR_TEST_OPS_PW}" }

[clusters.dr]
datacenter = "dr"
brokers = ["127.0.0.1:29092"]
client = { "security.protocol" = "SASL_PLAINTEXT", "sasl.mechanism" = "SCRAM-SHA-256", "sasl.username" = "ops", "sasl.password" = "${env:DCMIRROR_TEST_OPS_PW}" }

[[mirrors]]
source = "east"
target = "dr"
topics = "orders"
mirror_topics = true
config = { "source.sasl.username" = "mirror-east", "target.sasl.username" = "mirror-dr" }
""")
    console = make_console(load(path), 1.0)
    (flow,) = console.topology.mirrors
    admin = Session("s1", "admin (token)", ROLE_ADMIN, "c", 0, 0)
    assert _flow_settings(console, admin, flow, "source")["sasl.username"] == "mirror-east"
    target = _flow_settings(console, admin, flow, "target")
    assert target["sasl.username"] == "mirror-dr" and target["bootstrap.servers"] == "127.0.0.1:29092"
    alice = Session("s2", "alice", ROLE_USER, "c", 0, 0, password=Secret("alice-pw"), clusters=("east", "dr"))
    for side in ("source", "target"):
        mine = _flow_settings(console, alice, flow, side)
        assert mine["sasl.username"] == "alice" and isinstance(mine["sasl.password"], Secret)
    only_east = Session("s3", "bob", ROLE_USER, "c", 0, 0, password=Secret("bob-pw"), clusters=("east",))
    with pytest.raises(ValueError, match="bob is not a user of cluster dr"):
        _flow_settings(console, only_east, flow, "target")
