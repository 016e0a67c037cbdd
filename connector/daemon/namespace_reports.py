""":class:`NamespaceReports`: what a daemon client tells the daemon about its namespaces without
waiting for the reply -- their labels, and the blocks declined or failed under each -- so the
daemon's stats name them and count them whichever process did the work."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from connector.daemon.errors import DaemonUnavailable
from connector.proto import kvstore_daemon_pb2 as pb
from kvstore.errors import KVStoreError
from kvstore.namespace_stats import MAX_NAMESPACES


class NamespaceReports:
    """Reports sent by ``call`` (the session's) on ``pool`` (the client's threads); a report
    that did not reach the daemon is counted by ``failed(call name)``. Arguments are checked
    by the client before they get here. Thread-safe."""

    def __init__(self, call: Callable[[str, Any], Any], pool: ThreadPoolExecutor,
                 failed: Callable[[str], None]) -> None:
        self._call = call
        self._pool = pool
        self._failed = failed
        self._lock = threading.Lock()
        #: namespace id -> its label, told to the daemon once per session (again after a
        #: reconnect: a restarted daemon forgot them); as many as the daemon keeps
        self._labels: dict[bytes, str] = {}
        #: failures (namespace, what, reason) -> blocks not yet told to the daemon (it was
        #: unreachable), told when a session is open again; bounded like the daemon's rows
        self._untold: Counter[tuple[bytes, str, str]] = Counter()

    def retell(self) -> None:
        """A new session: the daemon may be a new process. Tell it every label again, and the
        failures it could not be told."""
        with self._lock:
            labels = list(self._labels.items())
        for ns, label in labels:
            self._tell_label(ns, label)
        with self._lock:
            untold, self._untold = self._untold, Counter()
        for (ns, what, reason), n in untold.items():
            self.tell_failed(ns, what, reason, n)

    def tell_declined(self, namespace_id: bytes, num_blocks: int) -> None:
        req = pb.DeclinedRequest(namespace_id=namespace_id, blocks=num_blocks)
        try:
            self._pool.submit(self._tell, "CountDeclined", req)
        except RuntimeError:  # closed meanwhile: counted here only
            self._failed("CountDeclined")

    def tell_failed(self, namespace_id: bytes, what: str, reason: str, num_blocks: int) -> None:
        req = pb.FailedRequest(namespace_id=namespace_id, what=what, reason=reason,
                               blocks=num_blocks)

        def tell() -> None:
            try:
                self._call("CountFailed", req)
            except DaemonUnavailable:  # kept for the next session (a reconnect tells it)
                self._failed("CountFailed")
                with self._lock:
                    key = (namespace_id, what, reason)
                    if key in self._untold or len(self._untold) < MAX_NAMESPACES:
                        self._untold[key] += num_blocks
            except KVStoreError:  # refused (an older daemon): counted here only
                self._failed("CountFailed")

        try:
            self._pool.submit(tell)
        except RuntimeError:  # closed meanwhile: counted here only
            self._failed("CountFailed")

    def label(self, namespace_id: bytes, label: str) -> None:
        """Told once per namespace per session (unless the label changes)."""
        with self._lock:
            if self._labels.get(namespace_id) == label:
                return
            if namespace_id in self._labels or len(self._labels) < MAX_NAMESPACES:
                self._labels[namespace_id] = label
        self._tell_label(namespace_id, label)

    def _tell_label(self, namespace_id: bytes, label: str) -> None:
        req = pb.LabelRequest(namespace_id=namespace_id, label=label.encode())
        try:
            self._pool.submit(self._tell, "LabelNamespace", req)
        except RuntimeError:  # closed meanwhile
            self._failed("LabelNamespace")

    def _tell(self, call: str, request: Any) -> None:
        """A call whose answer nobody waits for (on the client's pool); a failure is counted."""
        try:
            self._call(call, request)
        except KVStoreError:
            self._failed(call)
