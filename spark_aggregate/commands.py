"""`dcmirror load` and `dcmirror warehouse sql` (also the spark-submit application, see
spark_aggregate/job.py). Exit codes: 0 done, 1 failure (data loss, unreachable cluster,
busy warehouse, bad query), 2 bad configuration."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import date, datetime
from decimal import Decimal
from typing import Any, TextIO

import orjson

from cluster.client.connection import KafkaConnectionError
from cluster.client.errors import KafkaError
from spark_aggregate.ledger import LedgerError
from spark_aggregate.load import (
    LoadConfigError,
    Loader,
    TopicsFailed,
    TopicsRefused,
    summary_table,
    write_last_load,
)
from spark_aggregate.options import OptionError
from spark_aggregate.ranges import DataLossError
from spark_aggregate.service_client import ask_service
from spark_aggregate.session import (
    WarehouseBusy,
    embedded_error,
    ensure_database,
    exception_text,
    metastore_error,
    spark_log_path,
    start_session,
    stop_session,
    warehouse_lock,
)
from spark_aggregate.settings import DATABASE, WarehouseSettings
from topology import TopologyError, load

log = logging.getLogger("dcmirror.load")

CRASH_ENV = "DCMIRROR_LOAD_CRASH_AT"
"""Tests: `step` or `step:n` (the n-th time) makes the load SIGKILL itself there."""


def settings_or_report(config: str, prog: str, err: TextIO) -> WarehouseSettings | None:
    try:
        return WarehouseSettings.from_topology(load(config))
    except TopologyError as exc:
        print(f"{prog}: {exc}", file=err)
        return None


def _crash_hook() -> Callable[[str], None] | None:
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return None
    step, _, nth = spec.partition(":")
    remaining = [int(nth or 1)]

    def hook(at: str) -> None:
        if at == step:
            remaining[0] -= 1
            if remaining[0] == 0:
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)

    return hook


def _spark_error(exc: BaseException) -> BaseException:
    """The dcmirror error inside a Spark/Py4J exception, if it is one this command answers
    apart (a task's or the planner's DataLossError arrives as text)."""
    embedded = embedded_error(exc)
    kinds: dict[str, type[Exception]] = {"DataLossError": DataLossError, "OptionError": OptionError}
    if embedded is not None and embedded[0] in kinds:
        return kinds[embedded[0]](embedded[1])
    return exc


@contextmanager
def own_session(settings: WarehouseSettings, app: str, *, submitted: bool = False) -> Iterator[Any]:
    """A Spark session of this process for one command, holding the warehouse lock."""
    with warehouse_lock(settings, app):
        spark = start_session(settings, app, submitted=submitted)
        try:
            yield spark
        finally:
            if not submitted:
                stop_session(spark)


def run_load(config: str | WarehouseSettings, *, out: TextIO = sys.stdout, err: TextIO = sys.stderr,
             submitted: bool = False, query: str | Sequence[str] | None = None,
             session: AbstractContextManager[Any] | None = None) -> int:
    """One load (exactly once through the ledger); with `query` (one or several), then those
    Spark SQL queries in the same session, in order, each one's rows printed as one JSON array
    on the line after its `query: N row(s)` line (one query: the last line). The load runs in
    `session` (the warehouse service's), else in a running `dcmirror warehouse serve`, else in
    a session of its own."""
    prog = "dcmirror load"
    queries = [] if query is None else [query] if isinstance(query, str) else list(query)
    answers: list[tuple[list[str], list[Any], bool, float]] = []
    query_error: str | None = None
    settings = config if isinstance(config, WarehouseSettings) else settings_or_report(config, prog, err)
    if settings is None:
        return 2
    started = time.time()
    last: dict[str, Any] = {"started_at": datetime.fromtimestamp(started).isoformat(timespec="seconds")}
    if session is None:
        served = ask_service(settings, "/v1/load", {"query": queries[0] if len(queries) == 1 else queries or None},
                             err)
        if served is not None and "output" not in served:
            print(f"{prog}: {served.get('error', 'the warehouse service failed')}", file=err)
            return 1
        if served is not None:  # `dcmirror warehouse serve` ran it in its session
            out.write(served.get("output", ""))
            err.write(served.get("errors", ""))
            return int(served.get("exit_code", 1))
    try:
        if session is None and not submitted:
            print(f"starting Spark (its own log: {spark_log_path(settings)})", file=out, flush=True)
        with session if session is not None else own_session(settings, prog, submitted=submitted) as spark:
            print(f"loading {settings.source} ({settings.bootstrap}) into {settings.warehouse_uri}",
                  file=out, flush=True)
            outcomes = Loader(spark, settings, out, _crash_hook()).run()
            for sql in queries:
                asked = time.monotonic()
                try:
                    answers.append((*query_rows(spark, settings, sql, QUERY_MAX_ROWS), time.monotonic() - asked))
                except Exception as exc:  # noqa: BLE001 - the load is done; the query is the user's
                    query_error = query_error_text(exc, settings)
                    break
    except TopicsFailed as exc:
        # Some topics did not load; the others did (and are committed): both are told.
        loaded = [o for o in exc.outcomes if o.topics]
        if loaded:
            print(summary_table(loaded), file=out)
        rows = sum(o.rows for o in loaded)
        print(f"loaded {rows:,} rows in {len(loaded)} load(s), {time.time() - started:.1f} s; "
              f"{len(exc.failed)} topic(s) not loaded", file=out, flush=True)
        for topic, why in exc.failed.items():
            print(f"{prog}: {topic}: {why}" if topic not in why else f"{prog}: {why}", file=err)
        write_last_load(settings, {**last, "status": "failed", "error": str(exc).splitlines()[0],
                                   "topics_failed": exc.failed, "rows": rows,
                                   "finished_at": datetime.now().isoformat(timespec="seconds"),
                                   "seconds": round(time.time() - started, 3)})
        return 2 if isinstance(exc, TopicsRefused) else 1
    except (LoadConfigError, OptionError) as exc:
        print(f"{prog}: {exc}", file=err)
        return 2
    except Exception as exc:  # noqa: BLE001 - every failure ends as a message and exit 1
        cause = _spark_error(exc)
        message = metastore_error(exc, settings) if not isinstance(cause, DataLossError) else None
        if message is None:
            if isinstance(cause, (DataLossError, LedgerError, WarehouseBusy, KafkaError, KafkaConnectionError)):
                message = str(cause)
            else:
                log.debug("load failed", exc_info=True)
                text = exception_text(cause)
                message = f"{type(cause).__name__}: {text.splitlines()[0] if text else ''}"
                try:
                    traceback.print_exc(file=err)
                except Exception:  # noqa: BLE001 - a Py4J error's text needs the JVM, which may be gone
                    print(f"{type(cause).__name__} (its traceback cannot be printed: the Spark session has stopped)",
                          file=err)
        print(f"{prog}: {message}" + ("" if session is not None or submitted else
                                       f" (Spark's own log: {spark_log_path(settings)})"), file=err)
        if not isinstance(cause, WarehouseBusy):
            write_last_load(settings, {**last, "status": "failed", "error": message,
                                       "finished_at": datetime.now().isoformat(timespec="seconds"),
                                       "seconds": round(time.time() - started, 3)})
        return 1
    rows = sum(o.rows for o in outcomes)
    if outcomes:
        print(summary_table(outcomes), file=out)
    else:
        print("nothing new to load", file=out)
    print(f"loaded {rows:,} rows in {len(outcomes)} load(s), {time.time() - started:.1f} s", file=out, flush=True)
    for columns, found, truncated, query_s in answers:
        print(f"query: {len(found)} row(s){' (truncated)' if truncated else ''} in {query_s:.1f} s, "
              "in the load's Spark session", file=out)
        out.write(orjson.dumps(_row_docs(columns, found)).decode() + "\n")
        out.flush()
    if query_error is not None:
        print(f"{prog}: the load succeeded; the query after it failed: {query_error}", file=err)
    write_last_load(settings, {
        **last, "status": "ok", "finished_at": datetime.now().isoformat(timespec="seconds"),
        "seconds": round(time.time() - started, 3), "rows": rows,
        "loads": [{"load_id": o.plan.load_id, "resumed": o.plan.resumed, "reload": o.plan.reload, "rows": o.rows,
                   "offsets": o.plan.offsets,
                   "tables": {t.table: t.rows for t in o.topics}} for o in outcomes],
    })
    return 0 if query_error is None else 1


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if hasattr(value, "asDict"):
        return _json_value(value.asDict(recursive=True))
    return value


QUERY_MAX_ROWS = 1000


def query_rows(spark: Any, settings: WarehouseSettings, query: str,
               max_rows: int) -> tuple[list[str], list[list[Any]], bool]:
    """(columns, at most max_rows rows of JSON-ready values, whether there were more) of a
    query over the warehouse."""
    ensure_database(spark, settings)
    spark.sql(f"USE {DATABASE}")
    df = spark.sql(query)
    rows = df.limit(max_rows + 1).collect()
    return list(df.columns), [[_json_value(v) for v in row] for row in rows[:max_rows]], len(rows) > max_rows


def query_error_text(exc: BaseException, settings: WarehouseSettings) -> str:
    """What a failed query says to the user: the metastore's trouble, or the error's first line."""
    return metastore_error(exc, settings) or (exception_text(exc).strip().splitlines() or [type(exc).__name__])[0]


def _row_docs(columns: list[str], rows: list[list[Any]]) -> list[dict[str, Any]]:
    return [dict(zip(columns, row, strict=True)) for row in rows]


def run_sql(config: str, query: str, *, as_json: bool = False, max_rows: int = 1000, out: TextIO = sys.stdout,
            err: TextIO = sys.stderr) -> int:
    """Run Spark SQL over the warehouse; print a table, or with as_json one JSON array of row
    objects on the last line (binary columns as UTF-8 text)."""
    prog = "dcmirror warehouse sql"
    settings = settings_or_report(config, prog, err)
    if settings is None:
        return 2
    served = ask_service(settings, "/v1/sql", {"query": query, "max_rows": max_rows}, err)
    if served is not None and "error" in served:
        print(f"{prog}: {served['error']}", file=err)
        return 1
    try:
        if served is not None:  # answered by `dcmirror warehouse serve`: no JVM start here
            columns, rows, truncated = served["columns"], served["rows"], served["truncated"]
        else:
            with own_session(settings, prog) if settings.embedded_metastore else _session_only(settings, prog) \
                    as spark:
                columns, rows, truncated = query_rows(spark, settings, query, max_rows)
    except WarehouseBusy as exc:
        print(f"{prog}: {exc}", file=err)
        return 1
    except Exception as exc:  # noqa: BLE001 - a bad query is the user's error: say it plainly
        print(f"{prog}: {query_error_text(exc, settings)}", file=err)
        return 1
    if as_json:
        if truncated:
            print(f"(first {max_rows} rows)", file=err)
        out.write(orjson.dumps(_row_docs(columns, rows)).decode() + "\n")
        return 0
    texts = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in texts]) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for r in texts:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)), file=out)
    print(f"({len(rows)} row{'s' if len(rows) != 1 else ''}{', truncated' if truncated else ''})", file=out)
    return 0


@contextmanager
def _session_only(settings: WarehouseSettings, app: str) -> Iterator[Any]:
    """An external metastore serves several processes: no lock."""
    spark = start_session(settings, app)
    try:
        yield spark
    finally:
        stop_session(spark)


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    shown = _json_value(value)
    return shown if isinstance(shown, str) else orjson.dumps(shown).decode() if isinstance(shown, dict | list) \
        else str(shown)
