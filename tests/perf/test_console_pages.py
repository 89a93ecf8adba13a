"""The web console's page times and broker load on the default topology (issue 34: every page
≤ 300 ms p95 from a warm console with 200 topics × 12 partitions and 50 groups; one poll
per refresh interval however many browsers are open).

Run with `make bench` (or `pytest -m perf -q -s tests/perf -k console`). What it does:

1. `dcmirror dev-secrets` and `dcmirror up` on a copy of topology/default.toml with free ports
   (east, west, aggregate: 3 brokers each, mutual TLS between brokers, SASL_SSL/SCRAM for
   dcmirror's clients, the console among them) and a [console] on a free loopback port with
   refresh_ms 2000;
2. TOPICS extra topics × 12 partitions, replication factor 3 (the default's), spread round
   robin over the three clusters (a third each: the machine holds the same 7,200 replicas
   either way, and the console polls the clusters side by side as it would in a real
   deployment), a few records in every partition, GROUPS consumer groups with committed
   offsets (each on 2 topics of its cluster) and LIVE_MEMBERS of them with a live
   confluent-kafka member;
3. logs in as the admin SCRAM user (POST /login, the cookie kept), waits until a poll shows
   every topic (and every group, or GROUPS_WAIT_S: the groups listed are printed), then
   times each page REQUESTS times one after another and again from CLIENTS concurrent
   clients (client-side wall time of the whole HTTP exchange), and what a fresh SASL_SSL
   login costs (the topic, group, records and security pages open one per request);
4. the console's requests to the brokers: the brokers' /metrics request counters by API
   summed over the 9 brokers, per completed poll, with 1 browser and with 8 browsers
   fetching /api/map every 250 ms, less the rate with the console stopped (SIGSTOP: the
   workers', members' and brokers' own traffic).

Knobs: DCMIRROR_BENCH_CONSOLE_TOPICS (200), DCMIRROR_BENCH_CONSOLE_GROUPS (50),
DCMIRROR_BENCH_CONSOLE_REQUESTS (50), DCMIRROR_BENCH_CONSOLE_POLLS (10 per load window).
Nothing here asserts speed: the figures are printed and marked against the 300 ms budget.
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.console.login import post_login_sync
from tests.deploy.conftest import UpRun
from tests.harness import REPO, free_port
from tests.perf.benchlib import emit, env_int, loadavg, percentile, progress

pytestmark = [pytest.mark.perf, pytest.mark.heavy]

TOPICS = env_int("DCMIRROR_BENCH_CONSOLE_TOPICS", 200)
TOPIC_PARTITIONS = 12
GROUPS = env_int("DCMIRROR_BENCH_CONSOLE_GROUPS", 50)
LIVE_MEMBERS = 3
RECORDS_PER_PARTITION = 4
REQUESTS = env_int("DCMIRROR_BENCH_CONSOLE_REQUESTS", 50)
CLIENTS = 4
POLLS = env_int("DCMIRROR_BENCH_CONSOLE_POLLS", 10)
BROWSERS = (1, 8)
BROWSER_EVERY_S = 0.25
REFRESH_MS = 2000
BUDGET_MS = 300.0
CLUSTERS = ("east", "west", "aggregate")
HTTP_TIMEOUT_S = 30.0
GROUPS_WAIT_S = 60.0


@dataclass
class Deployment:
    up: UpRun
    config: Path
    url: str
    admin_password: str
    local: dict[str, str]  # cluster -> its LOCAL (plaintext loopback, User:ANONYMOUS) bootstrap
    metrics: list[str]  # every broker's /metrics URL
    topics: dict[str, list[str]]  # cluster -> the bench topics it holds
    groups: dict[str, list[str]]  # cluster -> the bench groups it holds


def topic_name(i: int) -> str:
    return f"bench-console-{i:03d}"


def _topology(root: Path) -> tuple[Path, int]:
    from deploy.demo import demo_topology_text
    from topology import default_topology_text

    port = free_port()
    text = demo_topology_text(default_topology_text())
    text += f'\n[console]\nlisten = "127.0.0.1:{port}"\nrefresh_ms = {REFRESH_MS}\n'
    config = root / "topology.toml"
    config.write_text(text)
    made = subprocess.run([sys.executable, "-m", "deploy.cli", "dev-secrets", "--config", str(config)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, f"dev-secrets exited {made.returncode}: {made.stdout[-2000:]} {made.stderr[-2000:]}"
    return config, port


def _password(config: Path, user: str) -> str:
    for line in (config.parent / "secrets" / "passwords.properties").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == user:
            return value.strip()
    raise AssertionError(f"no {user} in the dev secrets' passwords file")


def _create_topics(local: dict[str, str]) -> dict[str, list[str]]:
    by_cluster: dict[str, list[str]] = {c: [] for c in CLUSTERS}
    for i in range(TOPICS):
        by_cluster[CLUSTERS[i % len(CLUSTERS)]].append(topic_name(i))
    for cluster, names in by_cluster.items():
        admin = AdminClient({"bootstrap.servers": local[cluster]})
        futures = admin.create_topics([NewTopic(n, TOPIC_PARTITIONS, 3) for n in names], operation_timeout=120,
                                      request_timeout=150)
        for future in futures.values():
            future.result(timeout=180)
        progress(f"{len(names)} topics x {TOPIC_PARTITIONS} partitions created in {cluster}")
    return by_cluster


def _produce(local: dict[str, str], topics: dict[str, list[str]]) -> None:
    for cluster, names in topics.items():
        producer = Producer({"bootstrap.servers": local[cluster], "linger.ms": 50, "acks": 1})
        for name in names:
            for p in range(TOPIC_PARTITIONS):
                for n in range(RECORDS_PER_PARTITION):
                    producer.produce(name, key=f"k{n}".encode(), value=f'{{"topic": "{name}", "n": {n}}}'.encode(),
                                     partition=p, headers=[("bench", b"console")])
            producer.poll(0)
        assert producer.flush(120) == 0, f"records to {cluster} not delivered"


def _commit_groups(local: dict[str, str], topics: dict[str, list[str]]) -> dict[str, list[str]]:
    """GROUPS groups, round robin over the clusters, each committing offset 2 on every
    partition of 2 of its cluster's topics (lag 2 per partition)."""
    groups: dict[str, list[str]] = {c: [] for c in CLUSTERS}
    for i in range(GROUPS):
        cluster = CLUSTERS[i % len(CLUSTERS)]
        group = f"bench-console-group-{i:02d}"
        names = topics[cluster]
        pair = [names[(i // len(CLUSTERS)) % len(names)], names[(i // len(CLUSTERS) + 1) % len(names)]]
        c = Consumer({"bootstrap.servers": local[cluster], "group.id": group, "enable.auto.commit": False})
        try:
            c.commit(offsets=[TopicPartition(t, p, 2) for t in pair for p in range(TOPIC_PARTITIONS)],
                     asynchronous=False)
        finally:
            c.close()
        groups[cluster].append(group)
    progress(f"{GROUPS} groups committed offsets")
    return groups


class LiveMembers:
    """LIVE_MEMBERS consumers subscribed in bench groups, polled by one thread (they stay
    members: the console shows them with their assignment)."""

    def __init__(self, local: dict[str, str], groups: dict[str, list[str]], topics: dict[str, list[str]]) -> None:
        self.consumers = []
        for i in range(LIVE_MEMBERS):
            cluster = CLUSTERS[i % len(CLUSTERS)]
            c = Consumer({"bootstrap.servers": local[cluster], "group.id": groups[cluster][0],
                          "enable.auto.commit": False, "auto.offset.reset": "earliest"})
            c.subscribe([topics[cluster][0]])
            self.consumers.append(c)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            for c in self.consumers:
                c.poll(0.05)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        for c in self.consumers:
            c.close()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    from topology import load

    root = tmp_path_factory.mktemp("console-bench")
    config, port = _topology(root)
    topology = load(config)
    up = UpRun(config)
    members: LiveMembers | None = None
    try:
        started = time.monotonic()
        up.wait_for_line("dcmirror up: ready", 240)
        progress(f"dcmirror up ready in {time.monotonic() - started:.0f} s (3 clusters x 3 brokers, SASL_SSL, console)")
        local = {name: spec.bootstrap("LOCAL") for name, spec in topology.clusters.items()}
        metrics = [f"http://{b.host}:{b.port + 1000}/metrics" for spec in topology.clusters.values() for b in spec.brokers]
        topics = _create_topics(local)
        _produce(local, topics)
        groups = _commit_groups(local, topics)
        members = LiveMembers(local, groups, topics)
        url = f"http://127.0.0.1:{port}"
        took_s = wait_until("the console answering /healthz (it serves once its first poll is in)",
                            lambda: _answers(url + "/healthz"), 120)
        progress(f"console serving ({took_s:.1f} s after the groups committed)")
        yield Deployment(up, config, url, _password(config, "admin"), local, metrics,
                         topics, groups)
    finally:
        if members is not None:
            members.close()
        up.stop(120)


# --------------------------------------------------------------------------- HTTP


def login(url: str, password: str) -> requests.Session:
    s = requests.Session()
    r = post_login_sync(s, {"username": "admin", "password": password, "next": "/"}, url,
                        allow_redirects=False, timeout=HTTP_TIMEOUT_S)
    assert r.status_code == 303 and s.cookies.get("dcmirror_console"), \
        f"login answered {r.status_code}: {r.text[:500]}"
    return s


def get_ms(s: requests.Session, url: str) -> float:
    started = time.perf_counter()
    r = s.get(url, allow_redirects=False, timeout=HTTP_TIMEOUT_S)
    took_ms = (time.perf_counter() - started) * 1000
    assert r.status_code == 200, f"{url}: {r.status_code} {r.text[:500]}"
    return took_ms


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=5).status_code == 200
    except requests.RequestException:
        return False


def map_state(s: requests.Session, url: str) -> dict:
    r = s.get(url + "/api/map", timeout=HTTP_TIMEOUT_S)
    r.raise_for_status()
    return r.json()


def wait_until(what: str, check: Callable[[], bool], timeout_s: float) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"{what}: not within {timeout_s:g} s")
        time.sleep(0.25)
    return time.monotonic() - started


def wait_polls(s: requests.Session, url: str, count: int, timeout_s: float) -> list[float]:
    """Until `count` more polls completed (the map's at_s moved); their poll_ms."""
    last = map_state(s, url)["at_s"]
    seen: list[float] = []
    deadline = time.monotonic() + timeout_s
    while len(seen) < count:
        assert time.monotonic() < deadline, f"{len(seen)} of {count} polls in {timeout_s:g} s"
        time.sleep(0.05)
        state = map_state(s, url)
        if state["at_s"] != last:
            last = state["at_s"]
            seen.append(state["poll_ms"])
    return seen


def shown(dep: Deployment, s: requests.Session) -> dict[str, set[str]]:
    """cluster -> the bench topics and groups its page lists (as of the console's last poll)."""
    out = {}
    for cluster in CLUSTERS:
        page = s.get(f"{dep.url}/clusters/{cluster}", timeout=HTTP_TIMEOUT_S).text
        out[cluster] = {n for n in dep.topics[cluster] + dep.groups[cluster] if f">{n}<" in page}
    return out


def warm(dep: Deployment, s: requests.Session) -> tuple[float, dict[str, list[str]]]:
    """Until a poll shows every bench topic (then every group, or GROUPS_WAIT_S more), then
    one more poll (its end offsets complete). Returns the wait and the groups shown."""
    started = time.monotonic()
    wait_until("every bench topic on the console",
               lambda: all(set(dep.topics[c]) <= found for c, found in shown(dep, s).items()), 180)
    try:
        wait_until("every bench group on the console",
                   lambda: all(set(dep.groups[c]) <= found for c, found in shown(dep, s).items()), GROUPS_WAIT_S)
    except AssertionError:
        pass  # reported below: the figures are still worth having
    wait_polls(s, dep.url, 1, 60)
    found = shown(dep, s)
    return time.monotonic() - started, {c: [g for g in dep.groups[c] if g in found[c]] for c in CLUSTERS}


# --------------------------------------------------------------------------- broker load


_COUNT = re.compile(r'^dcmirror_broker_request_latency_seconds_count\{([^}]*)\}\s+(\S+)$', re.MULTILINE)
_API = re.compile(r'api="([^"]+)"')


def request_counts(dep: Deployment) -> dict[str, float]:
    total: dict[str, float] = {}
    for url in dep.metrics:
        text = requests.get(url, timeout=HTTP_TIMEOUT_S).text
        for labels, value in _COUNT.findall(text):
            m = _API.search(labels)
            if m:
                total[m.group(1)] = total.get(m.group(1), 0.0) + float(value)
    return total


def _minus(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}


@dataclass
class Window:
    label: str
    seconds: float
    polls: int
    requests: dict[str, float]  # by API, in the window
    poll_ms: list[float]


def console_pid(dep: Deployment) -> int:
    pids = dep.up.child_pids()
    assert "console" in pids, f"no console child in {sorted(pids)}"
    return pids["console"]


def baseline_window(dep: Deployment, seconds: float) -> Window:
    """Every request the brokers answer with the console stopped (workers, members,
    replication's own): what the console windows have on top of it is the console's."""
    pid = console_pid(dep)
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(1.0)  # let requests in flight when it stopped be counted before the window
        before, started = request_counts(dep), time.monotonic()
        time.sleep(seconds)
        after, took_s = request_counts(dep), time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)
    return Window("console stopped", took_s, 0, _minus(after, before), [])


