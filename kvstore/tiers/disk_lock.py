"""The disk tier's directory lock: ``<dir>/LOCK``, an exclusive flock held while a tier has the
directory open, whose text is the owner's pid (for the message another opener gets); mode 0600.

The flock belongs to the descriptor: one left open by a failed start would keep the directory
locked until the process ends ("already open (by process ?)"), so every error path closes it.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from kvstore.errors import ConfigError, KVStoreError, TierUnavailable
from kvstore.tiers.disk_io import SPACE_ERRNOS, describe, open_private


def lock_directory(path: Path) -> int:
    """Take the directory's exclusive flock (non-blocking) and write our pid into it. Every
    error closes the descriptor (an open one would hold the flock until the process ends)."""
    lock_path = path / "LOCK"
    try:
        fd = open_private(lock_path, os.O_RDWR)
    except OSError as exc:
        raise _lock_error(path, exc) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        try:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        except OSError:
            holder = "?"
        finally:
            os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise _lock_error(path, exc) from None
        who = "this process" if holder == str(os.getpid()) else f"process {holder}"
        raise ConfigError(
            f"disk tier directory {path} is already open (by {who})",
            hint="give every disk tier, in every process, its own directory",
        ) from None
    text = f"{os.getpid()}\n".encode()
    try:
        # Over the old text, then cut (not cut, then write): a full filesystem still takes a
        # pid where the file already holds a block, and ext4 frees a cut block only later.
        os.pwrite(fd, text, 0)
        os.ftruncate(fd, len(text))
    except OSError as exc:
        os.close(fd)
        raise _lock_error(path, exc) from None
    return fd


def _lock_error(path: Path, exc: OSError) -> KVStoreError:
    if exc.errno in SPACE_ERRNOS:
        return TierUnavailable(
            f"cannot write the lock file of disk tier directory {path}: {describe(exc)}",
            hint="free space on the disk tier's filesystem, then start the tier again",
        )
    return ConfigError(
        f"cannot lock disk tier directory {path}: {describe(exc)}",
        hint="point the disk tier's path at a writable local directory",
    )


__all__ = ["lock_directory"]
