"""Key spec v1: the test vector of docs/keys-and-pages.md, determinism across processes, namespace separation."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from kvstore import InvalidArgument, KVLayout, Namespace, chain_keys, token_bytes
from kvstore.keys import shard_model_id

LLAMA = KVLayout(32, 8, 128, 16, "bfloat16")

# The spec's test vector (docs/keys-and-pages.md, key spec v1). Changing any of these is a format break.
VECTOR = {
    "layout_fingerprint": "9d5b7084f080f6ff",
    "seed": "23b30a8b666ca22d42a312935d0ba2b1",
    "keys": ["d1e799d21a96c5ba1c39f989b0582e33", "0094dd5d8ace31a9ab8ab11ef81a9cb7"],
    "salted_keys": ["fcf6891ef0b5e96a7d79134b8ce1147c", "62705565af29c3e6651a128e39268f02"],
}


def test_readme_vector() -> None:
    ns = Namespace("meta-llama/Llama-3.1-8B", LLAMA, "")
    assert LLAMA.fingerprint.hex() == VECTOR["layout_fingerprint"]
    assert ns.seed.hex() == VECTOR["seed"]
    assert [k.hex() for k in ns.chain(list(range(40))).keys] == VECTOR["keys"]
    salted = Namespace("meta-llama/Llama-3.1-8B", LLAMA, "tenant-a")
    assert [k.hex() for k in salted.chain(list(range(40))).keys] == VECTOR["salted_keys"]


def test_the_spec_page_states_the_vector() -> None:
    from tests.docs_pages import page

    spec = page("keys-and-pages")
    for value in (VECTOR["seed"], *VECTOR["keys"], *VECTOR["salted_keys"]):
        assert value in spec


def test_keys_identical_in_another_process() -> None:
    code = (
        "from kvstore import KVLayout, Namespace;"
        "ns = Namespace('m', KVLayout(32, 8, 128, 16, 'bfloat16'), 's');"
        "print(','.join(k.hex() for k in ns.chain(list(range(1000))).keys))"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True,
            env={"PYTHONHASHSEED": str(seed), "PATH": ""},
        ).stdout.strip()
        for seed in (1, 2)
    }
    here = ",".join(k.hex() for k in Namespace("m", LLAMA, "s").chain(list(range(1000))).keys)
    assert outs == {here}


def test_full_blocks_only_and_chained() -> None:
    ns = Namespace("m", LLAMA)
    assert len(ns.chain(list(range(15))).keys) == 0
    assert len(ns.chain(list(range(16))).keys) == 1
    assert len(ns.chain(list(range(47))).keys) == 2
    a = ns.chain(list(range(64))).keys
    b = ns.chain(list(range(32)) + [7] * 32).keys
    assert a[:2] == b[:2] and a[2] != b[2] and a[3] != b[3]
    # a changed first block changes every later key (keys name whole prefixes)
    c = ns.chain([1] + list(range(1, 64))).keys
    assert all(x != y for x, y in zip(a, c))


@pytest.mark.parametrize(
    "other",
    [
        Namespace("m", LLAMA, "salt-b"),
        Namespace("m2", LLAMA, "salt-a"),
        Namespace("m", KVLayout(32, 8, 128, 16, "float16"), "salt-a"),
        Namespace("m", KVLayout(32, 8, 128, 32, "bfloat16"), "salt-a"),
        Namespace("m", KVLayout(31, 8, 128, 16, "bfloat16"), "salt-a"),
    ],
)
def test_separation(other: Namespace) -> None:
    base = Namespace("m", LLAMA, "salt-a")
    tokens = list(range(64))
    mine = set(base.chain(tokens).keys)
    assert not mine & set(other.chain(tokens).keys)


def test_ambiguous_fields_do_not_collide() -> None:
    # length-prefixed fields: moving characters between model id and salt changes the seed
    assert Namespace("ab", LLAMA, "c").seed != Namespace("a", LLAMA, "bc").seed


def test_input_types_agree() -> None:
    ns = Namespace("m", LLAMA)
    toks = list(range(100, 164))
    expected = ns.chain(toks).keys
    assert ns.chain(tuple(toks)).keys == expected
    assert ns.chain(np.array(toks, dtype=np.int64)).keys == expected
    assert ns.chain(torch.tensor(toks)).keys == expected
    assert chain_keys(ns.seed, np.array(toks, dtype="<i4").tobytes(), 16) == expected


@pytest.mark.parametrize(
    "bad",
    [[-1, 2, 3], [2**31], ["a"], [1.5], b"\x00\x01", np.zeros((2, 2), dtype=np.int32),
     np.array([0.5]), 42],
)
def test_bad_tokens(bad: object) -> None:
    with pytest.raises(InvalidArgument):
        Namespace("m", LLAMA).chain(bad)


def test_bad_namespace() -> None:
    with pytest.raises(InvalidArgument, match="model_id"):
        Namespace("", LLAMA)


def test_block_meta_verifies_chain() -> None:
    chain = Namespace("m", LLAMA).chain(list(range(48)))
    metas = chain.metas()
    assert all(m.verify_chain() for m in metas)
    assert metas[0].parent == chain.namespace.seed and metas[1].parent == chain.keys[0]


def test_packed_keys_come_back_exactly_nuls_included() -> None:
    from kvstore.keys import pack_keys, unpack_keys

    keys = [b"\0" * 16, b"ab" + b"\0" * 14, b"\0" * 15 + b"z", bytes(range(16))]
    assert list(unpack_keys(pack_keys(keys))) == keys
    assert all(type(k) is bytes for k in unpack_keys(pack_keys(keys)))
    assert unpack_keys(b"") == ()
    with pytest.raises(InvalidArgument, match="33 bytes, not a multiple of 16"):
        unpack_keys(b"k" * 33)
    with pytest.raises(InvalidArgument, match="4 keys in one call; the limit is 3"):
        unpack_keys(pack_keys(keys), limit=3)


@pytest.mark.parametrize("n", [0, 1, 16, 64, 65, 4096])
def test_token_bytes_of_the_runtime_id_array_equal_those_of_a_list(n: int) -> None:
    import array

    ids = [(i * 7919) % 128256 for i in range(n)]
    assert token_bytes(array.array("I", ids)) == token_bytes(ids) == token_bytes(np.array(ids, dtype=np.int64))


@pytest.mark.parametrize("n", [1, 16, 65, 4096])
def test_token_bytes_refuses_an_id_array_past_int32(n: int) -> None:
    import array

    ids = array.array("I", [5] * n)
    ids[n // 2] = 2**31
    with pytest.raises(InvalidArgument, match="2147483648"):
        token_bytes(ids)


def test_tensor_parallel_shards_have_namespaces_of_their_own() -> None:
    layout = KVLayout(32, 8, 128, 16, "bfloat16")
    assert shard_model_id("m", 0, 1) == "m"  # no tensor parallelism: the model's own keys
    ids = [shard_model_id("m", r, 2) for r in range(2)]
    assert ids == ["m#tp0/2", "m#tp1/2"]
    seeds = {Namespace(i, layout).seed for i in [*ids, "m", shard_model_id("m", 0, 4)]}
    assert len(seeds) == 4
    for rank, world in [(2, 2), (-1, 2), (0, 0), (True, 2), (0, 1.0)]:
        with pytest.raises(InvalidArgument, match="tensor-parallel shard"):
            shard_model_id("m", rank, world)  # type: ignore[arg-type]
