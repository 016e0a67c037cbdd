"""The README's main command: `kvstore demo` on the embedded default, and config errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from server.cli import app


def test_demo_runs_on_embedded_default() -> None:
    # a real process, as the README runs it
    env = {**os.environ, "KVSTORE_TIERS": '[{"kind": "host", "capacity": "64MiB"}]'}
    proc = subprocess.run(
        [sys.executable, "-m", "server.cli", "store-demo", "--conversations", "2", "--turns", "3"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "verified byte for byte" in proc.stdout
    assert "host" in proc.stdout


def test_default_demo_uses_host_over_disk() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "server.cli", "store-demo", "--conversations", "3", "--turns", "3"],
        capture_output=True, text=True, timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("KVSTORE_")},
    )
    assert proc.returncode == 0, proc.stderr
    assert "disk" in proc.stdout and "write_back->disk" in proc.stdout
    assert "verified byte for byte" in proc.stdout


def test_bad_config_exits_with_a_named_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[store]\nwrite_policy = "sometimes"\n')
    result = CliRunner().invoke(app, ["store-demo", "--config", str(bad)])
    assert result.exit_code == 2
    assert "store.write_policy" in result.output


def test_main_demo_runs_the_runtime_with_and_without_the_prefix_cache() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "server.cli", "demo", "--model", "small", "--turns", "2",
         "--max-tokens", "4"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "TTFT" in proc.stdout and "reused" in proc.stdout


def test_config_command_prints_effective_config() -> None:
    result = CliRunner().invoke(app, ["config"])
    assert result.exit_code == 0
    assert '"write_policy"' in result.output and '"block_size"' in result.output
