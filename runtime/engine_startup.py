"""An engine's start: the step shapes its limits can produce, prepared before its first request
(CUDA graphs captured on a GPU, the long steps' eager path warmed), and the report of how long
that took. See :mod:`runtime.engine`, "Start".
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstore.pool import HBMTier
from runtime.model import LlamaForPagedLM
from runtime.scheduler import SchedulerConfig


@dataclass(frozen=True, slots=True)
class StartupReport:
    """How an engine started: ``seconds`` its construction took (the model is built before:
    its weights are not counted), ``capture_s`` of them preparing ``num_shapes`` step shapes,
    ``num_captured`` of which were captured as CUDA graphs then (0 in mode ``"eager"``, for
    shapes captured already for this pool, or with capture at start off or no step graphs),
    and ``warm_s`` running ``num_warm_steps`` long steps eagerly once
    (:func:`~runtime.step_graphs.eager_warm_steps`; 0 when no step is longer than the graphs'
    ``MAX_TOKENS``, with capture at start off or no step graphs)."""

    seconds: float
    capture_s: float
    num_shapes: int
    num_captured: int
    warm_s: float = 0.0
    num_warm_steps: int = 0


def prepare_steps(model: LlamaForPagedLM, pool: HBMTier, config: SchedulerConfig
                  ) -> tuple[float, int, int, float, int]:
    """Prepare every step shape an engine's limits (``config``) can produce
    (``runtime.step_graphs``), then run the long steps' eager forward once (:func:`~runtime.step_graphs.warm_eager`:
    over a scratch block, nothing written to the pool); (capture seconds, shapes, captured,
    warm seconds, warm steps). A progress bar on stderr while CUDA graphs are captured. On
    a CPU only the first long step runs: Triton's interpreter compiles nothing, and one
    step keeps the path in use at the cost of one step."""
    graphs = model.step_graphs
    if graphs is None:
        return 0.0, 0, 0, 0.0, 0
    # imports Triton: only when stepping
    from runtime.step_graphs import eager_warm_steps, reachable_shapes, warm_eager

    kv_pool = pool.pool
    shapes = reachable_shapes(
        model.config, kv_pool.device,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_num_seqs=config.max_num_seqs,
        max_chunk_tokens=config.max_chunk_tokens)
    if graphs.mode != "cuda":
        report = graphs.prepare(shapes, kv_pool)
    else:
        from tqdm import tqdm

        with tqdm(total=len(shapes), desc="capturing CUDA graphs", unit="shape",
                  leave=False) as bar:
            report = graphs.prepare(shapes, kv_pool, progress=lambda done: bar.update(1))
    block_size = pool.layout.block_size
    long_steps = eager_warm_steps(
        model.config, kv_pool.device, block_size=block_size,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_num_seqs=config.max_num_seqs,
        max_chunk_tokens=config.max_chunk_tokens,
        paged=model.backend.name == "paged")
    if kv_pool.device.type != "cuda":
        long_steps = long_steps[:1]
    warm_s = warm_eager(model, long_steps, block_size) if long_steps else 0.0
    return report.seconds, report.num_shapes, report.num_captured, warm_s, len(long_steps)
