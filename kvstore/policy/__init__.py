"""Eviction policies, chosen by name from a registry and imported only when selected.

``make_policy("lru", capacity)`` builds a registered policy; ``make_policy("pkg.mod:MyPolicy",
capacity)`` builds a user's own ``EvictionPolicy`` subclass from its import path. The contract
every policy implements is in :mod:`kvstore.policy.base`.
"""

from __future__ import annotations

import importlib

from kvstore.errors import UnknownComponent
from kvstore.policy.base import EvictionPolicy

#: Registry name -> ``module:Class``. Modules are imported on first use only.
POLICIES: dict[str, str] = {
    "lru": "kvstore.policy.lru:LRUPolicy",
    "fifo": "kvstore.policy.fifo:FIFOPolicy",
    "lfu": "kvstore.policy.lfu:LFUPolicy",
    "s3fifo": "kvstore.policy.s3fifo:S3FIFOPolicy",
    "arc": "kvstore.policy.arc:ARCPolicy",
    "lineage": "kvstore.policy.lineage:LineagePolicy",
    "lineage_arc": "kvstore.policy.lineage_arc:LineageARCPolicy",
}

__all__ = ["POLICIES", "EvictionPolicy", "available_policies", "make_policy"]


def available_policies() -> list[str]:
    """The registered policy names, sorted."""
    return sorted(POLICIES)


def make_policy(spec: str, capacity: int) -> EvictionPolicy:
    """Build the policy that ``spec`` names, for a tier of ``capacity`` pages.

    ``spec`` is a registry name (see :func:`available_policies`) or an import path
    ``"package.module:ClassName"`` of an :class:`EvictionPolicy` subclass.

    Raises :class:`~kvstore.errors.UnknownComponent` for an unknown name, a module or attribute
    that does not exist, or a class that is not an ``EvictionPolicy``; ``ValueError`` for
    ``capacity < 1``. A registered policy whose module fails to import raises that error as is:
    it is a broken install, not a configuration mistake.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise UnknownComponent(
            f"policy spec must be a non-empty string, got {spec!r}",
            hint=f"use one of {', '.join(available_policies())} or 'package.module:ClassName'",
        )
    spec = spec.strip()
    if ":" in spec:
        path = spec
    else:
        path = POLICIES.get(spec.lower(), "")
        if not path:
            raise UnknownComponent(
                f"unknown eviction policy {spec!r}; known policies: "
                f"{', '.join(available_policies())}",
                hint="set the policy to one of the known names, or to an import path "
                "'package.module:ClassName' of an EvictionPolicy subclass",
            )
    cls = _import_class(path)
    if not (isinstance(cls, type) and issubclass(cls, EvictionPolicy)):
        raise UnknownComponent(
            f"{path!r} resolves to {cls!r}, which is not an EvictionPolicy subclass",
            hint="point the policy at a class that subclasses kvstore.policy.EvictionPolicy",
        )
    return cls(capacity)


def _import_class(path: str) -> object:
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise UnknownComponent(
            f"malformed policy import path {path!r}",
            hint="write it as 'package.module:ClassName'",
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Only a missing module *named by the path* is a configuration mistake; a module that
        # exists but lacks one of its own dependencies fails loudly as itself.
        missing = exc.name or ""
        if not (module_name == missing or module_name.startswith(missing + ".")):
            raise
        raise UnknownComponent(
            f"cannot import module {module_name!r} of policy {path!r}",
            hint="check the module path and that its package is installed",
        ) from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise UnknownComponent(
            f"module {module_name!r} has no attribute {attr!r} (policy {path!r})",
            hint="check the class name after the ':'",
        ) from None
