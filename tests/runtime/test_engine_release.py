"""A request that its step's token ends by ``max_tokens`` gives its blocks back while the GPU
still runs the step (``Scheduler.release_ending``), before the token is read: the finish reason
still comes from the token, its committed blocks stay cached for the next hit, and requests
that go on keep theirs."""

from __future__ import annotations

from typing import Any

import pytest

from kvstore.keys import Namespace
from kvstore.metrics import Metrics
from kvstore.tiers.hbm import HBMTier
from runtime import LlamaForPagedLM, get_model_config
from runtime.engine import Engine
from runtime.sampling import SamplingParams

BS = 16
PROMPT = [(7 * i + 3) % 250 for i in range(40)]  # two full blocks and a partial one

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model() -> LlamaForPagedLM:
    return LlamaForPagedLM.from_random(get_model_config("tiny"), seed=5)


def make_engine(model: LlamaForPagedLM, num_blocks: int = 32) -> Engine:
    layout = model.config.kv_layout(BS)
    pool = HBMTier.build("hbm", layout, num_blocks, Metrics(), device="cpu")
    return Engine(model, pool, Namespace("test/release", layout))


def held_at_reads(engine: Engine) -> list[int]:
    """Blocks referenced by requests each time a token is read (recorded into the list)."""
    seen: list[int] = []
    argmax = engine._readout.argmax  # greedy tokens are read through it
    pool = engine.pool

    def spy(t: Any) -> Any:
        seen.append(sum(pool.refcount(b) for b in range(pool.num_blocks)))
        return argmax(t)

    engine._readout.argmax = spy  # type: ignore[method-assign]
    return seen


def test_ending_request_holds_no_block_when_its_token_is_read(model: LlamaForPagedLM) -> None:
    engine = make_engine(model)
    seen = held_at_reads(engine)
    (out,) = engine.generate([PROMPT], SamplingParams(max_tokens=1))
    assert seen == [0]
    assert out.finish_reason == "length" and len(out.output_token_ids) == 1
    assert out.prompt_token_ids == PROMPT and {type(t) for t in out.prompt_token_ids} == {int}
    # its two full blocks were committed before the release: the same prompt hits them
    (again,) = engine.generate([PROMPT], SamplingParams(max_tokens=1))
    assert again.metrics.num_tokens_reused["hbm"] == 2 * BS
    assert again.output_token_ids == out.output_token_ids
    engine.pool.check_integrity()


def test_request_that_goes_on_keeps_its_blocks(model: LlamaForPagedLM) -> None:
    engine = make_engine(model)
    seen = held_at_reads(engine)
    (out,) = engine.generate([PROMPT], SamplingParams(max_tokens=3))
    assert seen[0] == 3 and seen[1] == 3 and seen[2] == 0  # only the last read ends it
    assert out.finish_reason == "length" and len(out.output_token_ids) == 3
    reference = make_engine(model)
    (same,) = reference.generate([PROMPT], SamplingParams(max_tokens=3))
    assert same.output_token_ids == out.output_token_ids


def test_stop_token_still_decides_the_reason(model: LlamaForPagedLM) -> None:
    (first,) = make_engine(model).generate([PROMPT], SamplingParams(max_tokens=1))
    token = first.output_token_ids[0]
    engine = make_engine(model)
    seen = held_at_reads(engine)
    (out,) = engine.generate([PROMPT], SamplingParams(max_tokens=1, stop_token_ids=[token]))
    assert seen == [0]
    assert out.finish_reason == "stop" and out.output_token_ids == [token]


def test_batch_where_one_ends_and_one_goes_on(model: LlamaForPagedLM) -> None:
    other = [(5 * i + 1) % 250 for i in range(37)]
    engine = make_engine(model)
    outs = engine.generate([PROMPT, other], [SamplingParams(max_tokens=1),
                                             SamplingParams(max_tokens=4)])
    alone = [make_engine(model).generate([p], SamplingParams(max_tokens=m))[0]
             for p, m in ((PROMPT, 1), (other, 4))]
    assert [o.output_token_ids for o in outs] == [o.output_token_ids for o in alone]
    assert sum(engine.pool.refcount(b) for b in range(engine.pool.num_blocks)) == 0
    engine.pool.check_integrity()
