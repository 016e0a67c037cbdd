"""The native block-key chain against Python's: every length, block size and seed; the switch
that turns it off; the self-check that refuses a chain that disagrees."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from csrc.loader import build
from kvstore import keys, native_chain
from kvstore.keys import KEY_BYTES, chain_keys


def test_native_builds_and_is_active() -> None:
    # CI has a C compiler and python-xxhash: the native chain must be the one under test.
    assert build("chain_keys").exists()
    assert native_chain.native_chain(keys._chain_reference) is not None


@given(
    seed=st.binary(min_size=KEY_BYTES, max_size=KEY_BYTES),
    block_size=st.sampled_from([1, 4, 16, 64, 1024, 1025]),
    blocks=st.integers(0, 80),
    tail=st.integers(0, 3),
    salt=st.integers(0, 255),
)
def test_parity_with_python(seed: bytes, block_size: int, blocks: int, tail: int,
                            salt: int) -> None:
    step = 4 * block_size
    data = bytes((i * 31 + salt) % 256 for i in range(blocks * step + tail))
    got = chain_keys(seed, data, block_size)  # native from 16 blocks of at most 1024 tokens
    want = keys._chain_reference(seed, data, blocks, step)
    assert got == want
    assert all(type(k) is bytes and len(k) == KEY_BYTES for k in got)


def test_a_long_chain_matches_python_key_by_key() -> None:
    seed = bytes(range(KEY_BYTES))
    data = bytes(i % 251 for i in range(64 * 2048))
    fn = native_chain.native_chain(keys._chain_reference)
    assert fn is not None
    assert fn(seed, data, 2048, 64) == keys._chain_reference(seed, data, 2048, 64)


def test_a_chain_that_disagrees_is_turned_off(monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(native_chain, "_resolved", False)
    monkeypatch.setattr(native_chain, "_chain", None)

    def wrong(seed: bytes, data: bytes, n: int, step: int) -> list[bytes]:
        return [bytes(KEY_BYTES)] * n

    with caplog.at_level(logging.WARNING, logger="kvstore.native"):
        assert native_chain.native_chain(wrong) is None
    assert "disagrees" in caplog.text
    assert native_chain.native_chain(keys._chain_reference) is None  # decided once


def test_forced_python_path() -> None:
    code = (
        "from kvstore import keys, native_chain;"
        "d = bytes(range(256)) * 64; k = keys.chain_keys(bytes(16), d, 16);"
        "assert k == keys._chain_reference(bytes(16), d, 256, 64);"
        "print(native_chain.native_chain(keys._chain_reference))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={"KVSTORE_NATIVE": "0", "PATH": ""})
    assert out.stdout.strip() == "None"
