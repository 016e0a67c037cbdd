"""Attention backends, chosen by name and imported only when selected.

``make_attention_backend("torch_ref")`` builds the pure-torch reference (runs anywhere);
``"sdpa"`` uses PyTorch's fused scaled-dot-product attention. The interface is
:class:`runtime.attention.base.AttentionBackend`.
"""

from __future__ import annotations

from kvstore.registry import Registry
from runtime.attention.base import AttentionBackend

#: Registry name -> ``module:Class``. Modules are imported on first use only.
BACKENDS: dict[str, str] = {
    "torch_ref": "runtime.attention.torch_ref:TorchRefBackend",
    "sdpa": "runtime.attention.sdpa:SDPABackend",
    "paged": "runtime.attention.paged:PagedBackend",
}

REGISTRY: Registry[AttentionBackend] = Registry("attention backend", "backends",
                                                AttentionBackend, BACKENDS)

__all__ = [
    "BACKENDS",
    "DEFAULT_BACKEND",
    "AttentionBackend",
    "available_backends",
    "make_attention_backend",
]


#: The default: fused kernels where torch has them (GPU flash / memory-efficient attention), and
#: on par with transformers' attention on CPU; ``torch_ref`` stays the reference in tests.
DEFAULT_BACKEND = "sdpa"


def available_backends() -> list[str]:
    """The registered backend names, sorted."""
    return sorted(BACKENDS)


def make_attention_backend(name: str) -> AttentionBackend:
    """Build the backend registered as ``name``.

    ``name``: a registered name or a ``package.module:Class`` path. Raises
    :class:`~kvstore.errors.UnknownComponent` listing the known names for an unknown one, and for
    a registered backend whose module fails to import (a broken install must stop the start).
    """
    backend: AttentionBackend = REGISTRY.resolve(name)()
    return backend
