"""kvstore: a tiered KV-cache store for LLM inference.

The public surface is what ``__all__`` lists; everything else is internal. ``kvstore`` never
imports ``connector``, ``runtime`` or ``server``.
"""

from kvstore.build import build_namespace, build_store, build_tier
from kvstore.config import KVStoreConfig, load_config
from kvstore.errors import (
    ConfigError,
    InvalidArgument,
    KVStoreError,
    LeaseError,
    RecordError,
    TierUnavailable,
    UnknownComponent,
)
from kvstore.keys import BlockChain, BlockMeta, Namespace, chain_keys, token_bytes
from kvstore.layout import FORMAT_VERSION, KVLayout
from kvstore.metrics import Metrics, TierStats
from kvstore.policy import EvictionPolicy, available_policies, make_policy
from kvstore.results import GetResult, Lease, LookupResult, PutResult, StoreStats
from kvstore.store import TieredStore
from kvstore.tiers import Tier

__version__ = "0.1.0"

__all__ = [
    "FORMAT_VERSION",
    "BlockChain",
    "BlockMeta",
    "ConfigError",
    "EvictionPolicy",
    "GetResult",
    "InvalidArgument",
    "KVLayout",
    "KVStoreConfig",
    "KVStoreError",
    "Lease",
    "LeaseError",
    "LookupResult",
    "Metrics",
    "Namespace",
    "PutResult",
    "RecordError",
    "StoreStats",
    "Tier",
    "TierStats",
    "TierUnavailable",
    "TieredStore",
    "UnknownComponent",
    "available_policies",
    "build_namespace",
    "build_store",
    "build_tier",
    "chain_keys",
    "load_config",
    "make_policy",
    "token_bytes",
]
