"""The admin API's wire types: pydantic request and response models (the OpenAPI schema is
built from them). No logic here; :mod:`.service` fills them."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AliasChoices, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

from kvstore.namespace_labels import MAX_LABEL_BYTES
from kvstore.policy import POLICIES
from kvstore.retention import MAX_TTL_S
from kvstore.sizes import parse_size

HexKey = Annotated[str, Field(pattern=r"^[0-9a-fA-F]{32}$", description="16 bytes as 32 hex digits")]
#: at most this many blocks (or 64 times as many tokens) in one lookup
MAX_LOOKUP_BLOCKS = 1 << 16
PolicyName = Literal[tuple(sorted(POLICIES))]  # type: ignore[valid-type]


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True)


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NamespaceRef(_Out):
    """A namespace to pick: its id, its label and the pages it holds."""

    namespace_id: HexKey
    label: str | None = Field(description="the model id and tenant its users registered; null: "
                                          "none did")
    pages: int = Field(description="page copies it holds, summed over the local tiers (shared "
                                   "tiers: not scanned)")


class ErrorOut(_Out):
    detail: str = Field(description="what was wrong")
    hint: str = Field("", description="what to change")
    namespaces: list[NamespaceRef] | None = Field(
        None, description="a lookup by an unknown namespace_label (404): the namespaces there "
                          "are, with pages or a label, most pages first (at most 20)")


class Health(_Out):
    status: Literal["ok"] = "ok"


class Breaker(_Out):
    server: str
    state: Literal["closed", "open", "half_open"]
    trips: int
    failures: int


class TierReadiness(_Out):
    name: str
    kind: str
    ready: bool
    detail: str = Field(description="why it is not ready; empty when it is")
    breakers: list[Breaker] = Field(description="the Redis circuit breaker per server (Redis only)")


class Readiness(_Out):
    ready: bool
    tiers: list[TierReadiness] | None = Field(
        None, description="each tier's state; only to a client that sent the token (absent "
                          "otherwise)")


class Misses(_Out):
    """Pages a read did not return, by reason."""

    absent: int = Field(description="no such page (never stored, evicted, or gone from a shared tier)")
    corrupt: int = Field(description="records that failed verification: dropped, served as misses")
    timeout: int = Field(description="read calls that failed whole (timeout, server unreachable, "
                                     "breaker open): calls, not pages")
    expired: int | None = Field(description=(
        "pages this node stored whose TTL (Redis ttl_s) had run out when a read or a lookup "
        "found them gone, each counted once; the ones a read found are not in absent. Gone "
        "before the TTL (maxmemory eviction, another node's delete) is absent. Null: the tier "
        "has no TTL"))


class Latency(_Out):
    p50_s: float | None = Field(description="median batch latency since start (bucket estimate)")
    p99_s: float | None
    count: int


class TierStatsOut(_Out):
    name: str
    kind: str
    policy: str = Field(description="the eviction policy in force")
    capacity_pages: int
    used_pages: int
    page_bytes: int
    capacity_bytes: int
    used_bytes: int
    hits: int
    misses: Misses
    hit_rate_1m: float | None = Field(description=(
        "read hits / pages read over the last minute (loads, gets: not lookups, "
        "which only ask for presence); null: no reads"))
    hit_rate_15m: float | None
    bytes_in: int = Field(description="payload bytes written into the tier")
    bytes_out: int = Field(description="payload bytes read out of the tier")
    writes: int
    writes_refused: int
    deletes: int
    evictions: int
    errors: int
    latency: dict[str, Latency] = Field(description="per operation: read, write, contains, delete")


class NamespaceMisses(_Out):
    """A namespace's misses by reason, from the calls that name the namespace (lookups and
    loads of connectors and the daemon, reads; not the admin API's where-is lookups)."""

    absent: int = Field(description="blocks lookups asked for past the leading run they found")
    corrupt: int = Field(description="records of the namespace that reads dropped: failed "
                                     "verification")
    expired: int = Field(description="pages found gone after their TTL ran out (Redis ttl_s)")
    timeout: int = Field(description="pages asked of a tier call that failed whole (timeout, "
                                     "server unreachable, breaker open)")
    declined: int = Field(description="matched blocks an in-process connector recomputed "
                                      "instead of loading (load-or-recompute)")


