"""The admin REST API and dashboard over one :class:`~kvstore.store.TieredStore`.

``kvstore serve`` mounts it when ``admin.token`` is set. A library user with an in-process
store gets the same app::

    app = app_for(store, token="...")            # an ASGI app, to run under any server
    server = serve_admin(store, "127.0.0.1", 8470, token="...")   # or on uvicorn in a thread
    ...
    server.stop()

Layout (FastAPI's "bigger applications"): :mod:`.main` builds the app; :mod:`.routers` holds
one router per resource; :mod:`.guard` checks the token and caps the body before any body is
read; :mod:`.headers` puts the security headers on every response; :mod:`.deps` the settings
dependencies; :mod:`.schemas` the wire models; :mod:`.service` the domain operations over the
store; :mod:`.sampler` and :mod:`.events` the counters over time and the store's events;
``static/`` the dashboard.
"""

from __future__ import annotations

from fastapi import FastAPI

from kvstore.errors import ConfigError
from kvstore.store import TieredStore
from server.admin.deps import AdminSettings
from server.admin.guard import DEFAULT_MAX_BODY_BYTES
from server.admin.main import build_app
from server.admin.server import AdminServer
from server.admin.service import AdminService, NamespaceDefaults


def _settings(token: str, max_body_bytes: int) -> AdminSettings:
    if not isinstance(token, str) or not token:
        raise ConfigError("the admin API needs a token", hint="set admin.token (or "
                          "KVSTORE_ADMIN__TOKEN), e.g. `openssl rand -hex 32`")
    if type(max_body_bytes) is not int or max_body_bytes <= 0:  # noqa: E721 - no bool
        raise ConfigError(f"max_body_bytes must be a positive int, got {max_body_bytes!r}",
                          hint=f"leave it out for the default of {DEFAULT_MAX_BODY_BYTES}")
    return AdminSettings(token, max_body_bytes)


def app_for(store: TieredStore, token: str, *, namespace: NamespaceDefaults = NamespaceDefaults(),
            sample_interval_s: float = 2.0,
            max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    """The admin app over ``store`` (its sampler runs while the app's lifespan does). A
    request body over ``max_body_bytes`` is refused with 413, unread."""
    service = AdminService(store, namespace=namespace, sample_interval_s=sample_interval_s)
    return build_app(service, _settings(token, max_body_bytes), own_service=True)


def serve_admin(store: TieredStore, host: str, port: int, token: str, *,
                namespace: NamespaceDefaults = NamespaceDefaults(),
                sample_interval_s: float = 2.0,
                max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> AdminServer:
    """Run the admin app over ``store`` on uvicorn in a thread; returns once it listens (port
    0: a free port, see ``.port``). Stop it with ``.stop()``, before closing the store."""
    app = app_for(store, token, namespace=namespace, sample_interval_s=sample_interval_s,
                  max_body_bytes=max_body_bytes)
    return AdminServer(app, host, port).start()


__all__ = ["AdminServer", "AdminService", "NamespaceDefaults", "app_for", "serve_admin"]
