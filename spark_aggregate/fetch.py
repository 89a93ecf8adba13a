"""Reading one offset range of one partition from its leader (trio), and a synchronous
iterator over it for Spark's Python workers.

The fetcher keeps the next Fetch going while the caller turns the previous answer into
Arrow (a bounded channel between them). Only committed records arrive: the broker answers
consumer fetches up to the high watermark, read_committed fetches (the source's default) up
to the last stable offset, and the batches of aborted transactions are cut out of a chunk
here (`iter_committed`, the consumer's rule) so the column builders see data batches only. A leader that moves or dies is followed
(metadata refresh and retry, the client's `leader_request`); a range whose records are
not there yet (a new leader's high watermark catching up) is waited for up to
`poll_timeout_s`. Offsets deleted by retention while the range is read are data loss.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import trio

from cluster.client.config import ClientConfig, consumer_config, isolation_level
from cluster.client.connection import KafkaConnectionError
from cluster.client.errors import METADATA_ERRORS, KafkaError
from cluster.client.metadata import ClientCluster
from cluster.client.sync import TrioThread
from cluster.protocol.api_keys import ApiKey
from cluster.protocol.errors import ErrorCode
from cluster.protocol.record_batch import InvalidRecordBatch, iter_committed, scan_batches
from cluster.protocol.sentinels import (
    CONSUMER_REPLICA_ID,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
)
from spark_aggregate.ranges import DataLossError, Gap, OffsetRange, data_loss_message

log = logging.getLogger("dcmirror.spark.fetch")

PREFETCH_CHUNKS = 2  # fetched answers waiting to be decoded (each at most max.partition.fetch.bytes)
FETCH_MAX_WAIT_MS = 500
MAX_FETCH_BYTES = 128 << 20  # a single batch larger than this is refused by the broker anyway


@dataclass(frozen=True)
class Chunk:
    """Whole batches fetched from `fetch_offset`; the records below `next_offset` are in it."""

    data: bytes
    fetch_offset: int
    next_offset: int


class RangeGap(Exception):
    """Offsets of the range were deleted while it was being read (failOnDataLoss=false: the
    reader skips them and reports the gap)."""


class FetchClient:
    """What every range an executor process reads with one client config shares: the
    cluster's metadata and one connection per broker (use as `async with`, in a TrioThread).
    A load of 5,000 partitions read a range per partition, and each one started a thread,
    asked for metadata and connected anew: most of a 40-second staging job."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = consumer_config(config)
        self.cluster = ClientCluster(self.config)
        self._nursery: trio.Nursery | None = None
        self._nursery_cm: Any = None

    async def __aenter__(self) -> FetchClient:
        self._nursery_cm = trio.open_nursery()
        self._nursery = await self._nursery_cm.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()
        await self._nursery_cm.__aexit__(None, None, None)
        await self.cluster.aclose()

    def start(self, r: OffsetRange, *, poll_timeout_s: float, fail_on_data_loss: bool) -> RangeFetcher:
        """A fetcher of `r`, running until its range is read or stop()."""
        assert self._nursery is not None
        fetcher = RangeFetcher(self.cluster, self.config, r, poll_timeout_s=poll_timeout_s,
                               fail_on_data_loss=fail_on_data_loss)
        self._nursery.start_soon(fetcher.run)
        return fetcher


