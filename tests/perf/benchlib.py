"""Shared pieces of the `make bench` benchmarks.

dcmirror is driven with librdkafka (confluent_kafka, plus kcat for a consumer figure without
Python overhead); the peer is Debian's redis-server driven with redis-py (Redis Streams).
Figures are printed and written to tests/perf/results/latest.txt; nothing here asserts speed.

MB/s everywhere means payload bytes / 10**6 per second (record keys, headers and protocol
framing are not counted), so the dcmirror and Redis figures are directly comparable.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import resource
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

RESULTS_DIR = Path(__file__).resolve().parent / "results"
RESULTS_FILE = RESULTS_DIR / "latest.txt"

RECORD_BYTES = 200
PARTITIONS = 6
MB = 1_000_000


def env_int(name: str, default: int) -> int:
    """Integer from the environment; accepts 2000000, 2_000_000 and 2e6."""
    raw = os.environ.get(name, "").strip().replace("_", "")
    return int(float(raw)) if raw else default


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    return float(raw) if raw else default


POOL = 1024  # distinct values cycled through (power of two)


def payloads(size: int = RECORD_BYTES, count: int = POOL) -> list[bytes]:
    """`count` distinct random values of `size` bytes, cycled through by every writer.

    Distinct and incompressible so that neither system gets to compress repeats (Redis LZF-
    compresses stream listpack nodes when it rewrites its AOF with an RDB preamble).
    """
    return [os.urandom(size) for _ in range(count)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- results / output


_results_started = False


def emit(text: str) -> None:
    """Print a block and add it to results/latest.txt (truncated at the first block of a run)."""
    global _results_started
    text = text.rstrip("\n") + f"\n(load average at end: {loadavg()})"
    print(text, flush=True)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    mode = "a" if _results_started else "w"
    with open(RESULTS_FILE, mode) as f:
        if not _results_started:
            f.write(environment_header() + "\n")
        f.write(text.rstrip("\n") + "\n\n")
    _results_started = True


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def progress(text: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {text}", flush=True)


@functools.cache
def environment_header() -> str:
    import confluent_kafka
    import redis

    try:
        import hiredis  # noqa: F401

        parser = "hiredis"
    except ImportError:
        parser = "pure-Python parser (no hiredis)"
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    redis_version = "?"
    if shutil.which("redis-server"):
        out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout
        redis_version = out.split("v=")[1].split()[0] if "v=" in out else out.strip()
    kcat = "not installed"
    if shutil.which("kcat"):
        out = subprocess.run(["kcat", "-V"], capture_output=True, text=True).stdout
        m = re.search(r"Version (\S+).*?librdkafka (\S+)", out, re.S)
        kcat = f"{m.group(1)} (librdkafka {m.group(2)})" if m else "?"
    lines = [
        "dcmirror benchmark  " + time.strftime("%Y-%m-%d %H:%M:%S %z"),
        f"host: {platform.node()}  {os.cpu_count()} CPUs  {cpu}",
        f"python {platform.python_version()}  confluent_kafka {_first(confluent_kafka.version())}"
        f"  librdkafka {_first(confluent_kafka.libversion())}",
        f"redis-server {redis_version}  redis-py {redis.__version__} ({parser})  kcat {kcat}",
        f"git: {git_describe()}",
        f"load average at start: {loadavg()}",
        "MB/s = payload bytes / 1e6 per second",
        "",
    ]
    return "\n".join(lines)


def _first(version: object) -> str:
    return str(version[0] if isinstance(version, tuple) else version)


def git_describe() -> str:
    repo = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True,
                              text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "cluster", "deploy"], cwd=repo,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return head + (" (+ uncommitted changes in cluster/ deploy/)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "?"


@dataclass
class Rate:
    records: int
    payload_bytes: int
    seconds: float
    cpu: dict[str, float] = field(default_factory=dict)  # process name -> CPU seconds in the phase
    note: str = ""

    @property
    def msg_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else float("nan")

    @property
    def mb_s(self) -> float:
        return self.payload_bytes / MB / self.seconds if self.seconds > 0 else float("nan")

    def describe(self) -> str:
        cpu = ", ".join(f"{k} {v:.1f}s CPU" for k, v in self.cpu.items())
        other = self.cpu.get("other processes", 0.0) / self.seconds if self.seconds > 0 else 0.0
        if other > 0.25:
            cpu += f"; BUSY MACHINE: other processes averaged {other:.1f} cores, figure skewed"
        return (f"{self.records:,} records in {self.seconds:.2f}s = {self.msg_s:,.0f} msg/s, "
                f"{self.mb_s:.1f} MB/s" + (f" ({cpu})" if cpu else "") + (f" [{self.note}]" if self.note else ""))


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (q in 0..100)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), int(-(-q * len(sorted_values) // 100))))
    return sorted_values[rank - 1]


def proc_cpu_seconds(pid: int | None) -> float:
    """user+system CPU seconds of a process (all its threads) so far, from /proc."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def measure(pids: dict[str, int | None], fn: Callable[..., Rate], *args: object, **kwargs: object) -> Rate:
    """Run fn(...) -> Rate and attach the CPU seconds the given processes and the client used."""
    before = {name: proc_cpu_seconds(pid) for name, pid in pids.items()}
    self_before = time.process_time()
    children_before = _children_cpu()
    system_before = system_busy_seconds()
    rate = fn(*args, **kwargs)
    for name, pid in pids.items():
        rate.cpu[name] = proc_cpu_seconds(pid) - before[name]
    rate.cpu["client"] = time.process_time() - self_before + _children_cpu() - children_before
    # Everything else on the machine (other test runs would skew the figures): busy time of
    # all CPUs minus what the measured processes used.
    other = system_busy_seconds() - system_before - sum(rate.cpu.values())
    rate.cpu["other processes"] = max(0.0, other)
    return rate


