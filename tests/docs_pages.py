"""The project's documentation as the tests read it: README.md and the pages of docs/."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"


def page(name: str) -> str:
    """The text of ``docs/<name>.md``."""
    return (DOCS / f"{name}.md").read_text()


def pages() -> dict[Path, str]:
    """README.md, then every page of docs/ (sorted): path -> text."""
    out = {ROOT / "README.md": (ROOT / "README.md").read_text()}
    for path in sorted(DOCS.glob("*.md")):
        out[path] = path.read_text()
    return out


def all_text() -> str:
    """Every page, one after another (each starts with its own heading)."""
    return "\n\n".join(pages().values())