class RangeFetcher:
    """Fetches one range into a bounded channel (started by FetchClient.start)."""

    def __init__(self, cluster: ClientCluster, config: ClientConfig, r: OffsetRange, *, poll_timeout_s: float,
                 fail_on_data_loss: bool) -> None:
        self.config = config
        self.cluster = cluster
        self.range = r
        self.isolation_level = isolation_level(self.config)
        self.poll_timeout_s = poll_timeout_s
        self.fail_on_data_loss = fail_on_data_loss
        self.gaps: list[Gap] = []
        self._send, self._receive = trio.open_memory_channel[Chunk | BaseException | None](PREFETCH_CHUNKS)
        self._scope = trio.CancelScope()

    async def run(self) -> None:
        with self._scope:
            try:
                await self._run()
            except Exception as exc:  # noqa: BLE001 - the reader raises it; the shared client goes on
                await self._send.send(exc)

    def stop(self) -> None:
        self._scope.cancel()

    async def next_chunk(self) -> Chunk | None:
        """The next fetched chunk in offset order; None after the range's end."""
        item = await self._receive.receive()
        if isinstance(item, BaseException):
            raise item
        return item

    async def _run(self) -> None:
        try:
            await self._fetch_all()
        except (KafkaError, KafkaConnectionError, DataLossError, InvalidRecordBatch, TimeoutError) as exc:
            await self._send.send(exc)
        else:
            await self._send.send(None)

    async def _fetch_all(self) -> None:
        r = self.range
        position = r.start
        max_bytes = self.config["max.partition.fetch.bytes"]
        waited_since: float | None = None
        read_replica = -1  # KIP-392: the follower the leader sent this reader to (-1: the leader)
        while position < r.end:
            body = {
                "replica_id": CONSUMER_REPLICA_ID, "max_wait": FETCH_MAX_WAIT_MS, "min_bytes": 1,
                "max_bytes": max_bytes, "isolation_level": self.isolation_level, "session_id": 0,
                "session_epoch": -1, "forgotten_topics_data": [], "rack_id": self.config["client.rack"],
                "topics": [{"topic": r.topic, "partitions": [{
                    "partition": r.partition, "current_leader_epoch": -1, "fetch_offset": position,
                    "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": max_bytes}]}]}
            try:
                if read_replica >= 0:
                    resp = await (await self.cluster.connection(read_replica)).request(ApiKey.FETCH, body)
                else:
                    resp = await self.cluster.leader_request(r.topic, r.partition, ApiKey.FETCH, body)
            except (KafkaConnectionError, KafkaError) as exc:
                if read_replica >= 0:
                    read_replica = -1  # back to the leader
                    continue
                # Every broker tried is down or no leader is elected yet: keep trying a while.
                waited_since = self._waiting(waited_since, str(exc))
                await trio.sleep(0.5)
                continue
            p = resp.responses[0].partitions[0]
            if read_replica >= 0 and p.error_code:
                read_replica = -1  # the follower cannot serve this: the leader answers (and may send us back)
                continue
            preferred = getattr(p, "preferred_read_replica", -1)
            if not p.error_code and preferred >= 0 and read_replica < 0:
                if preferred not in self.cluster.metadata.brokers:
                    await self.cluster.refresh({r.topic})  # a broker this reader has not seen yet
                read_replica = preferred if preferred in self.cluster.metadata.brokers else -1
                if read_replica < 0:
                    await trio.sleep(0.2)
                continue
            if p.error_code == ErrorCode.offset_out_of_range:
                log_start, high_watermark = await self._offsets()
                if position < log_start:
                    position = self._lost(position, log_start)
                    continue
                waited_since = self._waiting(waited_since, f"the high watermark is {high_watermark}")
                await trio.sleep(0.1)
                continue
            if p.error_code in METADATA_ERRORS or p.error_code == ErrorCode.not_leader_or_follower:
                waited_since = self._waiting(waited_since, str(KafkaError("fetch", p.error_code)))
                await trio.sleep(0.2)
                continue
            if p.error_code:
                raise KafkaError(f"reading {r}", p.error_code)
            data = bytes(p.records or b"")
            span = scan_batches(data, strict=True)
            used, next_offset = span.end, max(position, span.next_offset)
            if next_offset <= position:
                if data and max_bytes < MAX_FETCH_BYTES:
                    max_bytes = min(2 * max_bytes, MAX_FETCH_BYTES)  # one batch is bigger than a fetch
                    continue
                # Not committed yet: a new leader's high watermark is catching up (the fetch
                # long-polls, so this loop does not spin).
                waited_since = self._waiting(waited_since, f"the high watermark is {p.high_watermark}")
                continue
            waited_since = None
            data = data[:used]
            if p.aborted_transactions:
                data = without_aborted(data, [(a.producer_id, a.first_offset) for a in p.aborted_transactions])
            await self._send.send(Chunk(data, position, next_offset))
            position = next_offset

    async def _offsets(self) -> tuple[int, int]:
        r = self.range
        out = []
        for ts in (EARLIEST_TIMESTAMP, LATEST_TIMESTAMP):
            resp = await self.cluster.leader_request(r.topic, r.partition, ApiKey.LIST_OFFSETS, {
                "replica_id": CONSUMER_REPLICA_ID, "isolation_level": self.isolation_level,
                "topics": [{"name": r.topic, "partitions": [{"partition_index": r.partition, "timestamp": ts,
                                                             "current_leader_epoch": -1}]}]})
            p = resp.topics[0].partitions[0]
            if p.error_code:
                raise KafkaError(f"listing offsets of {r.topic}-{r.partition}", p.error_code)
            out.append(int(p.offset))
        return out[0], out[1]

    def _lost(self, position: int, log_start: int) -> int:
        r = self.range
        gap = Gap(r.topic, r.partition, position, min(log_start, r.end), log_start)
        if self.fail_on_data_loss:
            raise DataLossError(data_loss_message(gap))
        log.warning("skipping %s", gap.describe())
        self.gaps.append(gap)
        return min(log_start, r.end)

    def _waiting(self, since: float | None, why: str) -> float:
        now = trio.current_time()
        if since is None:
            return now
        if now - since > self.poll_timeout_s:
            raise TimeoutError(f"{self.range}: no records arrived for {self.poll_timeout_s:g} s "
                               f"(pollTimeoutMs); {why}")
        return since