class OtherLoad:
    """Context manager: average cores used by processes other than `pids` and this one."""

    def __init__(self, *pids: int | None) -> None:
        self.pids = pids
        self.cores = 0.0

    def __enter__(self) -> OtherLoad:
        self._t = time.perf_counter()
        self._sys = system_busy_seconds()
        self._own = time.process_time() + sum(proc_cpu_seconds(p) for p in self.pids)
        return self

    def __exit__(self, *exc: object) -> None:
        own = time.process_time() + sum(proc_cpu_seconds(p) for p in self.pids) - self._own
        elapsed = time.perf_counter() - self._t
        self.cores = max(0.0, system_busy_seconds() - self._sys - own) / elapsed if elapsed > 0 else 0.0

    def describe(self) -> str:
        text = f"other processes averaged {self.cores:.2f} cores"
        return text + (" - BUSY MACHINE, figure skewed" if self.cores > 0.25 else "")


def system_busy_seconds() -> float:
    """Non-idle CPU seconds of all CPUs since boot, from /proc/stat."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        busy = sum(fields[:8]) - idle  # user nice system idle iowait irq softirq steal
        return busy / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


_LOG_PREFIX = re.compile(r"^\d{4}-\d\d-\d\d[ T][\d:,.]+\s+")
_PEER = re.compile(r"127\.0\.0\.1:\d+")


def tail(text: str, lines: int = 25) -> str:
    """Last lines of a log, runs of lines that differ only in timestamp/peer port collapsed."""
    out: list[tuple[str, str, int]] = []  # (line, normalized, repeats)
    for line in text.rstrip().splitlines():
        norm = _PEER.sub("127.0.0.1:*", _LOG_PREFIX.sub("", line))
        if out and out[-1][1] == norm:
            out[-1] = (line, norm, out[-1][2] + 1)
        else:
            out.append((line, norm, 1))
    return "\n".join(line + (f"   [same line x{n}]" if n > 1 else "") for line, _, n in out[-lines:])


# --------------------------------------------------------------------------- Kafka side (dcmirror)


def producer_conf(bootstrap: str, **extra: object) -> dict[str, object]:
    conf: dict[str, object] = {
        "bootstrap.servers": bootstrap,
        "acks": 1,
        "linger.ms": 5,
        "batch.size": 1_048_576,
        "compression.type": "none",
        # Big enough that the client queue never throttles the Python loop.
        "queue.buffering.max.messages": 2_000_000,
        "queue.buffering.max.kbytes": 2_097_152,  # 2 GiB
        "enable.idempotence": False,
    }
    conf.update(extra)
    return conf


def create_topic(bootstrap: str, name: str, partitions: int = PARTITIONS,
                 config: dict[str, str] | None = None, timeout_s: float = 60.0) -> tuple[int, str]:
    """CreateTopics via AdminClient, then wait until metadata shows every partition with a leader.

    Returns (partition count, note). When CreateTopics fails the topic is auto-created by a
    metadata request instead and the note says why (the partition count is then the broker's
    default, which is reported).
    """
    admin = AdminClient({"bootstrap.servers": bootstrap})
    note = ""
    try:
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})],
            operation_timeout=timeout_s, request_timeout=timeout_s)
        futures[name].result(timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001 - reported, then fall back to auto-creation
        note = f"CreateTopics failed ({exc!r}); relying on auto-creation"
        progress(note)
        if config:
            # the topic config cannot be set without CreateTopics
            note += f"; topic config {config} NOT applied"
    deadline = time.monotonic() + timeout_s
    last_err = ""
    while time.monotonic() < deadline:
        try:
            md = admin.list_topics(topic=name, timeout=5)
            tmd = md.topics.get(name)
            if tmd is not None and tmd.error is None and tmd.partitions and all(
                    p.leader >= 0 and p.error is None for p in tmd.partitions.values()):
                if note or len(tmd.partitions) != partitions:
                    note += f" (topic has {len(tmd.partitions)} partitions)"
                return len(tmd.partitions), note.strip()
            last_err = f"metadata: {tmd.error if tmd else 'topic missing'}"
        except KafkaException as exc:
            last_err = repr(exc)
        time.sleep(0.2)
    raise TimeoutError(f"topic {name} not ready within {timeout_s}s: {last_err}")


class DeliveryErrors:
    """Delivery-report callback that only sees failures (delivery.report.only.error=true)."""

    def __init__(self) -> None:
        self.count = 0
        self.first: str | None = None

    def __call__(self, err: object, msg: object) -> None:
        if err is not None:
            self.count += 1
            if self.first is None:
                self.first = str(err)


def kafka_produce(bootstrap: str, topic: str, n: int, values: Sequence[bytes],
                  progress_every_s: float = 10.0, **client: object) -> Rate:
    """Produce n records (cycling through values) as fast as the client allows; `client`
    overrides producer_conf's settings.

    The clock stops when flush() returns, i.e. every record has been acknowledged.
    """
    mask = len(values) - 1
    assert len(values) & mask == 0, "len(values) must be a power of two"
    errors = DeliveryErrors()
    p = Producer(producer_conf(bootstrap, **{"delivery.report.only.error": True, "on_delivery": errors, **client}))
    # Connection + metadata for the topic before the clock starts.
    p.produce(topic, values[0])
    if p.flush(30) != 0:
        raise RuntimeError(f"warm-up record to {topic} not delivered within 30s")
    if errors.count:
        raise RuntimeError(f"warm-up record to {topic} failed: {errors.first}")
    produce, poll = p.produce, p.poll
    queue_full = 0
    next_report = time.perf_counter() + progress_every_s
    start = time.perf_counter()
    for i in range(n):
        while True:
            try:
                produce(topic, values[i & mask])
                break
            except BufferError:
                queue_full += 1
                poll(0.005)
        if not i & 0x3FFF:
            poll(0)
            if progress_every_s and time.perf_counter() > next_report:
                progress(f"produced {i:,}/{n:,} (in flight/queued {len(p):,})")
                next_report += progress_every_s
    enqueued = time.perf_counter()
    remaining = p.flush(600)
    elapsed = time.perf_counter() - start
    if remaining:
        raise RuntimeError(f"{remaining:,} records still undelivered 600s after the last produce()")
    if errors.count:
        raise RuntimeError(f"{errors.count:,} of {n:,} records failed delivery; first error: {errors.first}")
    note = f"produce() loop {enqueued - start:.2f}s, flush {elapsed - (enqueued - start):.2f}s"
    if queue_full:
        note += f", client queue full {queue_full:,}x"
    return Rate(n, n * len(values[0]), elapsed, note=note)


def consumer_conf(bootstrap: str, **extra: object) -> dict[str, object]:
    conf: dict[str, object] = {
        "bootstrap.servers": bootstrap,
        # confluent_kafka refuses to create a consumer without group.id; with assign() and no
        # commits it never joins the group (consumer groups are not implemented by dcmirror yet).
        "group.id": "dcmirror-bench-assign-only",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": False,
        "auto.offset.reset": "earliest",
        # librdkafka (>= 2.4) stops fetching a partition for fetch.queue.backoff.ms (default
        # 1000 ms) whenever its local queue is over queued.max.messages.kbytes, i.e. whenever the
        # Python loop is a little behind. With the default, 2M-record runs stalled for whole
        # seconds (debug=fetch: "Fetch backoff for 1000ms: Local: Queue full") and the figure
        # swung between 200k and 600k msg/s; 10 ms measures the broker instead of that timer.
        "fetch.queue.backoff.ms": 10,
    }
    conf.update(extra)
    return conf


def kafka_consume(bootstrap: str, topic: str, partitions: int, expected: int,
                  stall_timeout_s: float = 60.0, progress_every_s: float = 10.0, **client: object) -> Rate:
    """assign() every partition from the beginning and consume(10000) until `expected` records.

    The clock starts at assign() (connection set-up is done beforehand by a metadata request)
    and stops when the last expected record has been returned.
    """
    c = Consumer(consumer_conf(bootstrap, **client))
    try:
        c.list_topics(topic=topic, timeout=10)
        count = 0
        nbytes = 0
        errors: list[str] = []
        consume = c.consume
        next_report = time.perf_counter() + progress_every_s
        start = time.perf_counter()
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        last_progress = start
        while count < expected:
            # Never ask for more than is left: consume() waits for num_messages or the timeout,
            # so a final short batch would otherwise add the whole timeout to the figure.
            msgs = consume(num_messages=min(10_000, expected - count), timeout=1.0)
            now = time.perf_counter()
            if not msgs:
                if now - last_progress > stall_timeout_s:
                    raise TimeoutError(f"consumer stalled: {count:,}/{expected:,} records after "
                                       f"{now - start:.1f}s, nothing for {stall_timeout_s:.0f}s")
                continue
            last_progress = now
            for m in msgs:
                err = m.error()
                if err is not None:
                    errors.append(str(err))
                    if len(errors) > 100:
                        raise RuntimeError(f"consumer errors: {errors[:5]}")
                    continue
                count += 1
                nbytes += len(m)
            if progress_every_s and now > next_report:
                progress(f"consumed {count:,}/{expected:,}")
                next_report += progress_every_s
        elapsed = time.perf_counter() - start
    finally:
        c.close()
    note = f"{len(errors)} error events: {errors[:3]}" if errors else ""
    if count != expected:
        note += f" (got {count:,} records, expected {expected:,})"
    return Rate(count, nbytes, elapsed, note=note.strip())


def kcat_consume(bootstrap: str, topic: str, expected: int, timeout_s: float = 900.0) -> Rate:
    """`kcat -C -e -o beginning -q` to /dev/null (librdkafka without Python; count not checked).

    kcat uses the system librdkafka and its legacy (no-group) consumer, with default settings.
    """
    cmd = ["kcat", "-C", "-b", bootstrap, "-t", topic, "-e", "-o", "beginning", "-q"]
    with open(os.devnull, "wb") as devnull:
        start = time.perf_counter()
        proc = subprocess.run(cmd, stdout=devnull, stderr=subprocess.PIPE, timeout=timeout_s)
        elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"kcat exited {proc.returncode}: {proc.stderr.decode(errors='replace')[-2000:]}")
    note = "process start included; exits at end of all partitions"
    stderr = proc.stderr.decode(errors="replace").strip()
    if stderr:
        note += f"; stderr: {stderr[-300:]}"
    return Rate(expected, expected * RECORD_BYTES, elapsed, note=note)


@dataclass
class Latency:
    system: str
    target_rate: float
    sent: int
    acked: int
    send_seconds: float
    latencies_ms: list[float]
    errors: int = 0
    note: str = ""

    def row(self) -> str:
        lat = sorted(self.latencies_ms)
        achieved = self.sent / self.send_seconds if self.send_seconds > 0 else float("nan")
        return (f"{self.system:<34} {self.sent:>9,} {achieved:>11,.0f} {percentile(lat, 50):>8.2f} "
                f"{percentile(lat, 99):>8.2f} {percentile(lat, 99.9):>9.2f} "
                f"{(lat[-1] if lat else float('nan')):>8.2f} {self.errors:>6}")

    @staticmethod
    def header() -> str:
        return (f"{'system':<34} {'sent':>9} {'achieved/s':>11} {'p50 ms':>8} {'p99 ms':>8} "
                f"{'p99.9 ms':>9} {'max ms':>8} {'errors':>6}")


def paced(rate: float, seconds: float, send: Callable[[int], None],
          idle: Callable[[float], None]) -> tuple[int, float]:
    """Call send(i) so that record i goes out at start + i/rate; idle(max_wait_s) in between.

    Returns (records sent, seconds from the first to the last send).
    """
    total = int(rate * seconds)
    sent = 0
    start = time.perf_counter()
    while sent < total:
        due = min(total, int((time.perf_counter() - start) * rate) + 1)
        while sent < due:
            send(sent)
            sent += 1
        wait = start + sent / rate - time.perf_counter()
        idle(max(0.0, wait))
    return sent, time.perf_counter() - start


def kafka_paced_latency(bootstrap: str, topic: str, rate: float, seconds: float,
                        values: Sequence[bytes], *, system: str = "dcmirror (confluent_kafka, acks=1)",
                        flush_timeout_s: float = 60.0, **client: object) -> Latency:
    """produce() at a fixed rate; latency = produce() call -> delivery callback (acks=1, linger
    5ms unless `client` says otherwise). The client queue holds every record of the run: when
    the brokers fall behind the pace, latency grows instead of produce() failing."""
    total = int(rate * seconds)
    p = Producer(producer_conf(bootstrap, **client, **{"queue.buffering.max.messages": max(2_000_000, total + 1)}))
    p.produce(topic, values[0])
    if p.flush(30) != 0:
        raise RuntimeError(f"warm-up record to {topic} not delivered within 30s")
    sent_at: list[float] = [0.0] * total
    latencies: list[float] = []
    errors = [0]
    perf = time.perf_counter

    def delivered(i: int, err: object, msg: object) -> None:
        if err is None:
            latencies.append((perf() - sent_at[i]) * 1000.0)
        else:
            errors[0] += 1

    callbacks = [functools.partial(delivered, i) for i in range(len(sent_at))]
    produce, poll = p.produce, p.poll

    def send(i: int) -> None:
        sent_at[i] = perf()
        produce(topic, values[i % len(values)], on_delivery=callbacks[i])

    def idle(wait: float) -> None:
        # poll() serves delivery callbacks as they arrive and doubles as the pacing sleep.
        poll(min(wait, 0.001))

    sent, send_seconds = paced(rate, seconds, send, idle)
    remaining = p.flush(flush_timeout_s)
    return Latency(system, rate, sent, len(latencies), send_seconds, latencies, errors[0] + remaining,
                   note=f"{remaining} undelivered after flush" if remaining else "")


# --------------------------------------------------------------------------- Redis side (peer)


class RedisServer:
    """Debian's redis-server on a free loopback port in its own directory, AOF everysec."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, timeout_s: float = 20.0) -> RedisServer:
        import redis

        self.workdir.mkdir(parents=True, exist_ok=True)
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
               "--dir", str(self.workdir), "--appendonly", "yes", "--appendfsync", "everysec",
               "--save", "", "--protected-mode", "no", "--daemonize", "no",
               "--logfile", str(self.workdir / "redis.log")]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited {self.proc.returncode}: {self.log_text()[-2000:]}")
            try:
                if self.client().ping():
                    return self
            except redis.exceptions.ConnectionError:
                time.sleep(0.05)
        raise TimeoutError(f"redis-server not answering within {timeout_s}s")

    def client(self):  # -> redis.Redis
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=False,
                           socket_timeout=120)

    def log_text(self) -> str:
        try:
            return (self.workdir / "redis.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def redis_produce(r, stream: bytes, n: int, values: Sequence[bytes], pipeline_size: int,
                  progress_every_s: float = 10.0) -> Rate:
    """XADD n entries {v: value} (cycling through values) in non-transactional pipelines."""
    pipe = r.pipeline(transaction=False)
    xadd = pipe.xadd
    fields = [{b"v": v} for v in values]
    mask = len(values) - 1
    assert len(values) & mask == 0, "len(values) must be a power of two"
    next_report = time.perf_counter() + progress_every_s
    start = time.perf_counter()
    for i in range(1, n + 1):
        xadd(stream, fields[i & mask])
        if i % pipeline_size == 0:
            pipe.execute()
            if progress_every_s and time.perf_counter() > next_report:
                progress(f"XADDed {i:,}/{n:,}")
                next_report += progress_every_s
    pipe.execute()
    elapsed = time.perf_counter() - start
    length = r.xlen(stream)
    if length != n:
        raise RuntimeError(f"XLEN {stream!r} = {length:,}, expected {n:,}")
    return Rate(n, n * len(values[0]), elapsed, note=f"pipelines of {pipeline_size}")


