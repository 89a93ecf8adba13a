"""The Spark session over the warehouse (Hive metastore: embedded Derby under the
warehouse path, or an external one), and the lock that keeps one process at a time on an
embedded metastore.

Embedded Derby allows a single JVM. `dcmirror load` and `dcmirror warehouse sql` take an
exclusive lock on <path>/warehouse.lock first; a second process fails at once with a
message naming the holder instead of Derby's "Another instance may have booted the
database". With metastore.uri set, queries need no lock (loads still take it, so two loads
from one machine never interleave).
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from spark_aggregate.settings import DATABASE, WarehouseSettings

log = logging.getLogger("dcmirror.spark")

LOCK_FILE = "warehouse.lock"
SPARK_LOG = "spark.log"  # the Spark JVM's own output, under the warehouse path
JVM_EXIT_TIMEOUT_S = 30.0


class WarehouseBusy(Exception):
    """Another process holds the warehouse lock."""


def lock_holder(settings: WarehouseSettings) -> str | None:
    """Who holds the warehouse lock now, as its file says ("dcmirror warehouse serve (pid N,
    since ...)"), or None when the process it names is gone. Read without locking: a probe
    must never make the lock's next taker fail."""
    try:
        text = (settings.path / LOCK_FILE).read_text().strip()
    except OSError:
        return None
    found = re.search(r"\(pid (\d+),", text)
    if found is None:
        return None
    pid = int(found.group(1))
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None  # the file is what the last holder wrote; the kernel released its lock
    except (PermissionError, OverflowError):
        pass  # alive under another user
    try:
        if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z":
            return None  # exited, not yet reaped by its parent
    except (OSError, IndexError):
        pass
    return text


@contextmanager
def warehouse_lock(settings: WarehouseSettings, what: str) -> Iterator[None]:
    """Hold <path>/warehouse.lock (flock: released by the kernel however the holder dies)."""
    settings.path.mkdir(parents=True, exist_ok=True)
    lock_path = settings.path / LOCK_FILE
    f: IO[str] = open(lock_path, "a+")
    try:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise WarehouseBusy(
                f"the warehouse at {settings.path} is in use by {holder}; its embedded metastore (Derby) allows "
                "one process at a time. Wait for it to finish, or configure an external metastore "
                "(warehouse config metastore.uri)") from None
        f.seek(0)
        f.truncate()
        f.write(f"{what} (pid {os.getpid()}, since {time.strftime('%Y-%m-%d %H:%M:%S')})\n")
        f.flush()
        yield
    finally:
        f.close()


def spark_conf(settings: WarehouseSettings, app_name: str, *, submitted: bool) -> dict[str, str]:
    """Spark settings for the warehouse; the user's spark.* settings win, except where the
    warehouse itself must decide (catalog, warehouse dir)."""
    conf = {
        "spark.app.name": app_name,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.memory": "1g",
        # Loads and queries are short-lived JVMs whose own work is small (the records are read
        # and written by Python tasks with Arrow): C1 alone starts them 25-30 % sooner (the
        # demo's load 30.5 -> 23.5 s). A warehouse config spark.driver.extraJavaOptions replaces it.
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
    }
    conf.update(settings.spark_conf)
    if submitted:
        conf.pop("spark.master", None)  # spark-submit's --master decides
    conf["spark.sql.catalogImplementation"] = "hive"
    conf["spark.sql.warehouse.dir"] = settings.warehouse_uri
    if settings.metastore_uri is not None:
        conf["spark.hadoop.hive.metastore.uris"] = settings.metastore_uri
    else:
        metastore = (settings.path / "metastore_db").absolute()
        conf["spark.hadoop.javax.jdo.option.ConnectionURL"] = f"jdbc:derby:;databaseName={metastore};create=true"
        derby_log = f"-Dderby.stream.error.file={(settings.path / 'derby.log').absolute()}"
        conf["spark.driver.extraJavaOptions"] = (conf.get("spark.driver.extraJavaOptions", "") + " " + derby_log).strip()
    return conf


