"""A load's write step: offset ranges into Parquet table files in staging, run in Spark
tasks (the parts that need no Spark; spark_aggregate/load.py drives them).

Each task reads one offset range from the partition's leader (spark_aggregate/fetch.py,
columns.py), turns the records into table rows (`table_batch`: provenance columns, source
datacenter, event date; fence records dropped) and writes them with Arrow's Parquet writer
straight into the staging directory, one file per range and table partition:

    <staging>/<table>/source_dc=<dc>/event_date=<yyyy-mm-dd>/p<partition>-o<start>.parquet

A file is written under a hidden name and renamed once complete, and its name depends only
on its range, so a task that runs again (Spark's retry, or a re-run of an interrupted load)
replaces its own files and never adds a second copy. A task answers with its counts (rows,
payload bytes, files, gaps), which the driver records.

Why not Spark's writer: on two cores the JVM's Parquet writer with partitionBy (it sorts
every row by the partition columns first) tops out near 170k of these rows a second, while
the task that decoded the records writes them with Arrow at over 500k
(tests/perf/test_load.py). Topics with a declared JSON schema, and warehouses on a
filesystem Arrow cannot open, still go through Spark's writer (`from_json` is Spark's),
fed by the same `table_batch`.
"""

from __future__ import annotations

import secrets
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_aggregate.columns import HEADER_TYPE, TIMESTAMP_TYPE, repeated_string
from spark_aggregate.options import ReadOptions
from spark_aggregate.ranges import Gap, OffsetRange
from spark_aggregate.settings import UNKNOWN_DATACENTER
from spark_aggregate.typed import DEAD_LETTER_SCHEMA, TypedTable, decode_keys, decode_rows

# The tables' columns: name, Spark DDL type, Arrow type (the Parquet files' schema). A table
# created before a column was added here gains it when a load next ensures the table
# (load.py: ALTER TABLE ... ADD COLUMNS, after its existing data columns); Parquet files
# written before have no such column and read it as NULL (source_topic_id and
# source_leader_epoch came after source_offset).
TABLE_COLUMNS: tuple[tuple[str, str, pa.DataType], ...] = (
    ("key", "BINARY", pa.binary()),
    ("value", "BINARY", pa.binary()),
    ("headers", "ARRAY<STRUCT<key: STRING, value: BINARY>>", HEADER_TYPE),
    ("timestamp", "TIMESTAMP", TIMESTAMP_TYPE),
    ("timestamp_type", "INT", pa.int32()),
    ("kafka_partition", "INT", pa.int32()),
    ("kafka_offset", "BIGINT", pa.int64()),
    ("source_cluster", "STRING", pa.string()),
    ("source_partition", "INT", pa.int32()),
    ("source_offset", "BIGINT", pa.int64()),
    ("source_topic_id", "STRING", pa.string()),
    ("source_leader_epoch", "INT", pa.int32()),
    ("load_id", "STRING", pa.string()),
)
PARTITION_COLUMNS: tuple[tuple[str, str, pa.DataType], ...] = (
    ("source_dc", "STRING", pa.string()),
    ("event_date", "DATE", pa.date32()),
)
DATA_SCHEMA = pa.schema([pa.field(name, kind) for name, _, kind in TABLE_COLUMNS])
ROW_SCHEMA = pa.schema([*DATA_SCHEMA, *(pa.field(name, kind) for name, _, kind in PARTITION_COLUMNS)])
# Hive's name for a NULL partition value (Spark's ExternalCatalogUtils.DEFAULT_PARTITION_NAME).
DEFAULT_PARTITION_NAME = "__HIVE_DEFAULT_PARTITION__"
# Characters Spark escapes in partition directory names (ExternalCatalogUtils.charToEscape).
_ESCAPED = frozenset(chr(c) for c in range(0x20)) | frozenset('"#%\'*/:=?\\\x7f{[]^')
TASK_RESULT_DDL = "task INT, rows BIGINT, bytes BIGINT, files INT, gaps STRING, dead_letters BIGINT"
# Parquet files a task writes at once: one per table partition (source_dc, event_date) its
# ranges touch. A range spanning more days than this (a backfill) is refused with advice
# rather than running the worker out of file descriptors.
MAX_OPEN_FILES_PER_TASK = 256
# Ranges of one table that one Spark task writes one after another share their Parquet files
# up to this many offsets: a load of 5,000 partitions with a few records each wrote 5,000
# files of 40 rows (and publishing them cost a minute of filesystem calls through Py4J).
SHARED_FILE_OFFSETS_MAX = 1_000_000


