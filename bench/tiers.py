"""Tier throughput: put/get GB/s of pages against the medium's own limit and against LMCache's
native adapter on the same medium, measured in the same run on the same bytes.

    python -m bench.tiers [--tier host|disk|redis] [--quick] [--json] [--record] [--dir D] [--url U]

Without ``--tier`` every tier runs, one after the other, in one process (``--record`` then
writes ``bench/results/tiers-<machine>.json``; with ``--tier T``, ``tiers-T-<machine>.json``).
Each tier's cases live in ``bench/tiers_<tier>.py`` (``measure(args) -> list[dict]``): pages of
2 MiB and 256 KiB, in batches of 16 and 64. LMCache's adapters come from
``bench/lmcache_peer.py``; where LMCache is not installed the bench says so and runs without
them. The table prints, for each of our lines, the ratio to the medium next to the ratio to
LMCache.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from bench.common import (
    Measurement,
    add_standard_args,
    command_line,
    emit_json,
    measurement,
    print_table,
    record,
)
from bench.lmcache_peer import VS

TIERS = ("host", "disk", "redis")


def to_measurement(d: dict) -> Measurement:
    return measurement(
        "tiers", d["case"], d.get("variant", "kvstore"), d.get("metric", "throughput"),
        float(d["value"]), d.get("unit", "GB/s"), baseline=d.get("baseline"),
        baseline_value=d.get("baseline_value"),
        higher_is_better=d.get("higher_is_better", True),
    )


def main(argv: list[str] | None = None) -> None:
    parser = add_standard_args(argparse.ArgumentParser(prog="python -m bench.tiers"))
    parser.add_argument("--tier", choices=TIERS, default=None, help="one tier (default: all)")
    parser.add_argument("--dir", default=None, help="directory for the disk tier")
    parser.add_argument("--url", default=None, help="redis URL (default: start a redis-server)")
    args = parser.parse_args(argv)
    lines: list[Measurement] = []
    for tier in (args.tier,) if args.tier else TIERS:
        module = importlib.import_module(f"bench.tiers_{tier}")
        lines += [to_measurement(d) for d in module.measure(args)]
        print(f"bench.tiers: {tier} done", file=sys.stderr)
    if args.json:
        emit_json(lines)
    else:
        print_human(lines, args.tier)
    if args.record:
        path = record("tiers" + (f"-{args.tier}" if args.tier else ""), lines, command_line())
        print(f"recorded {path}", file=sys.stderr)


def print_human(lines: list[Measurement], tier: str | None) -> None:
    """Our lines with the ratio to the medium and, beside it, to LMCache; then the others."""
    vs = {m.case: m for m in lines if m.variant == VS}
    ours = [m for m in lines if m.variant == "kvstore"]
    rows = [
        (m.case, m.value, m.baseline_value, m.ratio,
         vs[m.case].baseline_value if m.case in vs else None,
         vs[m.case].ratio if m.case in vs else None)
        for m in ours
    ]
    print_table(
        ("case", "kvstore GB/s", "medium GB/s", "ratio to medium", "LMCache GB/s",
         "ratio to LMCache"), rows,
        title=f"bench.tiers{' --tier ' + tier if tier else ''} (default settings)",
        footer=[f"{m.case}  {m.variant}: {m.value:.4g} {m.unit}"
                + (f"  ({m.baseline}: {m.baseline_value:.4g}, ratio {m.ratio:.3f})"
                   if m.ratio is not None else "")
                for m in lines if m.variant not in ("kvstore", VS)],
        headline=_headline(ours, list(vs.values())),
    )


def _headline(ours: list[Measurement], vs: list[Measurement]) -> str:
    parts = []
    worst = min((m for m in ours if m.ratio is not None), key=lambda m: m.ratio or 0, default=None)
    if worst is not None:
        parts.append(f"worst ratio to the medium = {worst.ratio:.3f} ({worst.case})")
    low = min(vs, key=lambda m: m.ratio or 0, default=None)
    if low is not None:
        parts.append(f"worst ratio to LMCache = {low.ratio:.3f} ({low.case})")
    return "headline: " + "; ".join(parts) if parts else ""


if __name__ == "__main__":
    main()
