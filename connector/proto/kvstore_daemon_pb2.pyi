from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Layout(_message.Message):
    __slots__ = ("num_layers", "num_kv_heads", "head_dim", "block_size", "dtype", "page_bytes", "block_format")
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    PAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FORMAT_FIELD_NUMBER: _ClassVar[int]
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: str
    page_bytes: int
    block_format: str
    def __init__(self, num_layers: _Optional[int] = ..., num_kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., block_size: _Optional[int] = ..., dtype: _Optional[str] = ..., page_bytes: _Optional[int] = ..., block_format: _Optional[str] = ...) -> None: ...

class TierInfo(_message.Message):
    __slots__ = ("name", "kind", "capacity_pages")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_PAGES_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: str
    capacity_pages: int
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., capacity_pages: _Optional[int] = ...) -> None: ...

class Block(_message.Message):
    __slots__ = ("key", "parent", "token_ids")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    parent: bytes
    token_ids: bytes
    def __init__(self, key: _Optional[bytes] = ..., parent: _Optional[bytes] = ..., token_ids: _Optional[bytes] = ...) -> None: ...

class OpenSessionRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SessionInfo(_message.Message):
    __slots__ = ("session_id", "layout", "shm_bytes", "slab_pages", "staging_tier", "tiers", "write_policy", "lease_ttl_s", "lane_socket", "shm_socket", "staging_pages")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    SHM_BYTES_FIELD_NUMBER: _ClassVar[int]
    SLAB_PAGES_FIELD_NUMBER: _ClassVar[int]
    STAGING_TIER_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    WRITE_POLICY_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_S_FIELD_NUMBER: _ClassVar[int]
    LANE_SOCKET_FIELD_NUMBER: _ClassVar[int]
    SHM_SOCKET_FIELD_NUMBER: _ClassVar[int]
    STAGING_PAGES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    layout: Layout
    shm_bytes: int
    slab_pages: int
    staging_tier: str
    tiers: _containers.RepeatedCompositeFieldContainer[TierInfo]
    write_policy: str
    lease_ttl_s: float
    lane_socket: str
    shm_socket: str
    staging_pages: int
    def __init__(self, session_id: _Optional[str] = ..., layout: _Optional[_Union[Layout, _Mapping]] = ..., shm_bytes: _Optional[int] = ..., slab_pages: _Optional[int] = ..., staging_tier: _Optional[str] = ..., tiers: _Optional[_Iterable[_Union[TierInfo, _Mapping]]] = ..., write_policy: _Optional[str] = ..., lease_ttl_s: _Optional[float] = ..., lane_socket: _Optional[str] = ..., shm_socket: _Optional[str] = ..., staging_pages: _Optional[int] = ...) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ("session_id", "namespace_id", "lease", "local_only", "keys")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_ONLY_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    namespace_id: bytes
    lease: bool
    local_only: bool
    keys: bytes
    def __init__(self, session_id: _Optional[str] = ..., namespace_id: _Optional[bytes] = ..., lease: _Optional[bool] = ..., local_only: _Optional[bool] = ..., keys: _Optional[bytes] = ...) -> None: ...

class TierBandwidth(_message.Message):
    __slots__ = ("tier", "bytes_per_s")
    TIER_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    tier: str
    bytes_per_s: float
    def __init__(self, tier: _Optional[str] = ..., bytes_per_s: _Optional[float] = ...) -> None: ...

class TierRun(_message.Message):
    __slots__ = ("tier", "blocks")
    TIER_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    tier: str
    blocks: int
    def __init__(self, tier: _Optional[str] = ..., blocks: _Optional[int] = ...) -> None: ...