class NamespaceTraffic(_Out):
    lookup_hit_blocks: int = Field(description="blocks of the leading runs lookups found")
    lookup_miss_blocks: int
    hit_rate_1m: float | None = Field(description="lookup hit blocks / blocks looked up over the "
                                                  "last minute; null: no lookups")
    hit_rate_15m: float | None
    loaded_pages: int = Field(description="pages loads pinned and reads returned")
    load_missed_pages: int = Field(description="pages loads and reads asked for and missed")
    misses: NamespaceMisses
    load_failed_blocks: dict[str, int] = Field(description=(
        "reason -> blocks connectors failed to load and recomputed (error: the daemon gone "
        "mid-load, say), as they told the daemon; every reason, zeros too"))
    save_failed_blocks: dict[str, int] = Field(description=(
        "reason -> blocks connectors failed to save (a later miss), as they told the daemon"))


class OtherNamespaces(NamespaceTraffic):
    """The traffic of namespaces past the store's cap on tracked namespaces, summed."""

    calls: int = Field(description="calls counted here")


class NamespaceStats(NamespaceTraffic):
    namespace_id: HexKey
    label: str | None = Field(description=(
        "who the namespace is: the model id and tenant (\"model · tenant t\") its users "
        "registered (a connector's scheduler does), else the configured namespace's; null: "
        "unknown"))
    pages: dict[str, int] = Field(description="pages held per local tier (shared tiers: not scanned)")
    bytes: int
    stored_pages: int = Field(description="pages stored into any tier since the admin API started")
    removed_pages: int = Field(description="pages removed from local tiers since then")
    pins: int = Field(0, description="its live retention pins")
    pinned_bytes: dict[str, int] = Field(
        default_factory=dict, description="bytes its pins keep, per tier holding any")
    budget_bytes: dict[str, int] = Field(
        default_factory=dict, description="its byte budget, per tier that has one (use: bytes "
                                          "of pages there, in GET /v1/namespaces/{id}/retention)")


class StoreStatsOut(_Out):
    """Store-wide traffic: every namespace's counters summed (the rows of ``namespaces``, those
    past the top 20, and ``other_namespaces``), so it agrees with them. Calls that name no
    namespace -- the admin API's where-is lookups -- are not traffic and not counted here (the
    Prometheus ``kvstore_lookup_blocks_total`` counts them)."""

    lookup_hit_blocks: int = Field(description="blocks of the leading runs clients' lookups found")
    lookup_miss_blocks: int = Field(description="blocks clients' lookups asked for past that run")
    lookup_hit_rate_1m: float | None
    lookup_hit_rate_15m: float | None
    loaded_pages: int = Field(description="pages loads pinned (prepare_load) and reads returned: "
                                          "what the daemon served, whichever process asked")
    load_missed_pages: int = Field(description="pages loads and reads asked for and missed")
    declined_blocks: int = Field(description="matched blocks a connector recomputed instead of "
                                             "loading (load-or-recompute), as clients told it")
    load_failed_blocks: dict[str, int] = Field(description=(
        "reason -> blocks connectors failed to load and recomputed, as clients told it"))
    save_failed_blocks: dict[str, int] = Field(description=(
        "reason -> blocks connectors failed to save, as clients told it"))
    active_leases: int
    copies_pages: dict[str, int] = Field(description="'reason->tier': pages copied into a tier")


class Removal(_Out):
    at: float = Field(description="unix time")
    tier: str
    pages: int
    namespace_ids: list[HexKey] = Field(description="namespaces of the removed pages, where known")


