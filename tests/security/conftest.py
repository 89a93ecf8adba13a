"""Fixtures of tests/security: the mirror lab of tests/mirror, `dcmirror up` runs of
tests/deploy."""

from tests.deploy.conftest import up_runs
from tests.mirror.conftest import mirror_lab

__all__ = ["mirror_lab", "up_runs"]
