"""Fixtures of the daemon tests: a real ``kvstore serve`` subprocess per test, engine child
processes driven over pipes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.daemon_proc import ROOT, DaemonProc, write_config


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProc]:
    with DaemonProc(write_config(tmp_path)) as d:
        yield d


class EngineChild:
    """``tests/server/engine_child.py`` in its own process."""

    def __init__(self, target: str, pause: str | None = None) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        if pause:
            env["KV_PAUSE"] = pause
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests/server/engine_child.py"), target], cwd=ROOT,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert self.readline() == "READY"

    def readline(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"engine child exited with {self.proc.wait()}")
        return line.strip()

    def send(self, obj: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
        self.proc.stdin.flush()

    def gen(self, prompt: list[int], max_tokens: int = 6) -> dict[str, Any]:
        self.send({"op": "gen", "prompt": prompt, "max_tokens": max_tokens})
        return json.loads(self.readline())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.send({"op": "quit"})
            self.proc.wait(60)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def engine_child() -> Iterator[Any]:
    children: list[EngineChild] = []

    def make(target: str, pause: str | None = None) -> EngineChild:
        children.append(EngineChild(target, pause))
        return children[-1]

    yield make
    for c in children:
        if c.proc.poll() is None:
            c.kill()


def reference_tokens(prompt: list[int], max_tokens: int = 6) -> list[int]:
    """Greedy tokens of the tiny model with no cache at all (this process)."""
    from runtime.engine import Engine
    from runtime.sampling import SamplingParams

    engine = Engine.from_config("tiny", num_blocks=64, enable_prefix_caching=False)
    return engine.generate([prompt], SamplingParams(max_tokens=max_tokens))[0].output_token_ids