class TooManyTablePartitions(Exception):
    """A task's range would write more table partitions at once than MAX_OPEN_FILES_PER_TASK."""


def hidden_path(path: str, attempt: str) -> str:
    """Where `path` is written before it is complete: a name Spark and Hive skip (leading
    "."), unique per attempt, renamed to `path` when whole."""
    directory, _, name = path.rpartition("/")
    return f"{directory}/.{name}.{attempt}.inprogress"


def _discard(filesystem: Any, path: str) -> None:
    try:
        filesystem.delete_file(path)
    except Exception:  # noqa: BLE001 - the error being raised matters more
        pass


def escape_partition_value(value: str | None) -> str:
    """A partition value as Spark names its directory (`=`, `/`, ... as %XX)."""
    if value is None or value == "":
        return DEFAULT_PARTITION_NAME
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in value)


def unescape_partition_value(name: str) -> str | None:
    return None if name == DEFAULT_PARTITION_NAME else urllib.parse.unquote(name)


@dataclass(frozen=True)
class RowContext:
    """What table rows need besides the records."""

    source: str
    """The loaded cluster: the source of records that carry no provenance."""
    datacenters: tuple[tuple[str, str], ...]
    """(cluster, datacenter) pairs."""
    load_id: str


def table_batch(batch: pa.RecordBatch, ctx: RowContext) -> pa.RecordBatch:
    """Records (the data source's columns with headers and provenance) -> table rows with
    the partition columns last; fence records are dropped.

    A row's source identity is (source_cluster, source_topic_id, source_partition,
    source_offset), with source_leader_epoch telling apart the two copies of an offset an
    unclean election leaves in the aggregate. Records without provenance (produced into the
    loaded cluster itself) get the loaded cluster and their own partition and offset, and
    NULL topic id and leader epoch, as do records mirrored before workers wrote those headers.
    """
    fence = batch.column("fence")
    if fence.true_count:
        batch = batch.filter(pc.invert(fence))
    n = batch.num_rows
    cluster = batch.column("sourceCluster")
    no_provenance = pc.is_null(cluster)
    if cluster.null_count == 0:
        source_cluster, source_partition, source_offset = \
            cluster, batch.column("sourcePartition"), batch.column("sourceOffset")
    else:
        source_cluster = pc.fill_null(cluster, ctx.source)
        source_partition = pc.if_else(no_provenance, batch.column("partition"), batch.column("sourcePartition"))
        source_offset = pc.if_else(no_provenance, batch.column("offset"), batch.column("sourceOffset"))
    names = pa.array([c for c, _ in ctx.datacenters], pa.string())
    dcs = pa.array([dc for _, dc in ctx.datacenters] + [UNKNOWN_DATACENTER], pa.string())
    index = pc.fill_null(pc.index_in(source_cluster, value_set=names), len(ctx.datacenters))
    return pa.RecordBatch.from_arrays([
        batch.column("key"), batch.column("value"), batch.column("headers"), batch.column("timestamp"),
        batch.column("timestampType"), batch.column("partition"), batch.column("offset"),
        source_cluster, source_partition, source_offset, batch.column("sourceTopicId"),
        batch.column("sourceLeaderEpoch"), repeated_string(ctx.load_id, n),
        dcs.take(index), pc.cast(batch.column("timestamp"), pa.date32()),
    ], schema=ROW_SCHEMA)


