"""Operations the store's concurrency tests share: pages whose bytes follow from their key (so a
read checks itself), and the put and get branches of their workers."""

from __future__ import annotations

from collections import Counter

import numpy as np
import xxhash

from kvstore import TieredStore
from kvstore.keys import BlockChain, Namespace


def page_of(key: bytes) -> np.ndarray:
    """128 bytes that only ``key`` has."""
    raw = b"".join(xxhash.xxh3_128_digest(key + bytes([i])) for i in range(8))
    return np.frombuffer(raw, dtype=np.uint8)


def put_or_get(store: TieredStore, ns: Namespace, chain: BlockChain, n: int, op: float,
               tally: Counter[str]) -> bool:
    """``op`` < 0.3: put the first ``n`` pages of ``chain``; < 0.5: get them, counting the
    pages that came back wrong in ``tally["wrong"]``. Returns whether it did either."""
    keys = list(chain.keys[:n])
    if op < 0.3:
        store.put(chain.metas(0, n), np.stack([page_of(k) for k in keys]))
    elif op < 0.5:
        out = np.zeros((n, store.layout.page_bytes), np.uint8)
        res = store.get(ns.id, keys, out)
        tally["wrong"] += sum(f and not np.array_equal(b, page_of(k))
                              for k, f, b in zip(keys, res.found, out))
    else:
        return False
    return True
