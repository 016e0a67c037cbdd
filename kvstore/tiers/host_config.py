"""The host tier's config model (see :mod:`kvstore.tiers.config_base`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ByteSize, Field

from kvstore.sizes import Size
from kvstore.tiers.config_base import TierConfigBase


class HostTierConfig(TierConfigBase):
    """Host memory: one slab of page slots, pinned when CUDA is present."""

    kind: Literal["host"] = "host"
    name: str = "host"
    capacity: Size = Field(ByteSize(1 << 30), description="bytes, e.g. '8GiB'")
    policy: str = "lru"
    pin_memory: Literal["auto"] | bool = "auto"

    def tier_kwargs(self) -> dict[str, Any]:
        return {"pin_memory": None if self.pin_memory == "auto" else self.pin_memory}
