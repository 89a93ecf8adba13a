"""A small synchronous facade for callers outside trio (Spark executors, scripts, REPLs).

Each facade owns a thread running trio with the real client inside it; calls cross over
with `trio.from_thread`. Use as context managers:

    with SyncProducer({"bootstrap.servers": bs}) as p:
        p.produce("t", b"v"); p.flush()
    with SyncConsumer({"bootstrap.servers": bs, "auto.offset.reset": "earliest"}) as c:
        c.assign([("t", 0)]); batches = c.poll(1.0)
    with SyncAdmin("127.0.0.1:9092") as admin:
        admin.create_topic("t", 3, 1)
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import trio

from cluster.client.accumulator import RecordMetadata
from cluster.client.admin import Admin
from cluster.client.consumer import Consumer
from cluster.client.producer import Producer
from cluster.client.topic_partition import TopicPartition
from cluster.protocol.records import Record
from cluster.security.connector import CLIENT_SECURITY_KEYS

T = TypeVar("T")


class TrioThread:
    """A thread running trio with one async client entered as a context manager: the way
    to use any of this library's async clients (or one built on them, like the warehouse
    loader's range fetcher) from synchronous code. `run` calls into it and waits."""

    def __init__(self, factory: Callable[[], Any], name: str) -> None:
        self._factory = factory
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self.client: Any = None
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def _main(self) -> None:
        try:
            trio.run(self._run)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            if not self._ready.is_set():
                self._error = exc
        finally:
            self._ready.set()

    async def _run(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with self._factory() as client:
            self.client = client
            self._ready.set()
            await self._stop.wait()

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run an async function of the client in its trio thread and wait for the result."""
        return trio.from_thread.run(functools.partial(fn, *args, **kwargs), trio_token=self._token)

    def run_sync(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return trio.from_thread.run_sync(functools.partial(fn, *args, **kwargs), trio_token=self._token)

    @property
    def alive(self) -> bool:
        """The thread runs and its client is open."""
        return self._thread.is_alive() and self._stop is not None and not self._stop.is_set()

    def close(self, timeout_s: float = 60.0) -> None:
        if self._thread.is_alive() and self._stop is not None:
            try:
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            except trio.RunFinishedError:
                pass
            self._thread.join(timeout_s)


class SyncProducer:
    def __init__(self, config: Mapping[str, Any]) -> None:
        self._t = TrioThread(lambda: Producer(config), "dcmirror-producer")
        self.producer: Producer = self._t.client

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, **kwargs: Any) -> None:
        """Queue one record (waits for buffer space); on_delivery runs in the client's thread."""
        self._t.run(self._send, topic, value, key, **kwargs)

    async def _send(self, topic: str, value: bytes | None, key: bytes | None, *,
                    on_delivery: Callable[..., None] | None = None, **kwargs: Any) -> None:
        future = await self.producer.send(topic, value, key, **kwargs)
        if on_delivery is not None:
            self.producer._nursery.start_soon(_report, future, on_delivery)  # type: ignore[union-attr]

    def produce_many(self, topic: str, records: Iterable[tuple[bytes | None, bytes | None]]) -> None:
        """Queue many (key, value) records in one crossing into the client's thread."""
        self._t.run(self._send_many, topic, list(records))

    async def _send_many(self, topic: str, records: list[tuple[bytes | None, bytes | None]]) -> None:
        for key, value in records:
            await self.producer.send(topic, value, key)

    def send_and_wait(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                      **kwargs: Any) -> RecordMetadata:
        return self._t.run(self.producer.send_and_wait, topic, value, key, **kwargs)

    def flush(self, timeout_s: float | None = None) -> None:
        self._t.run(self.producer.flush, timeout_s)

    def close(self) -> None:
        self._t.close()

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _report(future: Any, callback: Callable[..., None]) -> None:
    try:
        metadata = await future.wait()
    except Exception as exc:  # noqa: BLE001 - delivered to the callback
        callback(None, exc)
    else:
        callback(metadata, None)


class SyncConsumer:
    def __init__(self, config: Mapping[str, Any]) -> None:
        self._t = TrioThread(lambda: Consumer(config), "dcmirror-consumer")
        self.consumer: Consumer = self._t.client

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        self._t.run_sync(self.consumer.assign, list(partitions))

    def subscribe(self, topics: Iterable[str] = (), *, pattern: str | None = None) -> None:
        self._t.run_sync(self.consumer.subscribe, list(topics), pattern=pattern)

    def poll(self, timeout_s: float = 1.0, max_records: int | None = None) -> dict[TopicPartition, list[Record]]:
        return self._t.run(self.consumer.getmany, timeout_s, max_records)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._t.run_sync(self.consumer.seek, tp, offset)

    def position(self, tp: TopicPartition) -> int | None:
        return self._t.run_sync(self.consumer.position, tp)

    def assignment(self) -> set[TopicPartition]:
        return self._t.run_sync(self.consumer.assignment)

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        self._t.run(self.consumer.commit, offsets)

    def committed(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        return self._t.run(self.consumer.committed, list(tps))

    def list_offsets(self, timestamps: Mapping[TopicPartition, int]) -> dict[TopicPartition, int | None]:
        return self._t.run(self.consumer.list_offsets, dict(timestamps))

    def close(self) -> None:
        self._t.close()

    def __enter__(self) -> SyncConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncAdmin:
    """Every `Admin` coroutine method, called synchronously."""

    def __init__(self, bootstrap: str, *, client_id: str = "dcmirror-admin",
                 config: Mapping[str, Any] | None = None) -> None:
        """`config`: client settings; its security settings (security.protocol, sasl.*,
        ssl.*) are used, consumer-only settings of a shared dict are left out."""
        security = {k: v for k, v in (config or {}).items() if k in CLIENT_SECURITY_KEYS}
        self._t = TrioThread(lambda: Admin(bootstrap, client_id=client_id, config=security), "dcmirror-admin")
        self.admin: Admin = self._t.client

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.admin, name)
        if not callable(attr):
            return attr
        return functools.partial(self._t.run, attr)

    def close(self) -> None:
        self._t.close()

    def __enter__(self) -> SyncAdmin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