def by_table_partition(rows: pa.RecordBatch, data_columns: list[str] | None = None
                       ) -> Iterator[tuple[str, pa.RecordBatch]]:
    """Table rows grouped by their partition directory (source_dc=.../event_date=...),
    without the partition columns (they are in the directory names)."""
    data = rows.select(DATA_SCHEMA.names if data_columns is None else data_columns)
    dc, day = rows.column("source_dc"), rows.column("event_date")
    if not rows.num_rows:
        return
    pairs = pa.RecordBatch.from_arrays([dc, day], ["dc", "day"])
    keys = pa.Table.from_batches([pairs]).group_by(["dc", "day"]).aggregate([]).to_pylist()
    for key in keys:
        folder = (f"source_dc={escape_partition_value(key['dc'])}/"
                  f"event_date={escape_partition_value(None if key['day'] is None else key['day'].isoformat())}")
        if len(keys) == 1:
            yield folder, data
            continue
        mask = pc.and_kleene(_equal(dc, key["dc"]), _equal(day, key["day"]))
        yield folder, data.filter(mask)


def _equal(column: pa.Array, value: Any) -> pa.Array:
    return pc.is_null(column) if value is None else pc.fill_null(pc.equal(column, value), False)


@dataclass(frozen=True)
class StageTask:
    """One range into one table's staging directory (a path in `filesystem_uri`'s filesystem);
    a typed topic's task also decodes values (typed.py) and stages poison records into
    `dead_letter_dir`."""

    range: OffsetRange
    table_dir: str
    typed: TypedTable | None = None
    dead_letter_dir: str = ""

    @property
    def file_name(self) -> str:
        return f"p{self.range.partition}-o{self.range.start}.parquet"


@dataclass
class TaskResult:
    rows: int = 0
    size_bytes: int = 0
    """Payload: key and value bytes."""
    files: int = 0
    gaps: list[Gap] = field(default_factory=list)
    dead_letters: int = 0


def payload_bytes(rows: pa.RecordBatch) -> int:
    """Key and value bytes of table rows."""
    return sum(pc.sum(pc.binary_length(rows.column(name))).as_py() or 0 for name in ("key", "value"))


def table_batches(task: StageTask, options: ReadOptions, ctx: RowContext,
                  gaps: list[Gap] | None = None) -> Iterator[pa.RecordBatch]:
    """The task's table rows (partition columns included), batch by batch."""
    from spark_aggregate.source import read_range

    for batch in read_range(options, task.range, gaps=gaps):
        rows = table_batch(batch, ctx)
        if rows.num_rows:
            yield rows


class PartitionWriters:
    """One Parquet writer per table partition directory under `table_dir`, each file written
    under a hidden name and renamed into place by close() (or discarded by abort())."""

    def __init__(self, filesystem: Any, table_dir: str, file_name: str, schema: pa.Schema, attempt: str,
                 where: OffsetRange, max_open_files: int) -> None:
        self.filesystem = filesystem
        self.table_dir = table_dir
        self.file_name = file_name
        self.schema = schema
        self.attempt = attempt
        self.where = where
        self.max_open_files = max_open_files
        self.writers: dict[str, tuple[Any, Any, str, str]] = {}

    def write(self, rows: pa.RecordBatch) -> None:
        import pyarrow.parquet as pq

        for folder, part in by_table_partition(rows, self.schema.names):
            if folder not in self.writers:
                if len(self.writers) >= self.max_open_files:
                    raise TooManyTablePartitions(
                        f"{self.where} holds records of more than {self.max_open_files} source_dc/event_date "
                        "table partitions (a backfill spanning many days); load it in smaller steps: "
                        "set maxOffsetsPerLoad in the warehouse config")
                directory = f"{self.table_dir}/{folder}"
                self.filesystem.create_dir(directory, recursive=True)
                final = f"{directory}/{self.file_name}"
                tmp = hidden_path(final, self.attempt)
                stream = self.filesystem.open_output_stream(tmp)
                self.writers[folder] = (pq.ParquetWriter(stream, self.schema, compression="snappy"), stream, tmp,
                                        final)
            self.writers[folder][0].write_batch(part)

    def close(self) -> int:
        for writer, stream, tmp, final in self.writers.values():
            writer.close()
            stream.close()
            self.filesystem.move(tmp, final)
        return len(self.writers)

    def abort(self) -> None:
        for writer, stream, tmp, _ in self.writers.values():
            try:
                writer.close()
                stream.close()
            except Exception:  # noqa: BLE001 - the error being raised matters more
                pass
            _discard(self.filesystem, tmp)


