"""The documentation site builds with ``mkdocs build --strict``: every page in the nav, no
broken link or anchor, no page left out."""

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
