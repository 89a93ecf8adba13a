"""The console in a real browser (headless Chromium) against a running topology started by
`dcmirror up`: three single-broker clusters in three datacenters with SCRAM on their client
listener and the StandardAuthorizer, two flows into the aggregate and one from west to east
(so west -> agg skips a column of the map) with their workers' admin HTTP, and the console
`dcmirror up` runs from [console].

What a user sees is checked, and each page is kept as a screenshot (tests/artifacts/console/,
or $DCMIRROR_TEST_ARTIFACTS) and checked by axe-core (no serious or critical violation):
- the map shows every flow with rate and lag, green, no arrow through a cluster it does not
  join and no label over a cluster or another label (a flow skipping a column arcs over it);
- a worker stopped (SIGSTOP: it answers nothing) turns its arrow red, and green again;
- a datacenter whose broker stops answering is drawn cut off, and whole again;
- the record browser finds a record by offset and by time and follows it to its copy in
  the aggregate (provenance: the same source partition and offset);
- the admin pauses and resumes a flow (the workers report it); a read-only user's pause is
  refused by the brokers (no WRITE on dcmirror.flow-control) and the flow keeps running.
Every wait is bounded by what the page shows; its timeout is a ceiling, and the delays seen
are printed.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from tests.console.browser import axe_violations, format_violations, screenshot, text_of, wait_for
from tests.deploy.conftest import UpRun
from tests.harness import free_port

pytestmark = [pytest.mark.heavy]

PASSWORDS = {"admin": "admin-pw-console", "mirror": "mirror-pw-console", "viewer": "viewer-pw-console"}
BASE_MS = 1_780_000_000_000  # the produced records' timestamps: BASE_MS + offset * 1000
RECORDS = 30


@dataclass
class Deployment:
    up: UpRun
    url: str
    brokers: dict[str, str]  # cluster -> its PLAINTEXT broker address (User:ANONYMOUS, super user)
    config: Path


def _topology(root: Path) -> tuple[Path, dict[str, str], int]:
    (root / "passwords.properties").write_text("".join(f"{u}={p}\n" for u, p in PASSWORDS.items()))
    clusters = {"east": "east", "west": "west", "agg": "central"}
    brokers: dict[str, str] = {}
    lines: list[str] = []
    for name, dc in clusters.items():
        broker, sasl = free_port(), free_port()
        brokers[name] = f"127.0.0.1:{broker}"
        lines += [f"[clusters.{name}]", f'datacenter = "{dc}"', f'brokers = ["127.0.0.1:{broker}"]',
                  'client_listener = "EXTERNAL"', "",
                  f"[clusters.{name}.listeners]", f'EXTERNAL = ["127.0.0.1:{sasl}"]', "",
                  f"[clusters.{name}.users]"]
        lines += [f'{u} = "${{file:passwords.properties:{u}}}"' for u in PASSWORDS]
        lines += ["", f"[clusters.{name}.config]",
                  '"listener.security.protocol.map" = "BROKER:PLAINTEXT,EXTERNAL:SASL_PLAINTEXT"',
                  '"inter.broker.listener.name" = "BROKER"',
                  '"sasl.enabled.mechanisms" = "SCRAM-SHA-512,SCRAM-SHA-256"',
                  '"authorizer.class.name" = "StandardAuthorizer"',
                  '"super.users" = "User:ANONYMOUS;User:admin;User:mirror"',
                  '"broker.session.timeout.ms" = "2000"', "",
                  f"[clusters.{name}.client]", '"security.protocol" = "SASL_PLAINTEXT"',
                  '"sasl.mechanism" = "SCRAM-SHA-512"', '"sasl.username" = "admin"',
                  '"sasl.password" = "${file:passwords.properties:admin}"', ""]
    for source in ("east", "west"):
        lines += ["[[topics]]", f'cluster = "{source}"', 'name = "pageviews"', "partitions = 2",
                  "replication_factor = 1", ""]
        lines += ["[[mirrors]]", f'source = "{source}"', 'target = "agg"', 'topics = "pageviews"',
                  f'workers_http = ["127.0.0.1:{free_port()}"]',
                  'config = { "topic.refresh.ms" = "1000", "flow.control.poll.ms" = "500" }', ""]
    # west -> east as well: west -> agg then skips east's column (drawn as an arc over it).
    lines += ["[[mirrors]]", 'source = "west"', 'target = "east"', 'topics = "pageviews"',
              f'workers_http = ["127.0.0.1:{free_port()}"]',
              'config = { "topic.refresh.ms" = "1000", "flow.control.poll.ms" = "500" }', ""]
    console_port = free_port()
    (root / "console.token").write_text("console-browser-token\n")
    lines += ["[console]", f'listen = "127.0.0.1:{console_port}"', 'auth_token = "${dir:.:console.token}"',
              "refresh_ms = 1000", ""]
    path = root / "topology.toml"
    path.write_text("\n".join(lines))
    return path, brokers, console_port


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    from confluent_kafka import Producer

    from tests.security.secured import create_acls

    root = tmp_path_factory.mktemp("console-browser")
    config, brokers, port = _topology(root)
    up = UpRun(config)
    try:
        up.wait_for_line("dcmirror up: ready", 180)
        # viewer may read and describe everything, write nothing.
        for name in ("east", "west", "agg"):
            create_acls({"bootstrap.servers": brokers[name]},
                        [("TOPIC", "*", "LITERAL", "User:viewer", "READ", "ALLOW"),
                         ("TOPIC", "*", "LITERAL", "User:viewer", "DESCRIBE", "ALLOW"),
                         ("GROUP", "*", "LITERAL", "User:viewer", "DESCRIBE", "ALLOW")])
        for name in ("east", "west"):
            producer = Producer({"bootstrap.servers": brokers[name]})
            for i in range(RECORDS):
                producer.produce("pageviews", key=f"user-{i % 7}".encode(), partition=0,
                                 value=f'{{"dc": "{name}", "n": {i}, "url": "/p/{i % 5}"}}'.encode(),
                                 timestamp=BASE_MS + i * 1000, headers=[("origin", name.encode())])
            assert producer.flush(30) == 0
        url = f"http://127.0.0.1:{port}"
        _wait_answering(url, up)
        yield Deployment(up, url, brokers, config)
    finally:
        up.stop()


def _wait_answering(url: str, up: UpRun, timeout_s: float = 90.0) -> None:
    """Until the console answers: `up` starts it last and says ready before its first poll is
    in (only then does it listen)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"the console at {url} never answered:\n{up.output()[-3000:]}")


