"""A request's ask to keep its prompt's prefix cached (retention pins, kvstore.retention): how
long, and how much of the prompt -- a system prompt, a shared document, an agent's context.

Engines pass it their own way: vLLM in a request's ``kv_transfer_params``
(``{"kvstore_pin_ttl_s": 600, "kvstore_pin_tokens": 1024}``), the bundled runtime as
``Engine.add_request(..., pin=PinRequest(...))``. The connector pins the prefix's whole blocks
when the request is first scheduled: blocks not stored yet are kept once they arrive."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvstore.errors import InvalidArgument
from kvstore.retention import MAX_TTL_S

#: the keys of vLLM's ``kv_transfer_params`` this connector reads
TTL_PARAM, TOKENS_PARAM = "kvstore_pin_ttl_s", "kvstore_pin_tokens"


@dataclass(frozen=True, slots=True)
class PinRequest:
    #: seconds to keep the prefix, in (0, 30 days]
    ttl_s: float
    #: the prompt's first tokens to keep (whole blocks of them); None: every whole block
    tokens: int | None = None

    def __post_init__(self) -> None:
        t = self.ttl_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) \
                or not 0 < t <= MAX_TTL_S:
            raise InvalidArgument(f"a pin's ttl_s is in (0, {MAX_TTL_S:.0f}] seconds, got {t!r}")
        n = self.tokens
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise InvalidArgument(f"a pin's tokens is a count >= 1 (or unset), got {n!r}")

    @classmethod
    def from_params(cls, params: Any) -> PinRequest | None:
        """The pin a vLLM request's ``kv_transfer_params`` asks for; None when it asks none.
        InvalidArgument names a bad value (the caller logs it: a request is never failed for
        its retention ask)."""
        if not isinstance(params, Mapping) or TTL_PARAM not in params:
            if isinstance(params, Mapping) and TOKENS_PARAM in params:
                raise InvalidArgument(f"{TOKENS_PARAM} without {TTL_PARAM}: how long to pin?")
            return None
        return cls(params[TTL_PARAM], params.get(TOKENS_PARAM))

    def blocks(self, num_tokens: int, block_size: int) -> int:
        """How many whole blocks of a ``num_tokens`` prompt to pin."""
        n = num_tokens if self.tokens is None else min(self.tokens, num_tokens)
        return n // block_size


__all__ = ["TOKENS_PARAM", "TTL_PARAM", "PinRequest"]
