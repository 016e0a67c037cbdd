"""Setting up a disk tier (its settings were validated by its config model): its directory and filesystem checked, the
choice of O_DIRECT, and what a slab that cannot be opened is reported as. Every failure is a
:class:`ConfigError` (or :class:`InvalidArgument`) whose hint names the setting to change.

The filesystem checks call :mod:`~kvstore.tiers.disk_io` through the module, so a test can
stand in for the filesystem there.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import Any

from kvstore.errors import ConfigError
from kvstore.tiers import disk_io
from kvstore.tiers.disk_slab import Slab

log = logging.getLogger("kvstore.tiers.disk")



def open_directory(name: str, path: Path, allow_nfs: bool) -> str:
    """Make ``path`` the tier's private directory (created if missing, mode 0700) and check
    that it is writable and, unless ``allow_nfs``, not on a network filesystem. Returns its
    filesystem type. Raises ConfigError."""
    try:
        disk_io.private_dir(path)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "not writable")
    except OSError as exc:
        raise ConfigError(
            f"disk tier {name!r}: cannot use directory {path}: {exc.strerror}",
            hint="point the disk tier's path at a writable local directory",
        ) from None
    filesystem = disk_io.filesystem_type(path)
    if disk_io.is_network_filesystem(filesystem) and not allow_nfs:
        raise ConfigError(
            f"disk tier {name!r}: {path} is on a network filesystem ({filesystem}); "
            "its locking and O_DIRECT semantics cannot keep the index consistent",
            hint="use a local disk, or set the disk tier's allow_network_fs to true",
        )
    return filesystem


def use_o_direct(name: str, path: Path, filesystem: str, o_direct: Any) -> bool:
    """Whether the tier's I/O goes O_DIRECT: ``o_direct`` True demands it (ConfigError where
    the filesystem refuses it), "auto" uses it where allowed (else logs and goes buffered),
    False never."""
    reason = disk_io.probe_o_direct(path) if o_direct is not False else "disabled"
    if reason is not None and o_direct is True:
        raise ConfigError(
            f"disk tier {name!r}: {path} ({filesystem}) refuses O_DIRECT: {reason}",
            hint="set the disk tier's o_direct to 'auto' or false, or use another filesystem",
        )
    if reason is not None and o_direct == "auto":
        log.warning(
            "disk tier %r: %s (%s) refuses O_DIRECT (%s); using buffered I/O through the "
            "page cache", name, path, filesystem, reason,
        )
    return reason is None


def slab_open_error(name: str, capacity_pages: int, slab: Slab, exc: OSError) -> ConfigError:
    """What a failure to open (and allocate) the slab is reported as."""
    if exc.errno in disk_io.SPACE_ERRNOS:  # the room check passed; someone took it since
        return ConfigError(
            f"disk tier {name!r}: capacity_pages={capacity_pages}: cannot "
            f"allocate its slab of {slab.nbytes} bytes in {slab.path}: "
            f"{disk_io.describe(exc)}",
            hint="lower the disk tier's capacity, or free space on its filesystem",
        )
    return ConfigError(
        f"disk tier {name!r}: cannot open {slab.path}: {disk_io.describe(exc)}",
        hint="check the disk tier directory's permissions and its disk",
    )
