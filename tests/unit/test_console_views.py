"""The console's page decisions (deploy/console/views.py, auth.py): colours by the alert
rules' thresholds, the map's layout, partitions worst first, record rendering, sessions."""

from __future__ import annotations

from typing import Any

import pytest

from deploy.console import views
from deploy.console.auth import SESSION_IDLE_S, SESSIONS_MAX, Sessions, token_matches
from deploy.render.monitoring import MonitoringOptions
from topology import load_default


def worker(**kw: Any) -> dict[str, Any]:
    return {"worker": "f-w0", "reachable": True, "partitions": [], **kw}


def part(**kw: Any) -> dict[str, Any]:
    return {"topic": "t", "partition": 0, "state": "MIRRORING", "lag_records": 0, "lag_s": 0.0,
            "source_silent_s": 0.1, **kw}


def test_flow_colours_follow_the_alert_rules() -> None:
    options = MonitoringOptions(lag_alert_s=60, source_silent_alert_s=30)
    assert views.flow_health(None, 1, options).level == views.UNKNOWN
    ok = views.flow_health({"workers": [worker(partitions=[part(lag_records=5, lag_s=59)])]}, 1, options)
    assert (ok.level, ok.lag_records, ok.lag_s) == (views.OK, 5, 59)
    lagging = views.flow_health({"workers": [worker(partitions=[part(lag_s=61)])]}, 1, options)
    assert lagging.level == views.WARN and "lags 61 s" in lagging.reasons[0]
    silent = views.flow_health({"workers": [worker(partitions=[part(source_silent_s=31)])]}, 1, options)
    assert silent.level == views.WARN and silent.reasons[0].startswith("source silent")
    down = views.flow_health({"workers": [worker(), {"worker": "f-w1", "reachable": False, "error": "refused"}]}, 2,
                             options)
    assert down.level == views.CRIT and down.live_workers == 1 and "f-w1 down: refused" in down.reasons[0]
    lost = views.flow_health({"workers": [worker()], "data_loss_records": 3}, 1, options)
    assert lost.level == views.CRIT and lost.reasons == ("3 records deleted at the source before they were mirrored",)
    failed = views.flow_health({"workers": [worker(partitions=[part(state="STOPPED", reason="re-created")])]}, 1,
                               options)
    assert failed.level == views.CRIT and failed.reasons == ("t-0 STOPPED: re-created",)
    paused = views.flow_health({"workers": [worker(paused=True)]}, 1, options)
    assert paused.level == views.WARN and paused.paused
    # A source the console cannot reach: amber at once (issue 41: green "ok" for 30 s and
    # more, the workers' last answers saying lag 0), whatever the lag says.
    cut = views.flow_health({"workers": [worker(partitions=[part()])]}, 1, options, {"source": "east"})
    assert cut.level == views.WARN and cut.reasons == ("source east unreachable",)
    both = views.flow_health({"workers": [worker(partitions=[part(lag_s=61)])]}, 1, options,
                             {"source": "east", "target": "aggregate"})
    assert both.level == views.WARN and both.reasons[:2] == ("source east unreachable", "target aggregate unreachable")


def test_partitions_worst_first_and_cluster_colour() -> None:
    parts = [{"topic": "a", "partition": 0, "leader": 1, "replicas": [1, 2, 3], "isr": [1, 2, 3]},
             {"topic": "a", "partition": 1, "leader": 1, "replicas": [1, 2, 3], "isr": [1, 2]},
             {"topic": "b", "partition": 0, "leader": -1, "replicas": [1, 2, 3], "isr": []},
             {"topic": "b", "partition": 1, "leader": 2, "replicas": [1, 2, 3], "isr": [2]}]
    ordered = views.partitions_worst_first(parts, min_isr=2)
    assert [(p["topic"], p["partition"], p["state"]) for p in ordered] == [
        ("b", 0, "offline"), ("b", 1, "under-min-isr"), ("a", 1, "under-replicated"), ("a", 0, "ok")]
    level, reasons = views.cluster_level({"brokers": [{"node_id": 1}, {"node_id": 2}], "controller_id": 1,
                                          "partition_counts": {"under-replicated": 2}}, 3)
    assert level == views.CRIT and reasons == ["1 of 3 brokers not registered", "2 under-replicated partitions"]
    assert views.cluster_level({"error": "no answer within 2 s"}, 3) == (views.CRIT, ["unreachable: no answer within 2 s"])
    assert views.cluster_level({"brokers": [{"node_id": 1}], "controller_id": 1,
                                "partition_counts": {"under-replicated": 1}}, 1)[0] == views.WARN


