"""The console's Warehouse page (issue 34) against a running topology: `dcmirror up` with a
source cluster and an aggregate (one broker each), one flow, a [warehouse] on the aggregate
and a [console]; `dcmirror warehouse serve` started by the test, and one `dcmirror load`
through it. The console is driven in-process over ASGI (tests/console/test_console_app.py).

After the load the page lists it from the ledger (ranges, rows = the records loaded,
seconds no longer than the load took) and the rows per table and Kafka partition; the query
box answers an exact count, says when the row limit cut an answer, and shows a malformed
query's error (not a traceback); a source record followed from the record browser to its
warehouse row finds exactly that row. Once the service is gone (kill -9: its socket file
stays), the page says no service runs and a query says so too.
"""

from __future__ import annotations

import html
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from mirror.history import topic_id_text
from tests.console.login import post_login
from tests.deploy.conftest import UpRun
from tests.harness import free_port
from tests.spark.common import run_cli
from tests.spark.test_warehouse_service import ANSWERED, Service

pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.timeout(900)]

RECORDS = 20  # over 2 source partitions: partition 0 holds records 0, 2, ..., 18 at offsets 0..9
TOKEN = "console-warehouse-token"
TABLE = "east_pageviews"  # the warehouse table of the aggregate's topic east.pageviews


def _topology(root: Path) -> Path:
    (root / "console.token").write_text(TOKEN + "\n")
    path = root / "topology.toml"
    path.write_text(f"""
[clusters.east]
datacenter = "dc-east"
brokers = ["127.0.0.1:{free_port()}"]

[clusters.agg]
datacenter = "central"
brokers = ["127.0.0.1:{free_port()}"]

[[topics]]
cluster = "east"
name = "pageviews"
partitions = 2
replication_factor = 1

[[mirrors]]
source = "east"
target = "agg"
topics = "pageviews"
config = {{ "topic.refresh.ms" = "1000" }}

[warehouse]
source = "agg"
path = "{root / 'warehouse'}"
topics = "east[.]pageviews"

[console]
listen = "127.0.0.1:{free_port()}"
auth_token = "${{dir:.:console.token}}"
refresh_ms = 5000
""")
    return path


