"""The warehouse load: what arrived in the source cluster since the last load, into one
Parquet table per topic, exactly once.

    dcmirror load --config FILE
    spark-submit --py-files dcmirror.zip spark_aggregate/job.py --config FILE

A load (load id = UTC time + random suffix):

1. plan: each wanted partition from its ledger next offset to its high watermark now
   (spark_aggregate/ledger.py); the `planned` rows go into dcmirror.loads first;
2. stage: one Spark job, a task per offset range, reads the records from the leaders and
   writes Parquet (partitioned by source_dc / event_date) to
   <warehouse>/_staging/<load id>/<table> (spark_aggregate/stage.py), replacing whatever an
   interrupted attempt left there; a `_counts.json` written last marks a topic staged (rows
   per partition, bytes, time, offsets found deleted while reading);
3. publish: every staged file is renamed into the table's partition directory as
   "<load id>-<file name>" and the partitions are added to the metastore;
4. commit: the `committed` rows go into dcmirror.loads; the staging directory is removed.

Killed anywhere, the next run first finishes the planned-but-uncommitted load with the same
id and ranges: a topic without `_counts.json` is staged again (overwriting), a staged one is
not, and publishing moves only what is still in staging, so each record reaches its table
once. Ledger rows are single-file appends, which appear whole or not at all.

A query while a load runs sees every committed load, and of a load being published the
files renamed so far (never a file twice); with the embedded metastore no query can run
during a load at all (one process at a time, see spark_aggregate/session.py).

Records without provenance headers (produced into the loaded cluster directly) get the
loaded cluster as their source cluster and their own partition and offset, and NULL
source_topic_id and source_leader_epoch (so do records mirrored before workers wrote those
headers); fence records (which a mirror worker writes when it takes over a partition) are
not data and are skipped. A source cluster the topology does not name gets source_dc
"unknown". A row's source identity is (source_cluster, source_topic_id, source_partition,
source_offset): a source topic deleted and created again starts its offsets at 0 again under
a new topic id, and after an unclean leader election the aggregate can hold one source
offset twice, the diverged copy and the source's new record, told apart by
source_leader_epoch. Exactly once holds per aggregate partition and offset (the ledger), so
a source record the mirror wrote once is one row.

Tables created by an earlier version gain the columns added since (and a topic's JSON schema
its new columns) with ALTER TABLE ... ADD COLUMNS when a load first touches them: after the
columns they had, before the partition columns; rows loaded before read them as NULL.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cluster.client.admin import EARLIEST, LATEST
from cluster.client.config import isolation_level
from cluster.client.sync import SyncAdmin
from spark_aggregate.hadoop import HadoopFs
from spark_aggregate.ledger import (
    LEDGER_COLUMNS,
    DeadLetter,
    LedgerError,
    LedgerRow,
    LoadPlan,
    finished_load_ids,
    pending_plans,
    plan_load,
    plan_reload,
)
from spark_aggregate.load_metrics import write_load_metrics
from spark_aggregate.options import ReadOptions
from spark_aggregate.ranges import Gap, OffsetRange, PartitionOffsets, cap_ranges, split_ranges
from spark_aggregate.session import embedded_error, ensure_database, exception_text
from spark_aggregate.settings import (
    DATABASE,
    LEDGER_TABLE,
    WarehouseSettings,
    table_name,
)
from spark_aggregate.stage import (
    PARTITION_COLUMNS,
    TABLE_COLUMNS,
    TASK_RESULT_DDL,
    RowContext,
    StageTask,
    filesystem_of,
    group_tasks,
    row_ddl,
    rows_function,
    unescape_partition_value,
    write_file_atomically,
    write_tasks_function,
)
from spark_aggregate.typed import (
    DEAD_LETTER_COLUMNS,
    UNKNOWN_ID_REASON,
    RegistryReader,
    SchemaError,
    TypedTable,
    context_of,
    dead_letter_table,
    plan_typed_table,
    spark_type,
)

log = logging.getLogger("dcmirror.load")

LEDGER = f"{DATABASE}.{LEDGER_TABLE}"
COUNTS_FILE = "_counts.json"
LAST_LOAD_FILE = "last_load.json"
PROGRESS_INTERVAL_S = 5.0
TopicPartition = tuple[str, int]

MAX_OFFSETS_PER_TASK = 4_000_000  # a Spark task's offsets (progress, and what a failed task reads again)


LEDGER_ARROW_TYPES = tuple({"STRING": pa.string(), "INT": pa.int32(), "BIGINT": pa.int64(),
                            "TIMESTAMP": pa.timestamp("us", tz="UTC")}[t] for _, t in LEDGER_COLUMNS)


class LoadConfigError(Exception):
    """The topology asks for something the warehouse cannot do (exit code 2)."""


@dataclass
class TopicLoad:
    topic: str
    table: str
    partitions: int
    offsets: int
    rows: int = 0
    size_bytes: int = 0
    seconds: float = 0.0


@dataclass
class LoadOutcome:
    plan: LoadPlan
    topics: list[TopicLoad] = field(default_factory=list)
    seconds: float = 0.0
    failed: dict[str, str] = field(default_factory=dict)
    """Topics of the plan that did not load (left planned in the ledger), topic -> why."""
    refused: set[str] = field(default_factory=set)
    """Of them, those whose table the topology cannot have (LoadConfigError)."""

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.topics)

    @property
    def size_bytes(self) -> int:
        return sum(t.size_bytes for t in self.topics)


class TopicsFailed(Exception):
    """Topics that did not load in a run whose other topics did (`outcomes`): each one's
    error, one per line. Their planned ranges stay in the ledger: the next run tries them
    again first, and plans nothing new for them until they load."""

    def __init__(self, failed: dict[str, str], outcomes: list[LoadOutcome]) -> None:
        super().__init__("\n".join(f"{topic}: {why}" if topic not in why else why for topic, why in failed.items()))
        self.failed = failed
        self.outcomes = outcomes


class TopicsRefused(TopicsFailed, LoadConfigError):
    """TopicsFailed where every failure is the topology asking for what cannot be done (exit 2)."""


def failure_text(exc: BaseException) -> str:
    """What a topic's failure says: the dcmirror error inside a Spark/Py4J exception (a
    task's TypedLoadError or DataLossError arrives as text), else its first line."""
    embedded = embedded_error(exc)
    if embedded is not None:
        return embedded[1]
    text = exception_text(exc)
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if isinstance(exc, (LoadConfigError, LedgerError)) else f"{type(exc).__name__}: {first}"


