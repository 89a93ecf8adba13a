"""`dcmirror load` and `dcmirror warehouse sql`: Spark warehouse loads (spark_aggregate/)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Registered by deploy.cli; filled in by the owner of this module."""
