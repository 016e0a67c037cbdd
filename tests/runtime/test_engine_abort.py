"""``Engine.abort``: a request whose client went away ends before it finishes -- a waiting one
leaves the queue, a running one gives its blocks back -- and is reported once with finish
reason "abort"; other requests in the batch finish with the tokens they would have had alone;
an unknown or finished id is False and changes nothing."""

from __future__ import annotations

import random

import pytest

from runtime import LlamaForPagedLM, get_model_config
from runtime.sampling import SamplingParams
from tests.runtime.test_engine_connector import BS, make_engine, prompt

pytestmark = pytest.mark.usefixtures("one_torch_thread")
LONG = SamplingParams(max_tokens=40)


@pytest.fixture(scope="module")
def model() -> LlamaForPagedLM:
    return LlamaForPagedLM.from_random(get_model_config("tiny"), seed=7)


def _until_done(engine, want: set[str]) -> dict:  # type: ignore[no-untyped-def]
    outs = {}
    while engine.has_unfinished():
        for out in engine.step():
            assert out.request_id not in outs, "a request was reported twice"
            outs[out.request_id] = out
    assert set(outs) == want
    return outs


def test_a_running_request_aborted_gives_its_blocks_back(model) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(11)
    engine = make_engine(model, num_blocks=32, connector=False)
    try:
        free0 = engine.pool.num_free + engine.pool.num_evictable
        keep, drop = prompt(rng, 2 * BS + 3), prompt(rng, 3 * BS + 1)
        a = engine.add_request(keep, LONG)
        b = engine.add_request(drop, LONG)
        for _ in range(3):  # both admitted and decoding
            engine.step()
        assert engine.abort(b) and not engine.abort(b)
        outs = _until_done(engine, {a, b})
        assert outs[b].finish_reason == "abort" and len(outs[b].output_token_ids) < 40
        alone = make_engine(model, num_blocks=32, connector=False)
        try:
            (solo,) = alone.generate([keep], LONG)
        finally:
            alone.close()
        assert outs[a].output_token_ids == solo.output_token_ids
        assert engine.pool.num_free + engine.pool.num_evictable == free0  # nothing held
        assert not engine.abort(a) and not engine.abort("never-added")
    finally:
        engine.close()


def test_a_waiting_request_aborted_never_runs(model) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(model, num_blocks=32, connector=False)
    try:
        rid = engine.add_request(prompt(random.Random(12), BS + 1), LONG)
        assert engine.abort(rid)
        outs = _until_done(engine, {rid})
        assert outs[rid].finish_reason == "abort" and outs[rid].output_token_ids == []
    finally:
        engine.close()


def test_an_aborted_request_with_a_connector_ends_its_transfers(model) -> None:  # type: ignore[no-untyped-def]
    """With the store's connector: the aborted request's saves in flight delay its blocks,
    never leak them; the engine drains clean."""
    rng = random.Random(13)
    engine = make_engine(model, num_blocks=32)
    try:
        rid = engine.add_request(prompt(rng, 4 * BS + 1), LONG)
        for _ in range(2):
            engine.step()
        assert engine.abort(rid)
        _until_done(engine, {rid})
        engine.drain()
        pool = engine.pool
        assert pool.num_free + pool.num_evictable == pool.num_blocks
    finally:
        engine.close()