def without_aborted(data: bytes, aborted: list[tuple[int, int]]) -> bytes:
    """The whole batches of `data` a read_committed consumer keeps (no markers, no batches of
    the aborted transactions), concatenated."""
    return b"".join(data[pos:pos + header.size_bytes] for pos, header in iter_committed(data, aborted))


# The fetch clients of this process by client config, most recently used last (each a trio
# thread with its connections; Spark reuses a Python worker for task after task).
_fetch_clients: OrderedDict[str, TrioThread] = OrderedDict()
_fetch_clients_lock = threading.Lock()
FETCH_CLIENTS_MAX = 4


def fetch_client(config: Mapping[str, Any]) -> TrioThread:
    """This process's FetchClient for `config` (in its trio thread), made at first use."""
    key = repr(sorted((str(k), repr(v)) for k, v in config.items()))
    with _fetch_clients_lock:
        thread = _fetch_clients.get(key)
        if thread is not None and thread.alive:
            _fetch_clients.move_to_end(key)
            return thread
        thread = TrioThread(lambda: FetchClient(config), "dcmirror-range-fetcher")
        _fetch_clients[key] = thread
        while len(_fetch_clients) > FETCH_CLIENTS_MAX:
            _, oldest = _fetch_clients.popitem(last=False)
            oldest.close()
        return thread


def read_chunks(config: Mapping[str, Any], r: OffsetRange, *, poll_timeout_s: float = math.inf,
                fail_on_data_loss: bool = True, gaps: list[Gap] | None = None) -> Iterator[Chunk]:
    """The chunks of range `r`, synchronously (the fetcher runs in this process's trio thread
    for `config`, shared by every range read with it). Gaps skipped with
    fail_on_data_loss=False are appended to `gaps`."""
    thread = fetch_client(config)
    client: FetchClient = thread.client
    fetcher: RangeFetcher = thread.run_sync(client.start, r, poll_timeout_s=poll_timeout_s,
                                            fail_on_data_loss=fail_on_data_loss)
    try:
        while True:
            chunk = thread.run(fetcher.next_chunk)
            if chunk is None:
                break
            yield chunk
        if gaps is not None:
            gaps.extend(fetcher.gaps)
    finally:
        thread.run_sync(fetcher.stop)