def browsers_window(dep: Deployment, browsers: int) -> Window:
    """`browsers` logged-in clients fetching /api/map every BROWSER_EVERY_S while POLLS polls
    complete; the brokers' request counters from the end of one poll to the end of the last."""
    sessions = [login(dep.url, dep.admin_password) for _ in range(browsers)]
    stop = threading.Event()
    fetched = [0] * browsers

    def browse(i: int) -> None:
        while not stop.is_set():
            map_state(sessions[i], dep.url)
            fetched[i] += 1
            stop.wait(BROWSER_EVERY_S)

    threads = [threading.Thread(target=browse, args=(i,), daemon=True) for i in range(browsers)]
    for t in threads:
        t.start()
    watcher = login(dep.url, dep.admin_password)
    try:
        wait_polls(watcher, dep.url, 1, 60)
        before, started = request_counts(dep), time.monotonic()
        poll_ms = wait_polls(watcher, dep.url, POLLS, POLLS * 30)
        after, took_s = request_counts(dep), time.monotonic() - started
    finally:
        stop.set()
        for t in threads:
            t.join(HTTP_TIMEOUT_S)
    progress(f"{browsers} browser(s): {sum(fetched)} /api/map answers during {len(poll_ms)} polls")
    return Window(f"{browsers} browser(s)", took_s, len(poll_ms), _minus(after, before), poll_ms)


