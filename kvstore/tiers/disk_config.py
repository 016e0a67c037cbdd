"""The disk tier's config model (see :mod:`kvstore.tiers.config_base`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import ByteSize, Field

from kvstore.sizes import Size
from kvstore.tiers.config_base import TierConfigBase


class DiskTierConfig(TierConfigBase):
    """NVMe: a preallocated slab of record slots with an LMDB index, in a directory of its own
    on a local filesystem (see kvstore/tiers/disk.py for the guarantees)."""

    kind: Literal["disk"] = "disk"
    name: str = "disk"
    capacity: Size = Field(ByteSize(64 << 30), description="bytes of pages, e.g. '500GiB'")
    policy: str = "lru"
    path: Path = Field(description="the tier's own directory (created if missing)")
    io_threads: int = Field(8, ge=1, le=256, description="parallel preadv/pwritev workers")
    o_direct: Literal["auto"] | bool = "auto"
    durability: Literal["group", "batch", "none"] = Field(
        "group",
        description="when a put is power-safe: group (within sync_interval_ms), batch (at once: "
        "a device flush per batch), none (never forced); all survive a process crash",
    )
    sync_interval_ms: float = Field(
        100.0, gt=0, le=60_000, description="the group commit's bound (durability = group)"
    )
    preallocate: bool = True
    allow_network_fs: bool = False
    check_index: bool = True
    max_io_bytes: Size = Field(
        ByteSize(1 << 20), ge=4096, description="bytes per syscall (one slot where bigger)"
    )
    hash_in_workers: bool | None = Field(
        None,
        description="who hashes puts and verifies gets: the I/O workers (true) or the calling "
        "thread (false); unset: the workers from 4 cores up",
    )

    def tier_kwargs(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "io_threads": self.io_threads,
            "o_direct": self.o_direct,
            "durability": self.durability,
            "sync_interval_ms": self.sync_interval_ms,
            "preallocate": self.preallocate,
            "allow_network_fs": self.allow_network_fs,
            "check_index": self.check_index,
            "max_io_bytes": int(self.max_io_bytes),
            "hash_in_workers": self.hash_in_workers,
        }