def _xread_entries(resp: object, stream: bytes) -> list:
    if not resp:
        return []
    if isinstance(resp, dict):  # RESP3
        value = resp.get(stream) or next(iter(resp.values()))
        return value[0] if value and isinstance(value[0], list) else value
    return resp[0][1]  # RESP2: [[stream, [(id, fields), ...]]]


def redis_consume(r, stream: bytes, expected: int, batch: int = 10_000,
                  progress_every_s: float = 10.0) -> Rate:
    """XREAD COUNT batch STREAMS stream <last id> in a loop from 0-0 until expected entries."""
    last = b"0-0"
    count = 0
    nbytes = 0
    next_report = time.perf_counter() + progress_every_s
    start = time.perf_counter()
    while count < expected:
        entries = _xread_entries(r.xread({stream: last}, count=batch), stream)
        if not entries:
            raise RuntimeError(f"XREAD returned nothing after {count:,}/{expected:,} entries")
        count += len(entries)
        for _id, fields in entries:
            nbytes += len(fields[b"v"])
        last = entries[-1][0]
        if progress_every_s and time.perf_counter() > next_report:
            progress(f"XREAD {count:,}/{expected:,}")
            next_report += progress_every_s
    elapsed = time.perf_counter() - start
    return Rate(count, nbytes, elapsed, note=f"COUNT {batch}")


