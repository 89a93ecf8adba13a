"""The `dcmirror` console script: deploy.cli.main without kio's optional hypothesis import
(see deploy/cli.py)."""

from __future__ import annotations

import sys


def main() -> int:
    sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]
    from deploy.cli import main as cli_main

    return cli_main()
