"""Human labels of namespace ids, so stats and the admin API can say "meta-llama/Llama-3.1-8B ·
tenant team-a" where the store itself only knows a 16-byte id (keys do not carry their model or
tenant; see :mod:`kvstore.keys`).

A label is the model id and the tenant salt (:func:`label_of`). Neither is secret: the salt is
what the operator or gateway names a tenant by, and the deployment secret it is keyed with (see
:class:`~kvstore.keys.Namespace`) never enters a label. Whoever builds a
:class:`~kvstore.keys.Namespace` and uses it with a store registers its label once
(:meth:`TieredStore.label_namespace`; a connector's per-namespace scheduler does it when it is
created).

Bounds: a label is at most :data:`MAX_LABEL_BYTES` of UTF-8 text with no control characters
(:func:`check_label`: it is printed in terminals and HTML); at most ``max_namespaces`` ids are
labelled, the first ones registered, like the per-namespace counters
(:mod:`kvstore.namespace_stats`), so what clients register cannot grow the store's memory.

Thread-safe.
"""

from __future__ import annotations

import threading

from kvstore.errors import InvalidArgument
from kvstore.namespace_stats import MAX_NAMESPACES

#: the longest label, in UTF-8 bytes (a model id is rarely over 100)
MAX_LABEL_BYTES = 256
_TENANT = " · tenant "
_ELLIPSIS = "…"


def label_of(model_id: str, tenant_salt: str = "") -> str:
    """``model_id``, and `` · tenant <salt>`` when there is a salt; cut to
    :data:`MAX_LABEL_BYTES` (ending in "…") when longer. Control characters become spaces, so
    the result always passes :func:`check_label`."""
    text = model_id + (_TENANT + tenant_salt if tenant_salt else "")
    text = "".join(" " if _is_control(c) else c for c in text)
    if len(text.encode("utf-8", "replace")) <= MAX_LABEL_BYTES:
        return text.encode("utf-8", "replace").decode("utf-8")
    room = MAX_LABEL_BYTES - len(_ELLIPSIS.encode())
    cut = text.encode("utf-8", "replace")[:room].decode("utf-8", "ignore")
    return cut + _ELLIPSIS


def check_label(label: object) -> str:
    """``label`` as text: a str, or bytes of UTF-8 (what the daemon's wire carries); raises
    InvalidArgument for anything else, an empty label, one over :data:`MAX_LABEL_BYTES` or
    one with a control character."""
    if isinstance(label, bytes):
        try:
            label = label.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidArgument(f"a namespace label must be UTF-8 text, got {label[:64]!r}",
                                  hint="build it with kvstore.namespace_labels.label_of") from None
    if not isinstance(label, str):
        raise InvalidArgument(f"a namespace label must be a string, got {type(label).__name__}")
    try:
        size = len(label.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate
        raise InvalidArgument(f"a namespace label must be UTF-8 text, got {label[:64]!r}") from None
    if not label or size > MAX_LABEL_BYTES:
        raise InvalidArgument(
            f"a namespace label must be 1 to {MAX_LABEL_BYTES} bytes of UTF-8, got {size}",
            hint="build it with kvstore.namespace_labels.label_of, which cuts it to size")
    if any(_is_control(c) for c in label):
        raise InvalidArgument(f"a namespace label has a control character: {label[:64]!r}",
                              hint="build it with kvstore.namespace_labels.label_of")
    return label


def _is_control(c: str) -> bool:
    return c < " " or "\x7f" <= c <= "\x9f"


class NamespaceLabels:
    """Namespace id -> label, for at most ``max_namespaces`` ids (the first registered; a later
    one is not kept and :meth:`set` says so). A label registered again replaces the old one."""

    def __init__(self, max_namespaces: int = MAX_NAMESPACES) -> None:
        if not isinstance(max_namespaces, int) or max_namespaces < 0:
            raise InvalidArgument(f"max_namespaces must be an int >= 0, got {max_namespaces!r}")
        self.max_namespaces = max_namespaces
        self._lock = threading.Lock()
        self._labels: dict[bytes, str] = {}

    def set(self, namespace_id: bytes, label: str) -> bool:
        """Label ``namespace_id`` (both already checked); False when the cap left it unlabelled."""
        with self._lock:
            if namespace_id not in self._labels and len(self._labels) >= self.max_namespaces:
                return False
            self._labels[namespace_id] = label
            return True

    def get(self, namespace_id: bytes) -> str | None:
        with self._lock:
            return self._labels.get(namespace_id)

    def ids_of(self, label: str) -> list[bytes]:
        """The ids labelled ``label`` (more than one only for labels cut to size, or namespaces
        of another page layout or deployment secret)."""
        with self._lock:
            return [ns for ns, text in self._labels.items() if text == label]

    def snapshot(self) -> dict[bytes, str]:
        with self._lock:
            return dict(self._labels)

    def __len__(self) -> int:
        with self._lock:
            return len(self._labels)


__all__ = ["MAX_LABEL_BYTES", "NamespaceLabels", "check_label", "label_of"]