class Status(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class LookupReply(_message.Message):
    __slots__ = ("num_blocks", "runs", "lease_id", "lease_ttl_s", "bandwidth", "has_remote_tiers", "error", "lease_ticket")
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_S_FIELD_NUMBER: _ClassVar[int]
    BANDWIDTH_FIELD_NUMBER: _ClassVar[int]
    HAS_REMOTE_TIERS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LEASE_TICKET_FIELD_NUMBER: _ClassVar[int]
    num_blocks: int
    runs: _containers.RepeatedCompositeFieldContainer[TierRun]
    lease_id: int
    lease_ttl_s: float
    bandwidth: _containers.RepeatedCompositeFieldContainer[TierBandwidth]
    has_remote_tiers: bool
    error: Status
    lease_ticket: bytes
    def __init__(self, num_blocks: _Optional[int] = ..., runs: _Optional[_Iterable[_Union[TierRun, _Mapping]]] = ..., lease_id: _Optional[int] = ..., lease_ttl_s: _Optional[float] = ..., bandwidth: _Optional[_Iterable[_Union[TierBandwidth, _Mapping]]] = ..., has_remote_tiers: _Optional[bool] = ..., error: _Optional[_Union[Status, _Mapping]] = ..., lease_ticket: _Optional[bytes] = ...) -> None: ...

class LeaseRequest(_message.Message):
    __slots__ = ("session_id", "namespace_id", "lease_id", "keep", "lease_ticket")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    KEEP_FIELD_NUMBER: _ClassVar[int]
    LEASE_TICKET_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    namespace_id: bytes
    lease_id: int
    keep: int
    lease_ticket: bytes
    def __init__(self, session_id: _Optional[str] = ..., namespace_id: _Optional[bytes] = ..., lease_id: _Optional[int] = ..., keep: _Optional[int] = ..., lease_ticket: _Optional[bytes] = ...) -> None: ...

class LeaseReply(_message.Message):
    __slots__ = ("lease_id", "lease_ttl_s", "lease_ticket")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_S_FIELD_NUMBER: _ClassVar[int]
    LEASE_TICKET_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    lease_ttl_s: float
    lease_ticket: bytes
    def __init__(self, lease_id: _Optional[int] = ..., lease_ttl_s: _Optional[float] = ..., lease_ticket: _Optional[bytes] = ...) -> None: ...

class ContainsRequest(_message.Message):
    __slots__ = ("namespace_id", "tier", "keys")
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    tier: str
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, namespace_id: _Optional[bytes] = ..., tier: _Optional[str] = ..., keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ContainsReply(_message.Message):
    __slots__ = ("present", "leading")
    PRESENT_FIELD_NUMBER: _ClassVar[int]
    LEADING_FIELD_NUMBER: _ClassVar[int]
    present: _containers.RepeatedScalarFieldContainer[bool]
    leading: int
    def __init__(self, present: _Optional[_Iterable[bool]] = ..., leading: _Optional[int] = ...) -> None: ...

class PrepareLoadRequest(_message.Message):
    __slots__ = ("session_id", "namespace_id", "keys", "lease_id", "tier", "lease_ticket")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    LEASE_TICKET_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    namespace_id: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    lease_id: int
    tier: str
    lease_ticket: bytes
    def __init__(self, session_id: _Optional[str] = ..., namespace_id: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ..., lease_id: _Optional[int] = ..., tier: _Optional[str] = ..., lease_ticket: _Optional[bytes] = ...) -> None: ...

class PrepareLoadReply(_message.Message):
    __slots__ = ("handle_id", "slots")
    HANDLE_ID_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    handle_id: int
    slots: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, handle_id: _Optional[int] = ..., slots: _Optional[_Iterable[int]] = ...) -> None: ...

class PrepareStoreRequest(_message.Message):
    __slots__ = ("session_id", "namespace_id", "blocks", "tier")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    namespace_id: bytes
    blocks: _containers.RepeatedCompositeFieldContainer[Block]
    tier: str
    def __init__(self, session_id: _Optional[str] = ..., namespace_id: _Optional[bytes] = ..., blocks: _Optional[_Iterable[_Union[Block, _Mapping]]] = ..., tier: _Optional[str] = ...) -> None: ...

