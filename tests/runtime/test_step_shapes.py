"""Step shapes prepared at engine start (``runtime.step_graphs.reachable_shapes``,
``Engine(capture_graphs_at_start=True)``), on a CPU in mode ``"eager"``: the shapes the engine
prepares cover every step that varied requests take (prompts of every length, shared prefixes,
decode batches, chunked prefill, preemption), so in mode ``"cuda"`` no capture runs on a
request's path; the engine reports its start; a second engine over the same model re-prepares
for its own pool (the documented case); steps too long for the graphs are warmed eagerly at
start over a scratch block (``eager_warm_steps``, ``warm_eager``), writing nothing to the pool.

Most workloads run with the step's kernels stubbed out (zero logits): the shapes come from the
scheduler and the batch alone, and Triton's interpreter would take minutes over hundreds of
steps. One short workload runs the real kernels."""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator

import pytest
import torch

from kvstore.errors import InvalidArgument
from runtime import Engine, SamplingParams, get_model_config
from runtime.step_graphs import MAX_TOKENS, StepGraphs, reachable_shapes

CFG = get_model_config("tiny")


@pytest.fixture
def stub_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps run no kernel: zero logits (greedy sampling picks token 0)."""
    rows = torch.zeros((MAX_TOKENS, CFG.vocab_size))
    monkeypatch.setattr(StepGraphs, "_walk", staticmethod(lambda pieces, hooks: rows))


def _engine(**kw: object) -> Engine:
    return Engine.from_config("tiny", seed=0, step_graphs="eager", **kw)  # type: ignore[arg-type]


def _workload(engine: Engine, seed: int, rounds: int = 6) -> None:
    """Requests of random lengths, some sharing prefixes with earlier ones, added while others
    run, with random output lengths."""
    rng = random.Random(seed)
    history: list[list[int]] = []
    for _ in range(rounds):
        for _ in range(rng.randrange(1, 7)):
            if history and rng.random() < 0.4:
                base = rng.choice(history)
                p = base[: rng.randrange(1, len(base) + 1)] + [rng.randrange(512)
                                                              for _ in range(rng.randrange(0, 9))]
            else:
                p = [rng.randrange(512) for _ in range(rng.randrange(1, 120))]
            history.append(p)
            engine.add_request(p, SamplingParams(max_tokens=rng.randrange(1, 9)))
        for _ in range(rng.randrange(1, 6)):
            engine.step()
    while engine.has_unfinished():
        engine.step()


LIMITS = [
    {"max_num_batched_tokens": 32, "max_num_seqs": 4},
    {"max_num_batched_tokens": 24, "max_num_seqs": 3, "chunk_size": 8},
    {"max_num_batched_tokens": 64, "max_num_seqs": 8, "chunk_size": 16},
    {"max_num_batched_tokens": 16, "max_num_seqs": 16},
    {"max_num_batched_tokens": 128, "max_num_seqs": 6, "num_blocks": 12},  # preempts
]


@pytest.mark.parametrize("limits", LIMITS)
def test_no_step_meets_a_shape_the_engine_did_not_prepare(stub_kernels: None,
                                                          limits: dict[str, int]) -> None:
    prepared = _engine(**limits)
    lazy = _engine(capture_graphs_at_start=False, **limits)
    for engine in (prepared, lazy):
        _workload(engine, seed=sum(limits.values()))
    graphs, met = prepared.model.step_graphs, lazy.model.step_graphs
    assert graphs is not None and met is not None
    assert graphs.late_shapes == []
    # the lazy engine records every shape its steps met: all of them were enumerated
    shapes = set(reachable_shapes(CFG, torch.device("cpu"),
                                  max_num_batched_tokens=limits["max_num_batched_tokens"],
                                  max_num_seqs=limits["max_num_seqs"],
                                  max_chunk_tokens=lazy.config.max_chunk_tokens))
    assert len(met.late_shapes) >= 6, "the workload should be varied"
    assert set(met.late_shapes) <= shapes, set(met.late_shapes) - shapes
    assert prepared.startup.num_shapes == len(shapes)
    if "num_blocks" in limits:
        assert prepared.scheduler.num_preemptions > 0


def test_the_real_steps_meet_no_late_shape() -> None:
    engine = _engine(max_num_batched_tokens=16, max_num_seqs=2)
    shared = list(range(3, 30))
    engine.generate([shared, shared + [7, 8, 9]], SamplingParams(max_tokens=3))
    graphs = engine.model.step_graphs
    assert graphs is not None and graphs.late_shapes == [] and graphs.num_captures == 0


def test_the_engine_reports_its_start(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="runtime.engine"):
        engine = _engine(max_num_batched_tokens=32, max_num_seqs=4)
    up = engine.startup
    assert up.num_shapes == 37 and up.num_captured == 0  # eager: nothing to capture
    assert 0 <= up.capture_s <= up.seconds
    assert "engine started in" in caplog.text and "37 step shapes prepared (eager)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="runtime.engine"):
        off = _engine(max_num_batched_tokens=32, capture_graphs_at_start=False)
        plain = Engine.from_config("tiny", seed=0, step_graphs="off")
    assert off.startup.num_shapes == 0 and plain.startup.num_shapes == 0
    assert plain.startup.seconds >= 0 and "engine started" not in caplog.text
    with pytest.raises(InvalidArgument, match="capture_graphs_at_start must be a bool"):
        _engine(capture_graphs_at_start="yes")


def test_a_second_engine_over_the_model_prepares_for_its_own_pool(stub_kernels: None) -> None:
    first = _engine(max_num_batched_tokens=16, max_num_seqs=2)
    second = Engine(first.model, Engine.from_config("tiny", step_graphs="off").pool,
                    first.namespace, max_num_batched_tokens=16, max_num_seqs=2)
    graphs = first.model.step_graphs
    assert graphs is not None and second.startup.num_shapes == first.startup.num_shapes
    second.generate([[1, 2, 3]], SamplingParams(max_tokens=2))
    assert graphs.late_shapes == []
    # the first engine's pool lost its shapes to the second's: they come back on its steps
    first.generate([[1, 2, 3]], SamplingParams(max_tokens=2))
    assert graphs.late_shapes


@pytest.fixture
def h200(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """num_splits_for as on an H200 (132 multiprocessors)."""
    import runtime.attention.paged as paged

    reachable_shapes.cache_clear()
    monkeypatch.setattr(paged, "_multiprocessors", lambda device: 132)
    yield
    reachable_shapes.cache_clear()


def test_the_shape_count_stays_bounded(h200: None) -> None:
    shapes = reachable_shapes(get_model_config("llama3-8b"), torch.device("cpu"),
                              max_num_batched_tokens=512, max_num_seqs=64, max_chunk_tokens=512)
    assert len(shapes) == 403  # the engine's defaults (runtime/step_graphs.py's docstring)
    assert all(s.logits <= s.seqs <= s.tokens <= MAX_TOKENS for s in shapes)
    assert {s.tokens for s in shapes} == {1 << i for i in range(10)}
    decode = [s for s in shapes if s.tokens == s.seqs == s.logits == 1]
    assert sorted(s.num_splits for s in decode) == [1, 2, 4, 8, 16, 32, 64]


LONG = {"max_num_batched_tokens": 600, "max_num_seqs": 4}  # steps past MAX_TOKENS: eager


def test_the_long_step_warm_up_writes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """The default backend (sdpa): under Triton's interpreter the paged one's 600-token steps
    take seconds each (tests/gpu/test_engine_startup_cuda.py runs it)."""
    with caplog.at_level(logging.INFO, logger="runtime.engine"):
        warmed = _engine(**LONG)
    up, pool = warmed.startup, warmed.pool
    # on a CPU only the first long step runs (Triton's interpreter compiles nothing)
    assert up.num_warm_steps == 1 and 0 < up.warm_s <= up.seconds
    assert "1 long steps warmed eagerly" in caplog.text
    assert pool.pool.count_nonzero() == 0, "the warm-up wrote into the pool"
    assert pool.num_free == pool.num_blocks and pool.num_evictable == 0  # nothing committed
    pool.check_integrity()
    graphs = warmed.model.step_graphs
    assert graphs is not None and graphs.late_shapes == []  # the long steps skip the graphs
    # three 200-token prompts: one step of 600 tokens, run eagerly (their first tokens)
    prompts = [[(7 * i + 3 * j) % 512 for j in range(200)] for i in range(3)]
    cold = _engine(capture_graphs_at_start=False, **LONG)
    assert cold.startup.num_warm_steps == 0 and cold.startup.warm_s == 0
    params = SamplingParams(max_tokens=1)
    assert ([o.output_token_ids for o in warmed.generate(prompts, params)]
            == [o.output_token_ids for o in cold.generate(prompts, params)])


def test_long_warm_steps_cover_each_kernel_specialisation(h200: None) -> None:
    from runtime.step_graphs import eager_warm_steps

    cfg = get_model_config("llama3-8b")
    limits = {"block_size": 16, "max_num_batched_tokens": 1024, "max_num_seqs": 8,
              "max_chunk_tokens": 1024}
    dev = torch.device("cpu")
    assert eager_warm_steps(cfg, dev, **{**limits, "max_num_batched_tokens": MAX_TOKENS},
                            paged=True) == ()
    steps = eager_warm_steps(cfg, dev, **limits, paged=True)
    # one sequence, 2 or 3 (query_start_loc unaligned), 4 or 8 (aligned) x table widths of
    # a multiple of 16 or not; block_q 16 and one split for every step this long on an H200
    assert steps[0].seqs == ((0, 1024),) and steps[0].num_tokens == 1024
    assert len(steps) == 6 and all(MAX_TOKENS < s.num_tokens <= 1024 for s in steps)
    assert {(len(s.seqs) % 4 == 0, len(s.seqs) == 1, s.table_width % 16 == 0)
            for s in steps} == {(a, b, c) for a in (False, True) for b in (False, True)
                                for c in (False, True) if not (a and b)}
    for s in steps:
        assert all(0 < n <= 1024 and c + n <= cfg.max_position_embeddings for c, n in s.seqs)
        assert s.table_width >= -(-max(c + n for c, n in s.seqs) // 16)
    other = eager_warm_steps(cfg, dev, **limits, paged=False)
    assert {s.num_tokens for s in other} == {1024, MAX_TOKENS + 1} and len(other) <= 8
