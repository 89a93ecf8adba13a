"""Executor-side set-up shared by the data source and the load's tasks.

Spark's Python worker calls importlib.invalidate_caches() before every task
(pyspark.worker_util.setup_spark_files), and on Python 3.11 every zipimporter then re-reads
its archive's whole directory: pyspark.zip, py4j's zip and the Spark jar that Spark puts on
the workers' PYTHONPATH, each once per package imported from it. That costs a reused worker
~0.3 s of CPU per task on a small machine (measured: 15 jobs of two empty tasks 8.2 s, then
2.5-3.5 s), more than a task of 100k records takes to read and write. The archives do not
change while a worker lives, so the first dcmirror task in a worker turns the re-read off for
that worker process (the driver is not touched).
"""

from __future__ import annotations

import zipimport

_done = False


def _keep_directory(self: zipimport.zipimporter) -> None:
    """zipimporter.invalidate_caches that keeps the archive's directory as read."""


def prepare_worker() -> None:
    """Once per Python worker process, before a dcmirror task's work."""
    global _done
    if not _done:
        zipimport.zipimporter.invalidate_caches = _keep_directory  # type: ignore[method-assign]
        _done = True
