"""The Troubleshooting page quotes kvstore's errors as the code raises them: each bold quoted
phrase of the page that is kvstore's own text appears in the source it comes from."""

from __future__ import annotations

import re
from pathlib import Path

from tests.docs_pages import ROOT, page

#: quoted phrases that are not kvstore's text (vLLM's and Python's), or describe a behaviour
NOT_OURS = {"PackageNotFoundError", "Not enough allowed NUMA nodes to bind threads",
            "Lookups miss and saves are dropped while the daemon is down"}


def _sources() -> str:
    return "\n".join(p.read_text() for d in ("kvstore", "connector", "server")
                     for p in sorted((ROOT / d).rglob("*.py")))


def test_every_quoted_message_is_in_the_code() -> None:
    text = page("troubleshooting")
    quoted = [q for q in re.findall(r"\*\*`?([^*`]+?)`?\*\*", text) if q not in NOT_OURS]
    assert len(quoted) >= 12, quoted
    code = " ".join(_sources().split())
    for q in quoted:
        fixed = [part.strip() for part in re.split(r"…|\(…\)", q) if part.strip()]
        for part in fixed:  # each fixed piece of the message, as the code writes it
            assert part in code or repr(part)[1:-1] in code, f"not in the code: {part!r} (of {q!r})"
    assert all(Path(ROOT / "docs" / f).exists() for f in re.findall(r"\]\(([\w-]+\.md)\)", text))
