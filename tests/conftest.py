from __future__ import annotations

import fcntl
import os
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import settings as hypothesis_settings

from tests.harness import BrokerProcess, ClusterProcesses

# Property tests draw the same cases every run of make test (a fresh draw once failed CI on a
# case no one had seen); `make soak` sets DCMIRROR_FUZZ_EXPLORE=1 to draw new ones. Settings
# a test gives itself inherit this.
hypothesis_settings.register_profile("dcmirror", derandomize=not os.environ.get("DCMIRROR_FUZZ_EXPLORE"))
hypothesis_settings.load_profile("dcmirror")


@pytest.fixture(autouse=True)
def _heavy_tests_one_at_a_time(request: pytest.FixtureRequest,
                               tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A test marked `heavy` (a multi-broker cluster killed -9 beside client applications,
    JVMs or Spark) never runs beside another one on the other xdist worker: each holds an
    exclusive lock on a file every worker of the run shares (the workers' base temporary
    directories have one parent) from before its fixtures start to after they stop. Under
    `make test` the files holding heavy tests run on one worker anyway (HeavyFilesTogether,
    below), so the lock is not waited for; the time a test did wait is reported at the end."""
    if request.node.get_closest_marker("heavy") is None:
        yield
        return
    with open(tmp_path_factory.getbasetemp().parent / "heavy-tests.lock", "a") as lock:
        asked = time.monotonic()
        fcntl.flock(lock, fcntl.LOCK_EX)
        request.node.user_properties.append(("heavy_lock_wait_s", time.monotonic() - asked))
        yield


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A fresh standalone broker on a free loopback port."""
    proc = BrokerProcess(tmp_path / "broker").start()
    yield proc
    proc.stop()


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[object]:
    """Start brokers with config overrides: broker_factory(**{"log.retention.ms": 1000})."""
    started: list[BrokerProcess] = []

    def make(name: str = "broker", **overrides: object) -> BrokerProcess:
        proc = BrokerProcess(tmp_path / name, **overrides)
        started.append(proc)
        return proc.start()

    yield make
    for proc in started:
        if proc.alive():
            proc.stop()


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[object]:
    """Start topology clusters: cluster_factory(3, **{"broker.session.timeout.ms": 2000})."""
    started: list[ClusterProcesses] = []

    def make(size: int = 3, name: str = "east", controllers: int = 0, **config: object) -> ClusterProcesses:
        cluster = ClusterProcesses(tmp_path / f"cluster-{name}", size, name=name, controllers=controllers, **config)
        started.append(cluster)
        return cluster.start()

    yield make
    for cluster in started:
        cluster.stop()


# ---- order of files under xdist (make test runs `--dist loadfile --no-loadscope-reorder`) ----
# Each file runs whole on one worker, in the order collected (the files holding heavy tests
# all on one worker, one after the other: pytest_xdist_make_scheduler). The longest files go first
# (longest-processing-time-first), so the run does not end with one worker on a long file
# while the other is idle. tests/durations.json holds seconds per file from a recent run
# (the slowest files `make test` prints at its end); a file not in it counts 1 s per test.
# The order changes nothing but the order.

DURATIONS_S: dict[str, float] = orjson.loads((Path(__file__).parent / "durations.json").read_bytes())
_file_seconds: dict[str, float] = defaultdict(float)
_heavy_lock_waits: list[tuple[str, float]] = []
ROOT = Path(__file__).resolve().parent.parent
HEAVY_SCOPE = "files with heavy tests"


@cache
def holds_heavy_tests(path: str) -> bool:
    """Does the test file (relative to the repository) mark a test, or all of them, `heavy`?
    (xdist's controller schedules files without collecting them: it reads the source.)"""
    try:
        return re.search(r"pytest\.mark\.heavy\b", (ROOT / path).read_text()) is not None
    except OSError:
        return False


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """--dist loadfile, with every file holding heavy tests in one work unit: they run one
    after the other on one worker while the other worker runs the rest, instead of one
    worker idling on the heavy-test lock whenever both reach heavy tests at once. The unit
    goes where its first file is in the longest-first order, so it starts early."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class HeavyFilesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = _file_of(nodeid)
            return HEAVY_SCOPE if holds_heavy_tests(path) else path

    return HeavyFilesTogether(config, log)


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests_per_file = Counter(_file_of(item.nodeid) for item in items)  # in collection order
    rank = {path: (-DURATIONS_S.get(path, float(count)), i) for i, (path, count) in enumerate(tests_per_file.items())}
    items.sort(key=lambda item: rank[_file_of(item.nodeid)])


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _file_seconds[_file_of(report.nodeid)] += report.duration
    _heavy_lock_waits.extend((report.nodeid, float(v)) for k, v in report.user_properties
                             if k == "heavy_lock_wait_s" and report.when == "setup")


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or len(_file_seconds) < 2:
        return
    if _heavy_lock_waits:
        waited = sorted(_heavy_lock_waits, key=lambda kv: -kv[1])
        terminalreporter.write_line(f"heavy tests waited {sum(s for _, s in waited):.0f} s in all for the heavy-test "
                                    f"lock; longest: {', '.join(f'{n} {s:.0f} s' for n, s in waited[:3])}")
    slowest = sorted(_file_seconds.items(), key=lambda kv: -kv[1])[:30]
    terminalreporter.write_sep("=", "slowest 30 files (seconds, for tests/durations.json)")
    terminalreporter.write_line(orjson.dumps({path: round(s) for path, s in slowest}).decode())
