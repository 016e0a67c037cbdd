"""The one loader of native ops. Each op is a C file in ``csrc/``, compiled on first use with the
system C compiler into a per-user cache keyed by the source's hash, and loaded with ctypes
(ctypes calls release the GIL). No compiler, a failed build, or ``KVSTORE_NATIVE=0`` -> the
caller gets None and uses the pure reference. ``KVSTORE_NATIVE=1`` makes a failed build an error.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

log = logging.getLogger("kvstore.native")
_SRC_DIR = Path(__file__).resolve().parent
_FLAGS = ("-O2", "-shared", "-fPIC", "-std=c11")
_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | None] = {}


def native_mode() -> str:
    """'auto' (default), '0' (never) or '1' (always: a failed build raises)."""
    mode = os.environ.get("KVSTORE_NATIVE", "auto").strip().lower()
    return mode if mode in ("auto", "0", "1") else "auto"


def _cache_dir() -> Path:
    base = os.environ.get("KVSTORE_NATIVE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kvstore", "native"
    )
    return Path(base)


def load(name: str) -> ctypes.CDLL | None:
    """The compiled ``csrc/<name>.c``, or None when native ops are off or unavailable."""
    mode = native_mode()
    if mode == "0":
        return None
    with _lock:
        if name in _loaded:
            return _loaded[name]
        try:
            lib: ctypes.CDLL | None = ctypes.CDLL(str(build(name)))
        except Exception as exc:
            if mode == "1":
                raise RuntimeError(f"native op {name!r} failed to build or load: {exc}") from exc
            log.warning("native op %s unavailable (%s); using the pure reference", name, exc)
            lib = None
        _loaded[name] = lib
        return lib


def build(name: str) -> Path:
    """Compile ``csrc/<name>.c`` (once per source version) and return the shared library."""
    src = _SRC_DIR / f"{name}.c"
    code = src.read_bytes()
    digest = hashlib.sha256(code + " ".join(_FLAGS).encode()).hexdigest()[:16]
    out = _cache_dir() / f"{name}-{digest}.so"
    if out.exists():
        return out
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler found (set CC)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        tmp_out = Path(tmp) / out.name
        proc = subprocess.run(
            [cc, *_FLAGS, "-o", str(tmp_out), str(src)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed: {proc.stderr.strip()[:500]}")
        os.replace(tmp_out, out)  # atomic: a concurrent builder never loads a half-written file
    return out
