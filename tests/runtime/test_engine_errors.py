"""Engine boundaries: bad input raises InvalidArgument at add_request and changes nothing; a
request that can never fit fails alone; the tokenizer and the chat demo."""

from __future__ import annotations

import pytest

from kvstore.errors import InvalidArgument
from kvstore.keys import Namespace
from kvstore.metrics import Metrics
from kvstore.tiers.hbm import HBMTier
from runtime import LlamaForPagedLM, get_model_config
from runtime.demo import run_chat_demo
from runtime.engine import Engine
from runtime.sampling import SamplingParams
from runtime.scheduler import SchedulerConfig
from runtime.tokenizer import ByteTokenizer

BS = 16


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model() -> LlamaForPagedLM:
    return LlamaForPagedLM.from_random(get_model_config("tiny"), seed=3)


def make_engine(model: LlamaForPagedLM, num_blocks: int = 64, **kw: object) -> Engine:
    layout = model.config.kv_layout(BS)
    pool = HBMTier.build("hbm", layout, num_blocks, Metrics(), device="cpu")
    return Engine(model, pool, Namespace("test/errors", layout), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"seed": -1}, "seed"),
        ({"stop_token_ids": "ab"}, "stop_token_ids"),
        ({"stop_token_ids": [1, -2]}, "stop_token_ids"),
    ],
)
def test_bad_sampling_params(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("prompt", "params", "match"),
    [
        ([], SamplingParams(), "empty"),
        ([1, 512], SamplingParams(), "outside"),
        ([1, -1], SamplingParams(), "outside"),
        ([1, True], SamplingParams(), "outside"),
        ([1, 2.0], SamplingParams(), "outside"),
        ([1, 2**70], SamplingParams(), "outside"),
        ("hello", SamplingParams(), "sequence of token ids"),
        ([1] * 250, SamplingParams(max_tokens=7), "max_position_embeddings"),
        ([1, 2], SamplingParams(stop_token_ids=[600]), "stop_token_ids"),
        ([1, 2], "greedy", "SamplingParams"),
        # long prompts take the bulk check (runtime.batch.id_array): the same refusals
        ([5] * 100 + [True], SamplingParams(), "token id True is outside"),
        ([5] * 100 + [False], SamplingParams(), "token id False is outside"),
        ([0, 1] * 50 + [True] + [1, 0] * 5, SamplingParams(), "token id True is outside"),
        ([5] * 100 + [512], SamplingParams(), "token id 512 is outside"),
        ([5] * 100 + [-1], SamplingParams(), "token id -1 is outside"),
        ([5] * 100 + [2.0], SamplingParams(), "token id 2.0 is outside"),
        ([5] * 100 + ["7"], SamplingParams(), "token id '7' is outside"),
        ([5] * 100 + [2**40], SamplingParams(), "outside"),
    ],
)
def test_bad_requests_raise_and_change_nothing(
    model: LlamaForPagedLM, prompt: object, params: object, match: str
) -> None:
    engine = make_engine(model)
    good = engine.add_request([5, 6, 7], SamplingParams(max_tokens=4), request_id="good")
    engine.step()
    before = (len(engine.scheduler.waiting), len(engine.scheduler.running), engine.pool.num_free)
    with pytest.raises(InvalidArgument, match=match):
        engine.add_request(prompt, params)  # type: ignore[arg-type]
    assert (len(engine.scheduler.waiting), len(engine.scheduler.running),
            engine.pool.num_free) == before
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert [o.request_id for o in outs] == [good]
    assert len(outs[0].output_token_ids) == 4


@pytest.mark.parametrize("n", [3, 100])
def test_numpy_integer_ids_are_token_ids(model: LlamaForPagedLM, n: int) -> None:
    """A prompt of numpy integers (``list(array)``) runs like the same ints, and its output
    holds plain ints; ids 0 and 1 pass the bulk check's bool screen."""
    import numpy as np

    ids = [0, 1] + [int(x) for x in np.random.default_rng(n).integers(2, 512, n - 2)]
    params = SamplingParams(max_tokens=3)
    (want,) = make_engine(model).generate([ids], params)
    (got,) = make_engine(model).generate([list(np.array(ids, dtype=np.int64))], params)
    assert got.output_token_ids == want.output_token_ids
    assert got.prompt_token_ids == ids and {type(t) for t in got.prompt_token_ids} == {int}


