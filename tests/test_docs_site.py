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


def test_no_page_cites_a_commit() -> None:
    """Prose states what holds now; which commit measured what is the records' business
    (``bench/results/``, the git log). A commit id is 7-12 hex digits, or 40 (the key spec's test
    vector has digests of 16 and 32); a number of decimal digits is not one."""
    import re

    from tests.docs_pages import pages

    hexid = r"(?=[0-9]*[a-f])[0-9a-f]{7,12}"  # not a decimal number
    commit = re.compile(rf"`{hexid}`|`[0-9a-f]{{40}}`|\bat {hexid}\b")
    for path, text in pages().items():
        for line in text.splitlines():
            if path.name == "benchmarks.md" and line.startswith("|"):
                continue  # the table of records
            assert not commit.search(line), f"{path.name}: {line}"
