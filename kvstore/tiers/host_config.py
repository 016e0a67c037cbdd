"""The host tier's config model (see :mod:`kvstore.tiers.config_base`)."""

from __future__ import annotations

from typing import Literal

from pydantic import ByteSize, Field

from kvstore.sizes import Size
from kvstore.tiers.config_base import TierConfigBase


class HostTierConfig(TierConfigBase):
    """Host memory: one slab of page slots, pinned when CUDA is present."""

    kind: Literal["host"] = Field("host", description="selects the tier implementation")
    name: str = Field("host", description="unique name: the metrics label and the tier= argument")
    capacity: Size = Field(
        ByteSize(1 << 30), description="bytes of host memory for pages, e.g. '8GiB'")
    policy: str = Field(
        "lru", description="eviction policy: a registered name or package.module:Class")
    pin_memory: Literal["auto"] | bool = Field("auto", description=(
        "page-lock the slab for fast GPU copies; auto: when CUDA is available, true: refuse to "
        "start without it"))
