"""What the scheduler side of :class:`~connector.vllm.KVStoreConnector` keeps per request, and
the one place it corrects a vLLM request's cached-token count after a failed load."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from connector.inprocess import InProcessScheduler

if TYPE_CHECKING:
    from vllm.v1.request import Request


@dataclass(eq=False)
class RequestState:
    """Scheduler-side state of one request the connector follows. ``scheds``: one scheduler
    per tensor-parallel shard (rank order), each over the shard's namespace; empty for a
    request the connector skips."""

    request: Request
    scheds: tuple[InProcessScheduler, ...]
    num_local: int = 0  # tokens vLLM's own prefix cache had at the last match
    block_ids: list[int] = field(default_factory=list)
    saved: int | None = None  # leading blocks saved (or already held) so far
    #: per shard, the keys of the first len(keys[r]) blocks in that shard's namespace
    keys: list[list[bytes]] = field(default_factory=list)
    load_async: bool = False  # the last match loads across steps
    receiving: bool = False  # an asynchronous load into its blocks was handed out, not reported
    loading: tuple[int, ...] = ()  # the blocks its last load writes, in prompt order


def count_loaded_only(request: Request, num_local_tokens: int, num_loaded_tokens: int) -> None:
    """Make ``request``'s cached-token count honest after a failed load: ``num_local_tokens``
    from vLLM's prefix cache plus the ``num_loaded_tokens`` (the leading run of our offer that
    did load; vLLM recomputes from the first failed block on) -- never more than vLLM counted.

    vLLM sets the count when it first schedules the request, from what the connector offered,
    and reports it with the request's first output (``RequestOutput.num_cached_tokens``,
    ``usage.prompt_tokens_details.cached_tokens``, the prefix-cache stats); its recovery from
    a failed load (``Scheduler._update_requests_with_invalid_blocks``) fixes the computed
    tokens only. No public hook sets it, so this is the one place the connector writes a
    Request attribute, for the two shapes vLLM has had:

    * ``request.prefill_stats`` (a :class:`vllm.v1.metrics.stats.PrefillStats`; the vLLM this
      package is tested with): rewritten through its own ``set``. It is None once the first
      output took it -- too late then, but vLLM gives a request whose synchronous load failed
      no output in the step that reports the failure, and calls ``update_connector_output``
      later in that step;
    * ``request.num_cached_tokens`` (earlier vLLMs: an int, -1 until scheduled), read at
      every output.
    """
    if hasattr(request, "prefill_stats"):
        stats = request.prefill_stats
        if stats is not None and stats.num_external_cached_tokens > num_loaded_tokens:
            stats.set(num_prompt_tokens=stats.num_prompt_tokens,
                      num_local_cached_tokens=stats.num_local_cached_tokens,
                      num_external_cached_tokens=num_loaded_tokens)
        return
    cached = getattr(request, "num_cached_tokens", None)
    if isinstance(cached, int) and cached > num_local_tokens + num_loaded_tokens:
        setattr(request, "num_cached_tokens", num_local_tokens + num_loaded_tokens)  # noqa: B010
