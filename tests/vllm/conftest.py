"""vLLM fixtures: a tiny random-weight Llama written by transformers, and real ``vllm.LLM``
engines (CPU backend, in this process) with or without kvstore's connector.

The whole directory is skipped when vLLM is not installed (``KVSTORE_WITH_VLLM=1
scripts/bootstrap.sh`` installs it; CI does). Engines run in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that a test can read the connector's counters and
its store; a second process is started only where the test is about a new process.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
pytest.importorskip("vllm", reason="vLLM is not installed (KVSTORE_WITH_VLLM=1 scripts/bootstrap.sh)")

from bench.vllm_engines import (  # noqa: E402
    close_llm,
    generate,
    make_llm,
    reset_prefix_cache,
    write_tiny_llama,
)
from tests.vllm.prompts import PROMPTS  # noqa: E402


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/vllm/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.vllm)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def expected(tiny_llama: str) -> list[list[int]]:
    """Greedy tokens of vLLM without a connector, each prompt computed from scratch."""
    llm = make_llm(tiny_llama)
    try:
        out = []
        for p in PROMPTS:
            reset_prefix_cache(llm)
            out.append(generate(llm, [p])[0][0])
        return out
    finally:
        close_llm(llm)
