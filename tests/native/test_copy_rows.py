"""copy_rows on a CPU-only machine: the reference is what runs (the CUDA kernel is tested against
it on the GPU machine, tests/gpu/test_copy_rows_cuda.py), bad arguments are refused, and the
CUDA build is reported unavailable rather than crashing where there is no nvcc or no GPU."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from csrc import loader
from kvstore import ops


def _idx(ids: list[int]) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.int64)


def test_reference_copies_the_named_rows_over_strided_views() -> None:
    L, S = 3, 32
    src = torch.arange(5 * L * S, dtype=torch.int64).to(torch.uint8).view(5, L * S)
    dst = torch.zeros(4, L * S, dtype=torch.uint8)
    for layer in range(L):
        ran_kernel = ops.copy_rows(dst.view(-1, L, S)[:, layer], src.view(-1, L, S)[:, layer],
                                   _idx([3, 0, 1]), _idx([4, 4, 0]))
        assert not ran_kernel  # CPU tensors: the reference
    assert torch.equal(dst[3], src[4]) and torch.equal(dst[0], src[4])
    assert torch.equal(dst[1], src[0]) and not dst[2].any()


@pytest.mark.parametrize("bad", ["shape", "rowsize", "idx"])
def test_bad_arguments_are_refused(bad: str) -> None:
    dst = torch.zeros(4, 32, dtype=torch.uint8)
    src = torch.ones(4, 32 if bad != "rowsize" else 16, dtype=torch.uint8)
    if bad == "shape":
        src = src.view(-1)
    di, si = _idx([0, 1]), (_idx([0]) if bad == "idx" else _idx([1, 2]))
    with pytest.raises(ValueError, match="copy_rows needs"):
        ops.copy_rows(dst, src, di, si)
    assert not dst.any()


def test_empty_index_is_a_no_op() -> None:
    dst = torch.zeros(2, 16, dtype=torch.uint8)
    assert ops.copy_rows(dst, torch.ones(2, 16, dtype=torch.uint8), _idx([]), _idx([]))
    assert not dst.any()


def test_cuda_op_without_nvcc_is_unavailable_not_fatal(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {**os.environ, "NVCC": str(tmp_path / "no-nvcc"), "KVSTORE_NATIVE_CACHE": str(tmp_path),
           "KVSTORE_NATIVE": "auto"}
    code = "from kvstore.ops import copy_rows_native_active as a; print(a())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True)
    assert out.stdout.strip() == "False"
    assert "copy_rows unavailable" in out.stderr
    env["KVSTORE_NATIVE"] = "1"  # forced native: a failed build is an error naming the op
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode != 0 and "native op 'copy_rows' failed to build" in out.stderr


def test_cuda_sources_are_built_with_nvcc(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("NVCC", "/opt/cuda/bin/nvcc")
    monkeypatch.setenv("KVSTORE_CUDA_ARCH", "sm_90")
    compiler, flags = loader._command(loader._SRC_DIR / "copy_rows.cu")
    assert compiler == ["/opt/cuda/bin/nvcc"] and "-arch=sm_90" in flags and "-shared" in flags
    compiler, flags = loader._command(loader._SRC_DIR / "copy_pages.c")
    assert "-std=c11" in flags
