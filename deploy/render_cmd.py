"""`dcmirror deploy render`: systemd units and Kubernetes manifests from a topology."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Registered by deploy.cli; filled in by the owner of this module."""
