"""Build hook for the optional C record codec; everything else is in pyproject.toml.

The extension is optional: without a compiler the pure-Python codec in
cluster/protocol/records.py is used, with the same results.
"""

from setuptools import Extension, setup

FLAGS = ["-O2", "-Wall", "-Werror=implicit-function-declaration"]
setup(ext_modules=[Extension("cluster.protocol._speedups", ["cluster/protocol/_speedups.c"], optional=True,
                             depends=["cluster/protocol/varint.h"],
                             extra_compile_args=FLAGS),
                   # The Spark data source's records -> Arrow buffers loop (spark_aggregate/columns.py).
                   Extension("spark_aggregate._columns", ["spark_aggregate/_columns.c"], optional=True,
                             depends=["cluster/protocol/varint.h"],
                             extra_compile_args=FLAGS)])
