"""The `dcmirror` Spark data source (PySpark 4 Python Data Source API).

    from spark_aggregate.source import register
    register(spark)
    df = (spark.read.format("dcmirror").option("bootstrap.servers", "127.0.0.1:39092")
          .option("subscribe", "east.pageviews").load())

Planning (on the driver) asks the cluster for the topics' partitions, log start offsets and
high watermarks and turns startingOffsets/endingOffsets into one input partition per
offset range (split further with minPartitions). Each input partition is read on an
executor from the partition's leader and handed to Spark as Arrow record batches.
See spark_aggregate/options.py for the options.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from cluster.client.admin import EARLIEST, LATEST
from cluster.client.config import consumer_config, isolation_level
from cluster.client.sync import SyncAdmin
from cluster.common.config_def import InvalidConfig
from spark_aggregate.columns import new_builder, spark_schema
from spark_aggregate.fetch import read_chunks
from spark_aggregate.options import OptionError, ReadOptions, parse_options
from spark_aggregate.ranges import Gap, OffsetRange, PartitionOffsets, resolve_ranges, split_ranges
from spark_aggregate.worker import prepare_worker

log = logging.getLogger("dcmirror.spark.source")

NAME = "dcmirror"
BATCH_ROWS = 1 << 16  # rows per Arrow batch handed to Spark (bounded also by BATCH_BYTES)
BATCH_BYTES = 16 << 20


def is_internal_topic(name: str) -> bool:
    """Kafka's internal topics (__consumer_offsets, ...) are never read by a pattern."""
    return name.startswith("__")


def checked_options(raw: Any) -> ReadOptions:
    try:
        options = parse_options(dict(raw))
        consumer_config(options.client_config())
    except InvalidConfig as exc:
        raise OptionError(f"kafka.* option: {exc}") from None
    return options


class RangePartition(InputPartition):
    def __init__(self, r: OffsetRange) -> None:
        super().__init__(r)
        self.range = r


def plan_ranges(options: ReadOptions, *, timeout_ms: int = 60_000) -> list[OffsetRange]:
    """The offset ranges a read covers (empty ones included), from the cluster's metadata
    and offsets now."""
    with SyncAdmin(options.bootstrap_servers, config=options.client_config()) as admin:
        admin.admin.api_timeout_s = timeout_ms / 1000
        meta = admin.metadata(None)
        partitions: dict[str, list[int]] = {}
        for t in meta.topics:
            if t.error_code == 0:
                partitions[t.name] = sorted(p.partition_index for p in t.partitions)
        wanted: list[tuple[str, int]] = []
        where = f"the cluster at {options.bootstrap_servers}"
        if options.assign:
            for topic, partition in options.assign:
                if partition not in partitions.get(topic, []):
                    raise OptionError(f"option assign: {topic}-{partition} does not exist in {where}")
            wanted = list(options.assign)
        elif options.subscribe:
            for topic in options.subscribe:
                if topic not in partitions:
                    raise OptionError(f"option subscribe: topic {topic!r} does not exist in {where}")
                wanted += [(topic, p) for p in partitions[topic]]
        else:
            assert options.subscribe_pattern is not None
            pattern = re.compile(options.subscribe_pattern)
            wanted = [(t, p) for t, ps in partitions.items()
                      if not is_internal_topic(t) and pattern.fullmatch(t) for p in ps]
        if not wanted:
            return []
        starts = admin.list_offsets(wanted, EARLIEST)
        ends = admin.list_offsets(wanted, LATEST, isolation_level=isolation_level(options.client_config()))
    offsets = {tp: PartitionOffsets(starts[tp], ends[tp]) for tp in wanted}
    ranges, gaps = resolve_ranges(wanted, offsets, options.starting, options.ending,
                                  fail_on_data_loss=options.fail_on_data_loss)
    for gap in gaps:
        log.warning("failOnDataLoss=false: skipping %s", gap.describe())
    return ranges


def read_range(options: ReadOptions, r: OffsetRange, *, gaps: list[Gap] | None = None) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the records in range `r` (executor side); offsets deleted while it
    is read (failOnDataLoss=false) are appended to `gaps`."""
    builder = new_builder(options.include_headers, options.include_provenance)
    for chunk in read_chunks(options.client_config(), r, poll_timeout_s=options.poll_timeout_ms / 1000,
                             fail_on_data_loss=options.fail_on_data_loss, gaps=gaps):
        builder.add_chunk(chunk.data, max(r.start, chunk.fetch_offset), r.end)
        if builder.rows >= BATCH_ROWS or builder.size_bytes >= BATCH_BYTES:
            yield builder.finish(r.topic, r.partition)
            builder = new_builder(options.include_headers, options.include_provenance)
    if builder.rows:
        yield builder.finish(r.topic, r.partition)


class DcMirrorReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        ranges = split_ranges(plan_ranges(self.options), self.options.min_partitions)
        return [RangePartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        prepare_worker()
        if partition is None:  # Spark's stand-in when planning found nothing to read
            return iter(())
        assert isinstance(partition, RangePartition)
        return read_range(self.options, partition.range)


class DcMirrorDataSource(DataSource):
    """spark.read.format("dcmirror"): a batch read of offset ranges of a dcmirror (or Kafka) cluster."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        options = checked_options(self.options)
        return spark_schema(options.include_headers, options.include_provenance)

    def reader(self, schema: StructType) -> DataSourceReader:
        return DcMirrorReader(checked_options(self.options))


def register(spark: Any) -> None:
    """Make format("dcmirror") available in this Spark session."""
    spark.dataSource.register(DcMirrorDataSource)