def test_the_default_topology_map_places_sources_left_of_the_aggregate() -> None:
    layout = views.map_layout(load_default())
    nodes = {n.id: n for n in layout.nodes}
    assert set(nodes) == {"east", "west", "aggregate", "warehouse"}
    assert nodes["east"].x == nodes["west"].x < nodes["aggregate"].x < nodes["warehouse"].x
    assert nodes["east"].y != nodes["west"].y
    assert {e.id for e in layout.edges} == {m.name for m in load_default().mirrors} | {"warehouse"}
    for dc in layout.datacenters:  # every datacenter box holds its clusters
        for n in layout.nodes:
            if n.kind == "cluster" and load_default().clusters[n.id].datacenter == dc.name:
                assert dc.x <= n.x and n.x + views.MAP_NODE_W <= dc.x + dc.w
                assert dc.y <= n.y and n.y + views.MAP_NODE_H <= dc.y + dc.h
    assert 0 < layout.width <= 2000 and 0 < layout.height <= 1000


def test_records_render_as_json_text_or_hex_and_are_cut() -> None:
    assert views.render_bytes(b'{"a": 1}') == ("json", '{\n  "a": 1\n}')
    assert views.render_bytes(b"plain words") == ("text", "plain words")
    assert views.render_bytes(b"\xff\x00") == ("hex", "00000000  ff 00" + " " * 45 + "|..|")
    # as hexdump -C: offset, 8 + 8 bytes, the ASCII beside (issue 41)
    assert views.render_bytes(b'{"a": 1}', "hex") == ("hex", '00000000  7b 22 61 22 3a 20 31 7d' + " " * 27 + '|{"a": 1}|')
    assert views.render_bytes(bytes(range(60, 78)), "hex")[1].splitlines() == [
        "00000000  3c 3d 3e 3f 40 41 42 43  44 45 46 47 48 49 4a 4b  |<=>?@ABCDEFGHIJK|",
        "00000010  4c 4d" + " " * 45 + "|LM|"]
    assert views.render_bytes(None) == ("null", "null")
    kind, text = views.render_bytes(b"x" * (views.VALUE_SHOWN_BYTES_MAX + 10))
    assert kind == "text" and text.endswith("10 more bytes not shown")


def test_rates_and_lag_history() -> None:
    rates = views.RateTracker()
    rates.observe("f", 10.0, 100)
    assert rates.rate("f") is None
    rates.observe("f", 12.0, 300)
    assert rates.rate("f") == 100.0
    rates.observe("f", 13.0, 5)  # a restarted worker: no negative rate
    assert rates.rate("f") == 100.0
    history = views.LagHistory(samples=3)
    for i in range(5):
        history.observe("f", float(i), [{"topic": "t", "partition": 0, "lag_records": i}])
    assert history.of("f") == {("t", 0): [(2.0, 2), (3.0, 3), (4.0, 4)]}
    assert views.sparkline([(0.0, 0), (1.0, 4)], width=10, height=10) == "0.0,9.0 10.0,1.0"


def test_sessions_expire_are_bounded_and_check_their_form_token() -> None:
    sessions = Sessions()
    s = sessions.create("alice", "user", now_s=1000.0)
    assert sessions.get(s.id, now_s=1000.0 + SESSION_IDLE_S - 1) is s
    assert sessions.get(s.id, now_s=1000.0 + 2 * SESSION_IDLE_S) is None
    assert sessions.get("made-up") is None and sessions.get(None) is None
    t = sessions.create("bob", "user", now_s=0.0)
    # One character changed (the token is random: it may start with any character).
    other = ("y" if t.csrf[0] == "x" else "x") + t.csrf[1:]
    assert t.csrf_ok(t.csrf) and not t.csrf_ok(other) and not t.csrf_ok(t.csrf[:-1]) and not t.csrf_ok(None)
    for i in range(SESSIONS_MAX + 5):
        sessions.create(f"u{i}", "user", now_s=1.0 + i)
    assert len(sessions.by_id) == SESSIONS_MAX
    for _ in range(10):
        sessions.failed("10.0.0.1", now_s=5.0)
    assert sessions.too_many_failures("10.0.0.1", now_s=6.0)
    assert not sessions.too_many_failures("10.0.0.1", now_s=100.0)