def start_session(settings: WarehouseSettings, app_name: str, *, submitted: bool = False) -> Any:
    """A SparkSession over the warehouse with the dcmirror data source registered."""
    if not submitted:
        # Local Python workers run this interpreter (its virtualenv has the project and
        # pyarrow), unless the user chose one; under spark-submit the cluster's setup decides.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings.path.mkdir(parents=True, exist_ok=True)  # derby.log goes there
    from pyspark.sql import SparkSession

    from spark_aggregate.source import register

    logging.getLogger("py4j").setLevel(logging.WARNING)  # one INFO line per closed gateway connection
    conf = spark_conf(settings, app_name, submitted=submitted)
    if not submitted:
        _launch_jvm_logging_to(spark_log_path(settings), conf)
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.enableHiveSupport().getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def spark_log_path(settings: WarehouseSettings) -> Path:
    """Where a command's Spark JVM (and its Python workers) write their own output: Spark's and
    the JVM's warnings, stack traces of what they retried; the command prints its progress and
    result, and names this file."""
    return settings.path / SPARK_LOG


def _launch_jvm_logging_to(path: Path, conf: dict[str, str]) -> None:
    """Start the driver JVM with its stdout and stderr in `path` (pyspark would give it this
    process's: some 240 lines of warnings around a load's dozen), before the session is made
    (which then uses this gateway)."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None:
        return  # a JVM of this process already runs (a test's session)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as out:
        out.write(f"---- {time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()}\n".encode())
        out.flush()
        spark_conf_ = SparkConf(loadDefaults=False)
        for key, value in conf.items():
            spark_conf_.set(key, value)
        gateway = launch_gateway(spark_conf_, popen_kwargs={"stdout": out, "stderr": out})
    SparkContext._gateway = gateway
    SparkContext._jvm = gateway.jvm


def ensure_database(spark: Any, settings: WarehouseSettings) -> None:
    location = f"{settings.warehouse_uri.rstrip('/')}/{DATABASE}.db"
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {DATABASE} LOCATION '{location}'")


def stop_session(spark: Any) -> None:
    """Stop Spark and wait for its JVM to exit, so the embedded metastore is free when this
    returns (a JVM left to notice its parent's exit would hold Derby a moment longer)."""
    from pyspark import SparkContext

    spark.stop()
    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if gateway is not None:
        gateway.shutdown()
    if proc is not None:
        try:
            if proc.stdin is not None:
                proc.stdin.close()  # the JVM exits when its stdin closes
            proc.wait(JVM_EXIT_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - best effort at exit
            log.warning("the Spark JVM did not exit within %g s: %s", JVM_EXIT_TIMEOUT_S, exc)
    SparkContext._gateway = None
    SparkContext._jvm = None


def exception_text(exc: BaseException) -> str:
    """str(exc), also for a Py4J error whose text the JVM would give once the session is gone
    (its __str__ then fails: SparkContext._jvm is None): its message as it was kept."""
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - any failure to describe an error must not hide it
        kept = getattr(exc, "errmsg", None) or getattr(exc, "desc", None)
        if isinstance(kept, str) and kept:
            return kept
        return next((a for a in exc.args if isinstance(a, str) and a), type(exc).__name__)


# dcmirror errors a Spark task or the planner raised, which reach the driver as a Py4J
# error's text: their class names as the text shows them.
EMBEDDED_ERRORS = ("TypedLoadError", "UnknownSchemaId", "DataLossError", "SchemaError",
                   "LoadConfigError", "OptionError")


def embedded_error(exc: BaseException) -> tuple[str, str] | None:
    """(class name, message) of the dcmirror error inside a Spark/Py4J exception, if there is
    one; the one place that reads them out of an error's text."""
    text = exception_text(exc)
    found = [(text.find(f"{name}: "), name) for name in EMBEDDED_ERRORS if f"{name}: " in text]
    if not found:
        return None
    at, name = min(found)
    message = text[at + len(name) + 2:].strip().splitlines()
    return name, message[0] if message else ""


def metastore_error(exc: BaseException, settings: WarehouseSettings) -> str | None:
    """A clear message for a metastore that cannot be opened, else None."""
    text = exception_text(exc)
    if "Another instance of Derby" in text or "XSDB6" in text or "Failed to start database" in text:
        return (f"the embedded metastore at {Path(settings.path) / 'metastore_db'} is in use by another JVM "
                "(a load or a warehouse query still running); wait for it to finish, or configure an "
                "external metastore (warehouse config metastore.uri)")
    if settings.metastore_uri and ("MetaException" in text or "Could not connect to meta store" in text):
        return f"cannot reach the Hive metastore at {settings.metastore_uri}: {text.splitlines()[0]}"
    return None
