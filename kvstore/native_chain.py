"""The chained block keys of :func:`kvstore.keys.chain_keys` in one native call
(``csrc/chain_keys.c``): the chain is sequential, so in Python every block is a loop turn (a
slice, a concatenation and a hash call, ~0.24 us on the H200's host: 0.06 ms before a 4K-token
prompt's lookup, 0.5 ms before a 32K one's).

The native loop hashes with ``XXH3_128bits`` of the very xxhash library Python hashes with (the
python-xxhash extension exports it), so both paths run the same hash code. Where the library,
the symbol or a C compiler is missing, or ``KVSTORE_NATIVE=0``, :func:`native_chain` is None and
keys are hashed in Python. Before first use the native chain is checked against the Python one
on a fixed input: a disagreement (a library whose symbol is not that hash) turns it off with a
warning -- a wrong key would be a miss everywhere, never a wrong page, but it must not happen.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import struct
import threading
from collections.abc import Callable

import xxhash

log = logging.getLogger("kvstore.native")

#: A key is one XXH3-128 digest (kvstore.keys.KEY_BYTES; that module imports this one)
KEY_BYTES = xxhash.xxh3_128().digest_size
#: The native op's limit on a block's token bytes, KV_MAX_STEP in csrc/chain_keys.c
#: (block_size <= 1024; larger blocks hash in Python).
MAX_STEP = 4096

ChainFn = Callable[[bytes, bytes, int, int], list[bytes]]

_lock = threading.Lock()
_resolved = False
_chain: ChainFn | None = None


@functools.lru_cache(maxsize=64)
def _splitter(n: int) -> struct.Struct:
    """Splits ``n`` keys' bytes into ``n`` bytes objects in one C call."""
    return struct.Struct(f"{KEY_BYTES}s" * n)


def _bind() -> ChainFn | None:
    from csrc.loader import load

    lib = load("chain_keys")
    if lib is None:
        return None
    try:
        hasher = ctypes.CDLL(xxhash._xxhash.__file__).XXH3_128bits  # type: ignore[attr-defined]
    except (AttributeError, OSError) as exc:
        log.warning("xxhash exports no XXH3_128bits (%s); block keys are hashed in Python", exc)
        return None
    hash_ptr = ctypes.cast(hasher, ctypes.c_void_p).value
    fn = lib.kv_chain_keys
    fn.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                   ctypes.c_size_t, ctypes.c_void_p]
    fn.restype = ctypes.c_int

    def chain(seed: bytes, data: bytes, n: int, step: int) -> list[bytes]:
        out = ctypes.create_string_buffer(n * KEY_BYTES)
        if fn(hash_ptr, seed, data, n, step, out) != 0:
            raise ValueError(f"block of {step} token bytes is outside (0, {MAX_STEP}]")
        return list(_splitter(n).unpack(out.raw))

    return chain


def _agrees(chain: ChainFn, reference: ChainFn) -> bool:
    seed = bytes(range(KEY_BYTES))
    data = bytes((7 * i + 3) % 256 for i in range(64 * 40))
    return all(chain(seed, data[: n * step], n, step) == reference(seed, data[: n * step], n, step)
               for n, step in ((1, 64), (40, 64), (10, 256)))


def native_chain(reference: ChainFn) -> ChainFn | None:
    """The native chain (``fn(seed, data, n, step)``: the keys of the ``n`` blocks of ``step``
    bytes in ``data``), or None; checked once against ``reference``, the Python chain."""
    global _resolved, _chain
    if _resolved:
        return _chain
    with _lock:
        if not _resolved:
            chain = _bind()
            if chain is not None and not _agrees(chain, reference):
                log.warning("the native block-key chain disagrees with xxhash; hashing in Python")
                chain = None
            _chain, _resolved = chain, True
    return _chain