def check_page(driver: WebDriver, name: str) -> None:
    screenshot(driver, name, full_page=True)
    found = axe_violations(driver)
    assert not found, f"{name}: accessibility violations:\n{format_violations(found)}"


def login(driver: WebDriver, url: str, user: str, password: str) -> None:
    driver.delete_all_cookies()
    driver.get(url + "/login")
    driver.find_element(By.ID, "username").send_keys(user)
    driver.find_element(By.ID, "password").send_keys(password)
    driver.find_element(By.CSS_SELECTOR, "form.card button[type=submit]").click()
    wait_for(driver, lambda d: d.find_elements(By.ID, "map"), f"the map after {user} logged in", 30)


def flow_level(driver: WebDriver, flow: str) -> str | None:
    for el in driver.find_elements(By.CSS_SELECTOR, f'g.flow[data-flow="{flow}"]'):
        classes = (el.get_attribute("class") or "").split()
        return next((c.removeprefix("level-") for c in classes if c.startswith("level-")), None)
    return None


FLOWS = ("east-to-agg", "west-to-agg", "west-to-east")

# Points along each flow's arrow (not within 2 px of its own ends' boxes) that fall in another
# cluster's box or a datacenter's label, flow labels that overlap those or each other, and
# anything of a flow outside the picture: in the SVG's own coordinates, as Chromium laid
# them out.
_OVERLAPS_JS = """
const inside = (p, r, pad) => p.x > r.x - pad && p.x < r.x + r.width + pad && p.y > r.y - pad && p.y < r.y + r.height + pad;
const meets = (a, b) => a.x < b.x + b.width && b.x < a.x + a.width && a.y < b.y + b.height && b.y < a.y + a.height;
const nodes = {};
document.querySelectorAll('#map g.node').forEach(g => { nodes[g.dataset.node] = g.querySelector('rect').getBBox(); });
const found = [];
const labels = [];
const view = document.querySelector('#map svg').viewBox.baseVal;
const obstacles = Object.entries(nodes);
document.querySelectorAll('#map g.dc text.dc-label').forEach(t => obstacles.push(['the label of datacenter ' + t.parentNode.dataset.dc, t.getBBox()]));
document.querySelectorAll('#map g.flow').forEach(g => {
  const flow = g.dataset.flow, path = g.querySelector('path');
  const ends = path.getAttribute('d').match(/-?[0-9.]+/g).map(Number);
  const a = {x: ends[0], y: ends[1]}, b = {x: ends[ends.length - 2], y: ends[ends.length - 1]};
  const total = path.getTotalLength();
  for (let i = 0; i <= 200; i++) {
    const p = path.getPointAtLength(total * i / 200);
    if (!inside(p, view, 0)) { found.push(flow + ' leaves the picture'); }
    for (const [name, r] of obstacles) {
      if (inside(a, r, 2) || inside(b, r, 2)) continue;
      if (inside(p, r, 0)) { found.push(flow + ' runs through ' + name); break; }
    }
  }
  g.querySelectorAll('text').forEach(t => labels.push([flow, t.getBBox()]));
});
for (const [flow, box] of labels) {
  if (box.y < view.y || box.y + box.height > view.y + view.height || box.x < view.x || box.x + box.width > view.x + view.width)
    found.push(flow + "'s label leaves the picture");
  for (const [name, r] of obstacles) if (meets(box, r)) found.push(flow + "'s label covers " + name);
}
for (let i = 0; i < labels.length; i++) for (let j = i + 1; j < labels.length; j++)
  if (labels[i][0] !== labels[j][0] && meets(labels[i][1], labels[j][1])) found.push(labels[i][0] + "'s label covers " + labels[j][0] + "'s");
return [...new Set(found)];
"""


