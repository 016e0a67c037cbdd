"""The README stays true: its results table is what bench/results/ holds, and its commands
exist."""

from __future__ import annotations

from pathlib import Path

from bench.report import readme_table, render

ROOT = Path(__file__).parents[1]


def test_results_table_comes_from_bench_results() -> None:
    table = readme_table((ROOT / "README.md").read_text())
    assert table is not None, "README lacks the results markers"
    assert table == render(), "README results are stale: run python -m bench.report --write"


def test_setup_commands_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "bash scripts/bootstrap.sh && .venv/bin/kvstore demo" in readme
    assert "bash scripts/test.sh" in readme
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    for script in ("scripts/bootstrap.sh", "scripts/test.sh"):
        assert (ROOT / script).exists()


def test_connector_example_runs() -> None:
    """The README's minimal engine over the connector is real code: it runs and its asserts hold."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Connector API"):]
    code = section[section.index("```python\n") + 10:]
    code = code[:code.index("```")]
    exec(compile(code, "README.md#connector-api", "exec"), {"__name__": "readme_example"})
