"""Whether a disk tier's capacity fits, decided before anything is reserved.

A capacity turns into three amounts (``N`` = capacity_pages, ``S`` = slot bytes, ``E`` = an
upper bound of one index entry's bytes, ``disk_index``)::

    slab        N * S                 allocated at open when preallocating, else as pages arrive
    reserve     1 MiB + 2 * E * N     allocated past the end of data.mdb at every open
    index map   8 MiB + 4 * E * N     virtual address space LMDB maps (no disk)

A mistyped capacity must not fill the filesystem (ext4 keeps what a failed ``fallocate`` got,
invisibly) nor make LMDB fail to map a healthy index (which would look like damage), so the tier
refuses it with a ConfigError that names it, before it touches the slab or the index:

* the index map must stay under :data:`MAX_MAP_BYTES`;
* what is allocated at open (the slab when preallocating, and the reserve) must fit in the
  filesystem's free space plus what the tier's own files already hold (a tier that filled its
  filesystem earlier still reopens);
* a sparse slab (no preallocation) must fit in the filesystem's whole size.
"""

from __future__ import annotations

import os
from pathlib import Path

from kvstore.errors import ConfigError
from kvstore.tiers import disk_io
from kvstore.tiers.disk_index import map_bytes, reserve_bytes, reserve_bytes_per_page

#: LMDB maps the whole index; x86-64 gives a process 128 TiB of address space. A map past
#: this is a mistyped capacity (it stands for tens of billions of pages).
MAX_MAP_BYTES = 1 << 45


def check_capacity(
    name: str,
    directory: Path,
    capacity_pages: int,
    *,
    slot_bytes: int,
    block_size: int,
    preallocate: bool,
    slab_file: Path,
    index_file: Path,
) -> None:
    """Raise ConfigError when ``capacity_pages`` cannot fit (module docstring). Changes nothing."""
    what = f"disk tier {name!r}: capacity_pages={capacity_pages}"
    per_page = reserve_bytes_per_page(block_size)
    index_map = map_bytes(block_size, capacity_pages)
    if index_map > MAX_MAP_BYTES:
        most = (MAX_MAP_BYTES - map_bytes(block_size, 0)) // (2 * per_page)
        raise ConfigError(
            f"{what} needs an index map of {_size(index_map)}, more than the "
            f"{_size(MAX_MAP_BYTES)} of address space the index may take",
            hint=f"lower the disk tier's capacity to at most {most} pages",
        )
    reserve = reserve_bytes(block_size, capacity_pages)
    ours = disk_io.allocated_bytes(index_file)
    slab = capacity_pages * slot_bytes
    if preallocate:
        ours += disk_io.allocated_bytes(slab_file)
        need, room = slab + reserve, disk_io.free_bytes(directory) + ours
        where = "free (with what its files already hold)"
    else:
        st = os.statvfs(directory)
        need, room = slab + reserve, st.f_blocks * st.f_frsize
        where = "in all (its slab is sparse, yet must fit the filesystem)"
    if need > room:
        most = max(0, (room - reserve_bytes(block_size, 0)) // (slot_bytes + per_page))
        raise ConfigError(
            f"{what} needs {_size(need)} ({capacity_pages} slots of {slot_bytes} bytes and "
            f"{_size(reserve)} reserved for the index) but the filesystem of {directory} has "
            f"{_size(room)} {where}",
            hint=f"lower the disk tier's capacity to at most {most} pages, or free space on "
            "its filesystem",
        )


def _size(nbytes: int) -> str:
    """``nbytes`` for a message: exact below 1 MiB, else in binary units with one decimal."""
    if nbytes < 1 << 20:
        return f"{nbytes} bytes"
    value, unit = float(nbytes), "bytes"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        value /= 1024
        if value < 1024:
            break
    return f"{value:.1f} {unit}"


__all__ = ["MAX_MAP_BYTES", "check_capacity"]
