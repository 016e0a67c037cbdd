"""The one error tree of kvstore.

Every error carries a ``hint`` that names what to change. The server maps these classes once to
gRPC status codes and once to HTTP codes (``http_status`` below is the REST mapping); nothing
else in the code base translates errors.

A miss is not an error: reads that find nothing, or find a record that fails its checks, return
a miss and count it. Back-pressure (a full tier) is a return value, not an exception.
"""

from __future__ import annotations


class KVStoreError(Exception):
    """Base class of every error kvstore raises on purpose."""

    http_status = 500

    def __init__(self, message: str, *, hint: str = "") -> None:
        self.message = message
        self.hint = hint
        super().__init__(f"{message} (hint: {hint})" if hint else message)


class ConfigError(KVStoreError, ValueError):
    """A configuration value is missing, malformed or out of range."""

    http_status = 400


class InvalidArgument(KVStoreError, ValueError):
    """A caller passed a value the API cannot accept (wrong shape, dtype, size, key length...)."""

    http_status = 400


class UnknownComponent(ConfigError):
    """A tier, policy or backend name that no registry knows and no import path resolves."""


class TierUnavailable(KVStoreError):
    """A tier cannot serve at all (its medium is gone, its server refuses us)."""

    http_status = 503


class StoreClosed(KVStoreError):
    """The store (or tier) was closed: it serves nothing more."""

    http_status = 503

    def __init__(self, what: str = "the store") -> None:
        super().__init__(f"{what} is closed", hint="build a new store; a closed one serves nothing")


class LeaseError(KVStoreError):
    """A lease id that is unknown, already released or expired."""

    http_status = 409


class QuotaExceeded(KVStoreError):
    """A namespace asked for more room than its configured quota allows."""

    http_status = 429


class RecordError(KVStoreError):
    """A stored record failed its checks. Tiers turn this into a miss plus a counter; it only
    escapes from the record codec itself, for callers that decode records directly."""

    http_status = 422

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message, hint=f"the stored record is damaged or foreign ({reason})")
        #: One of ``kvstore.record.REASONS``; tiers count failures by it.
        self.reason = reason
