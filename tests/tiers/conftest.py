"""The tier conformance suite runs against every tier kind listed in ``TIER_FACTORIES``.

A factory takes (layout, capacity_pages, request, metrics) and returns an opened tier, starting
whatever real server or directory it needs through the request's fixtures."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from kvstore import KVLayout, Metrics
from kvstore.tiers import Tier
from kvstore.tiers.host import HostTier

Factory = Callable[[KVLayout, int, pytest.FixtureRequest, Metrics], Tier]


def _host(layout: KVLayout, capacity: int, _req: pytest.FixtureRequest, metrics: Metrics) -> Tier:
    return HostTier.build("host", layout, capacity, metrics, pin_memory=False)


def _hbm(layout: KVLayout, capacity: int, _req: pytest.FixtureRequest, metrics: Metrics) -> Tier:
    from kvstore.tiers.hbm import HBMTier

    return HBMTier.build("hbm", layout, capacity, metrics, device="cpu")


def _redis(layout: KVLayout, capacity: int, req: pytest.FixtureRequest, metrics: Metrics) -> Tier:
    from kvstore.tiers.redis import RedisTier

    server = req.getfixturevalue("redis_server")
    return RedisTier.build("redis", layout, capacity, metrics, url=server.url, timeout_s=2.0)


def _disk(layout: KVLayout, capacity: int, req: pytest.FixtureRequest, metrics: Metrics) -> Tier:
    from kvstore.tiers.disk import DiskTier

    tmp = req.getfixturevalue("tmp_path")
    return DiskTier.build("disk", layout, capacity, metrics, path=tmp / "disk")


def _disk_workers(
    layout: KVLayout, capacity: int, req: pytest.FixtureRequest, metrics: Metrics
) -> Tier:
    """The disk tier as machines with cores to spare run it: the I/O workers hash and verify
    (the plain ``disk`` factory gets whichever way this machine's cores choose)."""
    from kvstore.tiers.disk import DiskTier

    tmp = req.getfixturevalue("tmp_path")
    return DiskTier.build("disk", layout, capacity, metrics, path=tmp / "disk", hash_in_workers=True)


TIER_FACTORIES: dict[str, Factory] = {
    "hbm": _hbm, "host": _host, "disk": _disk, "disk-workers": _disk_workers, "redis": _redis,
}


@pytest.fixture(params=sorted(TIER_FACTORIES))
def make_tier(request: pytest.FixtureRequest) -> Iterator[Callable[..., Tier]]:
    opened: list[Tier] = []

    def make(layout: KVLayout, capacity: int = 16, metrics: Metrics | None = None) -> Tier:
        tier = TIER_FACTORIES[request.param](layout, capacity, request, metrics or Metrics())
        opened.append(tier)
        return tier

    yield make
    for t in opened:
        t.close()
