"""Building an engine over a store: a random-weight model of a named config or a Hugging Face
checkpoint, an hbm pool in a :class:`~kvstore.store.TieredStore` over it and the lower tiers,
and the KV connector -- in process over the store's first host tier, or over a ``kvstore
serve`` daemon. :class:`~runtime.engine.Engine` exposes these as its ``from_config``,
``from_pretrained`` and ``_over_store`` class methods.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from connector.inprocess import InProcessScheduler, InProcessWorker
from kvstore import Tier
from kvstore.api import LocalStagingSlab
from kvstore.errors import InvalidArgument
from kvstore.keys import Namespace
from kvstore.metrics import Metrics
from kvstore.pool import HBMTier
from kvstore.store import TieredStore
from runtime.attention import DEFAULT_BACKEND
from runtime.config import get_model_config
from runtime.model import LlamaForPagedLM, StepGraphsMode
from runtime.tokenizer_hf import load_tokenizer
from runtime.weights import load_checkpoint_config

if TYPE_CHECKING:
    from runtime.engine import Engine


def from_config(
    cls: type[Engine],
    config_name: str = "tiny",
    *,
    seed: int = 0,
    num_blocks: int = 256,
    block_size: int = 16,
    device: str | torch.device = "cpu",
    lower_tiers: Sequence[Tier] = (),
    write_policy: str = "write_back",
    backend: str = DEFAULT_BACKEND,
    prefetch_policy: str = "timeout",
    prefetch_timeout_s: float = 5.0,
    layerwise: bool = True,
    daemon: str | None = None,
    daemon_token: str | None = None,
    step_graphs: StepGraphsMode = "auto",
    **engine_kwargs: Any,
) -> Engine:
    """A random-weight model of a named config (``tiny``, ``small``, ...), an hbm pool of
    ``num_blocks`` blocks in a :class:`TieredStore` over ``[hbm, *lower_tiers]`` (exposed as
    ``engine.store``), and the engine (``engine_kwargs`` as for ``__init__``). When a host
    tier is among ``lower_tiers`` (``kvstore.build_tier({"kind": "host", ...})``, pinned for
    a pool on a GPU), the engine gets an in-process KV connector over the store and its
    first host tier (prefixes evicted from hbm are loaded back instead of recomputed), with
    ``prefetch_policy`` and
    ``prefetch_timeout_s`` for pages below host (see :class:`InProcessWorker`).

    ``daemon``: the address of a ``kvstore serve`` (``unix:///path.sock`` or ``host:port``
    with ``daemon_token``) instead of ``lower_tiers``: the same connector runs over a
    :class:`~connector.daemon.DaemonStore` (exposed as ``engine.daemon``), whose host tier
    is shared memory. If the daemon goes down the engine recomputes, and reconnects when it
    is back. Raises DaemonUnavailable if it cannot be reached at start, InvalidArgument if
    its page layout is not this model's. ``step_graphs``: how the model runs small steps
    (:data:`runtime.model.StepGraphsMode`: CUDA graphs on a GPU by default)."""
    if daemon is not None and lower_tiers:
        raise InvalidArgument("pass either daemon or lower_tiers: the daemon owns the tiers")
    model = LlamaForPagedLM.from_random(get_model_config(config_name), seed,
                                        backend=backend, device=device,
                                        step_graphs=step_graphs)
    return cls._over_store(
        model, f"random/{config_name}/{seed}", device, num_blocks=num_blocks,
        block_size=block_size, lower_tiers=lower_tiers, write_policy=write_policy,
        prefetch_policy=prefetch_policy, prefetch_timeout_s=prefetch_timeout_s,
        layerwise=layerwise, daemon=daemon, daemon_token=daemon_token, **engine_kwargs)


def from_pretrained(
    cls: type[Engine],
    path: str | Path,
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    backend: str = DEFAULT_BACKEND,
    model_id: str | None = None,
    step_graphs: StepGraphsMode = "auto",
    **kwargs: Any,
) -> Engine:
    """The engine over a Hugging Face checkpoint directory: ``config.json`` and its
    ``*.safetensors`` weights (:func:`runtime.weights.load_checkpoint`; pickles are never
    loaded), in ``dtype`` (default: the checkpoint's) on ``device``.

    ``engine.tokenizer`` is the checkpoint's ``tokenizer.json`` read with the ``tokenizers``
    library (:class:`runtime.tokenizer_hf.HFTokenizer`), or None when there is none — then
    prompts and outputs are token ids only. The store's namespace is ``model_id``, by default
    ``"hf/<resolved directory>"``: engines sharing lower tiers reuse each other's pages only
    under the same id (and dtype). Every other keyword is as for :meth:`from_config`
    (``num_blocks``, ``block_size``, ``lower_tiers``, ``write_policy``, the prefetch and
    ``layerwise`` settings) or :meth:`__init__`. Raises :class:`~runtime.errors.CheckpointError`
    naming the file for a bad checkpoint or tokenizer, before any weight is read."""
    root = Path(path)
    config = load_checkpoint_config(root)
    tokenizer = load_tokenizer(root, config.vocab_size)
    model = LlamaForPagedLM.from_checkpoint(root, backend=backend, device=device, dtype=dtype,
                                            step_graphs=step_graphs)
    engine = cls._over_store(model, model_id or f"hf/{root.resolve()}", device, **kwargs)
    engine.tokenizer = tokenizer
    return engine


def over_store(
    cls: type[Engine],
    model: LlamaForPagedLM,
    model_id: str,
    device: str | torch.device,
    *,
    num_blocks: int = 256,
    block_size: int = 16,
    lower_tiers: Sequence[Tier] = (),
    write_policy: str = "write_back",
    prefetch_policy: str = "timeout",
    prefetch_timeout_s: float = 5.0,
    layerwise: bool = True,
    daemon: str | None = None,
    daemon_token: str | None = None,
    **engine_kwargs: Any,
) -> Engine:
    """``model`` over a new hbm pool on ``device`` in a TieredStore over
    ``[hbm, *lower_tiers]``, in namespace ``model_id``, with the connector when a lower tier
    is a host tier or ``daemon`` is given (the keywords as for :meth:`from_config`)."""
    layout = model.config.kv_layout(block_size)
    metrics = lower_tiers[0].metrics if lower_tiers else Metrics()
    pool = HBMTier.build("hbm", layout, num_blocks, metrics, device=device)
    # The pool evicts leaf-first ("lineage"): a hit touches a chain head to tail, so LRU would
    # evict heads first, and the blocks left behind them can only be recomputed (the hbm
    # prefix and the connector's match both stop at the first missing block).
    policies = ["lineage", *["lru"] * len(lower_tiers)]
    store = TieredStore(layout, [pool, *lower_tiers], policies,
                        write_policy=write_policy)  # type: ignore[arg-type]
    namespace = Namespace(model_id, layout)
    remote = None
    if daemon is not None and "connector" not in engine_kwargs:
        remote = _daemon_connector(daemon, daemon_token, namespace, num_blocks, device,
                                   prefetch_policy, prefetch_timeout_s, layerwise)
        engine_kwargs["connector"] = remote[1:]
    host = _staging_tier(store) if lower_tiers else None
    if host is not None and "connector" not in engine_kwargs:
        engine_kwargs["connector"] = (
            InProcessScheduler(store, namespace, num_blocks=num_blocks, host_tier=host.name),
            InProcessWorker(store, host_tier=host.name,
                            prefetch_policy=prefetch_policy,  # type: ignore[arg-type]
                            prefetch_timeout_s=prefetch_timeout_s, layerwise=layerwise),
        )
    engine = cls(model, pool, namespace, **engine_kwargs)
    engine.store = store
    engine.daemon = remote[0] if remote else None
    return engine


def _daemon_connector(target: str, token: str | None, namespace: Namespace, num_blocks: int,
                      device: str | torch.device, prefetch_policy: str,
                      prefetch_timeout_s: float, layerwise: bool) -> tuple[Any, Any, Any]:
    """A :class:`DaemonStore` at ``target`` and the in-process connector's two sides over it."""
    from connector.build import connect_daemon

    remote = connect_daemon(target, namespace.layout, token=token, namespace_id=namespace.id,
                            cuda=torch.device(device).type == "cuda")
    try:
        staging = remote.staging_tier().name
        return (remote,
                InProcessScheduler(remote, namespace, num_blocks=num_blocks, host_tier=staging),
                InProcessWorker(remote, host_tier=staging,
                                prefetch_policy=prefetch_policy,  # type: ignore[arg-type]
                                prefetch_timeout_s=prefetch_timeout_s, layerwise=layerwise))
    except BaseException:
        remote.close()
        raise


def _staging_tier(store: TieredStore) -> LocalStagingSlab | None:
    """The tier the store stages loads and saves through (its first host tier), None when it
    has none: then the engine runs without a connector."""
    try:
        return store.staging_tier()
    except InvalidArgument:
        return None