def login_times(dep: Deployment, per_cluster: int) -> dict[str, list[float]]:
    """What a page acting as the user pays before its first request: a fresh SASL_SSL
    connection with a SCRAM login (and one DescribeCluster), per cluster, in ms."""
    import trio

    from cluster.client.admin import Admin
    from cluster.common.secrets import Secret
    from deploy.console.records import client_settings
    from topology import load

    topology = load(dep.config)
    times: dict[str, list[float]] = {}

    async def run() -> None:
        for name, spec in topology.clusters.items():
            times[name] = []
            for _ in range(per_cluster):
                config = client_settings(spec, "admin", Secret(dep.admin_password))
                started = time.perf_counter()
                async with Admin(config.pop("bootstrap.servers"), client_id="bench-console", config=config) as admin:
                    await admin.describe_cluster()
                times[name].append((time.perf_counter() - started) * 1000)

    trio.run(run)
    return {f"fresh SASL_SSL login + DescribeCluster: {name}": v for name, v in times.items()}


# --------------------------------------------------------------------------- the benchmark


def pages_of(dep: Deployment, groups: dict[str, list[str]]) -> list[str]:
    east, west, agg = (dep.topics[c] for c in CLUSTERS)
    pages = ["/", "/api/map"]
    pages += [f"/clusters/{c}" for c in CLUSTERS]
    pages += [f"/clusters/east/topics/{east[0]}", f"/clusters/west/topics/{west[-1]}",
              f"/clusters/aggregate/topics/{agg[len(agg) // 2]}", "/clusters/east/topics/pageviews"]
    # A group with a live member (each cluster's first) and one with committed offsets only.
    pages += [f"/clusters/{c}/groups/{g}" for c in CLUSTERS[:2] for g in groups[c][:1]]
    pages += [f"/clusters/aggregate/groups/{g}" for g in groups["aggregate"][-1:]]
    pages += [f"/clusters/east/topics/{east[0]}/records?partition=0",
              f"/clusters/aggregate/topics/{agg[-1]}/records?partition=0"]
    pages += ["/flows", "/security", "/warehouse"]
    return pages