def _mirrored(bootstrap: str, topic: str, count: int, timeout_s: float) -> None:
    """Wait until `count` committed records can be read from `topic` in the aggregate."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "console-warehouse-test",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "auto.offset.reset": "earliest"})
    try:
        deadline = time.monotonic() + timeout_s
        seen = 0
        while seen < count:
            assert time.monotonic() < deadline, f"{seen} of {count} records mirrored into {topic} in {timeout_s:g} s"
            if not consumer.assignment():
                parts = consumer.list_topics(topic, timeout=5).topics[topic].partitions
                if not parts:
                    time.sleep(0.5)
                    continue
                consumer.assign([TopicPartition(topic, p, 0) for p in parts])
            for message in consumer.consume(100, 1.0):
                if message.error() is None:
                    seen += 1
    finally:
        consumer.close()


def _run_console(config: Path, body: Callable[[httpx.AsyncClient, Any], Awaitable[None]]) -> None:
    from deploy.console.app import build_app
    from deploy.console.server import make_console
    from topology import load

    console = make_console(load(config), refresh_s=5.0)

    async def main() -> None:
        await console.poller.poll_once()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(console)),
                                     base_url="http://console.test") as client:
            r = await post_login(client, {"token": TOKEN, "next": "/"})
            assert r.status_code == 303, r.text
            await body(client, console)
        for c in console.poller.clusters.values():
            await c.close()

    trio.run(main)


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "no CSRF token in the page"
    return found.group(1)


def _table(page: str, table_id: str) -> list[list[str]]:
    """The body rows of <table id=table_id> as cell texts."""
    found = re.search(rf'<table[^>]*id="{table_id}"[^>]*>(.*?)</table>', page, re.S)
    assert found, f"no table {table_id} in the page:\n{page[-3000:]}"
    body = found.group(1).split("<tbody>", 1)[1]
    return [[html.unescape(re.sub(r"<[^>]+>", "", cell)).strip()
             for cell in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row, re.S)]
            for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)]


def _header(page: str, table_id: str) -> list[str]:
    found = re.search(rf'<table[^>]*id="{table_id}"[^>]*>\s*<thead>(.*?)</thead>', page, re.S)
    assert found, f"no table {table_id} in the page"
    return [html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<th[^>]*>(.*?)</th>", found.group(1))]


async def _query(client: httpx.AsyncClient, query: str, max_rows: int = 100) -> str:
    page = await client.get("/warehouse")
    r = await client.post("/warehouse/query", data={"csrf": _csrf(page.text), "query": query,
                                                    "max_rows": str(max_rows)})
    assert r.status_code == 200 and "Traceback" not in r.text, r.text[-3000:]
    return r.text


def test_warehouse_page_loads_partitions_queries_and_a_followed_row(tmp_path: Path) -> None:
    from confluent_kafka import Producer

    started = time.monotonic()
    config = _topology(tmp_path)
    up = UpRun(config)
    service = Service(config)  # its JVM starts beside the clusters
    try:
        up.wait_for_line("dcmirror up: ready", 180)
        from topology import load

        topology = load(config)
        source, agg = (topology.clusters[n].bootstrap() for n in ("east", "agg"))
        producer = Producer({"bootstrap.servers": source})
        for i in range(RECORDS):
            producer.produce("pageviews", key=f"k{i}".encode(), value=f'{{"n": {i}}}'.encode(), partition=i % 2)
        assert producer.flush(30) == 0
        del producer
        _mirrored(agg, "east.pageviews", RECORDS, 120)
        mirrored_s = time.monotonic() - started
        service.wait_ready()
        ready_s = time.monotonic() - started

        load_started = time.monotonic()
        loaded = run_cli(["load", "--config", str(config)])
        load_s = time.monotonic() - load_started
        assert loaded.returncode == 0 and ANSWERED in loaded.stderr, loaded.stdout + loaded.stderr
        assert f"loaded {RECORDS} rows" in loaded.stdout, loaded.stdout

        async def with_service(client: httpx.AsyncClient, console: Any) -> None:
            r = await client.get("/warehouse")
            assert r.status_code == 200 and "No warehouse service runs" not in r.text, r.text[-3000:]
            assert 'class="error"' not in r.text, r.text[-3000:]
            header, loads = _header(r.text, "loads"), _table(r.text, "loads")
            assert len(loads) == 1, loads
            load = dict(zip(header, loads[0], strict=True))
            assert load["Topics"] == "1" and load["Partitions"] == "2", load
            assert load["Rows"] == str(RECORDS) and int(load["Offsets"]) >= RECORDS, load
            assert re.fullmatch(r"east\.pageviews-0 \[0, \d+\), east\.pageviews-1 \[0, \d+\)", load["Ranges"]), load
            assert 0 < float(load["Seconds"]) <= load_s + 1, (load, load_s)
            when = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ"
            assert re.fullmatch(when, load["Planned"]) and re.fullmatch(when, load["Finished"]), load
            print(f"\nthe load on the page: {load}")
            partitions = [row[:3] for row in _table(r.text, "partitions")]
            assert partitions == [[TABLE, "0", str(RECORDS // 2)], [TABLE, "1", str(RECORDS // 2)]], partitions

            text = await _query(client, f"SELECT count(*) AS n FROM {TABLE}")
            assert _header(text, "answer") == ["n"] and _table(text, "answer") == [[str(RECORDS)]], text[-2000:]
            assert "(cut at the limit)" not in text
            text = await _query(client, f"SELECT source_offset FROM {TABLE}", max_rows=5)
            assert len(_table(text, "answer")) == 5 and "5 row(s) (cut at the limit)" in text, text[-2000:]
            text = await _query(client, f"SELEC count(*) FROM {TABLE}")
            error = re.search(r'<p class="error" role="alert">(.*?)</p>', text, re.S)
            assert error and "SELEC" in html.unescape(error.group(1)) and len(error.group(1)) < 1000, text[-2000:]
            text = await _query(client, f"SELECT nope FROM {TABLE}")
            error = re.search(r'<p class="error" role="alert">(.*?)</p>', text, re.S)
            assert error and "nope" in error.group(1), text[-2000:]

            # From the record browser's source record to its warehouse row.
            r = await client.get("/clusters/east/topics/pageviews/records", params={"partition": 0, "offset": 7,
                                                                                  "limit": 1})
            link = re.search(r'class="to-row" href="([^"]+)"', r.text)
            assert r.status_code == 200 and link, r.text[-3000:]
            r = await client.get(html.unescape(link.group(1)))
            assert r.status_code == 200, r.text[-3000:]
            header, rows = _header(r.text, "answer"), _table(r.text, "answer")
            assert len(rows) == 1, (console.poller.snapshot.clusters["east"]["topics"]["pageviews"], r.text[-3000:])
            row = dict(zip(header, rows[0], strict=True))
            assert (row["source_cluster"], row["source_partition"], row["source_offset"]) == ("east", "0", "7"), row
            assert row["value"] == '{"n": 14}' and row["key"] == "k14", row
            topic_id = console.poller.snapshot.clusters["east"]["topics"]["pageviews"]["topic_id"]
            assert row["source_topic_id"] == topic_id_text(uuid.UUID(topic_id)), (row, topic_id)

        _run_console(config, with_service)

        # kill -9: the socket file stays behind, and nobody answers on it.
        service.kill_group()
        assert (tmp_path / "warehouse" / "warehouse.sock").exists()

        async def without_service(client: httpx.AsyncClient, console: Any) -> None:
            r = await client.get("/warehouse")
            assert r.status_code == 200 and "No warehouse service runs" in r.text, r.text[-3000:]
            assert _table(r.text, "loads") == []
            text = await _query(client, f"SELECT count(*) FROM {TABLE}")
            assert 'role="alert">no warehouse service runs' in text, text[-2000:]

        _run_console(config, without_service)
        print(f"\nconsole warehouse test: up and mirrored {mirrored_s:.1f} s, service ready {ready_s:.1f} s, "
              f"load {load_s:.1f} s, all {time.monotonic() - started:.1f} s")
    finally:
        service.kill_group()
        up.stop()
