"""LMCache's own fastest adapters, driven directly, as the same-run peer of ``bench.tiers``.

What LMCache 0.5.6 ships for each medium (read from its installed source):

* **disk** — ``lmcache.lmcache_fs.LMCacheFSClient`` (C++; its ``fs_native`` L2 adapter): one
  file per object, written and read by ``num_workers`` C++ threads, O_DIRECT when asked
  (``use_odirect``; we ask: the medium, not the page cache, is what is compared).
* **redis** — ``lmcache.lmcache_redis.LMCacheRedisClient`` (C++ RESP client, its ``resp`` L2
  adapter and ``RESPClient``): ``num_workers`` connections, raw ``SET``/``GET`` of the bytes.
* **host** — ``LocalCPUBackend`` with its own ``MixedMemoryAllocator``: a put allocates memory
  objects from LMCache's pool, copies the page in (``tensor.copy_``: what its connector does on
  a CPU device) and hands the objects to the backend; a get looks them up and copies out.

Both native clients share one asynchronous interface: ``submit_batch_{set,get,exists,delete}``
return a future id; completions are signalled on an eventfd and collected with
``drain_completions()`` as ``(future_id, ok, error, bools)``. :class:`NativeClient` waits on
that eventfd, so a call here costs what LMCache's own sync wrappers cost, without an asyncio
loop in between.

Install (``pip install -e '.[peers]'`` does the same): ``pip install --no-deps lmcache==0.5.6``
plus the few pure-Python/CPU packages its ``LocalCPUBackend`` imports (the ``peers`` extra lists
them). Its declared requirements would pull CUDA wheels (cupy-cuda13x, cuda-python) and older
protobuf/prometheus pins; the native clients need only the torch already installed. When
LMCache is missing, :func:`unavailable` says why and the bench runs without the peer.
"""

from __future__ import annotations

import logging
import os
import select
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

VERSION_TESTED = "0.5.6"
FS_VARIANT = "LMCache native fs (C++, O_DIRECT)"
REDIS_VARIANT = "LMCache native Redis (C++ RESP)"
HOST_VARIANT = "LMCache LocalCPUBackend"
VS = "kvstore vs LMCache"


@lru_cache(maxsize=None)
def unavailable(what: str = "native") -> str | None:
    """None when LMCache's ``what`` ("native": the C++ fs and Redis clients; "host": the
    LocalCPUBackend) imports, else why not (printed by the bench)."""
    logging.getLogger("lmcache").setLevel(logging.ERROR)
    try:
        if what == "host":
            from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend  # noqa: F401
        else:
            from lmcache.lmcache_fs import LMCacheFSClient  # noqa: F401
            from lmcache.lmcache_redis import LMCacheRedisClient  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means: no peer
        return f"LMCache is not importable ({type(exc).__name__}: {exc}); pip install -e '.[peers]'"
    _quiet_lmcache()
    return None


def _quiet_lmcache() -> None:
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("lmcache"):
            logging.getLogger(name).setLevel(logging.ERROR)


def version() -> str:
    try:
        from importlib.metadata import version as v

        return v("lmcache")
    except Exception:  # noqa: BLE001
        return "unknown"


class NativeClient:
    """A blocking face over one of LMCache's C++ connector clients."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._fd = int(client.event_fd())
        self._done: dict[int, tuple[bool, str, Any]] = {}

    def _wait(self, future_id: int) -> Any:
        while future_id not in self._done:
            select.select([self._fd], [], [])
            try:
                os.read(self._fd, 8)
            except BlockingIOError:
                pass
            for fid, ok, error, bools in self._client.drain_completions():
                self._done[int(fid)] = (bool(ok), str(error), bools)
        ok, error, bools = self._done.pop(future_id)
        if not ok:
            raise RuntimeError(f"LMCache: {error}")
        return bools

    def set(self, keys: Sequence[str], bufs: Sequence[np.ndarray]) -> None:
        self._wait(self._client.submit_batch_set(list(keys), [memoryview(b) for b in bufs]))

    def get(self, keys: Sequence[str], bufs: Sequence[np.ndarray]) -> None:
        self._wait(self._client.submit_batch_get(list(keys), [memoryview(b) for b in bufs]))

    def delete(self, keys: Sequence[str]) -> None:
        self._wait(self._client.submit_batch_delete(list(keys)))

    def close(self) -> None:
        self._client.close()


def fs_client(directory: str, num_workers: int) -> NativeClient:
    from lmcache.lmcache_fs import LMCacheFSClient

    return NativeClient(LMCacheFSClient(directory, num_workers, "", True, 0))


def redis_client(url: str, num_workers: int) -> NativeClient:
    from urllib.parse import urlparse

    from lmcache.lmcache_redis import LMCacheRedisClient

    u = urlparse(url)
    return NativeClient(
        LMCacheRedisClient(u.hostname or "127.0.0.1", u.port or 6379, num_workers,
                           u.username or "", u.password or "")
    )


def keys(prefix: str, n: int) -> list[str]:
    """Object names as LMCache forms them (``model@world@worker@hash``; its fs client refuses
    others)."""
    return [f"{prefix}@1@0@{i:016x}" for i in range(n)]


class CpuBackend:
    """LMCache's LocalCPUBackend with its own allocator, for pages of ``shape`` and ``dtype``."""

    def __init__(self, shape: tuple[int, ...], dtype: Any, capacity_bytes: int) -> None:
        import torch
        from lmcache.utils import CacheEngineKey
        from lmcache.v1.config import LMCacheEngineConfig
        from lmcache.v1.metadata import LMCacheMetadata
        from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

        cfg = LMCacheEngineConfig.from_defaults(
            chunk_size=shape[2], local_cpu=True,
            max_local_cpu_size=max(capacity_bytes * 1.25, 64 << 20) / (1 << 30),
        )
        md = LMCacheMetadata(
            model_name="bench", world_size=1, local_world_size=1, worker_id=0,
            local_worker_id=0, kv_dtype=dtype, kv_shape=shape,
        )
        self.backend = LocalCPUBackend(cfg, md)
        _quiet_lmcache()
        self.shape, self.dtype = torch.Size(shape), dtype
        self._key = lambda i: CacheEngineKey("bench", 1, 0, i, dtype)

    def put(self, ids: Sequence[int], pages: Sequence[Any]) -> None:
        objs = self.backend.batched_allocate(self.shape, self.dtype, len(ids))
        assert objs is not None, "LMCache's CPU pool is full"
        for obj, page in zip(objs, pages):
            obj.tensor.copy_(page)
        self.backend.batched_submit_put_task([self._key(i) for i in ids], objs)
        for obj in objs:
            obj.ref_count_down()  # the backend holds its own reference now

    def get(self, ids: Sequence[int], pages: Sequence[Any]) -> None:
        for i, page in zip(ids, pages):
            obj = self.backend.get_blocking(self._key(i))
            assert obj is not None, "LMCache's CPU backend lost a page"
            page.copy_(obj.tensor)
            obj.ref_count_down()

    def remove(self, ids: Sequence[int]) -> None:
        for i in ids:
            self.backend.remove(self._key(i))

    def close(self) -> None:
        self.backend.clear()
        self.backend.close()


def peer_line(bench: str, case: str, ours: float, peer: float) -> dict[str, Any]:
    """The line that states kvstore's throughput as a ratio of LMCache's, same case."""
    return {
        "bench": bench, "case": case, "variant": VS, "metric": "throughput", "value": ours,
        "unit": "GB/s", "baseline": f"LMCache {version()}", "baseline_value": peer,
        "ratio": ours / peer if peer else None,
    }