def redis_benchmark_produce(port: int, stream: str, n: int, pipeline: int = 1000) -> Rate | None:
    """XADD through redis-benchmark (C client, one connection): Redis without redis-py overhead.

    redis-benchmark sends one constant value (so Redis may compress it in AOF rewrites).
    """
    exe = shutil.which("redis-benchmark")
    if not exe:
        return None
    value = "x" * RECORD_BYTES
    cmd = [exe, "-h", "127.0.0.1", "-p", str(port), "-n", str(n), "-c", "1", "-P", str(pipeline),
           "--csv", "XADD", stream, "*", "v", value]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        return Rate(0, 0, float("nan"), note=f"redis-benchmark failed: {proc.stderr[-300:]}")
    rps = None
    for line in proc.stdout.splitlines():
        parts = [p.strip('"') for p in line.split('","')]
        if len(parts) >= 2 and parts[0].upper().startswith("XADD"):
            try:
                rps = float(parts[1])
            except ValueError:
                pass
    seconds = n / rps if rps else elapsed
    return Rate(n, n * RECORD_BYTES, seconds, note=f"-c 1 -P {pipeline}, reported rps")


def redis_paced_latency(r, stream: bytes, rate: float, seconds: float, values: Sequence[bytes],
                        flush_interval_s: float = 0.001) -> Latency:
    """XADD at a fixed rate, pipeline flushed every flush_interval_s; latency = enqueue -> reply."""
    pipe = r.pipeline(transaction=False)
    fields = [{b"v": v} for v in values]
    pending: list[float] = []
    latencies: list[float] = []
    perf = time.perf_counter
    last_flush = [perf()]

    def flush() -> None:
        if pending:
            pipe.execute()
            done = perf()
            latencies.extend((done - t) * 1000.0 for t in pending)
            pending.clear()
        last_flush[0] = perf()

    def send(i: int) -> None:
        pending.append(perf())
        pipe.xadd(stream, fields[i % len(fields)])

    def idle(wait: float) -> None:
        until_flush = last_flush[0] + flush_interval_s - perf()
        if until_flush <= 0:
            flush()
            until_flush = flush_interval_s
        time.sleep(max(0.0, min(wait, until_flush)))

    sent, send_seconds = paced(rate, seconds, send, idle)
    flush()
    return Latency(f"redis (XADD pipeline every {flush_interval_s * 1000:g}ms)", rate, sent,
                   len(latencies), send_seconds, latencies)



