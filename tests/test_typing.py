"""The store core and the connector type-check (mypy with the pydantic plugin, pyproject's
settings): types at the boundaries stay true."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_mypy_is_clean_on_the_core() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "kvstore", "connector"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_finds_nothing() -> None:
    """pyflakes' checks (pyproject's [tool.ruff]) over the whole tree: no undefined names, no
    unused imports."""
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "."],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
