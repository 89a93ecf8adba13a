"""The bookkeeping of `dcmirror perf`, as plain objects driven by the caller's clock (no I/O):
Kafka's ProducerPerformance.Stats, its ThroughputThrottler and ConsumerPerformance's totals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MB = 1024 * 1024
# At most this many latencies are kept for percentiles, as Kafka does.
LATENCY_SAMPLES_MAX = 500_000
PERCENTILES = (0.5, 0.95, 0.99, 0.999)


def percentiles(values: list[float], points: tuple[float, ...] = PERCENTILES) -> list[float]:
    """Kafka's nearest-rank percentiles: sorted[int(p * n)] (0 for no values)."""
    if not values:
        return [0.0 for _ in points]
    ordered = sorted(values)
    n = len(ordered)
    return [ordered[min(int(p * n), n - 1)] for p in points]


# Latency is measured on every LATENCY_SAMPLE_EVERY-th record: a delivery callback on every
# record halves the Python producer's rate (measured: 92k -> 53k records/s), one in 16 costs
# a few percent. Counts and bytes come from the producer's own totals, for every record.
LATENCY_SAMPLE_EVERY = 16


@dataclass
class ProducerStats:
    """A producer run: acknowledged totals (fed from the producer's counters), the current
    progress window and sampled latencies."""

    num_records: int
    record_size: int
    start_s: float
    sample_every: int = field(init=False)
    acked: int = 0
    errors: int = 0
    latency_ms_total: float = 0.0
    latency_ms_max: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    first_error: str | None = None
    _window_start_s: float = field(init=False)
    _window_acked: int = 0
    _window_latencies: int = 0
    _window_latency_ms_total: float = 0.0
    _window_latency_ms_max: float = 0.0

    def __post_init__(self) -> None:
        self._window_start_s = self.start_s
        self.sample_every = max(LATENCY_SAMPLE_EVERY, -(-self.num_records // LATENCY_SAMPLES_MAX))

    def samples(self, index: int) -> bool:
        """Whether record `index` (0-based) gets its latency measured."""
        return index % self.sample_every == 0

    def latency(self, latency_ms: float) -> None:
        """A sampled record was acknowledged after `latency_ms`."""
        self.latencies_ms.append(latency_ms)
        self.latency_ms_total += latency_ms
        if latency_ms > self.latency_ms_max:
            self.latency_ms_max = latency_ms
        self._window_latencies += 1
        self._window_latency_ms_total += latency_ms
        if latency_ms > self._window_latency_ms_max:
            self._window_latency_ms_max = latency_ms

    def failed(self, error: Exception) -> None:
        if self.first_error is None:
            self.first_error = str(error)

    def update(self, acked: int, errors: int) -> None:
        """The producer's totals of acknowledged and failed records."""
        self.acked, self.errors = acked, errors

    def progress_line(self, now_s: float) -> str:
        """Kafka's window line; starts a new window."""
        elapsed = max(now_s - self._window_start_s, 1e-9)
        count = self.acked - self._window_acked
        n = self._window_latencies
        avg = self._window_latency_ms_total / n if n else 0.0
        line = (f"{count} records sent, {count / elapsed:.1f} records/sec "
                f"({count * self.record_size / elapsed / MB:.2f} MB/sec), "
                f"{avg:.1f} ms avg latency, {self._window_latency_ms_max:.1f} ms max latency.")
        self._window_start_s, self._window_acked = now_s, self.acked
        self._window_latencies, self._window_latency_ms_total, self._window_latency_ms_max = 0, 0.0, 0.0
        return line

    def summary(self, now_s: float) -> dict[str, Any]:
        elapsed = max(now_s - self.start_s, 1e-9)
        p50, p95, p99, p999 = percentiles(self.latencies_ms)
        n = len(self.latencies_ms)
        size = self.acked * self.record_size
        return {
            "records": self.acked,
            "errors": self.errors,
            "bytes": size,
            "elapsed_s": round(elapsed, 3),
            "records_per_sec": round(self.acked / elapsed, 1),
            "mb_per_sec": round(size / elapsed / MB, 3),
            "avg_latency_ms": round(self.latency_ms_total / n, 2) if n else 0.0,
            "max_latency_ms": round(self.latency_ms_max, 2),
            "p50_ms": round(p50, 2),
            "p95_ms": round(p95, 2),
            "p99_ms": round(p99, 2),
            "p999_ms": round(p999, 2),
            "latency_samples": n,
        }

    @staticmethod
    def summary_line(s: dict[str, Any]) -> str:
        return (f"{s['records']} records sent, {s['records_per_sec']:.1f} records/sec ({s['mb_per_sec']:.2f} MB/sec), "
                f"{s['avg_latency_ms']:.2f} ms avg latency, {s['max_latency_ms']:.2f} ms max latency, "
                f"{s['p50_ms']:.0f} ms 50th, {s['p95_ms']:.0f} ms 95th, {s['p99_ms']:.0f} ms 99th, "
                f"{s['p999_ms']:.0f} ms 99.9th.")


class Throttler:
    """Kafka's ThroughputThrottler: how long to pause so `sent` records after `elapsed_s`
    stay at `records_per_s` (a negative target: never)."""

    def __init__(self, records_per_s: float) -> None:
        self.records_per_s = records_per_s

    def delay_s(self, sent: int, elapsed_s: float) -> float:
        if self.records_per_s <= 0:
            return 0.0
        return max(0.0, sent / self.records_per_s - elapsed_s)


@dataclass
class ConsumerStats:
    """ConsumerPerformance's totals, with a progress window."""

    start_s: float
    count: int = 0
    bytes: int = 0
    first_record_s: float | None = None  # the end of joining (rebalance time) for a group consumer
    last_record_s: float | None = None
    window_start_s: float = field(init=False)
    window_count: int = 0
    window_bytes: int = 0

    def __post_init__(self) -> None:
        self.window_start_s = self.start_s

    def consumed(self, count: int, size_bytes: int, now_s: float) -> None:
        if count <= 0:
            return
        if self.first_record_s is None:
            self.first_record_s = now_s
        self.last_record_s = now_s
        self.count += count
        self.bytes += size_bytes
        self.window_count += count
        self.window_bytes += size_bytes

    def progress_line(self, now_s: float) -> str:
        elapsed = max(now_s - self.window_start_s, 1e-9)
        line = (f"{self.window_count} records consumed, {self.window_count / elapsed:.1f} records/sec "
                f"({self.window_bytes / elapsed / MB:.2f} MB/sec); total {self.count} records, "
                f"{self.bytes / MB:.2f} MB")
        self.window_start_s, self.window_count, self.window_bytes = now_s, 0, 0
        return line

    def summary(self, *, rebalance_s: float, now_s: float, start_wall_s: float) -> dict[str, Any]:
        """As kafka-consumer-perf-test: totals over the whole run, fetch rates over the time
        after joining (rebalance_s)."""
        end_s = self.last_record_s if self.last_record_s is not None else now_s
        elapsed = max(end_s - self.start_s, 1e-9)
        fetch_s = max(elapsed - rebalance_s, 1e-9)
        mb = self.bytes / MB
        return {
            "start_time_ms": int(start_wall_s * 1000),
            "end_time_ms": int((start_wall_s + elapsed) * 1000),
            "records": self.count,
            "bytes": self.bytes,
            "mb": round(mb, 4),
            "mb_per_sec": round(mb / elapsed, 4),
            "records_per_sec": round(self.count / elapsed, 1),
            "rebalance_time_ms": int(rebalance_s * 1000),
            "fetch_time_ms": int(fetch_s * 1000),
            "fetch_mb_per_sec": round(mb / fetch_s, 4),
            "fetch_records_per_sec": round(self.count / fetch_s, 1),
        }
