"""The connector's two sides over any store of the one face (:class:`~kvstore.api.StoreAPI`): an
in-process :class:`~kvstore.store.TieredStore` or a client of the sidecar daemon. Every load and
save goes through the store's staging path (``prepare_load``/``complete_load``,
``prepare_store``/``complete_store``/``abort``) on its staging tier -- the tier with page slots
in one slab (the host tier, :meth:`~kvstore.api.StoreAPI.staging_tier`) -- so the tier's
policy, counters and leases see every hit and every save.

* :mod:`.scheduler` -- :class:`InProcessScheduler`: lookups, leases and the load-or-recompute
  decision, and the plan it hands the worker each step;
* :mod:`.worker` -- :class:`InProcessWorker`: the loads and saves of a bound plan, on its
  threads (the load and save paths, the prefetch policy, concurrency, CPU and GPU);
* :mod:`.jobs` -- the worker's record of one load and one save in flight;
* :mod:`.block_ids` -- the check of the engine's block ids both sides run.
"""

from connector.inprocess.scheduler import InProcessScheduler
from connector.inprocess.worker import PREFETCH_POLICIES, InProcessWorker, PrefetchPolicy

__all__ = ["PREFETCH_POLICIES", "InProcessScheduler", "InProcessWorker", "PrefetchPolicy"]