class Alternated:
    """Figures of two systems measured in alternated rounds (A B, B A, A B, ...): per row each
    system's median, the median of the per-round ratios A/B and their range, and the 1-minute
    load average around each measurement, so a row says how much it moved and how busy the
    machine was."""

    def __init__(self, systems: tuple[str, str] = ("dcmirror", "kafka")) -> None:
        self.systems = systems
        self.values: dict[str, dict[str, list[float | None]]] = {}
        self.loads: dict[str, list[float]] = {}

    def add(self, row: str, system: str, value: float | None) -> None:
        per = self.values.setdefault(row, {s: [] for s in self.systems})
        per[system].append(value)
        try:
            self.loads.setdefault(row, []).append(float(Path("/proc/loadavg").read_text().split()[0]))
        except (OSError, ValueError):
            pass

    def medians(self, row: str) -> tuple[float | None, float | None]:
        per = self.values.get(row, {})
        out = []
        for s in self.systems:
            got = sorted(v for v in per.get(s, []) if v is not None)
            out.append(got[len(got) // 2] if got else None)
        return out[0], out[1]

    def ratios(self, row: str) -> list[float]:
        per = self.values.get(row, {})
        a, b = (per.get(s, []) for s in self.systems)
        return sorted(x / y for x, y in zip(a, b, strict=False) if x and y)

    def render(self, title: str, rows: list[tuple[str, str, str]], names: tuple[str, str]) -> str:
        """rows: (row key, label, unit: "/s", "s", "ms" or "MiB")."""

        def fmt(v: float | None, unit: str) -> str:
            if v is None:
                return "-"
            if unit == "s":
                return f"{v:.2f} s"
            return (f"{v:.2f} {unit}" if v < 10 else f"{v:,.0f} {unit}").replace(" /s", "/s")

        out = [title, f"  {'':<46} {names[0]:>12} {names[1]:>14} {'ratio (median)':>15} {'range':>13} {'load':>9}"]
        for key, label, unit in rows:
            a, b = self.medians(key)
            r = self.ratios(key)
            loads = self.loads.get(key, [])
            spread = f"{r[0]:.2f}-{r[-1]:.2f}" if len(r) > 1 else ""
            med = f"{r[len(r) // 2]:.2f}" if r else "n/a"
            load = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "?"
            out.append(f"  {label:<46} {fmt(a, unit):>12} {fmt(b, unit):>14} {med:>15} {spread:>13} {load:>9}")
        return "\n".join(out)
