"""Build hook for the optional C extensions; everything else is in pyproject.toml.

The extensions are optional: without a compiler the pure-Python code paths are used
(cluster/protocol/records.py, spark_aggregate/columns.py, fastavro in spark_aggregate/typed.py),
with the same results.
"""

from setuptools import Extension, setup

FLAGS = ["-O2", "-Wall", "-Werror=implicit-function-declaration"]
setup(ext_modules=[Extension("cluster.protocol._speedups", ["cluster/protocol/_speedups.c"], optional=True,
                             depends=["cluster/protocol/varint.h"],
                             extra_compile_args=FLAGS),
                   # The Spark data source's records -> Arrow buffers loop (spark_aggregate/columns.py).
                   Extension("spark_aggregate._columns", ["spark_aggregate/_columns.c"], optional=True,
                             depends=["cluster/protocol/varint.h"],
                             extra_compile_args=FLAGS),
                   # Typed tables: wire-format Avro values -> Arrow buffers (spark_aggregate/avro_batch.py).
                   Extension("spark_aggregate._avro", ["spark_aggregate/_avro.c"], optional=True,
                             extra_compile_args=FLAGS)])
