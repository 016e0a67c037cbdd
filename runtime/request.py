"""A request's state inside the engine, and what the engine hands back (:class:`RequestOutput`).

A request's tokens are ``token_ids = prompt + output``. ``num_computed_tokens`` of them have their
K/V in the blocks of ``block_ids`` (in order; block ``i`` holds tokens ``[i*B, (i+1)*B)``). The
first ``num_committed_blocks`` blocks are committed in the pool under ``block_keys`` (which chain
over the whole token sequence, prompt and output alike)::

    token_ids:  [ prompt ............................ | output ....... ]
    blocks:     [ b0 (committed) | b1 (committed) | b2 (held) | b3 (held) ]
                                                  ^ num_committed_blocks = 2
    computed:   [ K/V written ............................... ]  ^ next token to run

The last output token never has K/V until it is run as the next decode step.
"""

from __future__ import annotations

import array
import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from runtime.sampling import SamplingParams

FinishReason = Literal["stop", "length", "error", "abort"]


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True, slots=True)
class RequestMetrics:
    """Per-request numbers.

    ``ttft_s``: seconds from arrival to the first generated token (None if none was generated).
    ``num_tokens_computed``: tokens run through the model in prefill — the prompt part not found
    in the cache, plus everything recomputed after a preemption (decode steps are not counted).
    ``num_tokens_reused``: tokens whose K/V came from the cache instead, by tier (``{"hbm": n}``),
    summed over admissions; with a KV connector also ``"host"`` and, when used, each lower
    tier the connector loaded from (``"disk"``, ``"redis"``: tokens loaded through host from
    there). Without preemption ``computed + sum(reused) == len(prompt)``.
    ``num_preemptions``: times the request was evicted from the running set to free blocks.
    """

    arrival_time: float
    first_token_time: float | None
    finished_time: float | None
    ttft_s: float | None
    num_tokens_computed: int
    num_tokens_reused: dict[str, int]
    num_preemptions: int
    #: Tokens whose K/V a connector load failed to supply and that were recomputed instead
    #: (they count in ``num_tokens_computed``, not in ``num_tokens_reused``).
    num_tokens_load_failed: int = 0


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """A finished request. ``finish_reason``: ``"stop"`` (a stop token, kept as the last output
    token), ``"length"`` (``max_tokens`` reached) or ``"error"`` (``error`` says why; the engine
    kept serving the other requests)."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    finish_reason: FinishReason
    metrics: RequestMetrics
    error: str | None = None


@dataclass(eq=False)
class Request:
    """Mutable engine-side state of one request (owned by the scheduler). Its tokens are kept
    as unsigned 32-bit arrays (``array("I")``): the engine's id check makes one already, and
    a 32K-token prompt made a list of 32K int objects (~0.5 ms) before its lookup could start;
    outputs get lists."""

    request_id: str
    prompt_token_ids: Sequence[int]
    params: SamplingParams
    arrival_time: float
    token_ids: array.array[int] = field(default_factory=lambda: array.array("I"))
    #: The prompt's ids as int32le bytes (what block keys hash), when the caller had them (the
    #: engine converts a prompt once, in ``add_request``); empty: converted where needed.
    prompt_bytes: bytes = b""
    status: RequestStatus = RequestStatus.WAITING
    block_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_committed_blocks: int = 0
    block_keys: list[bytes] = field(default_factory=list)
    #: ``(start, stop, metas)``: identities of the full blocks ``[start, stop)`` the running
    #: step completes, built while the GPU runs it (``Scheduler.prepare_commits``).
    pending_metas: tuple[int, int, list[Any]] | None = None
    #: True from admission until a chunk reaches the last token (then decode steps follow).
    in_prefill: bool = True
    generator: torch.Generator | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_tokens_computed: int = 0
    num_tokens_reused: dict[str, int] = field(default_factory=lambda: {"hbm": 0})
    num_preemptions: int = 0
    finish_reason: FinishReason | None = None
    error: str | None = None
    #: Connector state (None/empty without a connector). ``connector_id``: this admission's id
    #: at the connector (fresh per admission, so a preempted request's in-flight transfers are
    #: never confused with its next admission's). ``num_saved_blocks``: leading blocks that are
    #: saved, loaded or hbm hits (saves go past it). ``load_start``/``load_block_ids``: the
    #: blocks being loaded this step (block index of the first, engine block ids);
    #: ``load_tiers``: the tier each of them is loaded from (as the connector matched it).
    connector_id: str | None = None
    num_saved_blocks: int = 0
    load_start: int = 0
    load_block_ids: list[int] = field(default_factory=list)
    load_tiers: tuple[str, ...] = ()
    num_tokens_load_failed: int = 0
    #: The request's blocks and connector admission were given back (it ends in the running
    #: step: ``Scheduler.release_ending``, or it finished).
    released: bool = False
    #: The output's copy of the prompt, when made before the last token was known.
    prompt_out: list[int] | None = None

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = array.array("I", self.prompt_token_ids)
        if self.generator is None:
            self.generator = self.params.make_generator()

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids):].tolist()

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def max_kv_tokens(self) -> int:
        """Tokens that will ever hold K/V: all but the last possible output token."""
        return self.num_prompt_tokens + self.params.max_tokens - 1

    def output_prompt(self) -> list[int]:
        """The prompt as the output's list of plain ints."""
        return self.prompt_out if self.prompt_out is not None else _as_list(self.prompt_token_ids)

    def to_output(self) -> RequestOutput:
        assert self.finish_reason is not None, "only finished requests have an output"
        ttft = (None if self.first_token_time is None
                else self.first_token_time - self.arrival_time)
        metrics = RequestMetrics(
            arrival_time=self.arrival_time, first_token_time=self.first_token_time,
            finished_time=self.finished_time, ttft_s=ttft,
            num_tokens_computed=self.num_tokens_computed,
            num_tokens_reused=dict(self.num_tokens_reused),
            num_preemptions=self.num_preemptions,
            num_tokens_load_failed=self.num_tokens_load_failed,
        )
        return RequestOutput(self.request_id, self.output_prompt(),
                             self.output_token_ids, self.finish_reason, metrics, self.error)


def _as_list(ids: Sequence[int]) -> list[int]:
    """A list of plain ints (an array's ``tolist``; a list copied)."""
    return ids.tolist() if isinstance(ids, array.array) else list(ids)


__all__ = ["FinishReason", "Request", "RequestMetrics", "RequestOutput", "RequestStatus"]
