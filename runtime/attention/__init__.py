"""Attention backends, chosen by name and imported only when selected.

``make_attention_backend("torch_ref")`` builds the pure-torch reference (runs anywhere);
``"sdpa"`` uses PyTorch's fused scaled-dot-product attention. The interface is
:class:`runtime.attention.base.AttentionBackend`.
"""

from __future__ import annotations

import importlib

from kvstore.errors import UnknownComponent
from runtime.attention.base import AttentionBackend

#: Registry name -> ``module:Class``. Modules are imported on first use only.
BACKENDS: dict[str, str] = {
    "torch_ref": "runtime.attention.torch_ref:TorchRefBackend",
    "sdpa": "runtime.attention.sdpa:SDPABackend",
}

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

    Raises :class:`~kvstore.errors.UnknownComponent` listing the known names for an unknown one.
    A registered backend whose module fails to import raises that error as is (a broken install
    must stop the start, not fall back silently).
    """
    path = BACKENDS.get(name) if isinstance(name, str) else None
    if path is None:
        raise UnknownComponent(
            f"unknown attention backend {name!r}; known backends: "
            f"{', '.join(available_backends())}",
            hint="set the attention backend to one of the known names",
        )
    module_name, _, attr = path.partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    backend: AttentionBackend = cls()
    return backend
