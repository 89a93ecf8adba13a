"""`dcmirror load`, `dcmirror warehouse sql` and `dcmirror warehouse serve`: Spark warehouse loads
(spark_aggregate/)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Registered by deploy.cli."""
    load = sub.add_parser(
        "load", help="load the warehouse topics' new records into warehouse tables, exactly once",
        description="Load what arrived in the topology's [warehouse] source cluster since the last load into "
                    "Parquet tables (database dcmirror, one table per topic; ledger dcmirror.loads). "
                    "Exit 0: done (a summary table is printed), 1: failed (e.g. data loss), 2: bad config.")
    load.add_argument("--config", required=True, help="topology file with a [warehouse] section")
    load.add_argument("--query", metavar="SQL", action="append",
                      help="after the load, run this Spark SQL query in the same Spark session (no second JVM and "
                           "metastore start) and print its rows as one JSON array on the line after its "
                           "`query: N row(s)` line (the last line); may be given more than once (run in order)")
    load.set_defaults(func=cmd_load)

    warehouse = sub.add_parser("warehouse", help="query the warehouse tables")
    actions = warehouse.add_subparsers(dest="warehouse_action", required=True)
    sql = actions.add_parser(
        "sql", help="run Spark SQL over the warehouse and print the result",
        description="Run one Spark SQL statement over the warehouse (database dcmirror is the default, so "
                    "SELECT count(*) FROM east_pageviews works). Exit 0: done, 1: failed, 2: bad config.")
    sql.add_argument("--config", required=True, help="topology file with a [warehouse] section")
    sql.add_argument("--json", action="store_true",
                     help="print one JSON array of row objects on the last line (binary as UTF-8 text)")
    sql.add_argument("--max-rows", type=int, default=1000, metavar="N", help="print at most N rows (default 1000)")
    sql.add_argument("query", help="the SQL statement")
    sql.set_defaults(func=cmd_warehouse_sql)
    serve = actions.add_parser(
        "serve", help="keep one Spark session for `warehouse sql` and `load` (answers in about a second)",
        description="Start Spark once and answer `dcmirror warehouse sql` and `dcmirror load` in that session, on "
                    "the Unix socket <warehouse path>/warehouse.sock (mode 0600), until SIGTERM or SIGINT. "
                    "Holds the warehouse (embedded metastore) while it runs. Exit 0: stopped, 1: warehouse in use, "
                    "2: bad config.")
    serve.add_argument("--config", required=True, help="topology file with a [warehouse] section")
    serve.add_argument("--load-interval-ms", type=_load_interval_ms, metavar="MS",
                       help="also run a load in the session every MS milliseconds, the first at once (as "
                            "dcmirror-load.timer does from outside; a Kubernetes pod has no timer): "
                            f"{LOAD_INTERVAL_MS_MIN} to {LOAD_INTERVAL_MS_MAX}")
    serve.set_defaults(func=cmd_warehouse_serve)


LOAD_INTERVAL_MS_MIN = 1_000
LOAD_INTERVAL_MS_MAX = 7 * 24 * 3_600_000


def _load_interval_ms(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 12 or not (
            LOAD_INTERVAL_MS_MIN <= int(text) <= LOAD_INTERVAL_MS_MAX):
        raise argparse.ArgumentTypeError(
            f"milliseconds from {LOAD_INTERVAL_MS_MIN} to {LOAD_INTERVAL_MS_MAX} in ASCII digits, not {text!r}")
    return int(text)


def cmd_load(args: argparse.Namespace) -> int:
    from spark_aggregate.commands import run_load

    return run_load(args.config, query=args.query)


def cmd_warehouse_sql(args: argparse.Namespace) -> int:
    from spark_aggregate.commands import run_sql

    if args.max_rows < 1:
        print("dcmirror warehouse sql: --max-rows must be at least 1")
        return 2
    return run_sql(args.config, args.query, as_json=args.json, max_rows=args.max_rows)


def cmd_warehouse_serve(args: argparse.Namespace) -> int:
    import sys

    from spark_aggregate.commands import settings_or_report
    from spark_aggregate.service import serve

    settings = settings_or_report(args.config, "dcmirror warehouse serve", sys.stderr)
    if settings is None:
        return 2
    return serve(settings, load_interval_ms=args.load_interval_ms)
