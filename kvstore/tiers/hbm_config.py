"""The hbm tier's config model (see :mod:`kvstore.tiers.config_base`)."""

from __future__ import annotations

from typing import Literal

from pydantic import ByteSize, Field, field_validator

from kvstore.sizes import Size
from kvstore.tiers.config_base import TierConfigBase


class HBMTierConfig(TierConfigBase):
    """GPU memory: the page pool an engine allocates its paged KV cache from (torch's CPU device
    where there is no GPU)."""

    kind: Literal["hbm"] = Field("hbm", description="selects the tier implementation")
    name: str = Field("hbm", description="unique name: the metrics label and the tier= argument")
    capacity: Size = Field(ByteSize(8 << 30), description="bytes of GPU memory for pages")
    # Leaf-first: a hit touches a chain head to tail, so LRU would evict heads first and leave
    # tails an engine can only recompute (its prefix stops at the first missing block).
    policy: str = Field("lineage", description=(
        "eviction policy: a registered name or package.module:Class; lineage evicts leaves "
        "first, so a chain keeps its head"))
    device: str | None = Field(None, description="torch device; default cuda if present, else cpu")

    @field_validator("device", mode="before")
    @classmethod
    def _device_as_text(cls, device: object) -> object:
        # An engine holds a torch.device: it is kept as its text ("cuda:0"), which this light
        # module can check without importing torch.
        return str(device) if type(device).__name__ == "device" else device
