"""A lookup's runs and per-run load estimates (kvstore.results): runs of one tier merged and
cut at the hit's length, seconds at each tier's measured bandwidth, None before a measurement."""

from __future__ import annotations

from kvstore.results import LookupResult, load_estimates, merge_runs


def test_runs_merge_neighbours_and_stop_at_the_hit() -> None:
    assert merge_runs([("host", 2), ("host", 3), ("disk", 4), ("host", 1)], 7) == (
        ("host", 5), ("disk", 2))
    assert merge_runs([("host", 2)], 0) == ()
    assert LookupResult(4, ("host", "host", "disk", "host")).runs == (
        ("host", 2), ("disk", 1), ("host", 1))


def test_estimates_are_bytes_over_bandwidth() -> None:
    bw = {"host": 10e9, "disk": 2e9}.get
    assert load_estimates((("host", 5), ("disk", 2), ("redis", 1)), 1 << 20, bw) == (
        5 * (1 << 20) / 10e9, 2 * (1 << 20) / 2e9, None)
