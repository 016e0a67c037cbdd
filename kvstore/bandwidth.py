"""Measured read bandwidth per tier: what load-or-recompute weighs against recompute speed.

Every tier read the store makes that returns at least one page feeds that tier's exponentially
weighted average of bytes/s of pages read (``alpha`` weighs the newest sample). Thread-safe.
"""

from __future__ import annotations

import threading

from kvstore.errors import InvalidArgument


class BandwidthMeter:
    def __init__(self, alpha: float) -> None:
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < alpha <= 1.0:
            raise InvalidArgument(f"bandwidth_alpha must be in (0, 1], got {alpha!r}")
        self._alpha = float(alpha)
        self._lock = threading.Lock()
        self._bw: dict[str, float] = {}

    def sample(self, tier: str, nbytes: int, elapsed_s: float) -> None:
        if nbytes <= 0:
            return
        value = nbytes / max(elapsed_s, 1e-9)
        with self._lock:
            old = self._bw.get(tier)
            a = self._alpha
            self._bw[tier] = value if old is None else a * value + (1 - a) * old

    def get(self, tier: str) -> float | None:
        """Bytes/s of ``tier``'s reads, or None before its first successful one."""
        with self._lock:
            return self._bw.get(tier)


__all__ = ["BandwidthMeter"]