def new_load_id(now_s: float) -> str:
    """Sorts by time: 20261121T230512.345Z-9f3a1c."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now_s)) + f".{int(now_s * 1000) % 1000:03d}Z"
    return f"{stamp}-{secrets.token_hex(3)}"


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _sql_literal(text: str | None) -> str:
    return "NULL" if text is None else _sql_string(text)


def _ms(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp() * 1000)


def _dt(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000)


class Loader:
    """One `dcmirror load` run in a Spark session over the warehouse."""

    def __init__(self, spark: Any, settings: WarehouseSettings, out: TextIO,
                 crash_hook: Callable[[str], None] | None = None) -> None:
        self.spark = spark
        self.settings = settings
        self.out = out
        self.fs = HadoopFs(spark, settings.warehouse_uri)
        # Tests name a step here to be killed at (see tests/spark/test_load_crash.py).
        self.crash_hook = crash_hook or (lambda step: None)
        self.ledger: list[LedgerRow] = []
        self._tables: set[str] = set()  # ensured by this run
        self._locations: dict[str, str] = {}
        self._ledger_written = False  # with Arrow: Spark's cached listing of the ledger is stale
        self._typed: dict[str, TypedTable] = {}  # typed topics' registry schemas, as this run found them

    # ---- the whole run -------------------------------------------------------------

    def run(self) -> list[LoadOutcome]:
        """Finish interrupted loads, then load what is new; the outcomes (none: nothing new)."""
        ensure_database(self.spark, self.settings)
        self.ensure_ledger()
        self.ledger = self.read_ledger()
        self.clean_staging()
        outcomes = []
        for pending in pending_plans(self.ledger):
            gone = [t for t in pending.all_topics() if not self.settings.wanted(t)]
            if gone:
                # The topology no longer loads them (a datacenter removed, the topics regex
                # narrowed): they do not hold the rest back; their planned ranges stay.
                print(f"load {pending.load_id}: {', '.join(gone)} no longer loaded by this warehouse "
                      f"(topics = {self.settings.topics!r}); their planned ranges stay in {LEDGER}",
                      file=self.out, flush=True)
            rest = [t for t in pending.all_topics() if t not in gone]
            if rest:
                outcomes.append(self.execute(pending.of_topics(rest)))
        offsets, tables = self.discover()
        refused: dict[str, str] = {}
        for topic in sorted(tables):
            if self.settings.registry_schema_of(topic) is not None and not any(
                    o.high_watermark > o.log_start for (t, _), o in offsets.items() if t == topic):
                # A typed topic that never held a record may have no schema yet (a new
                # deployment's orders): its table comes with its first records.
                continue
            try:
                self.ensure_table(topic)
            except LoadConfigError as exc:
                refused[topic] = str(exc)  # this topic only: the others load
        offsets = {tp: o for tp, o in offsets.items() if tp[0] not in refused}
        now = time.time()
        plan = plan_load(self.ledger, offsets, load_id=new_load_id(now), now_ms=int(now * 1000),
                         fail_on_data_loss=self.settings.fail_on_data_loss,
                         max_offsets=self.settings.max_offsets_per_load)
        if plan is not None:
            self.append_ledger(plan.planned_rows())
            self.crash_hook("planned")
            outcomes.append(self.execute(plan))
        failed = {**refused, **{t: why for o in outcomes for t, why in o.failed.items()}}
        reload = self.plan_reload({tp: o for tp, o in offsets.items() if tp[0] not in failed})
        if reload is not None:
            self.append_ledger(reload.planned_rows())
            outcomes.append(self.execute(reload))
        if self._ledger_written:
            self.spark.sql(f"REFRESH TABLE {LEDGER}")  # for queries in this session
        failed = {**refused, **{t: why for o in outcomes for t, why in o.failed.items()}}
        if failed:
            config_only = set(failed) <= set(refused) | {t for o in outcomes for t in o.refused}
            raise (TopicsRefused if config_only else TopicsFailed)(failed, [o for o in outcomes if o.topics])
        return outcomes

    def plan_reload(self, offsets: dict[TopicPartition, PartitionOffsets]) -> LoadPlan | None:
        """The reload of dead letters whose schema id the registry knows now (ledger.plan_reload):
        the typed topics' dead-letter tables are read for unknown-id reasons."""
        dead: list[DeadLetter] = []
        for topic in sorted({t for t, _ in offsets}):
            if self.settings.registry_schema_of(topic) is None:
                continue
            name = dead_letter_table(table_name(topic))
            known = self.catalog_table(name)
            if known is None:
                continue
            try:
                dead += self.unknown_id_dead_letters(topic, name, known[0])
            except (LoadConfigError, SchemaError, OSError, pa.ArrowException) as exc:
                # A reload is a chance, never a failure: the topic's own load reports its trouble.
                log.warning("dead letters of %s not checked for a reload: %s", topic, exc)
        if not dead:
            return None

        readers: dict[str, RegistryReader] = {}  # the driver's own: a table's cache travels to the executors

        def registry_knows(d: DeadLetter) -> bool:
            try:
                typed = self.typed_table(d.topic)
            except LoadConfigError:
                return False
            side = typed.key if (typed is not None and d.key) else typed
            if side is None:
                return False
            reader = readers.setdefault(side.registry_url, RegistryReader(side.registry_url, side.access))
            try:
                return reader.schema_by_id(d.schema_id, d.context) is not None
            except SchemaError:  # the registry cannot be asked now: the next load asks again
                return False

        now = time.time()
        plan, gone = plan_reload(self.ledger, dead, registry_knows, {tp: o.log_start for tp, o in offsets.items()},
                                 load_id=new_load_id(now), now_ms=int(now * 1000))
        for topic in sorted({d.topic for d in gone}):
            lost = [d for d in gone if d.topic == topic]
            print(f"  {topic}: {len(lost):,} dead letters whose schema id the registry knows now cannot be "
                  f"reloaded: retention deleted their records from the topic (their values stay in "
                  f"{DATABASE}.{dead_letter_table(table_name(topic))}; first: partition {lost[0].partition} offset "
                  f"{lost[0].offset})", file=self.out, flush=True)
        if plan is not None:
            ids = sorted({d.schema_id for d in dead if d.topic in plan.topics()})
            print(f"reloading {plan.offsets:,} dead letters of {', '.join(plan.topics())}: the registry knows "
                  f"their schema ids now (of ids {', '.join(map(str, ids[:10]))})", file=self.out, flush=True)
        return plan

    def unknown_id_dead_letters(self, topic: str, table: str, location: str) -> list[DeadLetter]:
        """The dead letters of `topic` whose reason is an unknown schema id (value or key)."""
        typed = self.typed_table(topic)
        if typed is None:
            return []
        columns = ["kafka_partition", "kafka_offset", "schema_id", "source_cluster", "reason"]
        opened = filesystem_of(location)
        if opened is not None:
            import pyarrow.dataset as ds

            filesystem, path = opened
            dataset = ds.dataset(path, format="parquet", filesystem=filesystem)
            if "reason" not in dataset.schema.names:
                return []  # no dead letter written yet
            data = dataset.to_table(columns=columns,
                                    filter=pc.match_substring(ds.field("reason"), UNKNOWN_ID_REASON))
            found: Iterable[tuple[Any, ...]] = zip(*(data.column(c).to_pylist() for c in columns), strict=True)
        else:
            self.spark.sql(f"REFRESH TABLE {DATABASE}.{table}")
            found = ((r[0], r[1], r[2], r[3], r[4]) for r in self.spark.sql(
                f"SELECT {', '.join(columns)} FROM {DATABASE}.{table} "
                f"WHERE reason LIKE '%{UNKNOWN_ID_REASON}%'").collect())
        return [DeadLetter(topic, partition, offset, schema_id,
                           context_of(cluster, typed.loaded_cluster, typed.contexts), reason.startswith("key: "))
                for partition, offset, schema_id, cluster, reason in found if schema_id is not None]

    def discover(self) -> tuple[dict[TopicPartition, PartitionOffsets], dict[str, str]]:
        """Log start offsets and high watermarks of the wanted partitions, and topic -> table."""
        with SyncAdmin(self.settings.bootstrap, client_id="dcmirror-load", config=self.settings.kafka) as admin:
            meta = admin.metadata(None)
            partitions = [(t.name, p.partition_index) for t in meta.topics
                          if t.error_code == 0 and self.settings.wanted(t.name) for p in t.partitions]
            tables: dict[str, str] = {}
            for topic in sorted({t for t, _ in partitions}):
                table = table_name(topic)
                other = next((t for t, name in tables.items() if name == table), None)
                if other is not None:
                    raise LoadConfigError(f"topics {other!r} and {topic!r} would both load into table "
                                          f"{DATABASE}.{table}; narrow the warehouse topics regex to one of them")
                tables[topic] = table
            if not partitions:
                return {}, tables
            starts = admin.list_offsets(partitions, EARLIEST)
            ends = admin.list_offsets(partitions, LATEST,
                                      isolation_level=isolation_level(self.read_options().client_config()))
        return {tp: PartitionOffsets(starts[tp], ends[tp]) for tp in partitions}, tables

    # ---- one load ------------------------------------------------------------------

    def execute(self, plan: LoadPlan) -> LoadOutcome:
        """One load, topic by topic as far as failures go: a topic that cannot load (its
        table, its records) is left planned and named in the outcome's `failed`, the others
        commit."""
        started = time.monotonic()
        outcome = LoadOutcome(plan)
        verb = ("finishing interrupted " if plan.resumed else "") + ("reload" if plan.reload else "load")
        print(f"{verb} {plan.load_id}: {plan.offsets:,} offsets in {len(plan.ranges)} partitions of "
              f"{len(plan.topics())} topics", file=self.out, flush=True)
        for gap in plan.gaps:
            print(f"  data loss recorded (failOnDataLoss=false): {gap.describe()}", file=self.out, flush=True)
        errors: dict[str, BaseException] = {}
        for topic in plan.topics():
            try:
                self.ensure_table(topic)
            except LoadConfigError as exc:
                errors[topic] = exc
        staged = self.stage_all(plan.of_topics(t for t in plan.all_topics() if t not in errors), errors)
        for topic, error in errors.items():
            outcome.failed[topic] = failure_text(error)
            if isinstance(error, LoadConfigError):
                outcome.refused.add(topic)
            print(f"  {topic}: not loaded: {outcome.failed[topic]}", file=self.out, flush=True)
        plan = plan.of_topics(t for t in plan.all_topics() if t not in errors)
        if not plan.all_topics():
            outcome.seconds = time.monotonic() - started
            return outcome
        self.crash_hook("staged")
        for topic in plan.topics():
            self.publish(plan, topic)
        self.crash_hook("published")
        rows: dict[TopicPartition, int] = {}
        read_gaps: list[Gap] = []
        for topic, counts in staged.items():
            for partition, n in counts["rows"].items():
                rows[(topic, int(partition))] = n
            read_gaps += [Gap(*g) for g in counts.get("gaps", [])]
            if counts.get("dead_letters"):
                print(f"  {topic}: {counts['dead_letters']:,} poison records into "
                      f"{DATABASE}.{dead_letter_table(table_name(topic))}", file=self.out, flush=True)
            ranges = plan.ranges_of(topic)
            outcome.topics.append(TopicLoad(topic, f"{DATABASE}.{table_name(topic)}", len(ranges),
                                            sum(r.size for r in ranges), sum(counts["rows"].values()),
                                            counts["bytes"], counts["seconds"]))
        for gap in read_gaps:
            print(f"  data loss while reading (failOnDataLoss=false): {gap.describe()}", file=self.out, flush=True)
        self.append_ledger(plan.committed_rows(rows, int(time.time() * 1000), read_gaps))
        self.crash_hook("committed")
        self.fs.delete(self.staging_dir(plan.load_id))
        outcome.seconds = time.monotonic() - started
        return outcome

    def staging_dir(self, load_id: str, table: str | None = None) -> str:
        base = f"{self.settings.staging_uri}/{load_id}"
        return base if table is None else f"{base}/{table}"

    def stage_all(self, plan: LoadPlan, errors: dict[str, BaseException]) -> dict[str, dict[str, Any]]:
        """Every topic's ranges as Parquet in staging, topic -> counts (a topic whose
        `_counts.json` exists is staged already); a topic that cannot be staged goes into
        `errors` instead (the topics' job is run again topic by topic to find which)."""
        if len(plan.topics()) <= 1:
            try:
                return self._stage_all(plan)
            except Exception as exc:  # noqa: BLE001 - the caller decides what a failure stops
                errors.update({t: exc for t in plan.topics()})
                return {}
        try:
            return self._stage_all(plan)
        except Exception as exc:  # noqa: BLE001 - which topic it was is found below
            log.info("staging %d topics failed (%s); staging them one by one", len(plan.topics()), failure_text(exc))
        staged: dict[str, dict[str, Any]] = {}
        for topic in plan.topics():
            try:
                staged.update(self._stage_all(plan.of_topics([topic])))
            except Exception as exc:  # noqa: BLE001 - this topic only
                errors[topic] = exc
        return staged

    def _stage_all(self, plan: LoadPlan) -> dict[str, dict[str, Any]]:
        """Every topic's ranges as Parquet in staging, topic -> counts (a topic whose
        `_counts.json` exists is staged already). Arrow writes from the tasks where it can
        (spark_aggregate/stage.py); topics with a JSON schema go through Spark's writer."""
        staged: dict[str, dict[str, Any]] = {}
        todo = []
        for topic in plan.topics():
            done = self.fs.read_text(f"{self.staging_dir(plan.load_id, table_name(topic))}/{COUNTS_FILE}")
            if done is not None:
                staged[topic] = orjson.loads(done)
            else:
                todo.append(topic)
        if not todo:
            return staged
        opened = None if self.settings.writer == "spark" else filesystem_of(self.settings.staging_uri)
        if opened is None and self.settings.writer == "arrow":
            raise LoadConfigError(f"load.writer = \"arrow\", but Arrow cannot open {self.settings.staging_uri}; "
                                  "use \"spark\" or \"auto\"")
        # Typed tables (registry_schemas, which win over a [warehouse.schemas] entry) are
        # always written by the tasks with Arrow, whatever load.writer says.
        typed = [t for t in todo if self.settings.registry_schema_of(t) is not None]
        if typed and opened is None:
            opened = filesystem_of(self.settings.staging_uri)
            if opened is None:
                raise LoadConfigError(f"topic {typed[0]!r} loads into a typed table, which the Spark tasks write "
                                      f"with Arrow, and Arrow cannot open {self.settings.staging_uri}")
            direct = typed
        else:
            direct = [t for t in todo if opened is not None
                      and (self.settings.schema_of(t) is None or t in typed)]
        if direct:
            assert opened is not None
            staged.update(self.stage_direct(plan, direct, opened[1]))
        for topic in todo:
            if topic not in direct:
                staged[topic] = self.stage_with_spark(plan, topic)
        return staged

    def read_options(self) -> ReadOptions:
        s = self.settings
        return ReadOptions(bootstrap_servers=s.bootstrap, include_headers=True, include_provenance=True,
                           fail_on_data_loss=s.fail_on_data_loss, poll_timeout_ms=s.poll_timeout_ms,
                           kafka=dict(s.kafka))

    def row_context(self, load_id: str) -> RowContext:
        return RowContext(self.settings.source, tuple(sorted(self.settings.datacenters.items())), load_id)

    def parallelism(self) -> int:
        return self.settings.min_partitions or int(self.spark.sparkContext.defaultParallelism)

    def task_ranges(self, ranges: list[OffsetRange]) -> list[OffsetRange]:
        return cap_ranges(split_ranges(ranges, self.parallelism()), MAX_OFFSETS_PER_TASK)

    def groups(self, tasks: list[StageTask]) -> list[list[int]]:
        offsets = sum(t.range.size for t in tasks)
        return group_tasks(tasks, max(self.parallelism(), -(-offsets // MAX_OFFSETS_PER_TASK)))

    def stage_direct(self, plan: LoadPlan, topics: list[str], staging_path: str) -> dict[str, dict[str, Any]]:
        """One Spark job: a task per range writes its table files (stage.write_task)."""
        tasks: list[StageTask] = []
        for topic in topics:
            table = table_name(topic)
            self.fs.delete(self.staging_dir(plan.load_id, table))  # an interrupted attempt's files
            typed = self.typed_table(topic)
            dead_dir = ""
            if typed is not None:
                self.fs.delete(self.staging_dir(plan.load_id, dead_letter_table(table)))
                dead_dir = f"{staging_path}/{plan.load_id}/{dead_letter_table(table)}"
            tasks += [StageTask(r, f"{staging_path}/{plan.load_id}/{table}", typed, dead_dir)
                      for r in self.task_ranges(plan.ranges_of(topic))]
        started = time.monotonic()
        groups = self.groups(tasks)
        run = write_tasks_function(tasks, groups, self.read_options(), self.row_context(plan.load_id),
                                   self.settings.staging_uri)
        label = topics[0] if len(topics) == 1 else f"{len(topics)} topics"
        with Progress(self.spark, label, sum(t.range.size for t in tasks), self.out):
            results = self.spark.range(0, len(groups), 1, len(groups)).mapInArrow(run, TASK_RESULT_DDL).collect()
        seconds = round(time.monotonic() - started, 3)
        if sorted(r.task for r in results) != list(range(len(tasks))):
            raise LedgerError(f"load {plan.load_id}: the staging job answered for tasks "
                              f"{sorted(r.task for r in results)}, expected 0..{len(tasks) - 1}")
        self.crash_hook("stage-written")
        counts: dict[str, dict[str, Any]] = {
            t: {"rows": {str(r.partition): 0 for r in plan.ranges_of(t)}, "bytes": 0, "seconds": seconds, "gaps": [],
                "dead_letters": 0}
            for t in topics}
        for result in results:
            task = tasks[result.task]
            c = counts[task.range.topic]
            c["rows"][str(task.range.partition)] += result.rows
            c["bytes"] += result.bytes
            c["gaps"] += orjson.loads(result.gaps)
            c["dead_letters"] += result.dead_letters
        for topic in topics:
            self.fs.write_text(f"{self.staging_dir(plan.load_id, table_name(topic))}/{COUNTS_FILE}",
                               orjson.dumps(counts[topic]).decode())
        return counts

    def stage_with_spark(self, plan: LoadPlan, topic: str) -> dict[str, Any]:
        """The topic's table rows through Spark's writer (JSON schema columns by from_json)."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        table = table_name(topic)
        staging = self.staging_dir(plan.load_id, table)
        ranges = plan.ranges_of(topic)
        started = time.monotonic()
        tasks = [StageTask(r, "") for r in self.task_ranges(ranges)]
        groups = self.groups(tasks)
        df = (self.spark.range(0, len(groups), 1, len(groups))
              .mapInArrow(rows_function(tasks, groups, self.read_options(), self.row_context(plan.load_id)),
                          row_ddl()))
        ddl = self.settings.schema_of(topic)
        if ddl is not None:
            df = df.selectExpr(*(c for c, *_ in TABLE_COLUMNS),
                               f"from_json(CAST(value AS STRING), {_sql_string(ddl)}) AS __parsed",
                               *(c for c, *_ in PARTITION_COLUMNS))
            df = df.select(*(c for c, *_ in TABLE_COLUMNS), "__parsed.*", *(c for c, *_ in PARTITION_COLUMNS))
        observation = Observation(f"dcmirror-load-{table}")
        metrics = [F.expr(f"count_if(kafka_partition = {r.partition})").alias(f"p{r.partition}") for r in ranges]
        metrics += [F.expr("coalesce(sum(octet_length(key)), 0) + coalesce(sum(octet_length(value)), 0)")
                    .alias("bytes")]
        df = df.observe(observation, *metrics)
        with Progress(self.spark, topic, sum(r.size for r in ranges), self.out):
            df.write.mode("overwrite").partitionBy(*(c for c, *_ in PARTITION_COLUMNS)).parquet(staging)
        got = observation.get
        counts = {"rows": {str(r.partition): int(got[f"p{r.partition}"]) for r in ranges},
                  "bytes": int(got["bytes"]), "seconds": round(time.monotonic() - started, 3), "gaps": []}
        self.crash_hook("stage-written")
        self.fs.write_text(f"{staging}/{COUNTS_FILE}", orjson.dumps(counts).decode())
        return counts

    def publish(self, plan: LoadPlan, topic: str) -> None:
        """Move the staged files into the table (and a typed table's dead letters into its
        dead-letter table) and add their partitions to the metastore."""
        self.publish_table(plan, table_name(topic))
        if self.settings.registry_schema_of(topic) is not None:
            self.publish_table(plan, dead_letter_table(table_name(topic)))

    def publish_table(self, plan: LoadPlan, table: str) -> None:
        staging = self.staging_dir(plan.load_id, table)
        location = self.table_location(table)
        made: set[str] = set()
        for entry in self.fs.list_files(staging):
            folder, _, name = entry.relative.rpartition("/")
            target = f"{location}/{folder}/{plan.load_id}-{name}" if folder else f"{location}/{plan.load_id}-{name}"
            if folder and folder not in made:
                self.fs.mkdirs(f"{location}/{folder}")
                made.add(folder)
            if self.fs.exists(target):
                self.fs.delete(target)  # an earlier attempt's copy of the same staged file
            if not self.fs.rename(entry.path, target):
                raise OSError(f"could not move {entry.path} to {target}")
            self.crash_hook("publish-file")
        specs = []
        for dc_dir in self.fs.list_dirs(staging):
            for date_dir in self.fs.list_dirs(f"{staging}/{dc_dir}"):
                dc = unescape_partition_value(dc_dir.partition("=")[2])
                day = unescape_partition_value(date_dir.partition("=")[2])
                specs.append(f"PARTITION (source_dc = {_sql_literal(dc)}, event_date = "
                             f"{'NULL' if day is None else 'DATE ' + _sql_string(day)})")
        if specs:
            self.spark.sql(f"ALTER TABLE {DATABASE}.{table} ADD IF NOT EXISTS " + " ".join(specs))
        # Files added to partitions the table already had: drop Spark's cached listing.
        self.spark.sql(f"REFRESH TABLE {DATABASE}.{table}")

    # ---- tables and ledger -------------------------------------------------------

    def catalog_table(self, table: str) -> tuple[str, set[str]] | None:
        """(location, lower-case column names) of dcmirror.<table> from the session catalog
        (one JVM call; a SQL statement costs ~0.1 s), None if it does not exist or the
        catalog cannot be asked this way."""
        try:
            jvm = self.spark.sparkContext._jvm
            catalog = self.spark._jsparkSession.sessionState().catalog()
            ident = jvm.org.apache.spark.sql.catalyst.TableIdentifier.apply(table, jvm.scala.Option.apply(DATABASE))
            if not catalog.tableExists(ident):
                return None
            meta = catalog.getTableMetadata(ident)
            # The schema as one JSON text: iterating its Java array costs a Py4J call per column.
            fields = orjson.loads(str(meta.schema().json()))["fields"]
            return str(meta.location().toString()).rstrip("/"), {str(f["name"]).lower() for f in fields}
        except Exception:  # noqa: BLE001 - py4j errors: ask with SQL instead
            log.debug("catalog lookup of %s failed", table, exc_info=True)
            return None

    def ensure_table(self, topic: str) -> None:
        """Create the topic's table, or give the existing one the columns it lacks: table
        columns added since it was created, and new columns of the topic's JSON schema (rows
        loaded before read them as NULL)."""
        name = table_name(topic)
        table = f"{DATABASE}.{name}"
        if table in self._tables:
            return
        ddl = self.settings.schema_of(topic)
        typed = self.typed_table(topic)
        if typed is not None:
            ddl = ", ".join(f"`{c}` {spark_type(t)}" for c, t in typed.output_columns)
            self.ensure_dead_letter_table(dead_letter_table(name))
        declared = self.declared_columns(topic, ddl)
        known = self.catalog_table(name)
        if known is None:
            wanted = ", ".join(f"`{c}` {t}" for c, t, _ in TABLE_COLUMNS)
            if ddl is not None:
                wanted += ", " + ddl
            partition_ddl = ", ".join(f"`{c}` {t}" for c, t, _ in PARTITION_COLUMNS)
            self.spark.sql(f"CREATE TABLE IF NOT EXISTS {table} ({wanted}, {partition_ddl}) USING parquet "
                           f"PARTITIONED BY ({', '.join(c for c, *_ in PARTITION_COLUMNS)})")
            known = self.catalog_table(name)
        if known is not None:
            self._locations[name] = known[0]
            have = known[1]
        else:
            have = {c.lower() for c in self.spark.table(table).columns}
        new = [(c, t) for c, t, _ in TABLE_COLUMNS if c not in have]
        new += [(c, t) for c, t in declared if c.lower() not in have]
        if typed is not None:
            self.check_typed_columns(table, typed, declared)
        if new:
            log.info("table %s gains columns %s", table, ", ".join(c for c, _ in new))
            added = ", ".join(f"`{c}` {t}" for c, t in new)
            self.spark.sql(f"ALTER TABLE {table} ADD COLUMNS ({added})")
        self._tables.add(table)

    def typed_table(self, topic: str) -> TypedTable | None:
        """A typed topic's reader schemas and columns from the registry (once per run)."""
        spec = self.settings.registry_schema_of(topic)
        if spec is None:
            return None
        if topic not in self._typed:
            if self.settings.registry_url is None:
                raise LoadConfigError(f"topic {topic!r} loads into a typed table, but cluster "
                                      f"{self.settings.source!r} has no [clusters.{self.settings.source}.registry]")
            try:
                self._typed[topic] = plan_typed_table(topic, self.settings.registry_url, self.settings.source,
                                                      spec.subject, spec.poison,
                                                      access=self.settings.registry_access,
                                                      key_subject=spec.key_subject if spec.key else None,
                                                      sources=self.settings.schema_sources(topic))
            except SchemaError as exc:
                raise LoadConfigError(str(exc)) from None
        return self._typed[topic]

    def check_typed_columns(self, table: str, typed: TypedTable, declared: list[tuple[str, str]]) -> None:
        """A column the table has must keep its type: a schema that changes one is not a
        compatible evolution of what the table holds."""
        from pyspark.sql.types import StructType

        self.spark.sql(f"REFRESH TABLE {table}")
        have = {f.name.lower(): f.dataType.simpleString() for f in self.spark.table(table).schema.fields}
        for column, ddl in declared:
            parsed = StructType.fromDDL(f"`{column}` {ddl}")
            assert isinstance(parsed, StructType)
            kind = parsed.fields[0].dataType.simpleString()
            if column.lower() in have and have[column.lower()] != kind:
                ids = ", ".join(f"{ctx or '(default)'}: {sid}" for ctx, sid, _ in typed.readers)
                raise LoadConfigError(f"topic {typed.topic!r}: the latest schema (ids {ids}) makes column "
                                      f"{column!r} {kind}, but {table} holds it as {have[column.lower()]}; an "
                                      "incompatible change: load it into a new topic or table")

    def ensure_dead_letter_table(self, name: str) -> None:
        table = f"{DATABASE}.{name}"
        if table in self._tables:
            return
        known = self.catalog_table(name)
        if known is None:
            columns = ", ".join(f"`{c}` {t}" for c, t, _ in (*DEAD_LETTER_COLUMNS, *PARTITION_COLUMNS))
            self.spark.sql(f"CREATE TABLE IF NOT EXISTS {table} ({columns}) USING parquet "
                           f"PARTITIONED BY ({', '.join(c for c, *_ in PARTITION_COLUMNS)})")
        else:
            self._locations[name] = known[0]
        self._tables.add(table)

    def declared_columns(self, topic: str, ddl: str | None) -> list[tuple[str, str]]:
        """(name, Spark type) of the columns the topic's JSON schema `ddl` declares."""
        if ddl is None:
            return []
        from pyspark.sql.types import StructType

        declared = StructType.fromDDL(ddl)
        assert isinstance(declared, StructType)
        own = {c for c, *_ in (*TABLE_COLUMNS, *PARTITION_COLUMNS)}
        clash = [f.name for f in declared.fields if f.name.lower() in own]
        if clash:
            # The topology refuses the warehouse's own names; a schema written before a
            # column was added to the tables can still hold it.
            raise LoadConfigError(f"the warehouse schema of topic {topic!r} declares column {clash[0]!r}, one of "
                                  f"the warehouse's own columns ({', '.join(sorted(own))}); rename it in "
                                  "[warehouse.schemas]")
        return [(f.name, f.dataType.simpleString()) for f in declared.fields]

    def table_location(self, table: str) -> str:
        if table in self._locations:
            return self._locations[table]
        known = self.catalog_table(table)
        if known is not None:
            self._locations[table] = known[0]
            return known[0]
        for row in self.spark.sql(f"DESCRIBE TABLE EXTENDED {DATABASE}.{table}").collect():
            if row[0] == "Location":
                self._locations[table] = str(row[1]).rstrip("/")
                return self._locations[table]
        raise LedgerError(f"the metastore has no location for table {DATABASE}.{table}")

    def ensure_ledger(self) -> None:
        known = self.catalog_table(LEDGER_TABLE)
        if known is not None:
            self._locations[LEDGER_TABLE] = known[0]
            return
        columns = ", ".join(f"`{c}` {t}" for c, t in LEDGER_COLUMNS)
        self.spark.sql(f"CREATE TABLE IF NOT EXISTS {LEDGER} ({columns}) USING parquet")

    def read_ledger(self) -> list[LedgerRow]:
        """Every ledger row: read with Arrow where it can open the filesystem (a Spark query
        costs ~0.6 s), else by Spark."""
        opened = filesystem_of(self.table_location(LEDGER_TABLE))
        if opened is not None:
            import pyarrow.dataset as ds

            filesystem, path = opened
            schema = pa.schema([pa.field(c, kind) for (c, _), kind in zip(LEDGER_COLUMNS, LEDGER_ARROW_TYPES,
                                                                         strict=True)])
            table = ds.dataset(path, schema=schema, format="parquet", filesystem=filesystem).to_table()
            return [LedgerRow(r["load_id"], r["topic"], r["partition"], r["start_offset"], r["end_offset"], r["rows"],
                              r["status"], _ms(r["planned_at"]) or 0, _ms(r["finished_at"]), r["note"])
                    for r in table.to_pylist()]
        self.spark.sql(f"REFRESH TABLE {LEDGER}")  # appends written with Arrow: list the files again
        return [LedgerRow(r.load_id, r.topic, r.partition, r.start_offset, r.end_offset, r.rows, r.status,
                          _ms(r.planned_at) or 0, _ms(r.finished_at), r.note)
                for r in self.spark.table(LEDGER).collect()]

    def append_ledger(self, rows: Iterable[LedgerRow]) -> None:
        """One single-file append (whole or not at all): written with Arrow into the table's
        location when Arrow can open the filesystem (a Spark insert costs ~1 s), else by
        Spark."""
        rows = list(rows)
        opened = filesystem_of(self.table_location(LEDGER_TABLE))
        if opened is None:
            data = [(r.load_id, r.topic, r.partition, r.start_offset, r.end_offset, r.rows, r.status,
                     _dt(r.planned_at_ms), _dt(r.finished_at_ms), r.note) for r in rows]
            schema = ", ".join(f"`{c}` {t}" for c, t in LEDGER_COLUMNS)
            self.spark.createDataFrame(data, schema).coalesce(1).write.insertInto(LEDGER)
        else:
            filesystem, path = opened
            values = [[r.load_id for r in rows], [r.topic for r in rows], [r.partition for r in rows],
                      [r.start_offset for r in rows], [r.end_offset for r in rows], [r.rows for r in rows],
                      [r.status for r in rows], [r.planned_at_ms * 1000 for r in rows],
                      [None if r.finished_at_ms is None else r.finished_at_ms * 1000 for r in rows],
                      [r.note for r in rows]]
            table = pa.Table.from_arrays([pa.array(v, kind) for v, kind in zip(values, LEDGER_ARROW_TYPES, strict=True)],
                                         names=[c for c, _ in LEDGER_COLUMNS])
            name = f"part-{time.time_ns():020d}-{secrets.token_hex(4)}.parquet"
            write_file_atomically(filesystem, f"{path}/{name}", table)
            self._ledger_written = True
        self.ledger += rows

    def clean_staging(self) -> None:
        """Staging left by loads that committed (killed before removing it)."""
        done = finished_load_ids(self.ledger)
        for load_id in self.fs.list_dirs(self.settings.staging_uri):
            if load_id in done:
                self.fs.delete(self.staging_dir(load_id))


class Progress:
    """Prints a write's progress every PROGRESS_INTERVAL_S while it runs: input partitions
    done, records and MB written, rates (from Spark's status store)."""

    def __init__(self, spark: Any, topic: str, offsets: int, out: TextIO) -> None:
        self.spark = spark
        self.topic = topic
        self.offsets = offsets
        self.out = out
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dcmirror-load-progress", daemon=True)
        self._started = time.monotonic()

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        last = None
        while not self._stop.wait(PROGRESS_INTERVAL_S):
            try:
                line = self._line()
            except Exception:  # noqa: BLE001 - progress is best effort
                continue
            if line and line != last:
                print(line, file=self.out, flush=True)
                last = line

    def _line(self) -> str | None:
        store = self.spark.sparkContext._jsc.sc().statusStore()
        stages = store.activeStages()
        done = total = records = size = 0
        for i in range(stages.size()):
            stage = stages.apply(i)
            done += stage.numCompleteTasks()
            total += stage.numTasks()
            records += stage.outputRecords()
            size += stage.outputBytes()
        if not total:
            return None
        elapsed = time.monotonic() - self._started
        if not records:  # tasks writing with Arrow report when they finish: offsets of the finished ones
            offsets = self.offsets * done // total
            return (f"  {self.topic}: {done}/{total} tasks done, ~{offsets:,} of {self.offsets:,} offsets "
                    f"({offsets / elapsed:,.0f} offsets/s)")
        return (f"  {self.topic}: {done}/{total} input partitions done, {records:,} of ~{self.offsets:,} records "
                f"written ({records / elapsed:,.0f} records/s, {size / elapsed / 1e6:.1f} MB/s of Parquet)")


def summary_table(outcomes: list[LoadOutcome]) -> str:
    header = ("topic", "table", "partitions", "offsets", "rows", "MB", "seconds", "rows/s", "MB/s")
    lines: list[tuple[str, ...]] = []
    total = TopicLoad("total", "", 0, 0)
    for outcome in outcomes:
        for t in outcome.topics:
            lines.append(_row(t))
            total.partitions += t.partitions
            total.offsets += t.offsets
            total.rows += t.rows
            total.size_bytes += t.size_bytes
        total.seconds += outcome.seconds
    lines.append(_row(total))
    widths = [max(len(r[i]) for r in [header, *lines]) for i in range(len(header))]

    def fmt(r: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(header), rule, *[fmt(r) for r in lines[:-1]], rule, fmt(lines[-1])])


def _row(t: TopicLoad) -> tuple[str, ...]:
    seconds = max(t.seconds, 1e-9)
    return (t.topic, t.table, str(t.partitions), f"{t.offsets:,}", f"{t.rows:,}", f"{t.size_bytes / 1e6:.1f}",
            f"{t.seconds:.1f}", f"{t.rows / seconds:,.0f}", f"{t.size_bytes / seconds / 1e6:.1f}")


def write_last_load(settings: WarehouseSettings, doc: dict[str, Any]) -> None:
    """<path>/last_load.json: what the last load did (for `dcmirror status`, no Spark needed), and
    the load metrics textfile (for Prometheus, through node_exporter)."""
    path = Path(settings.path) / LAST_LOAD_FILE
    tmp = path.with_name(f".{LAST_LOAD_FILE}.tmp")
    tmp.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    tmp.replace(path)
    if settings.metrics_textfile is not None:
        write_load_metrics(settings.metrics_textfile, doc, source=settings.source,
                           interval_s=settings.load_interval_ms / 1000, now_s=time.time())
