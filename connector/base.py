"""The connector seam: what an engine calls to load KV pages from the store and save them to it.

Shaped like vLLM's KV connector (v1), split in two so that the two halves can live in different
processes (vLLM's scheduler process and its GPU workers):

* **scheduler side** (:class:`KVConnectorScheduler`) — never blocks on a page copy:

  - ``get_num_new_matched_tokens`` — how many tokens beyond the engine's own prefix cache the
    store can supply, and whether the load runs asynchronously (across steps);
  - ``update_state_after_alloc`` — which engine blocks the engine allocated for those tokens;
  - ``request_save`` — full blocks of a request to save this step;
  - ``build_connector_meta`` — this step's loads and saves, as one :class:`ConnectorMetadata`;
  - ``request_finished`` — the request is done; True means "do not free its blocks yet":
    transfers are in flight and the worker side will report it in ``FinishedRequests.sending``.

* **worker side** (:class:`KVConnectorWorker`) — runs the copies:

  - ``register_kv_caches`` — the engine's KV tensors and their layout (:class:`KVCacheSpec`);
  - ``bind_connector_metadata`` / ``clear_connector_metadata`` — this step's plan;
  - ``start_load_kv`` / ``wait_for_layer_load(l)`` — layer-wise loads: layer ``l + 1`` is copied
    while layer ``l`` computes;
  - ``save_kv_layer(l)`` / ``wait_for_save`` — layer-wise saves started as each layer's
    attention wrote its K/V;
  - ``get_finished`` — requests whose asynchronous loads, or delayed-free transfers, are done;
  - ``get_block_ids_with_load_errors`` — blocks that could not be loaded.

Per step, the engine calls::

    scheduler:  get_num_new_matched_tokens -> (allocate) -> update_state_after_alloc
                request_save(full blocks computed last step) ... build_connector_meta()
    worker:     bind_connector_metadata(meta); start_load_kv()
                for l in layers: wait_for_layer_load(l); attention(l); save_kv_layer(l)
                wait_for_save(); get_finished(finished ids); get_block_ids_with_load_errors()
                clear_connector_metadata()
    scheduler:  request_finished(...) for requests that ended

Failed loads: a block that cannot be loaded (a miss, a page that failed its check, an expired
lease, a timeout) is reported by ``get_block_ids_with_load_errors``, together with every later
block of the same request. The engine recomputes the request from its first failed block on;
blocks before it hold exactly the stored bytes. A failed block's bytes are unspecified.

Errors: misuse (a bad layout, an unknown request, a block id out of range) raises
:class:`~kvstore.errors.InvalidArgument` before anything changes. A miss is never an exception.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from kvstore.errors import InvalidArgument
from kvstore.keys import BlockMeta
from kvstore.layout import KVLayout
from kvstore.results import Lease

CacheLayout = Literal["page_first", "per_layer", "layer_blocks"]


@dataclass(frozen=True, slots=True)
class KVCacheSpec:
    """The engine's KV cache tensors and how blocks are laid out in them.

    * ``page_first`` — one tensor ``[num_blocks, num_layers, 2, block_size, num_kv_heads,
      head_dim]`` (the hbm tier's ``pool``); block ``b``'s layer ``l`` is ``t[b, l]``.
    * ``per_layer`` — ``num_layers`` tensors ``[num_blocks, 2, block_size, num_kv_heads,
      head_dim]`` (vLLM's per-layer caches); block ``b``'s layer ``l`` is ``tensors[l][b]``.

    * ``layer_blocks`` — ``num_layers`` tensors ``[num_blocks, *block_shape]`` whose blocks are
      opaque: an engine's own per-layer block layout (``KVLayout.block_format`` names it, e.g.
      vLLM's). Block ``b`` of layer ``l`` is ``tensors[l][b]``, which must be contiguous; the
      tensors themselves may be strided views (the block stride larger than a block, as when
      an engine interleaves layers in one allocation).

    Either way one block's one layer is a contiguous ``2 * block_size * num_kv_heads * head_dim``
    element slice, the same bytes as that layer's slice of a store page. Build with
    :meth:`page_first`, :meth:`per_layer` or :meth:`layer_blocks`; :meth:`validate` checks it
    against a layout.
    """

    layout: CacheLayout
    tensors: tuple[torch.Tensor, ...]

    @classmethod
    def page_first(cls, pool: torch.Tensor) -> KVCacheSpec:
        return cls("page_first", (pool,))

    @classmethod
    def per_layer(cls, tensors: Sequence[torch.Tensor]) -> KVCacheSpec:
        return cls("per_layer", tuple(tensors))

    @classmethod
    def layer_blocks(cls, tensors: Sequence[torch.Tensor]) -> KVCacheSpec:
        return cls("layer_blocks", tuple(tensors))

    @property
    def num_blocks(self) -> int:
        return int(self.tensors[0].shape[0]) if self.tensors else 0

    def layer_views(self, layout: KVLayout) -> list[torch.Tensor]:
        """Per layer, a ``(num_blocks, S)`` uint8 view of every block's slice of that layer
        (``S = page_bytes / num_layers``), sharing the caches' memory. Call :meth:`validate`
        first."""
        n, L = self.num_blocks, layout.num_layers
        if self.layout == "page_first":
            whole = self.tensors[0].view(n, -1).view(torch.uint8).view(n, L, -1)
            return [whole[:, lyr] for lyr in range(L)]
        if self.layout == "layer_blocks":  # rows keep the tensor's block stride
            return [t.flatten(1).view(torch.uint8) for t in self.tensors]
        return [t.view(n, -1).view(torch.uint8) for t in self.tensors]

    def validate(self, layout: KVLayout) -> None:
        """Raise InvalidArgument naming the offending tensor, shape, dtype or device unless
        every tensor matches ``layout``, all have the same number of blocks (>= 1), and all are
        contiguous tensors on one device (the CPU or one GPU)."""
        shape: tuple[int, ...] = layout.page_shape  # (L, 2, B, H, D)
        if self.layout == "page_first":
            if len(self.tensors) != 1:
                raise InvalidArgument(
                    f"a page_first KV cache is one tensor, got {len(self.tensors)}",
                    hint="use KVCacheSpec.per_layer for one tensor per layer",
                )
            want: tuple[int, ...] = shape
        elif self.layout in ("per_layer", "layer_blocks"):
            if len(self.tensors) != layout.num_layers:
                raise InvalidArgument(
                    f"a {self.layout} KV cache needs {layout.num_layers} tensors (one per layer), "
                    f"got {len(self.tensors)}",
                    hint="pass the model's per-layer caches in layer order",
                )
            if self.layout == "layer_blocks":
                self._validate_blocks(layout)
                return
            want = shape[1:]
        else:
            raise InvalidArgument(
                f"unknown KV cache layout {self.layout!r}",
                hint="use 'page_first', 'per_layer' or 'layer_blocks'",
            )
        nb: int | None = None
        for i, t in enumerate(self.tensors):
            what = f"KV cache tensor {i}"
            if not isinstance(t, torch.Tensor):
                raise InvalidArgument(f"{what} is a {type(t).__name__}, not a torch tensor")
            if t.device.type not in ("cpu", "cuda"):
                raise InvalidArgument(f"{what} is on {t.device}; the connector copies CPU or CUDA tensors")
            if t.device != self.tensors[0].device:
                raise InvalidArgument(
                    f"{what} is on {t.device}, tensor 0 on {self.tensors[0].device}",
                    hint="register the caches of one device per worker")
            if t.dtype != layout.torch_dtype:
                raise InvalidArgument(f"{what} has dtype {t.dtype}, the store's layout {layout.dtype}")
            if t.dim() != len(want) + 1 or tuple(t.shape[1:]) != want:
                raise InvalidArgument(
                    f"{what} has shape {tuple(t.shape)}, expected (num_blocks, "
                    f"{', '.join(map(str, want))}) for a {self.layout} cache of {layout}"
                )
            if not t.is_contiguous():
                raise InvalidArgument(f"{what} is not contiguous", hint="register contiguous caches")
            if nb is None:
                nb = int(t.shape[0])
            elif int(t.shape[0]) != nb:
                raise InvalidArgument(f"{what} has {t.shape[0]} blocks, tensor 0 has {nb}")
        if not nb:
            raise InvalidArgument("the KV cache has no blocks")

    def _validate_blocks(self, layout: KVLayout) -> None:
        block_elems = 2 * layout.block_size * layout.num_kv_heads * layout.head_dim
        nb: int | None = None
        for i, t in enumerate(self.tensors):
            what = f"KV cache tensor {i}"
            if not isinstance(t, torch.Tensor):
                raise InvalidArgument(f"{what} is a {type(t).__name__}, not a torch tensor")
            if t.device.type not in ("cpu", "cuda") or t.device != self.tensors[0].device:
                raise InvalidArgument(
                    f"{what} is on {t.device} (tensor 0 on {self.tensors[0].device}); the "
                    "connector copies the CPU or CUDA caches of one device")
            if t.dtype != layout.torch_dtype:
                raise InvalidArgument(f"{what} has dtype {t.dtype}, the store's layout {layout.dtype}")
            if t.dim() < 2 or t[0].numel() != block_elems:
                raise InvalidArgument(
                    f"{what} has shape {tuple(t.shape)}: a block (dimension 0) of "
                    f"{t[0].numel() if t.dim() >= 2 else 0} elements, expected {block_elems} "
                    f"(2 x {layout.block_size} tokens x {layout.num_kv_heads} heads x "
                    f"{layout.head_dim}) for {layout}")
            if t.shape[0] and not t[0].is_contiguous():
                raise InvalidArgument(
                    f"{what} (shape {tuple(t.shape)}, strides {t.stride()}) does not hold each "
                    "block contiguously", hint="register caches whose dimension 0 is the block")
            if t.shape[0] > 1 and t.stride(0) < block_elems:
                raise InvalidArgument(f"{what}'s blocks overlap (stride {t.stride(0)} < {block_elems})")
            if nb is None:
                nb = int(t.shape[0])
            elif int(t.shape[0]) != nb:
                raise InvalidArgument(f"{what} has {t.shape[0]} blocks, tensor 0 has {nb}")
        if not nb:
            raise InvalidArgument("the KV cache has no blocks")


@dataclass(frozen=True, slots=True)
class LoadMatch:
    """What the store can supply for a request: ``num_tokens`` (whole blocks) beyond the
    engine's computed prefix; ``load_async``: the load spans steps (pages come from a tier below
    the host tier) and the request waits until ``get_finished`` reports it in ``recving``.
    ``tiers``: where each matched block was found at lookup (its fastest tier), for the
    engine's per-tier reuse counts; empty when the connector does not say. ``num_tokens`` None:
    not known yet (a lookup of a remote tier is in flight) -- the engine leaves the request
    waiting and asks again on a later step, as vLLM does with ``None``."""

    num_tokens: int | None
    load_async: bool
    tiers: tuple[str, ...] = ()

    @property
    def pending(self) -> bool:
        return self.num_tokens is None


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """Load ``keys[i]`` into engine block ``block_ids[i]``. ``lease`` pins the pages since the
    lookup; the worker side releases it when the load ends. ``skip_first_layer``: layer 0 is
    not copied -- the engine writes its K/V itself, from the token ids (see
    :attr:`KVConnectorWorker.skips_first_layer`). ``in_host``: how many leading pages the
    lookup found in the host tier, which the lease keeps there -- the worker need not ask the
    tier again before it loads them (0: not known, it asks)."""

    request_id: str
    namespace_id: bytes
    block_ids: tuple[int, ...]
    keys: tuple[bytes, ...]
    lease: Lease | None
    load_async: bool
    skip_first_layer: bool = False
    in_host: int = 0


@dataclass(frozen=True, slots=True)
class SaveSpec:
    """Save engine block ``block_ids[i]`` (full, final K/V) as the page of ``metas[i]``."""

    request_id: str
    block_ids: tuple[int, ...]
    metas: tuple[BlockMeta, ...]


@dataclass(frozen=True, slots=True)
class ConnectorMetadata:
    """One step's plan, built by the scheduler side and bound on the worker side."""

    loads: tuple[LoadSpec, ...] = ()
    saves: tuple[SaveSpec, ...] = ()


@dataclass(frozen=True, slots=True)
class FinishedRequests:
    """``sending``: finished requests (``request_finished`` returned True) whose transfers are
    all done — their blocks may be freed now. ``recving``: requests whose asynchronous load
    ended (see ``get_block_ids_with_load_errors`` for blocks that failed)."""

    sending: frozenset[str] = frozenset()
    recving: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class ConnectorStats:
    """Worker-side totals. ``load_failures``: failed blocks by reason (``miss`` — absent or
    failed its check, ``lease_expired``, ``timeout`` — not in host when the prefetch timeout
    ran out, ``not_prefetched`` — below host under the ``best_effort`` prefetch policy,
    ``changed`` — deleted or replaced during the copy, ``error`` — an unexpected exception,
    ``unavailable`` — the store could not be asked: the daemon unreachable).
    ``save_failures``: blocks whose save failed, by reason (``reserve`` — reserving host slots
    raised, ``error`` — publishing them raised, ``unavailable``); a save short of room is not a
    failure, it is counted in ``saves_abandoned`` only."""

    blocks_loaded: int
    blocks_saved: int
    saves_abandoned: int
    load_failures: dict[str, int] = field(default_factory=dict)
    save_failures: dict[str, int] = field(default_factory=dict)


class KVConnectorScheduler(ABC):
    """Scheduler side. Not thread-safe: one scheduler loop drives it. Never waits for copies."""

    @property
    def keys_namespace_id(self) -> bytes | None:
        """The namespace (id) whose chain keys :meth:`get_num_new_matched_tokens` takes as
        ``block_keys``; None: it takes none."""
        return None

    @abstractmethod
    def get_num_new_matched_tokens(
        self, request_id: str, token_ids: Sequence[int], num_computed_tokens: int, *,
        block_keys: Sequence[bytes] | None = None,
    ) -> LoadMatch:
        """Tokens of ``token_ids`` past ``num_computed_tokens`` (the engine's own prefix hits,
        a multiple of ``block_size``) that can be loaded: whole blocks, never the last token
        (which must be computed to yield logits). Pins the pages (a lease) until the load ends
        or ``update_state_after_alloc`` / ``request_finished`` drops them; a second call for the
        same request replaces the first. Never blocks: when the answer needs a remote tier, it
        returns a pending match (``num_tokens`` None) and the engine asks again on a later step.
        ``block_keys``: the chain keys of ``token_ids``' full blocks under the connector's
        namespace (at least all but the last token's), when the caller hashed them already (an
        engine's prefix cache does: a 32K-token prompt's 2048 keys take ~1 ms to hash); the
        connector checks that the first and the last of them hash from the namespace and their
        tokens. Raises InvalidArgument for a bad argument."""

    @abstractmethod
    def update_state_after_alloc(
        self, request_id: str, block_ids: Sequence[int], num_external_tokens: int
    ) -> None:
        """The engine allocated ``block_ids`` (in order) for the first ``num_external_tokens``
        (a multiple of ``block_size``, at most what was matched) of the match; the load goes
        into the next :meth:`build_connector_meta`. ``num_external_tokens == 0`` drops the
        match. Raises InvalidArgument, changing nothing, for an unknown request, a wrong count
        or a block id out of range."""

    @abstractmethod
    def request_save(
        self, request_id: str, block_ids: Sequence[int], metas: Sequence[BlockMeta]
    ) -> None:
        """Save full blocks ``block_ids`` (final K/V written this step) as ``metas`` in the next
        :meth:`build_connector_meta`. Blocks the store already holds are skipped. Raises
        InvalidArgument, changing nothing, for mismatched lengths, a block id out of range or a
        meta whose key does not hash from its parent and tokens."""

    @abstractmethod
    def build_connector_meta(self) -> ConnectorMetadata:
        """This step's loads and saves; clears them from the scheduler side."""

    @abstractmethod
    def request_finished(self, request_id: str) -> bool:
        """The request ended (finished, aborted or preempted). Drops any match not yet loaded.
        Returns True when transfers of its blocks may be in flight: the engine must not free
        them until ``get_finished`` reports the request in ``sending``. Unknown ids: False."""

    @property
    def wants_saves(self) -> bool:
        """Whether the engine should hand computed full blocks to ``request_save``. False when
        the blocks reach the store another way (an engine pool under write-through)."""
        return True

    def close(self) -> None:
        """Drop pending matches and release what they hold. Idempotent. Default: nothing."""


class KVConnectorWorker(ABC):
    """Worker side. Its methods are called from one engine thread; its copies run on its own
    threads, which touch only the blocks named in the bound metadata."""

    #: Whether loads honour :attr:`LoadSpec.skip_first_layer` (never copy layer 0 of their
    #: blocks). An engine that writes the first layer's K/V of its loads itself asks for the
    #: skip only from a worker that honours it: a copy landing beside its own write would race.
    skips_first_layer: bool = False

    @abstractmethod
    def register_kv_caches(self, spec: KVCacheSpec) -> None:
        """Use ``spec``'s tensors as the engine's KV cache. Raises InvalidArgument (nothing
        registered) when they do not match the store's layout (see :meth:`KVCacheSpec.validate`)
        or when transfers are in flight."""

    @abstractmethod
    def bind_connector_metadata(self, meta: ConnectorMetadata) -> None:
        """This step's plan. Raises InvalidArgument, binding nothing, before registration, when
        a plan is already bound, or for a block id outside the registered caches."""

    @abstractmethod
    def clear_connector_metadata(self) -> None:
        """End of step. Saves whose layers were not all saved are abandoned (never stored)."""

    @abstractmethod
    def start_load_kv(self) -> None:
        """Start the bound plan's loads in the background; returns at once."""

    @abstractmethod
    def wait_for_layer_load(self, layer: int) -> None:
        """Block until layer ``layer`` of every synchronous load of this step is in place (or
        failed). Asynchronous loads are not waited for."""

    @abstractmethod
    def save_kv_layer(self, layer: int) -> None:
        """Layer ``layer`` of the bound saves' blocks is final: copy it out in the background.
        Once every layer is copied, the pages are stored. Raises InvalidArgument for a layer out
        of range or saved twice in one step."""

    @abstractmethod
    def wait_for_save(self) -> None:
        """Block until every layer copy out of the engine's blocks submitted so far is done
        (stores into the store continue in the background and do not delay the next step)."""

    @abstractmethod
    def wait_for_loads(self) -> None:
        """Block until every load started so far has ended — its pages copied and re-checked,
        or its failures recorded — so that :meth:`get_block_ids_with_load_errors` is complete."""

    @abstractmethod
    def get_finished(self, finished_req_ids: Sequence[str]) -> FinishedRequests:
        """``finished_req_ids``: requests that ended since the last call. Each request is
        reported once."""

    @abstractmethod
    def get_block_ids_with_load_errors(self) -> set[int]:
        """Engine blocks of loads ended since the last call that do not hold their page; for
        each request, its first failed block and every later one. Clears the set."""

    def settled_load_errors(self) -> set[int] | None:
        """The bound step's failed load blocks (as :meth:`get_block_ids_with_load_errors` will
        report them) when every load's outcome is settled before its copies land -- host loads
        whose pages were pinned and whose copies were queued in ``start_load_kv`` -- else None.
        The engine then commits the step's blocks while the copies run (their readers are
        ordered after them), instead of after them. Default: None (never settled early)."""
        return None

    def close(self) -> None:
        """Wait for every load and save in flight, then stop the side's threads. Idempotent.
        Default: nothing to stop."""


__all__ = [
    "CacheLayout",
    "ConnectorMetadata",
    "ConnectorStats",
    "FinishedRequests",
    "KVCacheSpec",
    "KVConnectorScheduler",
    "KVConnectorWorker",
    "LoadMatch",
    "LoadSpec",
    "SaveSpec",
]