def time_pages(dep: Deployment, pages: list[str], clients: int, per_client: int) -> dict[str, list[float]]:
    sessions = [login(dep.url, dep.admin_password) for _ in range(clients)]
    times: dict[str, list[float]] = {p: [] for p in pages}
    lock = threading.Lock()

    def client(i: int) -> None:
        # Every client walks the pages in its own rotation, so the concurrent ones differ.
        for _ in range(per_client):
            for page in pages[i % len(pages):] + pages[:i % len(pages)]:
                took = get_ms(sessions[i], dep.url + page)
                with lock:
                    times[page].append(took)

    if clients == 1:
        for page in pages:  # one page REQUESTS times in a row: its own figure, nothing beside it
            times[page] = [get_ms(sessions[0], dep.url + page) for _ in range(per_client)]
    else:
        with ThreadPoolExecutor(clients) as pool:
            for f in [pool.submit(client, i) for i in range(clients)]:
                f.result()
    return times


def table(title: str, times: dict[str, list[float]]) -> tuple[str, list[str]]:
    over = []
    lines = [title, f"{'page':<62} {'n':>4} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}  ≤ {BUDGET_MS:.0f} ms p95"]
    for page, values in times.items():
        v = sorted(values)
        p95 = percentile(v, 95)
        ok = p95 <= BUDGET_MS
        if not ok:
            over.append(page)
        lines.append(f"{page[:62]:<62} {len(v):>4} {percentile(v, 50):>8.1f} {p95:>8.1f} {v[-1]:>8.1f}  "
                     f"{'yes' if ok else 'NO'}")
    return "\n".join(lines), over


