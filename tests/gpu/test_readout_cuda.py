"""GPU machine only (-m gpu): HostReadout reads exact values through a kernel into pinned host
memory -- also while a large device-to-host save is queued on another stream, behind which a
copy-engine read would wait -- and grows past its first buffer. HostUpload the other way: exact
values, back to back (the buffer is not rewritten under a pending kernel), past its first
buffer, and not behind a large host-to-device load queued on another stream."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from runtime.readout import HostReadout, HostUpload

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.fail("-m gpu tests need a CUDA GPU")


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32, torch.bfloat16])
def test_values_are_exact(dtype: torch.dtype) -> None:
    r = HostReadout("cuda", nbytes=64)
    src = (torch.randn(3, 1000, device="cuda") * 1e4).to(dtype)
    if dtype.is_floating_point:
        src[0, :3] = torch.tensor([float("inf"), -0.0, float("-inf")], dtype=dtype)
    got = r.read(src)  # 3 * 1000 elements: past the 64-byte first buffer
    assert got.device.type == "cpu" and got.shape == src.shape and got.dtype == dtype
    assert torch.equal(got, src.cpu())
    assert torch.signbit(got[0, 1]) if dtype.is_floating_point else True
    again = r.read(src[1:2])  # the buffer is reused; the earlier result is a copy
    assert torch.equal(again, src[1:2].cpu()) and torch.equal(got, src.cpu())


def test_read_behind_a_queued_save() -> None:
    r = HostReadout("cuda")
    big = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    host = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        host.copy_(big, non_blocking=True)
    logits = torch.randn(8, 4096, device="cuda")
    toks = r.read(torch.argmax(logits, dim=-1))
    assert toks.tolist() == logits.argmax(-1).tolist()
    side.synchronize()


def test_argmax_is_written_straight_to_the_host() -> None:
    """Row-wise argmax into the pinned buffer: exact, the first of tied maxima, past the first
    buffer, and not behind a queued device-to-host copy."""
    r = HostReadout("cuda", nbytes=16)
    logits = torch.randn(5, 128256, device="cuda")
    logits[2, 7] = logits[2, 90000] = logits[2].max() + 1
    big = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    host = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        host.copy_(big, non_blocking=True)
    got = r.argmax(logits)  # 5 ids: past the 16-byte first buffer
    assert got == logits.argmax(-1).tolist() and got[2] == 7
    assert r.argmax(logits[3:4].to(torch.bfloat16)) == [int(logits[3].to(torch.bfloat16).argmax())]
    side.synchronize()


def test_uploads_are_exact_back_to_back_and_grow() -> None:
    up = HostUpload("cuda", nbytes=64)
    rng = np.random.default_rng(0)
    a = rng.integers(0, 1 << 40, size=5000, dtype=np.int64)  # past the 64-byte first buffer
    b = rng.integers(0, 1 << 40, size=7, dtype=np.int64)
    got_a, got_b = up.upload(a), up.upload(b)  # b is written only after a's kernel read a
    assert got_a.device.type == "cuda" and got_a.dtype == torch.int64
    assert got_a.cpu().numpy().tolist() == a.tolist() and got_b.cpu().numpy().tolist() == b.tolist()
    f = rng.standard_normal(33).astype(np.float32)
    assert np.array_equal(up.upload(f).cpu().numpy(), f)


def test_upload_not_behind_a_queued_load() -> None:
    """1 GiB host-to-device queued on another stream (a layer-wise load): the upload's kernel
    runs without waiting for it (a copy-engine upload of this size queued behind it)."""
    up = HostUpload("cuda")
    host = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    big = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    side = torch.cuda.Stream()
    ids = np.arange(40000, dtype=np.int64)  # 320 KB: past the pageable inline limit
    with torch.cuda.stream(side):
        big.copy_(host, non_blocking=True)
    got = up.upload(ids)
    done = torch.cuda.Event()
    done.record()
    done.synchronize()
    assert not side.query(), "the 1 GiB load ended first: nothing was measured"
    assert torch.equal(got.cpu(), torch.from_numpy(ids))
    side.synchronize()
