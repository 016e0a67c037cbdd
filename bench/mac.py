"""The record MAC switched on and off, for the tier benches that measure its cost (``bench.tiers
--tier disk|redis``): the same tier, the same pages, in the same run, once with the MAC of a
deployment secret and once with :class:`NoMac`, which hashes nothing and writes a zero tag.
Their line's ratio is on/off (1.0: the MAC is free; the target is >= 0.9).
"""

from __future__ import annotations

from typing import Any

from kvstore.record import TAG_BYTES, RecordMac

#: A stand-in deployment secret (the benches' records are deleted afterwards).
BENCH_SECRET = b"bench-only-secret-not-for-deployments"
VARIANT_ON = "kvstore"
VARIANT_OFF = "kvstore, MAC off"


class _NoHasher:
    __slots__ = ()

    def update(self, _piece: Any) -> None:
        pass


class NoMac(RecordMac):
    """The MAC switched off: nothing is hashed, every tag is zero (so every tag verifies).
    Benchmarks only; never a deployment's choice."""

    __slots__ = ()

    def begin(self, signed: Any) -> Any:
        return _NoHasher()

    def tag(self, hasher: Any) -> bytes:
        return bytes(TAG_BYTES)


def tier_macs() -> dict[str, RecordMac]:
    """Variant name -> the MAC its tier uses."""
    return {VARIANT_ON: RecordMac(BENCH_SECRET), VARIANT_OFF: NoMac()}


def mac_cost_line(bench: str, case: str, on: float, off: float) -> dict[str, Any]:
    """The line of the MAC's cost in ``case``: throughput with it on, against off."""
    return {
        "bench": bench,
        "case": case,
        "variant": "MAC on vs off",
        "metric": "throughput",
        "value": on,
        "unit": "GB/s",
        "baseline": VARIANT_OFF,
        "baseline_value": off,
        "ratio": on / off,
    }
