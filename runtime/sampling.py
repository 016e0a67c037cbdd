"""Sampling parameters and the per-request sampler.

``temperature == 0`` is greedy (argmax; ties go to the lowest id). Otherwise logits are divided
by the temperature, nucleus-filtered to the smallest set of tokens whose probability reaches
``top_p``, and one token is drawn with the request's own ``torch.Generator`` — seeded from
``seed`` when given, so a request's samples do not depend on what else is in the batch or on a
preemption (the generator lives with the request and advances once per sampled token).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvstore.errors import InvalidArgument
from runtime.readout import HostReadout


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request's tokens are chosen and when it stops.

    ``max_tokens``: generated tokens at most (>= 1). ``temperature``: 0 for greedy, else > 0.
    ``top_p``: in (0, 1]. ``seed``: an int >= 0 for reproducible sampling, or None.
    ``stop_token_ids``: generation stops after emitting one of these (the stop token is kept as
    the last output token). Invalid values raise :class:`~kvstore.errors.InvalidArgument`.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: Sequence[int] = ()

    def __post_init__(self) -> None:
        m = self.max_tokens
        if not isinstance(m, int) or isinstance(m, bool) or m < 1:
            raise InvalidArgument(f"max_tokens must be an int >= 1, got {m!r}",
                                  hint="ask for at least one generated token")
        t = self.temperature
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or t < 0:
            raise InvalidArgument(f"temperature must be a finite number >= 0, got {t!r}",
                                  hint="use 0 for greedy decoding, e.g. 0.8 for sampling")
        p = self.top_p
        if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0 < p <= 1:
            raise InvalidArgument(f"top_p must be in (0, 1], got {p!r}",
                                  hint="use 1.0 to disable nucleus filtering")
        s = self.seed
        if s is not None and (not isinstance(s, int) or isinstance(s, bool) or s < 0):
            raise InvalidArgument(f"seed must be an int >= 0 or None, got {s!r}",
                                  hint="pass a non-negative int for reproducible sampling")
        stops = self.stop_token_ids
        if isinstance(stops, (str, bytes)) or not isinstance(stops, Sequence):
            raise InvalidArgument(f"stop_token_ids must be a sequence of ints, got {stops!r}",
                                  hint="e.g. stop_token_ids=(tokenizer.eos_id,)")
        for tok in stops:
            if not isinstance(tok, int) or isinstance(tok, bool) or tok < 0:
                raise InvalidArgument(f"stop_token_ids holds {tok!r}, not an int >= 0",
                                      hint="use token ids of the model's vocabulary")
        object.__setattr__(self, "stop_token_ids", tuple(stops))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def check_vocab(self, vocab_size: int) -> None:
        """Raise InvalidArgument when a stop token id is outside ``[0, vocab_size)``."""
        bad = [t for t in self.stop_token_ids if t >= vocab_size]
        if bad:
            raise InvalidArgument(f"stop_token_ids {bad} are outside [0, {vocab_size})",
                                  hint="use token ids of the model's vocabulary")

    def make_generator(self) -> torch.Generator | None:
        """The request's generator (None for greedy): seeded from ``seed``, else randomly."""
        if self.greedy:
            return None
        gen = torch.Generator()
        if self.seed is None:
            gen.seed()
        else:
            gen.manual_seed(self.seed)
        return gen


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token id from float ``logits`` ``[vocab_size]`` (on any device)."""
    return sample_rows(logits[None], [params], [generator])[0]


def sample_rows(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    readout: HostReadout | None = None,
) -> list[int]:
    """One token id per row of float ``logits`` ``[rows, vocab_size]``, row ``i`` by
    ``params[i]`` and ``generators[i]``. The greedy rows are reduced on the logits' device in one
    kernel; what the host needs is read through ``readout`` when given (see
    :mod:`runtime.readout`), else by a plain copy."""
    if len(params) != logits.shape[0] or len(generators) != logits.shape[0]:
        raise InvalidArgument(f"{logits.shape[0]} rows of logits, {len(params)} params and "
                              f"{len(generators)} generators", hint="give one of each per row")
    read = readout.read if readout is not None else (lambda t: t.to("cpu"))
    out = [0] * len(params)
    greedy = [i for i, p in enumerate(params) if p.greedy]
    if greedy:
        rows = logits if len(greedy) == len(params) else logits[greedy]
        toks = (readout.argmax(rows) if readout is not None
                else torch.argmax(rows, dim=-1).to("cpu").tolist())
        for i, tok in zip(greedy, toks):
            out[i] = int(tok)
    others = [i for i, p in enumerate(params) if not p.greedy]
    if others:
        host = read(logits[others].float())
        for j, i in enumerate(others):
            out[i] = _draw(host[j], params[i], generators[i])
    return out


def _draw(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """A temperature/top-p draw from CPU float ``logits`` ``[vocab_size]``."""
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # mass of better tokens
        sorted_probs = sorted_probs.masked_fill(before >= params.top_p, 0.0)  # keeps the top one
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator).item())


__all__ = ["SamplingParams", "sample", "sample_rows"]