def write_task(task: StageTask, options: ReadOptions, ctx: RowContext, filesystem: Any, *,
               max_open_files: int = MAX_OPEN_FILES_PER_TASK) -> TaskResult:
    """Read the task's range and write its Parquet files (each whole or not at all)."""
    return write_tasks([task], options, ctx, filesystem, max_open_files=max_open_files)[0]


def write_tasks(tasks: Sequence[StageTask], options: ReadOptions, ctx: RowContext, filesystem: Any, *,
                max_open_files: int = MAX_OPEN_FILES_PER_TASK,
                shared_file_offsets_max: int = SHARED_FILE_OFFSETS_MAX) -> list[TaskResult]:
    """Read each task's range and write its rows; consecutive tasks of one table share their
    files (named after the first one's range, so a retried Spark task writes the same names)
    up to `shared_file_offsets_max` offsets. A result per task; a file's count goes to the
    task whose rows closed it."""
    results: list[TaskResult] = []
    shared: _SharedFiles | None = None
    try:
        for task in tasks:
            if shared is not None and not shared.takes(task, shared_file_offsets_max):
                results[-1].files += shared.close()
                shared = None
            if shared is None:
                shared = _SharedFiles(task, filesystem, max_open_files)
            results.append(shared.write(task, options, ctx))
        if shared is not None:
            results[-1].files += shared.close()
            shared = None
    except BaseException:
        if shared is not None:
            shared.abort()
        raise
    return results


class _SharedFiles:
    """The table (and dead-letter) files a run of tasks of one table writes."""

    def __init__(self, first: StageTask, filesystem: Any, max_open_files: int) -> None:
        self.first = first
        self.offsets = 0
        attempt = secrets.token_hex(4)
        typed = first.typed
        schema = DATA_SCHEMA if typed is None else pa.schema([*DATA_SCHEMA, *typed.output_schema])
        self.tables = PartitionWriters(filesystem, first.table_dir, first.file_name, schema, attempt, first.range,
                                       max_open_files)
        self.dead = PartitionWriters(filesystem, first.dead_letter_dir, first.file_name, DEAD_LETTER_SCHEMA, attempt,
                                     first.range, max_open_files)

    def takes(self, task: StageTask, offsets_max: int) -> bool:
        return (task.table_dir == self.first.table_dir and task.dead_letter_dir == self.first.dead_letter_dir
                and task.typed is self.first.typed and self.offsets + task.range.size <= offsets_max)

    def write(self, task: StageTask, options: ReadOptions, ctx: RowContext) -> TaskResult:
        result = TaskResult()
        self.offsets += task.range.size
        self.tables.where = self.dead.where = task.range
        typed = task.typed
        for rows in table_batches(task, options, ctx, result.gaps):
            if typed is not None:
                rows, poison = decode_rows(typed, rows, ctx.load_id, [c for c, *_ in PARTITION_COLUMNS])
                if poison.num_rows:
                    result.dead_letters += poison.num_rows
                    self.dead.write(poison)
                if typed.key is not None:
                    rows, poison = decode_keys(typed, rows, ctx.load_id, [c for c, *_ in PARTITION_COLUMNS])
                    if poison.num_rows:
                        result.dead_letters += poison.num_rows
                        self.dead.write(poison)
            result.rows += rows.num_rows
            result.size_bytes += payload_bytes(rows)
            self.tables.write(rows)
        return result

    def close(self) -> int:
        return self.tables.close() + self.dead.close()

    def abort(self) -> None:
        self.tables.abort()
        self.dead.abort()


