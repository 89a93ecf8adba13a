"""The restart schedule (deploy/supervisor.py) as plain function calls, and the health
assessment (deploy/health.py) from hand-made broker answers."""

from __future__ import annotations

import math
from pathlib import Path

from deploy.health import BrokerView, PartitionView, assess
from deploy.supervisor import RestartPolicy, Schedule
from topology.model import ClusterSpec, NodeAddress

POLICY = RestartPolicy(backoff_min_s=0.5, backoff_max_s=10.0, healthy_run_s=60.0)


def crash_after(schedule: Schedule, name: str, now_s: float, run_s: float, code: int = 1) -> tuple[float, float]:
    """Start `name` at now_s, let it exit after run_s; returns (delay, time of exit)."""
    assert schedule.until_start(name, now_s) == 0
    schedule.started(name, now_s, 100)
    return schedule.exited(name, now_s + run_s, code), now_s + run_s


def test_service_backoff_doubles_on_quick_failures_up_to_the_cap_and_resets_after_a_healthy_run() -> None:
    s = Schedule(POLICY)
    s.add("broker", 0.0)
    now = 0.0
    delays = []
    for _ in range(7):
        delay, now = crash_after(s, "broker", now, 1.0)
        delays.append(delay)
        assert s.until_start("broker", now) == delay
        assert s.until_start("broker", now + delay / 2) == delay / 2
        now += delay
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    delay, now = crash_after(s, "broker", now, 60.0)  # ran a minute: the shortest backoff again
    assert delay == 0.5
    now += delay
    delay, now = crash_after(s, "broker", now, 1.0)
    assert delay == 1.0
    r = s.children["broker"]
    assert (r.starts, r.restarts, r.failures, r.last_exit_code, r.last_run_s) == (9, 8, 9, 1, 1.0)


def test_a_service_that_exits_0_is_restarted_too() -> None:
    s = Schedule(POLICY)
    s.add("w", 5.0)
    assert s.until_start("w", 0.0) == 5.0
    delay, _ = crash_after(s, "w", 5.0, 2.0, code=0)
    assert delay == 0.5


def test_a_running_or_stopping_child_is_never_due_and_a_stopped_one_not_restarted() -> None:
    s = Schedule(POLICY)
    s.add("w", 0.0)
    s.started("w", 0.0, 7)
    assert s.until_start("w", 1e9) == math.inf
    assert s.children["w"].pid == 7
    s.stop("w")
    assert s.exited("w", 3.0, 0) == math.inf
    assert s.until_start("w", 1e9) == math.inf
    assert s.children["w"].pid is None and s.children["w"].failures == 0


def test_job_runs_every_interval_from_its_start_and_retries_failures_with_backoff_capped_at_the_interval() -> None:
    s = Schedule(POLICY)
    s.add("load", 0.0, interval_s=30.0, delay_s=30.0)
    assert s.until_start("load", 0.0) == 30.0
    delay, now = crash_after(s, "load", 30.0, 12.0, code=0)
    assert (delay, now) == (18.0, 42.0)  # 30 s after the previous start
    delay, now = crash_after(s, "load", 60.0, 45.0, code=0)  # overran the interval: next at once
    assert delay == 0.0
    delay, now = crash_after(s, "load", now, 1.0, code=1)
    assert delay == 0.5
    now += delay
    for expected in (1.0, 2.0, 4.0, 8.0, 10.0):
        delay, now = crash_after(s, "load", now, 1.0, code=1)
        assert delay == expected
        now += delay
    r = s.children["load"]
    assert (r.failures, r.restarts) == (6, 6)
    delay, now = crash_after(s, "load", now, 1.0, code=0)
    assert delay == 29.0 and r.backoff_s is None and r.last_success_s == now
    short = Schedule(POLICY)
    short.add("load", 0.0, interval_s=3.0)
    delays = []
    now = 0.0
    for _ in range(4):
        delay, now = crash_after(short, "load", now, 0.1, code=2)
        delays.append(delay)
        now += delay
    assert delays == [0.5, 1.0, 2.0, 3.0]  # never later than one interval


def test_spawn_failure_counts_as_a_failed_run() -> None:
    s = Schedule(POLICY)
    s.add("x", 0.0)
    assert s.spawn_failed("x", 0.0) == 0.5
    assert s.spawn_failed("x", 0.5) == 1.0
    assert s.children["x"].last_exit_code == -1


# ---- health ------------------------------------------------------------------------------