def load_table(windows: list[Window]) -> str:
    base, measured = windows[0], windows[1:]
    apis = sorted({k for w in windows for k, v in w.requests.items() if v})
    lines = ["Requests the console sends the 9 brokers per poll (the brokers' /metrics counters by API; the "
             f"rate with the console stopped ({base.seconds:.0f} s: mirror workers, live members, replication) "
             "subtracted; DescribeCluster, DescribeLogDirs and ListOffsets come from the console alone)",
             f"{'api':<28} {'stopped /s':>11}" + "".join(f" {w.label + ' /poll':>20}" for w in measured)]
    totals = [0.0] * len(measured)
    for api in apis:
        rate = base.requests.get(api, 0.0) / base.seconds
        row = f"{api:<28} {rate:>11.1f}"
        for i, w in enumerate(measured):
            per_poll = (w.requests.get(api, 0.0) - rate * w.seconds) / w.polls
            totals[i] += per_poll
            row += f" {per_poll:>20.1f}"
        lines.append(row)
    lines.append(f"{'total':<28} {'':>11}" + "".join(f" {t:>20.1f}" for t in totals))
    for w in measured:
        lines.append(f"{w.label}: {w.polls} polls in {w.seconds:.1f} s ({w.seconds / w.polls:.2f} s a poll at "
                     f"refresh {REFRESH_MS} ms); poll_ms median {statistics.median(w.poll_ms):.0f}, "
                     f"max {max(w.poll_ms):.0f}")
    return "\n".join(lines)


def test_console_pages(deployment: Deployment) -> None:
    dep = deployment
    session = login(dep.url, dep.admin_password)
    warm_s, groups = warm(dep, session)
    state = map_state(session, dep.url)
    groups_shown = sum(len(g) for g in groups.values())
    progress(f"console warm in {warm_s:.1f} s; last poll took {state['poll_ms']:.0f} ms; "
             + "; ".join(f"{c}: {v['text']}, {len(groups[c])}/{len(dep.groups[c])} bench groups shown"
                         for c, v in state["clusters"].items()))
    records_page = session.get(f"{dep.url}/clusters/east/topics/{dep.topics['east'][0]}/records?partition=0").text
    assert "<h2>Offset 0 " in records_page, f"the record browser shows no record of partition 0: {records_page[:2000]}"

    pages = pages_of(dep, groups)
    started = time.monotonic()
    alone = time_pages(dep, pages, 1, REQUESTS)
    alone_s = time.monotonic() - started
    started = time.monotonic()
    together = time_pages(dep, pages, CLIENTS, max(1, REQUESTS // CLIENTS))
    together_s = time.monotonic() - started

    logins = login_times(dep, 20)

    windows = [browsers_window(dep, browsers) for browsers in BROWSERS]
    # As long as a measured window: the workers' checkpoints and the members' fetches are bursty.
    windows.insert(0, baseline_window(dep, max(w.seconds for w in windows)))

    one, over_one = table(f"Console pages, one client, {REQUESTS} requests each in a row ({alone_s:.0f} s)", alone)
    many, over_many = table(f"Console pages, {CLIENTS} concurrent clients, {REQUESTS // CLIENTS} requests each per "
                            f"client ({together_s:.0f} s)", together)
    emit("\n".join([
        f"Web console on the default topology (3 clusters x 3 brokers, SASL_SSL/SCRAM) with {TOPICS} topics x "
        f"{TOPIC_PARTITIONS} partitions (RF 3, a third in each cluster), {GROUPS} groups ({LIVE_MEMBERS} with a "
        f"live member), refresh {REFRESH_MS} ms, {os.cpu_count()} CPUs, load average {loadavg()}",
        f"groups the console lists: {groups_shown} of {GROUPS}"
        + ("" if groups_shown == GROUPS else " (the others are missing from the console's cluster pages)"),
        "", one, "", many, "",
        table("What each topic, group, records and security page pays per cluster (no connection is kept "
              "between requests)", logins)[0], "",
        load_table(windows), "",
        "over budget (p95 > 300 ms): one client: " + (", ".join(over_one) or "none")
        + "; concurrent: " + (", ".join(over_many) or "none"),
    ]))
    for w in windows[1:]:
        assert w.polls == POLLS
