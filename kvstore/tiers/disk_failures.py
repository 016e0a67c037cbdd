"""How the disk tier reports a failing condition (writes refused, reads failing): every call
that meets it is counted in ``kvstore_tier_errors_total``, but it is logged once per distinct
failure, and once more when calls succeed again -- a full disk must not flood the log.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from kvstore.metrics import Metrics

log = logging.getLogger("kvstore.tiers.disk")


@dataclass(slots=True)
class FailureLog:
    """The condition of one operation (``op``: ``write`` or ``read``) of the tier named
    ``tier``. ``failing``: the error logged, formatted with the tier's name, its path and the
    failure; ``recovered``: the warning logged, formatted with the tier's name."""

    tier: str
    path: Path
    metrics: Metrics
    op: str
    failing: str
    recovered: str
    failure: str | None = None  # the failure last logged, until a call succeeds

    def note(self, failure: str | None) -> None:
        """A call that met ``failure`` (a description), or None: it succeeded."""
        if failure is None:
            if self.failure is not None:
                log.warning(self.recovered, self.tier)
                self.failure = None
            return
        self.metrics.errors.labels(self.tier, self.op).inc()
        if failure != self.failure:
            self.failure = failure
            log.error(self.failing, self.tier, self.path, failure)


def write_failures(tier: str, path: Path, metrics: Metrics) -> FailureLog:
    """Writes refused: reads go on, and writes resume by themselves once space frees."""
    return FailureLog(
        tier, path, metrics, "write",
        "disk tier %r at %s refuses writes: %s; reads keep working and writes resume "
        "when space frees (evict pages, free disk space or lower the tier's capacity)",
        "disk tier %r: writes succeed again",
    )


def read_failures(tier: str, path: Path, metrics: Metrics) -> FailureLog:
    """Reads failing: they are served as misses."""
    return FailureLog(
        tier, path, metrics, "read",
        "disk tier %r at %s: reads fail: %s; served as misses",
        "disk tier %r: reads succeed again",
    )
