"""Fixtures of tests/security: the mirror lab of tests/mirror."""

from tests.mirror.conftest import mirror_lab

__all__ = ["mirror_lab"]
