"""Native copy_spans against its pure reference: every size, offset and alignment."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from csrc.loader import build
from kvstore import ops


def test_native_builds_and_is_active() -> None:
    # CI has a C compiler: the native path must really be the one under test.
    assert build("copy_pages").exists()
    assert ops.native_active()


@given(
    sizes=st.lists(st.integers(0, 600_000), min_size=1, max_size=4),
    dst_off=st.integers(0, 127),
    src_off=st.integers(0, 127),
    seed=st.integers(0, 2**16),
)
def test_parity_with_reference(sizes: list[int], dst_off: int, src_off: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    total = sum(sizes) + 256
    src_buf = rng.integers(0, 256, total, dtype=np.uint8)
    got = np.zeros(total, dtype=np.uint8)
    want = np.zeros(total, dtype=np.uint8)
    spans_got, spans_want = [], []
    d, s = dst_off, src_off
    for n in sizes:
        spans_got.append((got[d : d + n], src_buf[s : s + n]))
        spans_want.append((want[d : d + n], src_buf[s : s + n]))
        d, s = d + n, s + n
    ops.copy_spans_native(spans_got)
    ops.copy_spans_reference(spans_want)
    assert np.array_equal(got, want)
    got[:] = 0
    ops.copy_spans(spans_got)  # whichever copy_choice() picked
    assert np.array_equal(got, want)


def test_forced_reference_path() -> None:
    code = (
        "import numpy as np; from kvstore import ops;"
        "a = np.arange(1 << 20, dtype=np.uint32).view(np.uint8); b = np.zeros_like(a);"
        "ops.copy_spans([(b, a)]); assert (a == b).all(); print(ops.native_active())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={"KVSTORE_NATIVE": "0", "PATH": ""},
    )
    assert out.stdout.strip() == "False"


def test_the_copy_is_chosen_by_measurement() -> None:
    choice = ops.copy_choice()
    assert set(choice) == {"small", "large"}
    assert set(choice.values()) <= {"native", "numpy"}
    assert ops.copy_choice() is choice, "measured once per process"


@pytest.mark.parametrize(("switch", "want"), [("0", "numpy"), ("1", "native")])
def test_the_native_switch_forces_the_copy_choice(switch: str, want: str) -> None:
    code = "from kvstore import ops; c = ops.copy_choice(); print(c['small'], c['large'])"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={"KVSTORE_NATIVE": switch, "PATH": "/usr/bin:/bin"},
    )
    assert out.stdout.split() == [want, want]


def test_a_bad_native_switch_is_an_error_for_library_users_too(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from csrc.loader import native_mode
    from kvstore.errors import ConfigError

    monkeypatch.setenv("KVSTORE_NATIVE", "banana")
    with pytest.raises(ConfigError, match="KVSTORE_NATIVE='banana': must be auto, 0 or 1"):
        native_mode()


def test_the_choice_copies_more_than_the_caches_hold() -> None:
    """The choice measures cold copies, as the tier's pages are: a working set that fits in
    the last-level cache favours np.copyto, which leaves it there (kvstore/ops.py)."""
    import glob

    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        text = open(path).read().strip().upper()
        sizes.append(int(text.rstrip("KM")) * {"K": 1 << 10, "M": 1 << 20}.get(text[-1], 1))
    cold = ops._cold_bytes()
    assert 32 << 20 <= cold <= 128 << 20
    assert cold >= min(128 << 20, 2 * max(sizes, default=0))


@pytest.mark.parametrize(("native_s", "numpy_s", "want"), [
    (1.00, 0.90, "numpy"),  # clearly faster
    (1.00, 0.97, "native"),  # within the margin: the streaming stores keep the cache
    (1.00, 1.20, "native"),
])
def test_numpy_is_chosen_only_when_clearly_faster(native_s: float, numpy_s: float,
                                                  want: str) -> None:
    assert ops._pick(native_s, numpy_s) == want
