"""Connector fixtures: a 4-layer layout (so layer-wise transfers are observable), its
namespace, and a clock the tests move by hand (lease expiry without sleeping)."""

from __future__ import annotations

import pytest

from kvstore import KVLayout, Namespace
from tests.connector.test_inprocess import FakeClock


@pytest.fixture
def layout() -> KVLayout:
    return KVLayout(num_layers=4, num_kv_heads=2, head_dim=8, block_size=4, dtype="float16")


@pytest.fixture
def ns(layout: KVLayout) -> Namespace:
    return Namespace("test-model", layout, "tenant-a")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
