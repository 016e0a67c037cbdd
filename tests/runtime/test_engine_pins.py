"""A request's pin (``Engine.add_request(pin=PinRequest(...))``): its prompt's prefix is kept in
the store's tiers (the engine's pool and host) through a flood of other prompts many times
their size, and is reused (not recomputed) afterwards with the same greedy output; a bad pin, or a pin without a
connector, is refused and queues nothing."""

from __future__ import annotations

import random

import pytest

from connector.pin_request import PinRequest
from kvstore.errors import InvalidArgument
from runtime import LlamaForPagedLM, get_model_config
from tests.runtime.test_engine_connector import BS, GREEDY, make_engine, prompt

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model() -> LlamaForPagedLM:
    return LlamaForPagedLM.from_random(get_model_config("tiny"), seed=7)


def _run(engine, rid: str) -> object:  # type: ignore[no-untyped-def]
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id == rid:
                return out
    raise AssertionError(f"{rid} never finished")


def test_a_pinned_prefix_outlives_a_flood_and_loads_back(model) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(3)
    engine = make_engine(model, num_blocks=16, host_pages=16)
    try:
        system = prompt(rng, 4 * BS)  # a 4-block system prompt
        first = system + prompt(rng, 5)
        rid = engine.add_request(first, GREEDY, pin=PinRequest(600, tokens=4 * BS))
        cold = _run(engine, rid)
        engine.drain()
        for i in range(12):  # 12 x 6 blocks: over four times the host tier's 16 pages
            engine.generate([prompt(rng, 6 * BS + 1)], GREEDY)
        engine.drain()
        keys = engine.namespace.chain(system).keys
        host = engine.store.tier("host")
        assert all(host.contains(keys)), "the flood evicted a pinned block"
        info = engine.store.retention(engine.namespace.id)
        assert info.pins and info.pins[0].keys == tuple(keys)
        (again,) = engine.generate([first], GREEDY)
        assert again.output_token_ids == cold.output_token_ids
        # a pin holds in every tier, the engine's pool too: the prefix is reused, not computed
        assert sum(again.metrics.num_tokens_reused.values()) == 4 * BS
        assert again.metrics.num_tokens_computed == 5
    finally:
        engine.close()


def test_a_bad_pin_is_refused_and_queues_nothing(model) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(4)
    engine = make_engine(model, num_blocks=16, host_pages=16)
    bare = make_engine(model, num_blocks=16, connector=False)
    try:
        p = prompt(rng, 2 * BS + 1)
        for bad, what in ((dict(ttl_s=0), "ttl_s"), (dict(ttl_s=10, tokens=0), "tokens"),
                          (dict(ttl_s=float("nan")), "ttl_s")):
            with pytest.raises(InvalidArgument, match=what):
                engine.add_request(p, GREEDY, pin=PinRequest(**bad))  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="PinRequest"):
            engine.add_request(p, GREEDY, pin={"ttl_s": 10})  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="connector"):
            bare.add_request(p, GREEDY, pin=PinRequest(10))
        # past the store's bound (half of the 16-page host tier): refused, nothing queued
        with pytest.raises(InvalidArgument, match="pins may hold"):
            engine.add_request(prompt(rng, 12 * BS + 1), GREEDY, pin=PinRequest(10))
        assert not engine.has_unfinished() and not bare.has_unfinished()
        assert engine.store.retention(engine.namespace.id).pins == ()
    finally:
        engine.close()
        bare.close()


def test_vllm_kv_transfer_params_ask_a_pin_by_name() -> None:
    assert PinRequest.from_params({"kvstore_pin_ttl_s": 60, "kvstore_pin_tokens": 32}) == \
        PinRequest(60, 32)
    assert PinRequest.from_params({"do_remote_prefill": True}) is None
    assert PinRequest.from_params(None) is None
    with pytest.raises(InvalidArgument, match="how long"):
        PinRequest.from_params({"kvstore_pin_tokens": 32})
    with pytest.raises(InvalidArgument, match="ttl_s"):
        PinRequest.from_params({"kvstore_pin_ttl_s": "forever"})
    assert PinRequest(10, tokens=40).blocks(100, 16) == 2 and PinRequest(10).blocks(100, 16) == 6


def test_the_engine_s_pool_takes_no_budget(model) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(model, num_blocks=16, host_pages=16)
    try:
        ns = engine.namespace.id
        with pytest.raises(InvalidArgument, match="block pool"):
            engine.store.set_budget(ns, "hbm", 4 * engine.store.layout.page_bytes)
        engine.store.set_budget(ns, "host", 4 * engine.store.layout.page_bytes)
        assert engine.store.retention(ns).tiers[0].budget_bytes is None
    finally:
        engine.close()
