"""bench.writeback runs (small) and reports each variant against its bare-pool baseline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_bench_reports_every_variant_against_the_bare_pool(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "bench.writeback", "--quick", "--json",
                          "--dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=300)
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    variants = {x["variant"] for x in lines}
    assert variants == {f"write-back, free_reserve {r}: engine time/step p{q}"
                        for r in ("0", "0.05, switch interval 5 ms", "0.05") for q in (50, 99)}
    assert all(x["baseline"] == "bare pool, nothing written back" and x["ratio"] > 0
               for x in lines)
    assert not list(tmp_path.iterdir())  # the disk tier's files are gone
