"""SIGSTOP the active controller (paused, not dead: a long GC pause, a hung VM) and resume
it: another node takes over in a higher epoch, no two nodes ever act as controller in the
same epoch, and the resumed node steps down instead of acting on its stale epoch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from tests.cluster_helpers import (
    ACTIVE,
    RESIGNED,
    SESSION_TIMEOUT_S,
    NotYet,
    activations,
    agreed_controller,
    create_topic,
    fast_teardown,
    latest_epoch_of,
    led_by,
    log_mark,
    log_since,
    metadata_from,
    topic_ready,
    wait_until,
)
from tests.harness import ClusterProcesses

ALL = [1, 2, 3]
PAUSE_S = 6.0


@pytest.fixture
def clusters(cluster_factory: Callable[..., ClusterProcesses]) -> Iterator[Callable[..., ClusterProcesses]]:
    yield from fast_teardown(cluster_factory)


def test_paused_controller_is_replaced_and_steps_down_on_resume(clusters) -> None:
    cluster = clusters(3)
    old = wait_until(lambda: agreed_controller(cluster, ALL, set(ALL)), 30,
                     "all 3 brokers registered and agreeing on one controller", cluster)
    old_epoch = latest_epoch_of(cluster, old)
    assert old_epoch is not None
    survivors = [n for n in ALL if n != old]
    live = cluster.bootstrap_of(*survivors)

    mark = log_mark(cluster)
    paused_at = time.monotonic()
    cluster[old].pause()
    try:
        new = wait_until(lambda: agreed_controller(cluster, survivors), 10,
                         f"the survivors {survivors} agreeing on a new controller", cluster)
        taken = [int(m.group(2)) for m in ACTIVE.finditer(log_since(cluster, new, mark))]
        assert taken and all(epoch > old_epoch for epoch in taken), (old_epoch, taken)
        new_epoch = max(taken)
        # The majority side works while the old controller is frozen.
        create_topic(live, "while-paused", 3, 2)
        # (Created while the paused node is still registered, a partition may name it; once its
        # session expires it is fenced and out of leadership and the ISRs.)
        wait_until(lambda: led_by(live, "while-paused", 3, survivors), SESSION_TIMEOUT_S + 4,
                   "while-paused led by the survivors only", cluster)
        time.sleep(max(0.0, paused_at + PAUSE_S - time.monotonic()))
    finally:
        cluster[old].resume()
    resumed_at = time.monotonic()

    # It wakes up believing it leads epoch old_epoch; it must find out and follow the new one.
    def follows_new() -> bool:
        md = metadata_from(cluster, old)
        if md.controller_id != new:
            raise NotYet(f"node {old} names controller {md.controller_id}")
        return True

    wait_until(follows_new, 5, f"node {old} naming node {new} as the controller", cluster)
    said = log_since(cluster, old, mark)
    assert "is the active controller" not in said, said

    by_epoch: dict[int, set[int]] = {}
    for node, epoch in activations(cluster):
        by_epoch.setdefault(epoch, set()).add(node)
    assert all(len(nodes) == 1 for nodes in by_epoch.values()), f"two controllers in one epoch: {by_epoch}"
    assert by_epoch[old_epoch] == {old} and by_epoch[new_epoch] == {new}, by_epoch

    # The resumed node rejoins: every node lists 3 brokers and names the same controller.
    assert wait_until(lambda: agreed_controller(cluster, ALL, set(ALL)), 15,
                      "all 3 nodes listing 3 brokers and agreeing on the controller", cluster) == new
    create_topic(cluster.bootstrap, "after-resume", 3, 3)
    wait_until(lambda: topic_ready(cluster, "after-resume", 3, 3), 15, "after-resume ready", cluster)
    assert agreed_controller(cluster, ALL, set(ALL)) == new
    assert max(by_epoch) == new_epoch == max(e for _, e in activations(cluster))

    # And it says that it stepped down.
    def logged_step_down() -> bool:
        return any(int(m.group(1)) == old for m in RESIGNED.finditer(log_since(cluster, old, mark)))

    while not logged_step_down() and time.monotonic() < resumed_at + 5:
        time.sleep(0.05)
    assert logged_step_down(), f"node {old} did not log its step-down\n{cluster.logs()}"
