"""Tier throughput: put/get GB/s of pages against the medium's own limit, measured in the same
run on the same bytes.

    python -m bench.tiers --tier host|disk|redis [--quick] [--json] [--record] [--dir D] [--url U]

Each tier's cases live in ``bench/tiers_<tier>.py`` (``measure(args) -> list[dict]``); this
module parses arguments, runs them and prints per the convention in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import importlib

from bench.common import (
    Measurement,
    add_standard_args,
    command_line,
    emit_json,
    measurement,
    print_table,
    record,
)

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
    parser.add_argument("--tier", choices=TIERS, required=True)
    parser.add_argument("--dir", default=None, help="directory for the disk tier")
    parser.add_argument("--url", default=None, help="redis URL (default: start a redis-server)")
    args = parser.parse_args(argv)
    module = importlib.import_module(f"bench.tiers_{args.tier}")
    lines = [to_measurement(d) for d in module.measure(args)]
    if args.json:
        emit_json(lines)
    else:
        rows = [(m.case, m.variant, m.value, m.unit, m.baseline, m.baseline_value, m.ratio)
                for m in lines]
        worst = min((m.ratio for m in lines if m.ratio is not None), default=None)
        print_table(
            ("case", "variant", "value", "unit", "baseline", "baseline value", "ratio"), rows,
            title=f"bench.tiers --tier {args.tier}",
            headline=f"headline: worst ratio to the medium's limit = {worst:.3f}" if worst else "",
        )
    if args.record:
        path = record(f"tiers-{args.tier}", lines, command_line())
        print(f"recorded {path}")


if __name__ == "__main__":
    main()
