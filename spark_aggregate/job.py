"""The warehouse load as a spark-submit application, on any Spark cluster:

    spark-submit --master yarn --py-files dcmirror.zip spark_aggregate/job.py --config topology.toml

The executors need the dcmirror packages (cluster, mirror, spark_aggregate, topology) and
their dependencies (trio, kio, orjson, crc32c, cramjam, pyarrow): a zip in --py-files or a
virtualenv shipped with --archives. spark-submit's --master and --conf settings win over
the topology's spark.* config; the topology's warehouse.uri and metastore.uri still decide
where the tables are (the default embedded Derby metastore only suits local mode).
"""

from __future__ import annotations

import argparse
import sys

from spark_aggregate.commands import run_load


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="spark_aggregate/job.py", description="dcmirror warehouse load")
    parser.add_argument("--config", required=True, help="topology file with a [warehouse] section")
    args = parser.parse_args(argv)
    return run_load(args.config, submitted=True)


if __name__ == "__main__":
    sys.exit(main())
