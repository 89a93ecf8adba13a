"""Disaster recovery from the web console (issue 34, Flows): a mirror-topics flow east -> dr
between two single-broker clusters and its worker process; the console in-process (its
background action runner in the same trio run, httpx over ASGI).

The flow is paused from the console, east takes 100 records the worker does not copy, and
a promotion is started from the console: it makes east read-only and waits for the copy,
so it is seen running (its progress says what it waits for) and a second action on the
flow is refused. Resumed from the console, the worker copies the rest and the promotion
ends ok: dr's topic is the primary (it takes writes, east's refuses them, as the clusters'
configs say), nothing lost. Unconfirmed and unknown actions are refused."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import trio

from tests.console.test_console_app import csrf_of
from tests.mirror.conftest import mirror_lab
from tests.mirror.lab import Flow, MirrorLab, end_offsets, new_topic, topic_config, wait_for
from tests.mirror.test_failover import produce, refused

pytestmark = [pytest.mark.timeout(300), pytest.mark.heavy]

__all__ = ["mirror_lab"]

FLOW = "east-to-dr"
TOPIC = "orders"  # tests/mirror/test_failover.py's produce() and refused() write it


async def until(what: str, timeout_s: float, check: Callable[[], Any]) -> Any:
    """`await check()` until truthy, at most `timeout_s`."""
    deadline = trio.current_time() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        assert trio.current_time() < deadline, f"not within {timeout_s:.0f} s: {what}; last seen: {value!r}"
        await trio.sleep(0.25)


def test_promote_from_the_console(mirror_lab: Callable[..., MirrorLab]) -> None:
    from deploy.console.app import build_app
    from deploy.console.server import make_console
    from mirror.failover import flow_directions
    from topology import load

    lab = mirror_lab({"east": 1, "dr": 1})
    east, dr = lab.bootstrap("east"), lab.bootstrap("dr")
    new_topic(east, TOPIC, 2)
    produce(east, "a", 200)
    lab.write_topology([Flow("east", "dr", TOPIC, rename="{topic}", mirror_topics=True,
                             config={"topic.refresh.ms": "1000", "flow.control.poll.ms": "500"})],
                       replication_factor=1)
    lab.start_worker(FLOW, 0)
    first = end_offsets(east, TOPIC)
    wait_for(lambda: end_offsets(dr, TOPIC) == first, 120, f"dr {TOPIC} at east's ends {first}", interval_s=0.3,
             on_timeout=lab.mirror_log_tail)
    topology = load(lab.topology_path)
    console = make_console(topology, refresh_s=0.5)

    async def act(client: httpx.AsyncClient, csrf: str, action: str, flow: str = FLOW, confirm: bool = True
                  ) -> httpx.Response:
        return await client.post(f"/flows/{flow}/{action}",
                                 data={"csrf": csrf, **({"confirm": "yes", "confirm_name": flow} if confirm else {})})

    async def action_state(client: httpx.AsyncClient) -> dict[str, Any]:
        r = await client.get(f"/api/flows/{FLOW}/action")
        assert r.status_code == 200, r.text
        doc: dict[str, Any] = r.json()
        return doc

    async def flow_report(key: str) -> Any:
        await console.poller.poll_once(with_warehouse=False)
        return (console.poller.snapshot.flows.get(FLOW) or {}).get(key)

    async def body(client: httpx.AsyncClient) -> None:
        page = await client.get("/flows")
        assert page.status_code == 200
        for action in ("promote", "failover", "failback"):
            assert f'id="{action}-{FLOW}"' in page.text and f'for="confirm-{action}-{FLOW}"' in page.text
        csrf = csrf_of(page.text)
        assert (await action_state(client)) == {"flow": FLOW, "action": None}

        # Refused: no confirmation, no form token, an unknown action or flow.
        r = await act(client, csrf, "promote", confirm=False)
        assert r.status_code == 400 and "tick the box" in r.text
        # A failover, destructive, only with the flow's name typed (issue 41), not a tick.
        assert 'name="confirm_name"' in page.text
        r = await client.post(f"/flows/{FLOW}/failover", data={"csrf": csrf, "confirm": "yes"})
        assert r.status_code == 400 and "type the flow" in r.text and f"name ({FLOW}) to confirm" in r.text
        r = await client.post(f"/flows/{FLOW}/failover", data={"csrf": csrf, "confirm_name": FLOW + "x"})
        assert r.status_code == 400
        assert (await client.post(f"/flows/{FLOW}/promote", data={"confirm": "yes"})).status_code == 403
        assert (await act(client, csrf, "explode")).status_code == 400
        assert (await act(client, csrf, "promote", flow="nowhere")).status_code == 400
        assert (await action_state(client))["action"] is None

        # Paused: what east takes next stays there until the flow is resumed.
        assert (await act(client, csrf, "pause")).status_code == 303
        await until("the worker reports the flow paused", 30, lambda: flow_report("paused"))
        await trio.to_thread.run_sync(produce, east, "b", 100)
        ends = await trio.to_thread.run_sync(end_offsets, east, TOPIC)
        assert sum(ends.values()) == 300

        r = await act(client, csrf, "promote")
        assert r.status_code == 303 and "promote+started" in r.headers["location"], r.headers
        with trio.fail_after(60):
            async def waiting() -> Any:
                doc = await action_state(client)
                return doc if any("to copy" in line for line in doc["lines"]) else None

            running = await until("the promotion waits for the copy", 60, waiting)
        assert running["running"] and running["action"] == "promote" and running["principal"] == "local"
        assert any("east:orders takes no more writes" in line for line in running["lines"]), running
        # One action per flow at a time.
        for action in ("promote", "failback"):
            busy = await act(client, csrf, action)
            assert busy.status_code == 409 and "still runs" in busy.text, busy.text[-500:]
        page = await client.get("/flows")
        assert 'data-running="1"' in page.text and "Running" in page.text
        assert re.search(rf'<button type="submit" class="failover" id="failover-{FLOW}" disabled>', page.text)

        assert (await act(client, csrf, "resume")).status_code == 303

        async def ended() -> Any:
            doc = await action_state(client)
            return None if doc["running"] else doc

        done = await until("the promotion ends", 120, ended)
        assert done["outcome"] == "ok", done
        assert done["report"][0] == f"promote of flow {FLOW}: dr is the primary", done
        assert {f"  {TOPIC}-{p}: copy ends at offset {end}" for p, end in ends.items()} <= set(done["report"])
        page = await client.get("/flows")
        assert "Done: ok" in page.text and f"{TOPIC}-0: copy ends at offset {ends[0]}" in page.text

        rows = await flow_directions(topology, 5.0)
        assert [(r["direction"], r["primary"]) for r in rows] == [("reverse", "dr")], rows

    async def main() -> None:
        await console.poller.poll_once(with_warehouse=False)
        async with trio.open_nursery() as nursery:
            await nursery.start(console.actions.run)
            transport = httpx.ASGITransport(app=build_app(console))
            async with httpx.AsyncClient(transport=transport, base_url="http://console.test") as client:
                await body(client)
            nursery.cancel_scope.cancel()
        for c in console.poller.clusters.values():
            await c.close()

    trio.run(main)

    # As the clusters say: dr's copy is the primary, east's topic its copy; nothing lost.
    assert "mirror.source" not in topic_config(dr, TOPIC)
    assert topic_config(east, TOPIC)["mirror.source"].value == "dr:orders"
    assert end_offsets(dr, TOPIC) == end_offsets(east, TOPIC)
    assert sum(end_offsets(dr, TOPIC).values()) == 300
    assert refused(east), "east's copy took a producer's write after the promotion"
    produce(dr, "c", 10)
