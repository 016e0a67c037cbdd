"""The tier conformance suite runs against every tier kind listed in ``TIER_FACTORIES``.

A factory takes (layout, capacity_pages, tmp_path, metrics) and returns an opened tier; a tier
issue adds its kind here (starting whatever real server or directory it needs)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvstore import KVLayout, Metrics
from kvstore.tiers import Tier
from kvstore.tiers.host import HostTier

Factory = Callable[[KVLayout, int, Path, Metrics], Tier]


def _host(layout: KVLayout, capacity: int, _tmp: Path, metrics: Metrics) -> Tier:
    return HostTier("host", layout, capacity, metrics)


TIER_FACTORIES: dict[str, Factory] = {"host": _host}


@pytest.fixture(params=sorted(TIER_FACTORIES))
def make_tier(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Tier]]:
    opened: list[Tier] = []

    def make(layout: KVLayout, capacity: int = 16, metrics: Metrics | None = None) -> Tier:
        tier = TIER_FACTORIES[request.param](layout, capacity, tmp_path, metrics or Metrics())
        opened.append(tier)
        return tier

    yield make
    for t in opened:
        t.close()