class PrepareStoreReply(_message.Message):
    __slots__ = ("handle_id", "block_index", "slots", "existing", "refused")
    HANDLE_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    EXISTING_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    handle_id: int
    block_index: _containers.RepeatedScalarFieldContainer[int]
    slots: _containers.RepeatedScalarFieldContainer[int]
    existing: int
    refused: int
    def __init__(self, handle_id: _Optional[int] = ..., block_index: _Optional[_Iterable[int]] = ..., slots: _Optional[_Iterable[int]] = ..., existing: _Optional[int] = ..., refused: _Optional[int] = ...) -> None: ...

class HandleRequest(_message.Message):
    __slots__ = ("session_id", "namespace_id", "handle_id", "ok", "segments")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    HANDLE_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    namespace_id: bytes
    handle_id: int
    ok: bool
    segments: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, session_id: _Optional[str] = ..., namespace_id: _Optional[bytes] = ..., handle_id: _Optional[int] = ..., ok: _Optional[bool] = ..., segments: _Optional[_Iterable[int]] = ...) -> None: ...

class CompleteLoadReply(_message.Message):
    __slots__ = ("num_blocks",)
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    num_blocks: int
    def __init__(self, num_blocks: _Optional[int] = ...) -> None: ...

class PutReply(_message.Message):
    __slots__ = ("stored", "existing", "refused")
    STORED_FIELD_NUMBER: _ClassVar[int]
    EXISTING_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    stored: int
    existing: int
    refused: int
    def __init__(self, stored: _Optional[int] = ..., existing: _Optional[int] = ..., refused: _Optional[int] = ...) -> None: ...

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PrefetchRequest(_message.Message):
    __slots__ = ("namespace_id", "keys", "to")
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    to: str
    def __init__(self, namespace_id: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ..., to: _Optional[str] = ...) -> None: ...