class StatsOut(_Out):
    at: float = Field(description="unix time of the snapshot")
    tiers: list[TierStatsOut]
    store: StoreStatsOut
    namespaces: list[NamespaceStats] = Field(
        description="namespaces holding pages or with traffic: by bytes held, largest first, "
                    "then by blocks looked up (at most 20)")
    other_namespaces: OtherNamespaces = Field(
        description="traffic of the namespaces the store does not track one by one (past its "
                    "cap of 1024)")
    recent_removals: list[Removal] = Field(description="evictions and deletes, newest first")


class TierPoint(_Out):
    hit_rate: float | None = Field(description="hits / reads during this interval; null: none")
    hits: float = Field(description="pages read from this tier during this interval")
    misses: float = Field(description="pages this tier missed during this interval")
    used_pages: int
    bytes_in_per_s: float
    bytes_out_per_s: float
    evictions_per_s: float


class HistoryPoint(_Out):
    at: float = Field(description="unix time at the interval's end")
    tiers: dict[str, TierPoint]
    copies_bytes_per_s: dict[str, float] = Field(description="'reason->tier': bytes/s copied into a tier")
    lookup_hit_blocks: float = Field(description="blocks lookups found during this interval "
                                                 "(every namespace's, summed)")
    lookup_miss_blocks: float
    lookup_hit_rate: float | None = Field(description="during this interval; null: no lookups")


class HistoryWindow(_Out):
    """The whole window's totals: defined while the store is idle if the window saw traffic."""

    start: float = Field(description="unix time of the window's oldest sample")
    end: float = Field(description="unix time of the newest sample (taken for this response)")
    lookup_hit_blocks: float
    lookup_miss_blocks: float
    lookup_hit_rate: float | None = Field(description="blocks found / blocks looked up over the "
                                                      "window; null: no lookups in it")
    tier_hit_rate: dict[str, float | None] = Field(
        description="per tier: page hits / page reads over the window; null: no reads")


class HistoryOut(_Out):
    interval_s: float
    window_s: float = Field(description="the window asked for")
    window: HistoryWindow
    points: list[HistoryPoint] = Field(description="oldest first, the last window_s seconds")


class NamespaceIn(_In):
    model_id: str | None = Field(None, min_length=1, max_length=1024,
                                 description="default: the configured model_id")
    tenant_salt: str | None = Field(None, max_length=1024,
                                    description="default: the configured tenant_salt")


class LookupIn(_In):
    """Exactly one of ``token_ids`` (the prompt) and ``block_keys``, and at most one of
    ``namespace``, ``namespace_id`` and ``namespace_label``. With token ids the keys are
    computed in ``namespace`` (default: the configured one) or in the namespace labelled
    ``namespace_label``; with block keys, any of the three names whose pages count."""

    token_ids: list[Annotated[int, Field(ge=0, le=2**31 - 1)]] | None = Field(
        None, max_length=MAX_LOOKUP_BLOCKS * 64)
    block_keys: list[HexKey] | None = Field(None, max_length=MAX_LOOKUP_BLOCKS)
    namespace: NamespaceIn | None = None
    namespace_id: HexKey | None = None
    namespace_label: str | None = Field(
        None, min_length=1, max_length=MAX_LABEL_BYTES,
        description="a label of the stats' namespaces (e.g. \"some/model · tenant t1\"): "
                    "the namespace its users registered; unknown: 404 listing the namespaces")


class BlockWhere(_Out):
    index: int
    key: HexKey
    tier: str | None = Field(description="the fastest tier that holds the page; null: none does")
    loadable: bool = Field(description="part of the leading run a connector load gets")
    reason: Literal["loadable", "absent", "after_miss"] = Field(
        description="absent: no tier holds it under this namespace; after_miss: held, but an "
                    "earlier block is absent, so a prefix load stops before it")


