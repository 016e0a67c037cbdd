"""Batched sampling (one kernel for the greedy rows, one read for the rest) picks what sampling
each row alone picks, with the same generators; bad shapes are refused by name."""

from __future__ import annotations

import pytest
import torch

from kvstore.errors import InvalidArgument
from runtime.readout import HostReadout
from runtime.sampling import SamplingParams, sample, sample_rows

PARAMS = [SamplingParams(), SamplingParams(temperature=0.8, seed=1),
          SamplingParams(temperature=1.3, top_p=0.5, seed=2), SamplingParams()]


def test_rows_are_sampled_as_each_row_alone() -> None:
    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(0))
    logits[3, 17] = logits[3, 18] = logits[3].max() + 1  # a tie: the lower id wins
    alone = [sample(logits[i], p, p.make_generator()) for i, p in enumerate(PARAMS)]
    batched = sample_rows(logits, PARAMS, [p.make_generator() for p in PARAMS],
                          HostReadout("cpu"))
    assert batched == alone
    assert batched[3] == 17 and batched[0] == int(logits[0].argmax())


def test_mismatched_rows_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="3 rows of logits, 2 params and 2 generators"):
        sample_rows(torch.zeros(3, 10), PARAMS[:2], [None, None])


def test_cpu_readout_is_a_copy() -> None:
    t = torch.arange(5)
    r = HostReadout("cpu").read(t)
    t.add_(1)
    assert r.tolist() == [0, 1, 2, 3, 4]


def test_cpu_argmax_takes_the_first_maximum() -> None:
    t = torch.tensor([[0.0, 3.0, 3.0], [5.0, 1.0, 5.0]])
    assert HostReadout("cpu").argmax(t) == [1, 0]
