"""Errors of the security layer; their messages never hold a secret."""

from __future__ import annotations


class AuthenticationFailed(Exception):
    """A SASL exchange or a TLS handshake did not prove who the peer is."""


class SecurityConfigError(ValueError):
    """A listener, TLS or SASL setting that cannot work (names the setting or file)."""
