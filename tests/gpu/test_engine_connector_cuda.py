"""GPU machine only (-m gpu): the engine-with-connector tests of tests/runtime, rerun with the
model and its pool on CUDA -- loads from the pinned host tier run as scatter kernels on the
connector's load stream, saves as gather kernels on its save stream, ordered by CUDA events.
Greedy tokens must equal the no-cache reference whether the prefix came from hbm, host, disk,
Redis or nowhere, with partial hits, concurrent requests, preemption and pages deleted mid-load."""

from __future__ import annotations

import pytest
import torch

from kvstore.ops import copy_rows_native_active
from runtime import LlamaForPagedLM, get_model_config
from tests.runtime.test_engine_connector import (  # noqa: F401 - collected here on CUDA
    test_concurrent_requests_sharing_a_host_prefix,
    test_delayed_free_waits_for_saves,
    test_disk_page_corrupted_after_lookup_is_recomputed,
    test_host_page_deleted_after_admission_is_recomputed,
    test_partial_and_mixed_hits,
    test_preemption_with_connector,
    test_prefix_from_disk_loads_through_host,
    test_prefix_from_hbm_host_and_none_identical,
    test_prefix_from_redis_loads_through_host,
    test_tiny_pool_evicts_to_host_between_requests,
    test_write_through_store_skips_request_save,
)
from tests.runtime.test_first_layer import (  # noqa: F401 - collected here on CUDA
    test_chunks_write_the_same,
    test_host_hit_copies_layers_one_on,
    test_written_kv_are_the_forwards,
)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def model() -> LlamaForPagedLM:
    if not torch.cuda.is_available():
        pytest.fail("-m gpu tests need a CUDA GPU")
    return LlamaForPagedLM.from_random(get_model_config("tiny"), seed=7, device="cuda")


def test_the_gather_scatter_kernel_is_what_runs() -> None:
    assert copy_rows_native_active(), "csrc/copy_rows.cu did not build: the reference ran"
