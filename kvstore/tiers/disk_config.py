"""The disk tier's config model (see :mod:`kvstore.tiers.config_base`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import ByteSize, Field

from kvstore.sizes import Size
from kvstore.tiers.config_base import TierConfigBase

#: Bytes per preadv/pwritev (one slot where a slot is bigger). Small enough that a batch's
#: runs spread over the workers and each run's hashing overlaps the others' I/O (a run is
#: verified only once all of it has arrived); big enough that a batch of small pages is a few
#: requests, not many. Measured on the 2-core machine, MAC on, 512 MiB in batches interleaved
#: with raw O_DIRECT, median, 3 runs: 256 KiB pages, ratio to raw at 1 / 2 / 4 MiB: puts x 16
#: 0.44-0.47 / 0.48-0.51 / 0.48-0.52, x 64 0.49-0.51 / 0.58-0.64 / 0.60-0.62; gets x 16
#: 0.67-0.70 / 0.74-0.77 / 0.73-0.76, x 64 0.87-0.91 / 0.91-0.92 / 0.84-0.86. Earlier, at
#: 8 MiB: gets of 256 KiB x 64 at 0.8 of 1 MiB's, of 2 MiB pages x 16 at 0.8 of one page's.
#: Pages of 1 MiB and up move one slot per call either way.
DEFAULT_MAX_IO_BYTES = 2 << 20

#: The group commit's bound. Measured on the 2-core machine (MAC off, puts interleaved batch by
#: batch with raw O_DIRECT, median of 3 x 384 MiB): 2 MiB x 16, raw 3.88 GB/s: none 0.839,
#: group at 100 ms 0.838, at 20 ms 0.847, batch 0.785 of raw; 256 KiB x 64, raw 3.65: none
#: 0.671, group 100 ms 0.683, 20 ms 0.637, batch 0.567. The group commit costs nothing
#: measurable against no flushing at all (what is left to raw is the tier's own work); 100 ms
#: bounds the exposure to a power cut well inside what a recomputable cache needs.
DEFAULT_SYNC_INTERVAL_MS = 100.0

#: When a put becomes power-safe (kvstore/tiers/disk.py: the module docstring).
Durability = Literal["group", "batch", "none"]


class DiskTierConfig(TierConfigBase):
    """NVMe: a preallocated slab of record slots with an LMDB index, in a directory of its own
    on a local filesystem (see kvstore/tiers/disk.py for the guarantees). Page buffers that are
    4 KiB aligned (``kvstore.buffers.aligned_pages``) go to and from disk with no copy; others
    go through a counted bounce buffer."""

    kind: Literal["disk"] = Field("disk", description="selects the tier implementation")
    name: str = Field("disk", description="unique name: the metrics label and the tier= argument")
    capacity: Size = Field(ByteSize(64 << 30), description="bytes of pages, e.g. '500GiB'")
    policy: str = Field(
        "lru", description="eviction policy: a registered name or package.module:Class")
    path: Path = Field(description="the tier's own directory (created if missing)")
    io_threads: int = Field(8, ge=1, le=256, description="parallel preadv/pwritev workers")
    o_direct: Literal["auto"] | bool = Field("auto", description=(
        "bypass the page cache; auto: where the filesystem allows it, else buffered I/O "
        "(logged); true: refuse to start without it"))
    durability: Durability = Field(
        "group",
        description="when a put is power-safe: group (within sync_interval_ms), batch (at once: "
        "a device flush per batch), none (never forced); all survive a process crash",
    )
    sync_interval_ms: float = Field(
        DEFAULT_SYNC_INTERVAL_MS, gt=0, le=60_000, description="the group commit's bound (durability = group)"
    )
    preallocate: bool = Field(True, description=(
        "reserve the whole slab file at start (false: sparse, it grows as pages are written)"))
    allow_network_fs: bool = Field(False, description=(
        "run on NFS/CIFS/FUSE anyway (unsafe: locks and O_DIRECT are not reliable there)"))
    check_index: bool = Field(True, description=(
        "probe the LMDB index in a child process at start; a damaged index is moved aside and "
        "the tier starts empty"))
    max_io_bytes: Size = Field(
        ByteSize(DEFAULT_MAX_IO_BYTES), ge=4096,
        description="bytes per syscall (one slot where bigger)",
    )
    hash_in_workers: bool | None = Field(
        None,
        description="who hashes puts and verifies gets: the I/O workers (true) or the calling "
        "thread (false); unset: the workers from 4 cores up",
    )
