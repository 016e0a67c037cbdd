"""The daemon-client connector's store: :class:`DaemonStore` talks to ``kvstore serve`` (control
over gRPC, pages through the daemon's shared-memory host slab)."""

from connector.daemon.client import DaemonNamespace, DaemonStats, DaemonStore, RemoteTier
from connector.daemon.errors import DaemonUnavailable

__all__ = ["DaemonNamespace", "DaemonStats", "DaemonStore", "DaemonUnavailable", "RemoteTier"]