def filesystem_of(uri: str) -> tuple[Any, str] | None:
    """(Arrow filesystem, path) for a warehouse URI (Hadoop's "file:/x" spelling too), or
    None when Arrow cannot open it (then Spark's writer is used)."""
    import pyarrow.fs

    if uri.startswith("file:/") and not uri.startswith("file://"):
        uri = "file://" + uri[len("file:"):]
    try:
        return pyarrow.fs.FileSystem.from_uri(uri)  # type: ignore[no-any-return]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError, ValueError):
        return None


def write_file_atomically(filesystem: Any, path: str, table: pa.Table) -> None:
    """One Parquet file that appears whole or not at all (a hidden name renamed into place)."""
    import pyarrow.parquet as pq

    tmp = hidden_path(path, secrets.token_hex(4))
    try:
        pq.write_table(table, tmp, filesystem=filesystem, compression="snappy")
        filesystem.move(tmp, path)
    except BaseException:
        _discard(filesystem, tmp)
        raise


def group_tasks(tasks: list[StageTask], groups: int) -> list[list[int]]:
    """Task indexes in `groups` Spark tasks of nearly equal offsets (largest first, each to the
    least loaded group). Every Spark task costs its Python worker ~0.3 s of start-up on a
    small machine, so a load runs about as many as it has cores, each writing several ranges."""
    load = [(0, g) for g in range(max(1, min(groups, len(tasks))))]
    out: list[list[int]] = [[] for _ in load]
    for i in sorted(range(len(tasks)), key=lambda i: (-tasks[i].range.size, i)):
        size, g = min(load)
        out[g].append(i)
        load[g] = (size + tasks[i].range.size, g)
    return [sorted(group) for group in out if group]


def write_tasks_function(tasks: list[StageTask], groups: list[list[int]], options: ReadOptions, ctx: RowContext,
                         filesystem_uri: str) -> Any:
    """mapInArrow function over spark.range(len(groups)): each id's group of tasks written,
    one result row (TASK_RESULT_DDL) per task."""
    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import orjson

        from spark_aggregate.worker import prepare_worker

        prepare_worker()
        opened = filesystem_of(filesystem_uri)
        if opened is None:
            raise OSError(f"Arrow cannot open the warehouse filesystem {filesystem_uri} on this executor")
        filesystem = opened[0]
        for batch in batches:
            ids = [i for group in batch.column(0).to_pylist() for i in groups[group]]
            for task_id, got in zip(ids, write_tasks([tasks[i] for i in ids], options, ctx, filesystem), strict=True):
                gaps = orjson.dumps([[g.topic, g.partition, g.start, g.end, g.log_start] for g in got.gaps])
                yield pa.RecordBatch.from_pylist(
                    [{"task": task_id, "rows": got.rows, "bytes": got.size_bytes, "files": got.files,
                      "gaps": gaps.decode(), "dead_letters": got.dead_letters}],
                    schema=pa.schema([pa.field("task", pa.int32()), pa.field("rows", pa.int64()),
                                      pa.field("bytes", pa.int64()), pa.field("files", pa.int32()),
                                      pa.field("gaps", pa.string()), pa.field("dead_letters", pa.int64())]))
    return run


def rows_function(tasks: list[StageTask], groups: list[list[int]], options: ReadOptions, ctx: RowContext) -> Any:
    """mapInArrow function over spark.range(len(groups)): the groups' table rows (for Spark's
    writer)."""
    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from spark_aggregate.worker import prepare_worker

        prepare_worker()
        for batch in batches:
            for task_id in (i for group in batch.column(0).to_pylist() for i in groups[group]):
                yield from table_batches(tasks[task_id], options, ctx)
    return run


def row_ddl() -> str:
    return ", ".join(f"`{name}` {ddl}" for name, ddl, _ in (*TABLE_COLUMNS, *PARTITION_COLUMNS))
