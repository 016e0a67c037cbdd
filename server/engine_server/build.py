"""The engine a ``kvstore engine serve`` runs: a random-weight preset (``tiny``/``small``,
byte tokenizer) through :meth:`Engine.from_config`, optionally over a host tier (then the
engine gets the in-process KV connector, as in ``runtime.demo``'s host run) or over a
``kvstore serve`` daemon (``daemon``: engines on one node share its tiers)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvstore import build_tier
from kvstore.errors import InvalidArgument
from kvstore.sizes import parse_size
from runtime.config import get_model_config
from runtime.engine import Engine
from runtime.tokenizer import ByteTokenizer, Tokenizer

#: presets this server runs (random weights, the byte tokenizer fits both vocabularies)
SERVE_MODELS = ("tiny", "small")


@dataclass(frozen=True, slots=True)
class Served:
    engine: Engine
    tokenizer: Tokenizer
    name: str


def build_served(model: str = "tiny", *, seed: int = 0, num_blocks: int = 256,
                 block_size: int = 16, host_cache: str | int | None = None,
                 device: str | None = None, capture_graphs_at_start: bool = True,
                 daemon: str | None = None, daemon_token: str | None = None,
                 prefix_cache: bool = True) -> Served:
    """Raises InvalidArgument for a model outside :data:`SERVE_MODELS`, a bad size, or both a
    host cache and a daemon (the daemon owns the tiers); DaemonUnavailable when the daemon
    cannot be reached."""
    if daemon is not None and host_cache is not None:
        raise InvalidArgument("give a host cache or a daemon, not both: the daemon owns the "
                              "tiers", hint="drop --host-cache when serving over --daemon")
    if model not in SERVE_MODELS:
        raise InvalidArgument(f"model {model!r} is not served: pick one of {SERVE_MODELS}",
                              hint="checkpoint directories are not served yet")
    cfg = get_model_config(model)
    tok = ByteTokenizer()
    tok.check_fits(cfg.vocab_size)
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    lower = []
    if host_cache is not None:
        layout = cfg.kv_layout(block_size)
        try:
            capacity = parse_size(host_cache)
        except ValueError as exc:
            raise InvalidArgument(f"host cache size {host_cache!r}: {exc}",
                                  hint="e.g. --host-cache 256MiB") from None
        if capacity < layout.page_bytes:
            raise InvalidArgument(f"host cache of {capacity} bytes holds no page of "
                                  f"{layout.page_bytes} bytes", hint="e.g. --host-cache 256MiB")
        lower.append(build_tier({"kind": "host", "capacity": capacity}, layout))
    engine = Engine.from_config(model, seed=seed, num_blocks=num_blocks, block_size=block_size,
                                device=dev, lower_tiers=lower, daemon=daemon,
                                daemon_token=daemon_token,
                                enable_prefix_caching=prefix_cache,
                                capture_graphs_at_start=capture_graphs_at_start)
    return Served(engine, tok, model)