SPEC = ClusterSpec("east", "dc1", tuple(NodeAddress(i, "127.0.0.1", 9000 + i) for i in (1, 2, 3)), (),
                   Path("/data/east"))


def parts(isr_of_p1: tuple[int, ...] = (1, 2, 3), leader_of_p2: int = 2) -> tuple[PartitionView, ...]:
    return (PartitionView("t", 0, 1, (1, 2, 3), (1, 2, 3)), PartitionView("t", 1, 2, (2, 3, 1), isr_of_p1),
            PartitionView("t", 2, leader_of_p2, (3, 1), (3, 1) if leader_of_p2 >= 0 else ()),
            PartitionView("__consumer_offsets", 0, 1, (1,), (1,), internal=True))


def view(node: int, registered: tuple[int, ...] = (1, 2, 3), controller: int = 1, **kw: object) -> BrokerView:
    return BrokerView(node, f"127.0.0.1:{9000 + node}", None, controller, registered,
                      parts(**kw))  # type: ignore[arg-type]


def test_health_of_a_whole_cluster() -> None:
    h = assess(SPEC, [view(1), view(2), view(3)])
    assert h.healthy and h.ready
    assert (h.up, h.registered, h.controller_id, h.topics, h.partitions) == ((1, 2, 3), (1, 2, 3), 1, 1, 3)
    assert h.offline == () and h.under_replicated == ()


def test_health_with_a_dead_broker_a_short_isr_and_an_offline_partition() -> None:
    dead = BrokerView(2, "127.0.0.1:9002", "cannot reach broker 127.0.0.1:9002: refused")
    h = assess(SPEC, [view(1, (1, 3), isr_of_p1=(3, 1), leader_of_p2=-1), dead, view(3, (1, 3))])
    assert not h.healthy and not h.ready
    assert (h.up, h.registered, h.controller_id) == ((1, 3), (1, 3), 1)
    assert h.offline == ("t-2",) and h.under_replicated == ("t-1", "t-2")
    assert h.problems == ("broker 2 (127.0.0.1:9002) does not answer: cannot reach broker 127.0.0.1:9002: refused",
                          "1 offline partition(s) (no leader): t-2",
                          "2 under-replicated partition(s) (ISR short of the replicas): t-1, t-2")
    assert "broker 2 does not answer yet" in h.waiting


def test_health_while_brokers_register_and_when_one_answers_but_is_fenced() -> None:
    starting = assess(SPEC, [view(1, (1,)), view(2, (1, 2)), view(3, (1, 2))])
    assert not starting.ready
    assert starting.waiting == ("broker 1 sees broker(s) 2, 3 not registered yet",
                                "broker 2 sees broker(s) 3 not registered yet",
                                "broker 3 sees broker(s) 3 not registered yet")
    # the controller's view decides who is registered
    assert starting.registered == (1,)
    assert "broker 3 answers but is not registered with the controller (fenced)" in starting.problems
    nobody = assess(SPEC, [BrokerView(i, f"127.0.0.1:{9000 + i}", "refused") for i in (1, 2, 3)])
    assert nobody.controller_id is None and nobody.up == ()
    assert nobody.problems == ("none of the 3 brokers answers (127.0.0.1:9001: refused)",)


def test_health_with_dedicated_controllers_counts_their_quorum() -> None:
    spec = ClusterSpec("east", "dc1", SPEC.brokers, tuple(NodeAddress(i, "127.0.0.1", 9000 + i) for i in (4, 5, 6)),
                       Path("/data/east"))
    brokers = [view(1, controller=1), view(2, controller=2), view(3, controller=3)]  # each names itself
    up = [BrokerView(i, f"127.0.0.1:{9000 + i}") for i in (4, 5, 6)]
    h = assess(spec, brokers, up)
    assert h.healthy and h.ready and h.controller_id is None
    assert (h.controller_ids, h.controllers_up) == ((4, 5, 6), (4, 5, 6))
    one_down = [up[0], BrokerView(5, "127.0.0.1:9005", "Connection refused"), up[2]]
    h = assess(spec, brokers, one_down)
    assert h.ready and h.problems == ("controller 5 (127.0.0.1:9005) does not answer: Connection refused",)
    two_down = [BrokerView(4, "127.0.0.1:9004", "Connection refused"), one_down[1], up[2]]
    h = assess(spec, brokers, two_down)
    assert not h.ready and h.waiting == ("no controller quorum yet",)
    assert h.problems[-1] == "no controller quorum: 1 of 3 dedicated controllers answer"
