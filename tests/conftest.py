"""Shared fixtures. Hypothesis runs a fixed, derandomized profile in CI."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings

from kvstore import KVLayout, Metrics, Namespace

# The Triton kernels (runtime.attention.paged, runtime.fused_kernels) run on a CPU only under
# Triton's interpreter, and Triton picks the interpreter when it is first imported: so the flag
# is set for the whole session, before any test imports Triton (vLLM's CPU build runs no Triton
# kernel and passes its tests either way).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "dev", max_examples=50, deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "long", max_examples=2000, deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def layout() -> KVLayout:
    """A tiny layout: 2 layers, 2 KV heads of 4, 4-token blocks, fp16 -> 256-byte pages."""
    return KVLayout(num_layers=2, num_kv_heads=2, head_dim=4, block_size=4, dtype="float16")


@pytest.fixture
def ns(layout: KVLayout) -> Namespace:
    return Namespace("test-model", layout, "tenant-a")


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


def random_pages(layout: KVLayout, n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, layout.page_bytes), dtype=np.uint8)