def map_overlaps(driver: WebDriver) -> list[str]:
    return list(driver.execute_script(_OVERLAPS_JS))


def child_pid(dep: Deployment, name: str) -> int:
    pids = dep.up.child_pids()
    assert name in pids, f"no child {name!r} in {sorted(pids)}"
    return pids[name]


def test_console_in_a_browser(deployment: Deployment, browser: WebDriver) -> None:
    dep, d = deployment, browser
    d.get(dep.url + "/")
    assert "/login" in d.current_url
    check_page(d, "01-login")
    login(d, dep.url, "admin", PASSWORDS["admin"])

    # The map: every flow with its rate and lag, green once everything is mirrored; nothing
    # drawn over anything else (west -> agg skips east's column).
    for flow in FLOWS:
        wait_for(d, lambda drv, f=flow: flow_level(drv, f) == "ok" and "lag 0 rec" in (
            text_of(drv, f'[data-flow-text="{f}"]') or ""), f"flow {flow} green with lag 0", 60)
    assert "rec/s" in (text_of(d, '[data-flow-text="east-to-agg"]') or "")
    check_page(d, "02-map")
    assert map_overlaps(d) == [], map_overlaps(d)

    # A stopped worker: red on the map without a reload, then green again.
    worker = child_pid(dep, "mirror east-to-agg-w0")
    os.kill(worker, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        wait_for(d, lambda drv: flow_level(drv, "east-to-agg") == "crit", "east-to-agg red after its worker stopped", 30)
        red_after_s = time.monotonic() - stopped
        assert flow_level(d, "west-to-agg") == "ok"
        screenshot(d, "03-map-worker-stopped", full_page=True)
    finally:
        os.kill(worker, signal.SIGCONT)
    wait_for(d, lambda drv: flow_level(drv, "east-to-agg") == "ok", "east-to-agg green again", 60)
    print(f"a stopped worker's arrow turned red {red_after_s:.1f} s after SIGSTOP (refresh 1 s, worker timeout 2 s)")

    # A datacenter nobody reaches: west's broker stops answering.
    west = child_pid(dep, "broker west-1")
    os.kill(west, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        wait_for(d, lambda drv: "CUT OFF" in (text_of(drv, '[data-dc-cut="west"]') or ""), "datacenter west cut off", 30)
        cut_after_s = time.monotonic() - stopped
        assert "CUT OFF" not in (text_of(d, '[data-dc-cut="east"]') or "")
        screenshot(d, "04-map-datacenter-cut", full_page=True)
    finally:
        os.kill(west, signal.SIGCONT)
    wait_for(d, lambda drv: "CUT OFF" not in (text_of(drv, '[data-dc-cut="west"]') or ""), "west whole again", 60)
    print(f"datacenter west drawn cut off {cut_after_s:.1f} s after its broker stopped")

    # Cluster, topic and group pages.
    d.get(dep.url + "/clusters/east")
    wait_for(d, lambda drv: "pageviews" in drv.page_source, "east's topics", 10)
    check_page(d, "05-cluster-east")
    d.get(dep.url + "/clusters/east/topics/pageviews")
    check_page(d, "06-topic")
    groups = d.find_elements(By.CSS_SELECTOR, 'a[href^="/clusters/agg/groups/"]')
    d.get(dep.url + "/clusters/east")
    group_links = [a.get_attribute("href") for a in d.find_elements(By.CSS_SELECTOR, 'a[href*="/groups/"]')]
    assert group_links, "the mirror's group on east is listed"
    d.get(str(group_links[0]))
    check_page(d, "07-group")
    del groups

    # Records: by offset, by time, then to the copy in the aggregate.
    d.get(dep.url + "/clusters/east/topics/pageviews/records?partition=0&offset=7&limit=3")
    offsets = [int(e.get_attribute("data-offset") or -1) for e in d.find_elements(By.CSS_SELECTOR, "article.record")]
    assert offsets == [7, 8, 9]
    assert '"n": 7' in (text_of(d, "#record-7 pre.value") or "")
    check_page(d, "08-records")
    d.get(dep.url + f"/clusters/east/topics/pageviews/records?partition=0&time={BASE_MS + 12_000}&limit=2")
    assert [int(e.get_attribute("data-offset") or -1) for e in d.find_elements(By.CSS_SELECTOR, "article.record")] == [12, 13]
    d.get(dep.url + "/clusters/east/topics/pageviews/records?partition=0&offset=7&limit=1")
    d.find_element(By.CSS_SELECTOR, "#record-7 a.to-copy").click()
    wait_for(d, lambda drv: "/clusters/agg/topics/east.pageviews/records" in drv.current_url, "the copy's page", 30)
    copy = d.find_element(By.CSS_SELECTOR, "article.record")
    copy_text = copy.text
    assert "From east partition 0 offset 7" in copy_text and '"n": 7' in copy_text, copy_text
    check_page(d, "09-record-copy")

    # Flows: pause and resume as the admin; the workers say so.
    d.get(dep.url + "/flows")
    check_page(d, "10-flows")
    _act(d, "pause", "east-to-agg")
    assert "pause requested" in (text_of(d, "p.notice") or ""), d.page_source

    def paused_shown(drv: WebDriver) -> bool:
        drv.get(dep.url + "/flows")
        return "paused" in (text_of(drv, "#flow-east-to-agg") or "")

    wait_for(d, paused_shown, "east-to-agg shown paused by its worker", 30)
    screenshot(d, "11-flows-paused", full_page=True)
    _act(d, "resume", "east-to-agg")
    assert "resume requested" in (text_of(d, "p.notice") or ""), d.page_source
    wait_for(d, lambda drv: not paused_shown(drv), "east-to-agg running again", 30)

    # A read-only user: the brokers refuse the pause; the flow keeps running.
    login(d, dep.url, "viewer", PASSWORDS["viewer"])
    d.get(dep.url + "/flows")
    notice = _act(d, "pause", "west-to-agg")
    assert "refused" in notice and "WRITE" in notice.upper(), notice
    screenshot(d, "12-flows-refused", full_page=True)
    d.get(dep.url + "/flows")
    assert "paused" not in (text_of(d, "#flow-west-to-agg") or "")
    d.get(dep.url + "/security")
    check_page(d, "13-security")


def _act(d: WebDriver, action: str, flow: str) -> str:
    """Confirm and submit a flow action, then wait for the server's answer page (its notice):
    a click only starts the form's navigation, and the next d.get() would cancel a POST not
    yet sent (the resume that never reached the console, on a loaded CI machine)."""
    d.find_element(By.ID, f"confirm-{action}-{flow}").click()
    button = d.find_element(By.ID, f"{action}-{flow}")
    button.click()
    WebDriverWait(d, 30).until(EC.staleness_of(button))  # the flows page was left
    return wait_for(d, lambda drv: text_of(drv, "p.notice"), f"the answer to {action} {flow}", 30)
