"""The sidecar daemon (``kvstore serve``): :mod:`.service` holds sessions, tenancy and quotas
over one :class:`~kvstore.store.TieredStore`; :mod:`.servicer` translates gRPC <-> domain;
:mod:`.app` builds the store on a shared-memory slab, starts the listeners and handles signals."""