class PrefetchReply(_message.Message):
    __slots__ = ("leading",)
    LEADING_FIELD_NUMBER: _ClassVar[int]
    leading: int
    def __init__(self, leading: _Optional[int] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("namespace_id", "keys")
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, namespace_id: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class DeleteReply(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: int
    def __init__(self, deleted: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ("check_integrity",)
    CHECK_INTEGRITY_FIELD_NUMBER: _ClassVar[int]
    check_integrity: bool
    def __init__(self, check_integrity: _Optional[bool] = ...) -> None: ...

class TierStats(_message.Message):
    __slots__ = ("name", "kind", "capacity_pages", "used_pages", "hits", "misses", "writes", "evictions", "free_pages")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_PAGES_FIELD_NUMBER: _ClassVar[int]
    USED_PAGES_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    WRITES_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    FREE_PAGES_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: str
    capacity_pages: int
    used_pages: int
    hits: int
    misses: int
    writes: int
    evictions: int
    free_pages: int
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., capacity_pages: _Optional[int] = ..., used_pages: _Optional[int] = ..., hits: _Optional[int] = ..., misses: _Optional[int] = ..., writes: _Optional[int] = ..., evictions: _Optional[int] = ..., free_pages: _Optional[int] = ...) -> None: ...

class StatsReply(_message.Message):
    __slots__ = ("tiers", "lookup_hit_blocks", "lookup_miss_blocks", "active_leases", "sessions", "open_load_handles", "open_store_handles", "integrity_checked", "integrity_error")
    TIERS_FIELD_NUMBER: _ClassVar[int]
    LOOKUP_HIT_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    LOOKUP_MISS_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_LEASES_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    OPEN_LOAD_HANDLES_FIELD_NUMBER: _ClassVar[int]
    OPEN_STORE_HANDLES_FIELD_NUMBER: _ClassVar[int]
    INTEGRITY_CHECKED_FIELD_NUMBER: _ClassVar[int]
    INTEGRITY_ERROR_FIELD_NUMBER: _ClassVar[int]
    tiers: _containers.RepeatedCompositeFieldContainer[TierStats]
    lookup_hit_blocks: int
    lookup_miss_blocks: int
    active_leases: int
    sessions: int
    open_load_handles: int
    open_store_handles: int
    integrity_checked: bool
    integrity_error: str
    def __init__(self, tiers: _Optional[_Iterable[_Union[TierStats, _Mapping]]] = ..., lookup_hit_blocks: _Optional[int] = ..., lookup_miss_blocks: _Optional[int] = ..., active_leases: _Optional[int] = ..., sessions: _Optional[int] = ..., open_load_handles: _Optional[int] = ..., open_store_handles: _Optional[int] = ..., integrity_checked: _Optional[bool] = ..., integrity_error: _Optional[str] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("namespace_id",)
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    def __init__(self, namespace_id: _Optional[bytes] = ...) -> None: ...

class CacheEvent(_message.Message):
    __slots__ = ("kind", "tier", "keys", "dropped_before")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STORED: _ClassVar[CacheEvent.Kind]
        REMOVED: _ClassVar[CacheEvent.Kind]
    STORED: CacheEvent.Kind
    REMOVED: CacheEvent.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    kind: CacheEvent.Kind
    tier: str
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    dropped_before: int
    def __init__(self, kind: _Optional[_Union[CacheEvent.Kind, str]] = ..., tier: _Optional[str] = ..., keys: _Optional[_Iterable[bytes]] = ..., dropped_before: _Optional[int] = ...) -> None: ...

class ReadEventsRequest(_message.Message):
    __slots__ = ("namespace_id", "cursor", "epoch", "limit", "timeout_s")
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    cursor: int
    epoch: bytes
    limit: int
    timeout_s: float
    def __init__(self, namespace_id: _Optional[bytes] = ..., cursor: _Optional[int] = ..., epoch: _Optional[bytes] = ..., limit: _Optional[int] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class LogEvent(_message.Message):
    __slots__ = ("seq", "at", "kind", "tier", "keys", "reason", "to_tier", "all_namespaces", "token_ids")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TO_TIER_FIELD_NUMBER: _ClassVar[int]
    ALL_NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    at: float
    kind: str
    tier: str
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    reason: str
    to_tier: str
    all_namespaces: bool
    token_ids: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, seq: _Optional[int] = ..., at: _Optional[float] = ..., kind: _Optional[str] = ..., tier: _Optional[str] = ..., keys: _Optional[_Iterable[bytes]] = ..., reason: _Optional[str] = ..., to_tier: _Optional[str] = ..., all_namespaces: _Optional[bool] = ..., token_ids: _Optional[_Iterable[bytes]] = ...) -> None: ...

class EventBatchReply(_message.Message):
    __slots__ = ("events", "next_cursor", "gap", "closed", "epoch")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    GAP_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[LogEvent]
    next_cursor: int
    gap: bool
    closed: bool
    epoch: bytes
    def __init__(self, events: _Optional[_Iterable[_Union[LogEvent, _Mapping]]] = ..., next_cursor: _Optional[int] = ..., gap: _Optional[bool] = ..., closed: _Optional[bool] = ..., epoch: _Optional[bytes] = ...) -> None: ...

class EventSnapshotRequest(_message.Message):
    __slots__ = ("namespace_id",)
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    def __init__(self, namespace_id: _Optional[bytes] = ...) -> None: ...

class EventSnapshotReply(_message.Message):
    __slots__ = ("cursor", "events", "epoch")
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    cursor: int
    events: _containers.RepeatedCompositeFieldContainer[LogEvent]
    epoch: bytes
    def __init__(self, cursor: _Optional[int] = ..., events: _Optional[_Iterable[_Union[LogEvent, _Mapping]]] = ..., epoch: _Optional[bytes] = ...) -> None: ...

class PinRequest(_message.Message):
    __slots__ = ("namespace_id", "keys", "ttl_s")
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    ttl_s: float
    def __init__(self, namespace_id: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ..., ttl_s: _Optional[float] = ...) -> None: ...

class PinReply(_message.Message):
    __slots__ = ("pin_id", "expires_in_s")
    PIN_ID_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_S_FIELD_NUMBER: _ClassVar[int]
    pin_id: int
    expires_in_s: float
    def __init__(self, pin_id: _Optional[int] = ..., expires_in_s: _Optional[float] = ...) -> None: ...

class UnpinRequest(_message.Message):
    __slots__ = ("namespace_id", "pin_id")
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    PIN_ID_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    pin_id: int
    def __init__(self, namespace_id: _Optional[bytes] = ..., pin_id: _Optional[int] = ...) -> None: ...

class UnpinReply(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: bool
    def __init__(self, removed: _Optional[bool] = ...) -> None: ...

class SetBudgetRequest(_message.Message):
    __slots__ = ("namespace_id", "tier", "nbytes")
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    tier: str
    nbytes: int
    def __init__(self, namespace_id: _Optional[bytes] = ..., tier: _Optional[str] = ..., nbytes: _Optional[int] = ...) -> None: ...

class RetentionRequest(_message.Message):
    __slots__ = ("namespace_id",)
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    def __init__(self, namespace_id: _Optional[bytes] = ...) -> None: ...

class HeldPin(_message.Message):
    __slots__ = ("pin_id", "keys", "expires_in_s")
    PIN_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_S_FIELD_NUMBER: _ClassVar[int]
    pin_id: int
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    expires_in_s: float
    def __init__(self, pin_id: _Optional[int] = ..., keys: _Optional[_Iterable[bytes]] = ..., expires_in_s: _Optional[float] = ...) -> None: ...

class TierRetention(_message.Message):
    __slots__ = ("tier", "used_bytes", "pinned_bytes", "budget_bytes")
    TIER_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    PINNED_BYTES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    tier: str
    used_bytes: int
    pinned_bytes: int
    budget_bytes: int
    def __init__(self, tier: _Optional[str] = ..., used_bytes: _Optional[int] = ..., pinned_bytes: _Optional[int] = ..., budget_bytes: _Optional[int] = ...) -> None: ...

class RetentionReply(_message.Message):
    __slots__ = ("pins", "tiers")
    PINS_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    pins: _containers.RepeatedCompositeFieldContainer[HeldPin]
    tiers: _containers.RepeatedCompositeFieldContainer[TierRetention]
    def __init__(self, pins: _Optional[_Iterable[_Union[HeldPin, _Mapping]]] = ..., tiers: _Optional[_Iterable[_Union[TierRetention, _Mapping]]] = ...) -> None: ...

class ReadPagesRequest(_message.Message):
    __slots__ = ("namespace_id", "keys")
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, namespace_id: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class Page(_message.Message):
    __slots__ = ("index", "tier", "data", "seal")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SEAL_FIELD_NUMBER: _ClassVar[int]
    index: int
    tier: str
    data: bytes
    seal: bytes
    def __init__(self, index: _Optional[int] = ..., tier: _Optional[str] = ..., data: _Optional[bytes] = ..., seal: _Optional[bytes] = ...) -> None: ...

class WritePage(_message.Message):
    __slots__ = ("namespace_id", "block", "data", "seal")
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SEAL_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    block: Block
    data: bytes
    seal: bytes
    def __init__(self, namespace_id: _Optional[bytes] = ..., block: _Optional[_Union[Block, _Mapping]] = ..., data: _Optional[bytes] = ..., seal: _Optional[bytes] = ...) -> None: ...

class DeclinedRequest(_message.Message):
    __slots__ = ("namespace_id", "blocks")
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    blocks: int
    def __init__(self, namespace_id: _Optional[bytes] = ..., blocks: _Optional[int] = ...) -> None: ...

class FailedRequest(_message.Message):
    __slots__ = ("namespace_id", "what", "reason", "blocks")
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    WHAT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    what: str
    reason: str
    blocks: int
    def __init__(self, namespace_id: _Optional[bytes] = ..., what: _Optional[str] = ..., reason: _Optional[str] = ..., blocks: _Optional[int] = ...) -> None: ...

class LabelRequest(_message.Message):
    __slots__ = ("namespace_id", "label")
    NAMESPACE_ID_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    namespace_id: bytes
    label: bytes
    def __init__(self, namespace_id: _Optional[bytes] = ..., label: _Optional[bytes] = ...) -> None: ...
