"""Our trio producer's mirror-facing features against a real broker process:

- a producer that claims partitions is fenced per partition: a partition it wrote under its
  own id (it was empty when claimed) and that another writer then claimed fails its own
  records only, never the producer (before: the whole producer went fatal, and every later
  claim of the mirror worker failed: a stalled flow);
- a record produced with its own codec lands alone in a zstd batch, and one larger than
  max.request.size uncompressed is accepted that way;
- batches queued for a topic that is deleted and created again before they are sent are
  failed (UNKNOWN_TOPIC_ID), never written into the new topic (KIP-516).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import pytest
import trio

from cluster.client.admin import Admin
from cluster.client.errors import KafkaError, ProducerFenced
from cluster.client.producer import DeliveryFuture, Producer
from cluster.protocol.errors import ErrorCode
from cluster.protocol.records import CODEC_IDS
from tests.harness import BrokerProcess
from tests.interop.common import read_disk_batches

pytestmark = pytest.mark.timeout(120)
T = TypeVar("T")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("producer-claims") / "broker").start()
    yield proc
    proc.stop()


def run(main: Callable[[], Awaitable[T]], timeout_s: float = 60.0) -> T:
    async def bounded() -> T:
        with trio.fail_after(timeout_s):
            return await main()

    return trio.run(bounded)


def conf(bs: str, **extra: object) -> dict[str, object]:
    return {"bootstrap.servers": bs, "acks": "all", "enable.idempotence": True, "linger.ms": 2, **extra}


async def create(bs: str, topic: str, partitions: int) -> None:
    async with Admin(bs) as admin:
        await admin.create_topic(topic, partitions, 1, {})
        with trio.fail_after(20):
            while True:
                (desc,) = await admin.describe_topic_partitions([topic])
                if desc["error_code"] == 0 and all(p["leader"] >= 0 for p in desc["partitions"]):
                    return
                await trio.sleep(0.05)


def test_a_claiming_producer_is_fenced_per_partition_even_where_it_wrote_under_its_own_id(
        broker: BrokerProcess) -> None:
    bs = broker.bootstrap
    topic = "claims-own-id"

    async def main() -> None:
        await create(bs, topic, 2)
        async with Producer(conf(bs)) as a, Producer(conf(bs)) as b:
            await a.flush()
            a.claim(topic, 0, -1, -1)  # empty: nothing to fence, written under a's own id
            for p in (0, 1):
                await (await a.send(topic, b"a-first", partition=p)).wait()
            pid, epoch = a.producer_identity
            # b takes partition 0 over, as a mirror worker does: a's id with a higher epoch.
            b.claim(topic, 0, pid, epoch + 1)
            await (await b.send(topic, b"b-took-over", partition=0)).wait()
            late: DeliveryFuture = await a.send(topic, b"a-late", partition=0)
            with pytest.raises(ProducerFenced):
                await late.wait()
            # Partition 1 is still a's; the producer is not failed.
            meta = await (await a.send(topic, b"a-still", partition=1)).wait()
            assert (meta.partition, meta.offset) == (1, 1)
            with pytest.raises(ProducerFenced):
                a.produce(topic, b"a-again", partition=0)
            await a.flush()  # nothing left waiting on the fenced partition

    run(main)


def test_a_record_with_its_own_codec_is_written_alone_compressed(broker: BrokerProcess) -> None:
    bs = broker.bootstrap
    topic = "claims-codec"
    big = b"pageview " * 300_000  # 2.7 MB raw, larger than max.request.size (1 MiB)

    async def main() -> None:
        await create(bs, topic, 1)
        async with Producer(conf(bs, **{"linger.ms": 50})) as p:
            small = [await p.send(topic, b"small-%d" % i, partition=0) for i in range(3)]
            with pytest.raises(KafkaError) as refused:
                p.produce(topic, big, partition=0)
            assert refused.value.code == ErrorCode.message_too_large
            packed = await p.send(topic, big, partition=0, compression="zstd")
            after = await p.send(topic, b"after", partition=0)
            await p.flush()
            offsets = [(await f.wait()).offset for f in [*small, packed, after]]
            assert offsets == [0, 1, 2, 3, 4]

    run(main)
    batches = read_disk_batches(broker.data_dir, topic, 0)
    codecs = [(b.base_offset, b.records_count, b.codec) for b in batches]
    assert codecs == [(0, 3, 0), (3, 1, CODEC_IDS["zstd"]), (4, 1, 0)], codecs


def test_batches_queued_for_a_topic_created_again_are_failed_not_written_into_the_new_one(
        broker: BrokerProcess) -> None:
    bs = broker.bootstrap
    topic = "claims-incarnation"

    async def main() -> None:
        await create(bs, topic, 1)
        async with Producer(conf(bs, **{"linger.ms": 60_000})) as p:
            await p.cluster.refresh({topic})
            queued = [await p.send(topic, b"old-%d" % i, partition=0) for i in range(5)]
            async with Admin(bs) as admin:
                await admin.delete_topic(topic)
                with trio.fail_after(20):
                    while True:
                        try:
                            await admin.create_topic(topic, 1, 1, {})
                            break
                        except KafkaError:
                            await trio.sleep(0.1)
            with trio.fail_after(20):
                while True:
                    await p.cluster.refresh({topic})
                    if p.cluster.metadata.leader(topic, 0) >= 0:
                        break
                    await trio.sleep(0.1)
            await p.flush()
            for f in queued:
                with pytest.raises(KafkaError) as failed:
                    await f.wait()
                assert failed.value.code == ErrorCode.unknown_topic_id
            sent = await p.send(topic, b"new", partition=0)
            await p.flush()
            meta = await sent.wait()
            assert meta.offset == 0  # the new topic holds only what was sent for it

    run(main)
