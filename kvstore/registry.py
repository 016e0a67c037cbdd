"""One registry for every pluggable component (tiers, eviction policies, attention backends):
a name or a ``package.module:Class`` path resolves to a class, imported only when selected, with
the same errors everywhere (:class:`~kvstore.errors.UnknownComponent`, naming the known names).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Generic, TypeVar

from kvstore.errors import UnknownComponent

T = TypeVar("T")


class Registry(Generic[T]):
    """``what``: the component's name in messages ("eviction policy"); ``plural``: how the list
    of known names is introduced ("policies"); ``entries``: name -> ``module:Class``; ``base``:
    what a resolved class must subclass. Registered modules are imported on first use only; a
    registered one that fails to import stops the start, loudly."""

    # ``base`` is usually abstract (an ABC): typed as ``type`` so mypy accepts one
    def __init__(self, what: str, plural: str, base: type, entries: Mapping[str, str]) -> None:
        self.what, self.plural, self.base = what, plural, base
        self.entries = dict(entries)

    def names(self) -> list[str]:
        return sorted(self.entries)

    def resolve(self, spec: object) -> type[T]:
        """The class ``spec`` names: a registered name (case-insensitive) or an import path."""
        known = ", ".join(self.names())
        if not isinstance(spec, str) or not spec.strip():
            raise UnknownComponent(
                f"{self.what} spec must be a non-empty string, got {spec!r}",
                hint=f"use one of {known} or 'package.module:ClassName'",
            )
        spec = spec.strip()
        if ":" in spec:
            cls = self._import(spec, registered=False)
        else:
            path = self.entries.get(spec.lower(), "")
            if not path:
                raise UnknownComponent(
                    f"unknown {self.what} {spec!r}; known {self.plural}: {known}",
                    hint="set it to one of the known names, or to an import path "
                    f"'package.module:ClassName' of a subclass of {self.base.__name__}",
                )
            cls = self._import(path, registered=True)
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            name = self.base.__name__
            article = "an" if name[0] in "AEIOU" else "a"
            raise UnknownComponent(
                f"{spec!r} resolves to {cls!r}, which is not {article} {name} subclass",
                hint=f"point it at a class that subclasses {self.base.__module__}."
                f"{self.base.__name__}",
            )
        return cls  # type: ignore[return-value]

    def _import(self, path: str, *, registered: bool) -> object:
        module_name, _, attr = path.partition(":")
        if not module_name or not attr:
            raise UnknownComponent(
                f"malformed {self.what} import path {path!r}",
                hint="write it as 'package.module:ClassName'",
            )
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            missing = getattr(exc, "name", None) or ""
            if registered:  # a broken install: a configured piece that cannot load stops the start
                raise UnknownComponent(
                    f"{self.what} {path!r} failed to import: {exc}",
                    hint="install the dependencies of that component",
                ) from exc
            # Only a missing module *named by the path* is a configuration mistake; a module
            # that exists but lacks one of its own dependencies fails loudly as itself.
            if not (module_name == missing or module_name.startswith(missing + ".")):
                raise
            raise UnknownComponent(
                f"cannot import module {module_name!r} of {self.what} {path!r}",
                hint="check the module path and that its package is installed",
            ) from exc
        try:
            return getattr(module, attr)
        except AttributeError:
            raise UnknownComponent(
                f"module {module_name!r} has no attribute {attr!r} ({self.what} {path!r})",
                hint="check the class name after the ':'",
            ) from None


__all__ = ["Registry"]