def test_duplicate_request_id(model: LlamaForPagedLM) -> None:
    engine = make_engine(model)
    engine.add_request([1, 2], request_id="x")
    with pytest.raises(InvalidArgument, match="already in use"):
        engine.add_request([3, 4], request_id="x")


def test_generate_validates_every_prompt_before_queueing(model: LlamaForPagedLM) -> None:
    engine = make_engine(model)
    with pytest.raises(InvalidArgument, match="outside"):
        engine.generate([[1, 2], [3, 999]], SamplingParams(max_tokens=2))
    assert not engine.has_unfinished()
    with pytest.raises(InvalidArgument, match="2 prompts but 1"):
        engine.generate([[1], [2]], [SamplingParams()])


def test_a_request_that_can_never_fit_fails_alone(model: LlamaForPagedLM) -> None:
    engine = make_engine(model, 4)  # 64 tokens of KV at most
    big, small = list(range(3, 83)), [4, 5, 6]
    outs = engine.generate([big, small], SamplingParams(max_tokens=5))
    assert outs[0].finish_reason == "error" and outs[0].output_token_ids == []
    assert outs[0].error is not None and "pool has 4" in outs[0].error
    assert outs[1].finish_reason == "length" and len(outs[1].output_token_ids) == 5
    engine.pool.check_integrity()
    assert engine.pool.num_free + engine.pool.num_evictable == 4


def test_bad_engine_settings(model: LlamaForPagedLM) -> None:
    with pytest.raises(InvalidArgument, match="chunk_size"):
        make_engine(model, chunk_size=0)
    with pytest.raises(InvalidArgument, match="max_num_seqs"):
        SchedulerConfig(max_num_seqs=0)
    layout = model.config.kv_layout(BS)
    pool = HBMTier.build("hbm", layout, 4, Metrics(), device="cpu")
    with pytest.raises(InvalidArgument, match="layout"):
        Engine(model, pool, Namespace("x", model.config.kv_layout(8)))
    other = get_model_config("small").kv_layout(BS)
    with pytest.raises(InvalidArgument, match="does not fit the model"):
        Engine(model, HBMTier.build("hbm", other, 4, Metrics(), device="cpu"), Namespace("x", other))


def test_byte_tokenizer_round_trip() -> None:
    tok = ByteTokenizer()
    ids = tok.encode("héllo ✓", add_bos=True, add_eos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == "héllo ✓"
    assert tok.decode(ids, skip_special=False) == "<s>héllo ✓</s>"
    tok.check_fits(get_model_config("tiny").vocab_size)
    with pytest.raises(InvalidArgument, match="vocab_size"):
        tok.check_fits(100)


def test_chat_demo_reuses_earlier_turns() -> None:
    result = run_chat_demo("small", turns=3, max_tokens=8)
    assert [t.tokens_reused for t in result.without_cache] == [0, 0, 0]
    for cached, uncached in zip(result.with_cache[1:], result.without_cache[1:]):
        assert cached.tokens_computed + cached.tokens_reused == cached.prompt_tokens
        assert uncached.tokens_computed == uncached.prompt_tokens
        assert cached.tokens_computed * 2 < uncached.tokens_computed
    assert all(t.ttft_s > 0 for t in result.with_cache + result.without_cache)
    # two conversations on a pool that holds one: later turns load their history from host
    host = result.with_host
    assert [t.conversation for t in host] == ["A", "B"] * 3
    assert sum(t.tokens_from_host for t in host) > 0
    for t in host:
        assert t.tokens_computed + t.tokens_reused + t.tokens_from_host == t.prompt_tokens
