"""The dcmirror error inside a Spark/Py4J error's text (spark_aggregate/session.py
embedded_error), read in one place for the load's per-topic failures and the command's exit."""

from __future__ import annotations

from spark_aggregate.commands import _spark_error
from spark_aggregate.load import failure_text
from spark_aggregate.ranges import DataLossError

PY4J_TEXT = ("An error occurred while calling o87.save.\n"
             ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 3.0 failed\n"
             "Traceback (most recent call last):\n"
             '  File "/x/spark_aggregate/source.py", line 310, in read\n'
             "    raise DataLossError(message)\n"
             "spark_aggregate.options.DataLossError: orders-0: offsets 10..19 were deleted before the load\n"
             "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException\n")


def test_the_first_dcmirror_error_in_the_text_is_the_failure() -> None:
    error = RuntimeError(PY4J_TEXT)
    assert failure_text(error) == "orders-0: offsets 10..19 were deleted before the load"
    cause = _spark_error(error)
    assert isinstance(cause, DataLossError) and str(cause) == "orders-0: offsets 10..19 were deleted before the load"


def test_an_error_without_one_is_named_by_its_first_line() -> None:
    error = RuntimeError("java.lang.OutOfMemoryError: Java heap space\n\tat x")
    assert failure_text(error) == "RuntimeError: java.lang.OutOfMemoryError: Java heap space"
    assert _spark_error(error) is error
