"""The documentation site builds with ``mkdocs build --strict``: every page in the nav, no
broken link or anchor, no page left out, and the API reference generated from the docstrings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_the_site_builds_strict(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (tmp_path / "site" / "configuration" / "index.html").exists()
    reference = (tmp_path / "site" / "reference" / "index.html").read_text()
    for name in ("prepare_load", "complete_store", "lookup", "KVConnectorScheduler",
                 "get_num_new_matched_tokens"):
        assert name in reference, name
