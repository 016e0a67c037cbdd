"""What the engine-level cases of ``bench.ttft`` run over, and how one run is timed and checked:
the plan, random prompts, the engines (bare, or with an in-process connector over an hbm + host
store), the reuse and placement checks every run makes (a mismatch raises :class:`BenchError`)
and the timed ``generate``. The cases themselves are described in :mod:`bench.ttft_engine`.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tqdm import tqdm

from connector.inprocess import InProcessScheduler, InProcessWorker, PrefetchPolicy
from kvstore import Tier, build_tier
from kvstore.api import LocalStagingSlab
from kvstore.keys import Namespace
from kvstore.layout import KVLayout
from kvstore.metrics import Metrics
from kvstore.pool import HBMTier
from kvstore.store import TieredStore
from runtime.engine import Engine
from runtime.model import LlamaForPagedLM
from runtime.request import RequestOutput
from runtime.sampling import SamplingParams

BLOCK = 16
GREEDY = SamplingParams(max_tokens=1)  # temperature 0: greedy


class BenchError(RuntimeError):
    """A run did not measure what it claims to (the prefix came from another tier, a load
    failed, a save went missing)."""


@dataclass(frozen=True)
class Plan:
    """What to run: prompt lengths, timed runs per case, no-reuse prompts per variant, the
    lengths that get the disk and Redis cases, and whether the PCIe floor is measured."""

    lengths: tuple[int, ...]
    runs: int
    no_reuse_prompts: int
    disk_lengths: frozenset[int]
    redis_lengths: frozenset[int]
    gpu: bool
    daemon_lengths: frozenset[int] = frozenset()
    startup_length: int = 256

    @classmethod
    def for_device(cls, gpu: bool) -> Plan:
        if gpu:
            return cls((4096, 16384, 32768), 3, 4, frozenset({4096, 16384}),
                       frozenset({4096}), True, frozenset({4096, 32768}), 1024)
        # CPU: each run takes milliseconds, so more of them make the medians robust on a
        # noisy 2-core machine at little cost (the engine part stays under ~15 s).
        return cls((256, 1024), 5, 8, frozenset({256, 1024}), frozenset({256, 1024}), False,
                   frozenset({256, 1024}))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        empty_host = getattr(torch._C, "_host_emptyCache", None)  # pinned-memory cache
        if empty_host is not None:
            empty_host()


class _Prompts:
    """Random prompts; every call gives a new one (never repeated within a run)."""

    def __init__(self, vocab_size: int, seed: int = 2) -> None:
        self.vocab_size = vocab_size
        self.gen = torch.Generator().manual_seed(seed)

    def new(self, n: int) -> list[int]:
        return torch.randint(0, self.vocab_size, (n,), generator=self.gen).tolist()


def _sync_stream(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def _timed_generate(engine: Engine, prompt: list[int], device: torch.device
                    ) -> tuple[float, RequestOutput]:
    """Seconds until ``generate`` returned the first token, synchronised on the engine's
    stream before and after. Not on the whole device: saves the engine left running in the
    background (on its save stream) are not waited for, before or after, as a server does not
    wait for them before it answers the next prompt."""
    _sync_stream(device)
    t0 = time.perf_counter()
    (out,) = engine.generate([prompt], GREEDY)
    _sync_stream(device)
    return time.perf_counter() - t0, out


def _expect(out: RequestOutput, reused: dict[str, int], what: str) -> None:
    """Raise BenchError unless the request reused exactly ``reused`` tokens per tier, had no
    failed load, and computed the rest of its prompt."""
    m = out.metrics
    n = len(out.prompt_token_ids)
    if out.finish_reason == "error":
        raise BenchError(f"{what}: the request failed: {out.error}")
    if (m.num_tokens_reused != reused or m.num_tokens_load_failed
            or m.num_tokens_computed != n - sum(reused.values())):
        raise BenchError(
            f"{what}: expected reuse {reused}, got {m.num_tokens_reused} (computed "
            f"{m.num_tokens_computed} of {n}, load failed {m.num_tokens_load_failed}, "
            f"preemptions {m.num_preemptions})")


def _check_placement(store: TieredStore, keys: Sequence[bytes], want: dict[str, int],
                     what: str) -> None:
    """Raise BenchError unless each named tier holds exactly ``want[tier]`` of ``keys``."""
    have = {t.name: sum(t.contains(list(keys))) for t in store.tiers if t.name in want}
    if have != want:
        raise BenchError(f"{what}: the prefix's {len(keys)} pages are in {have}, want {want}")


def _evict(store: TieredStore, tier: str) -> None:
    """Evict every evictable page of ``tier`` (write-back copies it to the next tier down
    where that tier lacks it)."""
    store.evict(store.tier(tier).capacity_pages, tier=tier)


def _engine_kwargs(n: int) -> dict[str, Any]:
    # steady-state cases: capture in the warm-up run (see the module docstring)
    return {"max_num_batched_tokens": max(n, 512), "max_num_seqs": 8,
            "capture_graphs_at_start": False}


def _pool_blocks(n: int) -> int:
    return 2 * (n // BLOCK) + 64


def _bare_engine(model: LlamaForPagedLM, layout: KVLayout, ns: Namespace, n: int,
                 device: torch.device) -> Engine:
    pool = HBMTier.build("hbm", layout, _pool_blocks(n), Metrics(), device=device)
    return Engine(model, pool, ns, **_engine_kwargs(n))  # LocalOwner, no connector


def _host_tier(layout: KVLayout, n: int, metrics: Metrics) -> Tier:
    """A host tier (pinned when CUDA is present) sized for an ``n``-token prompt."""
    return build_tier({"kind": "host", "capacity": _pool_blocks(n) * layout.page_bytes},
                      layout, metrics)


def host_store(layout: KVLayout, n: int, device: torch.device
               ) -> tuple[HBMTier, LocalStagingSlab, TieredStore]:
    """An hbm pool and a host tier (pinned when CUDA is present), each sized for an ``n``-token
    prompt, in a write-back store: what the host-hit cases run over."""
    metrics = Metrics()
    pool = HBMTier.build("hbm", layout, _pool_blocks(n), metrics, device=device)
    store = TieredStore(layout, [pool, _host_tier(layout, n, metrics)], write_policy="write_back")
    return pool, store.staging_tier("host"), store


def _connected_engine(model: LlamaForPagedLM, pool: HBMTier, store: TieredStore, ns: Namespace,
                      n: int, *, layerwise: bool, prefetch_policy: PrefetchPolicy = "timeout"
                      ) -> tuple[Engine, InProcessWorker]:
    """An engine over ``pool`` with an in-process connector over ``store`` (host tier "host")."""
    worker = InProcessWorker(store, host_tier="host", prefetch_policy=prefetch_policy,
                             layerwise=layerwise)
    csched = InProcessScheduler(store, ns, num_blocks=pool.num_blocks, host_tier="host")
    engine = Engine(model, pool, ns, connector=(csched, worker), **_engine_kwargs(n))
    engine.store = store
    return engine, worker


def _timed_case(engine: Engine, prompt: Callable[[], list[int]], prepare: Callable[[], None],
                reused: dict[str, int], what: str, device: torch.device, runs: int,
                check: Callable[[], None] | None = None) -> float:
    """Median TTFT of ``runs`` runs after one warm-up run; ``prepare`` before each (untimed),
    ``check`` after each (untimed); every run's reuse is verified."""
    times = []
    for i in range(runs + 1):
        prepare()
        t, out = _timed_generate(engine, prompt(), device)
        _expect(out, reused, f"{what} (run {i})")
        if check is not None:
            check()
        if i:
            times.append(t)
    return statistics.median(times)


class _Progress:
    def __init__(self, total: int, enabled: bool) -> None:
        self.bar = tqdm(total=total, desc="bench.ttft engine", leave=False, disable=not enabled)

    def step(self, what: str) -> None:
        self.bar.set_postfix_str(what)

    def done(self) -> None:
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