@pytest.mark.parametrize("given,ok", [("tok", True), ("tok2", False), ("", False)])
def test_token(given: str, ok: bool) -> None:
    from cluster.common.secrets import Secret

    assert token_matches(given, Secret("tok")) is ok
    assert token_matches(given, None) is False


def test_session_clients_are_reused_bounded_and_closed_when_idle() -> None:
    import trio

    from deploy.console import app

    class FakeAdmin:  # what SessionClients does with a client: enter, hand out, exit
        opened = 0
        closed = 0

        async def __aenter__(self) -> FakeAdmin:
            FakeAdmin.opened += 1
            return self

        async def __aexit__(self, *exc: object) -> None:
            FakeAdmin.closed += 1

    async def main() -> None:
        clients = app.SessionClients()
        async with clients.admin(("s1", "east"), FakeAdmin) as a:  # type: ignore[arg-type]
            pass
        async with clients.admin(("s1", "east"), FakeAdmin) as b:  # type: ignore[arg-type]
            assert b is a  # the same open client: no second login
        for i in range(app.CLIENTS_MAX + 3):
            async with clients.admin((f"s{i + 2}", "east"), FakeAdmin):  # type: ignore[arg-type]
                pass
        assert len(clients.open) == app.CLIENTS_MAX and FakeAdmin.closed == 4  # the least recently used
        await clients.close_session("s5")
        assert ("s5", "east") not in clients.open
        for key in clients.open:
            clients.open[key] = (clients.open[key][0], 0.0)  # long idle
        await clients.close_idle()
        assert clients.open == {} and FakeAdmin.opened == FakeAdmin.closed

    trio.run(main)


def test_a_flow_that_skips_a_column_arcs_over_the_node_between(tmp_path: Any) -> None:
    """Issue 41: west -> aggregate beside west -> east -> aggregate was drawn through east (the
    middle column) and could not be seen; "1 brokers"."""
    import re

    from topology import loads

    topology = loads("""
[clusters.west]
datacenter = "west"
brokers = ["127.0.0.1:19092"]
[clusters.east]
datacenter = "east"
brokers = ["127.0.0.1:29092", "127.0.0.1:29093"]
[clusters.aggregate]
datacenter = "central"
brokers = ["127.0.0.1:39092"]
[[mirrors]]
source = "west"
target = "east"
topics = ".*"
[[mirrors]]
source = "east"
target = "aggregate"
topics = ".*"
[[mirrors]]
name = "west-direct"
source = "west"
target = "aggregate"
topics = "orders"
""", base_dir=tmp_path)
    layout = views.map_layout(topology)
    nodes = {n.id: n for n in layout.nodes}
    assert nodes["west"].x < nodes["east"].x < nodes["aggregate"].x
    assert nodes["west"].sublabel == "west · 1 broker" and nodes["east"].sublabel == "east · 2 brokers"
    skip = next(e for e in layout.edges if e.id == "west-direct")
    x1, y1, mx, my, x2, y2 = (int(v) for v in re.findall(r"-?\d+", skip.path))
    # The curve at the middle node's x, above its top: t where x(t) is the node's middle.
    east = nodes["east"]
    for t in (0.4, 0.5, 0.6):
        x = (1 - t) ** 2 * x1 + 2 * (1 - t) * t * mx + t ** 2 * x2
        y = (1 - t) ** 2 * y1 + 2 * (1 - t) * t * my + t ** 2 * y2
        if east.x <= x <= east.x + views.MAP_NODE_W:
            assert y < east.y, (t, x, y, east)
    assert skip.label_y < east.y  # its label too
    # ... and everything stays in the picture: the arc and its two label lines below the top
    assert all(e.top >= 0 for e in layout.edges), [(e.id, e.top) for e in layout.edges]
    assert skip.label_y - views.MAP_LABEL_ABOVE_PX >= 0 and min(my, y1, y2) > -layout.height
