"""Errors of the bundled runtime; all derive from kvstore's one error tree."""

from __future__ import annotations

from kvstore.errors import ConfigError


class CheckpointError(ConfigError):
    """A model checkpoint directory is malformed: a missing/unreadable file, bad JSON, or a
    missing, extra or misshaped tensor. The message names the file or tensor and what was
    expected."""
