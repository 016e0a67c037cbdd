"""GPU machine only (-m gpu): the bundled engine on CUDA through a real ``kvstore serve``. The
client page-locks the daemon's shared-memory slab (cudaHostRegister), so the transfer kernels
copy between the GPU pool and the daemon's slab directly: a second engine (its own pool, its
own connection) loads the first one's prefix from the daemon and replies the same tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runtime.config import get_model_config
from runtime.engine import Engine
from runtime.sampling import SamplingParams
from server.daemon.process import DaemonProcess, layout_env

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.fail("-m gpu tests need a CUDA GPU")


def test_two_cuda_engines_share_a_prefix_through_the_daemon(tmp_path: Path) -> None:
    layout = get_model_config("tiny").kv_layout(16)
    prompt = [(7 * i + 3) % 200 + 1 for i in range(16 * 12 + 5)]
    outs = []
    with DaemonProcess(tmp_path, layout_env(layout)) as daemon:
        for _ in range(2):
            engine = Engine.from_config("tiny", device="cuda", num_blocks=64,
                                        daemon=daemon.target)
            try:
                assert engine.daemon is not None and engine.daemon.dma_registered
                (out,) = engine.generate([prompt], SamplingParams(max_tokens=8))
                engine.drain()
            finally:
                engine.close()
            assert out.error is None
            outs.append(out)
        assert daemon.stop() == 0
    first, second = outs
    assert first.metrics.num_tokens_reused.get("host", 0) == 0
    assert second.metrics.num_tokens_reused.get("host", 0) == 12 * 16
    assert second.output_token_ids == first.output_token_ids


def test_a_restarted_daemon_s_slab_is_registered_afresh(tmp_path: Path) -> None:
    # the client maps the new daemon's segment at the same address; a CUDA registration of the
    # old one would make the GPU copy from the old daemon's pages (wrong KV)
    layout = get_model_config("tiny").kv_layout(16)
    prompt = [(5 * i + 1) % 200 + 1 for i in range(16 * 10 + 3)]
    daemon = DaemonProcess(tmp_path, layout_env(layout)).start()
    engine = Engine.from_config("tiny", device="cuda", num_blocks=64, daemon=daemon.target)
    try:
        (first,) = engine.generate([prompt], SamplingParams(max_tokens=8))
        engine.drain()
        assert daemon.stop() == 0
        daemon = DaemonProcess(tmp_path, layout_env(layout)).start()  # warm: the disk tier
        assert engine.daemon.wait_connected(30) and engine.daemon.dma_registered
        engine.store.evict(engine.store.tier("hbm").capacity_pages, tier="hbm")
        (again,) = engine.generate([prompt], SamplingParams(max_tokens=8))
        assert sum(n for t, n in again.metrics.num_tokens_reused.items() if t != "hbm") == 160
        assert again.output_token_ids == first.output_token_ids
    finally:
        engine.close()
        daemon.stop()