class LookupOut(_Out):
    namespace_id: HexKey
    num_blocks: int
    num_leading: int = Field(description="blocks a connector load of this prefix finds")
    blocks: list[BlockWhere]
    namespaces: list[NamespaceRef] | None = Field(
        None, description="when the namespace asked for holds no pages (none of these blocks, "
                          "none in the local tiers): the namespaces there are, to pick from "
                          "(most pages first, at most 20); null otherwise")


class TierFlush(_Out):
    tier: str
    scanned: int
    matched: int
    deleted: int
    done: bool


class FlushOut(_Out):
    id: int
    namespace_id: HexKey
    state: Literal["running", "done", "failed"]
    error: str = ""
    tiers: list[TierFlush]
    deleted: int = Field(description="tier copies deleted, all tiers")


class PolicyIn(_In):
    policy: PolicyName = Field(description="a registered eviction policy (no import paths here)")


class PolicyOut(_Out):
    tier: str
    policy: str
    tracked_pages: int


#: a byte size in a request: bytes, or a string with a binary unit as the config takes it
SizeIn = Annotated[int, BeforeValidator(parse_size), Field(le=1 << 62), WithJsonSchema({
    "anyOf": [{"type": "integer", "minimum": 0, "maximum": 1 << 62},
              {"type": "string",
               "pattern": r"^\s*[0-9]+(\.[0-9]+)?\s*([bB]|[kKmMgGtTpP][iI][bB])?\s*$"}],
    "description": "bytes (an integer), or a size with a binary unit as the config takes it: "
                   "\"4GiB\", \"512MiB\" (no SI units such as \"4GB\")"})]


class PinIn(_In):
    """What to pin: exactly one of ``keys`` (block keys) and ``tokens`` (a prompt's token
    ids, chained into keys from the path's namespace id, whole blocks only; the names of
    /v1/lookup, ``block_keys`` and ``token_ids``, are taken too). ``namespace`` or
    ``namespace_label``, when given, must name the path's namespace (a check against pinning
    a prompt under the wrong one)."""

    keys: list[HexKey] | None = Field(None, min_length=1, max_length=MAX_LOOKUP_BLOCKS,
                                      validation_alias=AliasChoices("keys", "block_keys"))
    tokens: list[Annotated[int, Field(ge=0, le=2**31 - 1)]] | None = Field(
        None, min_length=1, max_length=MAX_LOOKUP_BLOCKS * 64,
        validation_alias=AliasChoices("tokens", "token_ids"))
    namespace: NamespaceIn | None = None
    namespace_label: str | None = Field(None, min_length=1, max_length=MAX_LABEL_BYTES)
    ttl_s: float = Field(gt=0, le=MAX_TTL_S, description=(
        f"seconds the pin lasts, at most {MAX_TTL_S:.0f} (30 days)"))


class PinOut(_Out):
    pin_id: int = Field(description="what DELETE .../pins/{pin_id} removes")
    pages: int = Field(description="distinct pages (block keys) the pin holds")
    expires_in_s: float = Field(description="seconds until it lapses")


class UnpinOut(_Out):
    removed: bool = Field(description="false: no such pin of this namespace (it lapsed, was "
                                      "removed already, or never was)")


class BudgetIn(_In):
    bytes: SizeIn = Field(description="the most the namespace may hold in the tier (whole "
                                      "pages: rounded down)")


class TierRetentionOut(_Out):
    tier: str
    used_bytes: int = Field(description="bytes of the namespace's pages in the tier")
    pinned_bytes: int = Field(description="of those, bytes its live pins hold")
    budget_bytes: int | None = Field(description="its budget there (whole pages); null: none")


class RetentionOut(_Out):
    namespace_id: HexKey
    pins: list[PinOut] = Field(description="live pins, oldest first")
    tiers: list[TierRetentionOut]


ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": ErrorOut, "description": what}
    for code, what in ((400, "bad input"), (401, "missing or wrong token"),
                       (404, "no such resource"),
                       (413, "the request body is over the limit (max_body_bytes)"),
                       (503, "the store cannot serve"))
}
