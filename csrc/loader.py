"""The one loader of native ops. Each op is a C file (``csrc/<name>.c``, built with the system C
compiler) or a CUDA file (``csrc/<name>.cu``, built with ``nvcc`` for the GPUs of this machine),
compiled on first use into a per-user cache keyed by the source's hash and flags, and loaded with
ctypes (ctypes calls release the GIL). No compiler, a failed build, or ``KVSTORE_NATIVE=0`` -> the
caller gets None and uses the pure reference. ``KVSTORE_NATIVE=1`` makes a failed build an error.

CUDA ops: ``NVCC`` (or ``CUDA_HOME/bin/nvcc``, else ``nvcc`` on the PATH) builds them;
``KVSTORE_CUDA_ARCH`` (default ``native``: the GPUs present) is passed as ``-arch``;
``KVSTORE_COPY_BLOCKS`` overrides the thread blocks of a copy_rows launch. The CUDA
runtime is linked statically and shares the driver's primary context with PyTorch, so streams
from ``torch.cuda`` are valid launch streams.
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
_CUDA_FLAGS = ("-O3", "-shared", "-Xcompiler", "-fPIC", "-std=c++17")
_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | None] = {}


def native_mode() -> str:
    """'auto' (default), '0' (never) or '1' (always: a failed build raises). Any other value is
    an error naming the variable (a typo must not silently mean 'auto')."""
    raw = os.environ.get("KVSTORE_NATIVE", "auto")
    mode = raw.strip().lower()
    if mode not in ("auto", "0", "1"):
        from kvstore.errors import ConfigError

        raise ConfigError(f"KVSTORE_NATIVE={raw!r}: must be auto, 0 or 1",
                          hint="unset it, or set auto, 0 or 1")
    return mode


def copy_blocks_override(name: str = "KVSTORE_COPY_BLOCKS") -> int | None:
    """``KVSTORE_COPY_BLOCKS`` (loads) or ``KVSTORE_SAVE_BLOCKS`` (saves): thread blocks per
    copy_rows launch (tuning; None = the default)."""
    env = os.environ.get(name, "").strip()
    return int(env) if env.isdigit() and int(env) > 0 else None


def _cache_dir() -> Path:
    base = os.environ.get("KVSTORE_NATIVE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kvstore", "native"
    )
    return Path(base)


def load(name: str) -> ctypes.CDLL | None:
    """The compiled ``csrc/<name>.c`` (or ``.cu``), or None when native ops are off or
    unavailable."""
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


def _nvcc() -> str | None:
    if os.environ.get("NVCC"):
        return os.environ["NVCC"]
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    for cand in ([os.path.join(home, "bin", "nvcc")] if home else []) + ["/usr/local/cuda/bin/nvcc"]:
        if os.path.exists(cand):
            return cand
    return shutil.which("nvcc")


def _command(src: Path) -> tuple[list[str], tuple[str, ...]]:
    """The compiler and flags for one source file (flags are part of the cache key)."""
    if src.suffix == ".cu":
        nvcc = _nvcc()
        if not nvcc:
            raise RuntimeError("no CUDA compiler found (set NVCC or CUDA_HOME)")
        arch = os.environ.get("KVSTORE_CUDA_ARCH", "native")
        return [nvcc], (*_CUDA_FLAGS, f"-arch={arch}")
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler found (set CC)")
    return [cc], _FLAGS


def build(name: str) -> Path:
    """Compile ``csrc/<name>.c`` or ``csrc/<name>.cu`` (once per source version and flags) and
    return the shared library."""
    src = _SRC_DIR / f"{name}.c"
    if not src.exists():
        src = _SRC_DIR / f"{name}.cu"
    code = src.read_bytes()
    compiler, flags = _command(src)
    digest = hashlib.sha256(code + " ".join(flags).encode()).hexdigest()[:16]
    out = _cache_dir() / f"{name}-{digest}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        tmp_out = Path(tmp) / out.name
        proc = subprocess.run(
            [*compiler, *flags, "-o", str(tmp_out), str(src)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{compiler[0]} failed: {proc.stderr.strip()[:500]}")
        os.replace(tmp_out, out)  # atomic: a concurrent builder never loads a half-written file
    return out
