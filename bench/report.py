"""Render the results tables from ``bench/results/*.json``: every compared line on the docs'
Benchmarks page, the headline lines (:data:`HEADLINES`) in the README.

    python -m bench.report            # print the full markdown table
    python -m bench.report --write    # replace both tables between their markers

A test checks that both tables are exactly what this renders, so the numbers shown always come
from the recorded results.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from bench.common import REPO_ROOT, RESULTS_DIR

START = "<!-- results:start (python -m bench.report --write) -->"
END = "<!-- results:end -->"


def _fmt(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"


#: The variant of the line that compares kvstore with LMCache on the same case (bench.tiers);
#: it fills the "vs LMCache" column of that case's kvstore row instead of a row of its own.
VS_LMCACHE = "kvstore vs LMCache"


#: the README's lines: (results file stem, variant); every case of each (ttft, transfer and
#: daemon: the H100 records, made after the store-face renovation; the H200's are older)
HEADLINES: tuple[tuple[str, str], ...] = (
    ("ttft-h100", "host hit, layer-wise"),
    ("ttft-h100", "daemon host hit"),
    ("ttft-h100", "no reuse, with store"),
    ("decode-h200", "ours vs memory-bandwidth floor"),
    ("transfer-h100", "load (copy_rows kernel, 33 blocks)"),
    ("transfer-h100", "save into reserved slots (whole pages, one DMA per run)"),
    ("daemon-h100", "peer-copy save"),
    ("daemon-h100", "peer-copy load"),
    ("daemon-h100", "shm save"),
    ("daemon-h100", "shm load"),
    ("daemon-h100", "lookup 2048 keys p99"),
    ("lookup-h200", "hash+lookup list-tokens"),
    ("writeback-h100", "write-back, free_reserve 0.05: engine time/step p50"),
    ("writeback-h100", "write-back, free_reserve 0.05: engine time/step p99"),
    ("vllm-cpu-2core", "kvstore host hit vs recompute"),
    ("vllm-cpu-2core", "kvstore no reuse"),
    ("vllm-cpu-2core", "default layout: kvstore daemon host hit vs the floor"),
)
#: the page whose table holds every line
BENCHMARKS_PAGE = "docs/benchmarks.md"


def render(results_dir: Path = RESULTS_DIR, *, headlines: bool = False) -> str:
    """The markdown table of the recorded lines: all that compare with a baseline, or only the
    :data:`HEADLINES` (one-client daemon lines only)."""
    want = set(HEADLINES)
    rows = [
        "| bench | machine | case | variant | value | baseline | baseline value | ratio "
        "| vs LMCache |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for path in sorted(results_dir.glob("*.json")):
        doc = json.loads(path.read_text())
        vs = {m["case"]: m["ratio"] for m in doc["measurements"] if m["variant"] == VS_LMCACHE}
        for m in _shown(doc["measurements"]):
            if headlines and ((path.stem, m["variant"]) not in want
                              or (path.stem.startswith("daemon") and m["case"] != "1-client")):
                continue
            peer = vs.get(m["case"]) if m["variant"] == "kvstore" else None
            rows.append(
                f"| {m['bench']} | {doc['machine']} | {m['case']} | {m['variant']} | "
                f"{_fmt(m['value'])} {m['unit']} | {m['baseline'] or '—'} | "
                f"{_fmt(m['baseline_value'])} | {_fmt(m['ratio'])} | {_fmt(peer)} |"
            )
    return "\n".join(rows)


def _shown(lines: list[dict]) -> list[dict]:
    """The compared lines; for policies only the best policy and LRU of each case (the files
    hold every line)."""
    lines = [m for m in lines if m.get("baseline") is not None and m["variant"] != VS_LMCACHE]
    best: dict[str, dict] = {}
    for m in lines:
        if m["bench"] == "policies" and (m["case"] not in best or m["value"] > best[m["case"]]["value"]):
            best[m["case"]] = m
    return [
        m for m in lines
        if m["bench"] != "policies" or m is best[m["case"]] or m["variant"] == "lru"
    ]


def readme_table(readme: str) -> str | None:
    m = re.search(re.escape(START) + r"\n(.*?)\n?" + re.escape(END), readme, re.S)
    return m.group(1).rstrip("\n") if m else None


def _replace_table(path: Path, table: str) -> None:
    text = path.read_text()
    if readme_table(text) is None:
        raise SystemExit(f"{path} lacks the markers {START!r} ... {END!r}")
    path.write_text(re.sub(re.escape(START) + r"\n.*?\n?" + re.escape(END),
                           lambda _m: f"{START}\n{table}\n{END}", text, flags=re.S))
    print(f"wrote {len(table.splitlines()) - 2} result rows into {path.name}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.report")
    parser.add_argument("--write", action="store_true",
                        help=f"update README.md and {BENCHMARKS_PAGE} in place")
    args = parser.parse_args()
    if not args.write:
        print(render())
        return
    _replace_table(REPO_ROOT / "README.md", render(headlines=True))
    _replace_table(REPO_ROOT / BENCHMARKS_PAGE, render())


if __name__ == "__main__":
    main()
