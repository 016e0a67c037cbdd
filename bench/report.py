"""Render the README's results table from ``bench/results/*.json``.

    python -m bench.report            # print the markdown table
    python -m bench.report --write    # replace the table between the README's markers

A test checks that the README's table is exactly what this renders, so the README's numbers
always come from the recorded results.
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


def render(results_dir: Path = RESULTS_DIR) -> str:
    rows = [
        "| bench | machine | case | variant | value | baseline | baseline value | ratio "
        "| vs LMCache |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for path in sorted(results_dir.glob("*.json")):
        doc = json.loads(path.read_text())
        vs = {m["case"]: m["ratio"] for m in doc["measurements"] if m["variant"] == VS_LMCACHE}
        for m in _shown(doc["measurements"]):
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


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.report")
    parser.add_argument("--write", action="store_true", help="update README.md in place")
    args = parser.parse_args()
    table = render()
    if not args.write:
        print(table)
        return
    path = REPO_ROOT / "README.md"
    text = path.read_text()
    if readme_table(text) is None:
        raise SystemExit(f"README.md lacks the markers {START!r} ... {END!r}")
    new = re.sub(
        re.escape(START) + r"\n.*?\n?" + re.escape(END),
        lambda _m: f"{START}\n{table}\n{END}",
        text,
        flags=re.S,
    )
    path.write_text(new)
    print(f"wrote {len(table.splitlines()) - 2} result rows into README.md")


if __name__ == "__main__":
    main()
