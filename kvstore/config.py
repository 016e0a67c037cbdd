"""The one typed configuration: a TOML or YAML file, overridden by ``KVSTORE_*`` variables.

Environment overrides use ``__`` for nesting and JSON for lists, e.g.::

    KVSTORE_MODEL_ID=meta-llama/Llama-3.1-8B
    KVSTORE_LAYOUT__BLOCK_SIZE=32
    KVSTORE_STORE__WRITE_POLICY=write_through
    KVSTORE_CONNECTOR__PREFETCH_POLICY=wait_complete
    KVSTORE_TIERS='[{"kind": "host", "capacity": "8GiB", "policy": "s3fifo"}]'

Environment beats file beats defaults. Any bad value raises :class:`ConfigError` whose message
names the field, the value given and what is allowed — except secrets, whose values are never
shown (nor the values of unknown fields, which may be misspelt secrets), and credentials inside a
value (a URL's password), which are masked. Only this module reads the environment (and the secret file).
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    ByteSize,
    Field,
    FilePath,
    PositiveFloat,
    PositiveInt,
    SecretStr,
    ValidationError,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from kvstore.cleaner import DEFAULT_RESERVE
from kvstore.event_log import DEFAULT_EVENT_LOG_EVENTS
from kvstore.mover import DEFAULT_SWITCH_INTERVAL_MS
from kvstore.retention import DEFAULT_MAX_PINNED_FRACTION
from kvstore.errors import ConfigError
from kvstore.layout import DTYPE_SIZES, KVLayout
from kvstore.record import usable_cores
from kvstore.sizes import Size, format_size
from kvstore.tiers import tier_config_models
from kvstore.tiers.config_base import Strict, TierConfigBase
# the tier models are re-exported: a config is written against this module alone
from kvstore.tiers.disk_config import DiskTierConfig as DiskTierConfig
from kvstore.tiers.hbm_config import HBMTierConfig as HBMTierConfig
from kvstore.tiers.host_config import HostTierConfig
from kvstore.tiers.redis_config import RedisTierConfig as RedisTierConfig

DType = Literal["float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int8", "uint8"]
assert set(DType.__args__) == set(DTYPE_SIZES)  # type: ignore[attr-defined]




class LayoutConfig(Strict):
    """The model's KV shape. Defaults are Llama-3-8B's (32 layers, 8 KV heads of 128, bf16).
    A page is one block of every layer's K and V: ``2 * num_layers * num_kv_heads * head_dim *
    block_size`` elements of ``dtype`` (2 MiB with the defaults). The layout is part of every
    key: stores of two layouts never share pages."""

    num_layers: PositiveInt = Field(32, description="transformer layers, each a slice of a page")
    num_kv_heads: PositiveInt = Field(
        8, description="KV heads per layer (with tensor parallelism: one rank's)")
    head_dim: PositiveInt = Field(128, description="elements per head")
    block_size: int = Field(16, ge=1, le=65535, description=(
        "tokens per block, i.e. per page and per key; a trailing partial block gets no key"))
    dtype: DType = Field("bfloat16", description="element type of the cached K and V")
    block_format: str = Field(
        "", pattern=r"^(?:[A-Za-z0-9][A-Za-z0-9._-]{0,63})?$",
        description="an engine's block layout the pages hold (e.g. 'vllm-cpu'); '' is kvstore's")

    def build(self) -> KVLayout:
        return KVLayout(self.num_layers, self.num_kv_heads, self.head_dim, self.block_size,
                        self.dtype, self.block_format)


# Each tier kind's config model lives beside the tier (kvstore/tiers/<kind>_config.py); the
# union of the tier list is built from the tier registry's configs.
if TYPE_CHECKING:
    TierConfig = TierConfigBase
else:
    TierConfig = Annotated[Union[tuple(tier_config_models())], Field(discriminator="kind")]


def _default_tier() -> TierConfig:
    return HostTierConfig()


class StoreConfig(Strict):
    """How pages move between the tiers (``kvstore.store.TieredStore``). A page already present
    in the destination tier is never written again."""

    write_policy: Literal["write_through", "write_back", "selective"] = Field(
        "write_back", description=(
            "when a page is copied to the next tier down: write_through (as soon as it is written, "
            "into every tier below), write_back (when it is evicted), selective (in the "
            "background, once it has been hit selective_hits times in a tier)"))
    selective_hits: PositiveInt = Field(
        2, description="hits in a tier after which selective copies a page down")
    promote_on_hit: bool = Field(True, description=(
        "copy a page read from a lower tier into the fastest tier, in the background"))
    lease_ttl_s: PositiveFloat = Field(30.0, description=(
        "longest a lookup's lease pins its pages against eviction (a load must follow within it)"))
    prefetch_workers: int = Field(2, ge=1, le=64, description=(
        "threads that run prefetch() and lookup_async()"))
    free_reserve: float = Field(DEFAULT_RESERVE, ge=0.0, le=0.5, description=(
        "share of each local tier's capacity kept free once the tier is full: a background "
        "cleaner evicts (writing back) ahead of need, so a save or an engine's block "
        "allocation finds room without evicting on its own thread; 0 turns it off"))
    switch_interval_ms: float = Field(DEFAULT_SWITCH_INTERVAL_MS, ge=0.0, le=5.0, description=(
        "once the store's background threads run, the Python interpreter's thread switch "
        "interval is lowered to this (sys.setswitchinterval; never raised): the longest an "
        "engine's thread waits for the GIL behind the store's bookkeeping; 0 leaves it alone"))
    event_log_events: int = Field(DEFAULT_EVENT_LOG_EVENTS, ge=0, le=1 << 24, description=(
        "events the store's event log keeps (every page stored, removed, demoted, with a "
        "store-wide sequence number): a reader further behind gets a gap and resynchronizes "
        "from a snapshot; 0 turns the log off"))
    max_pinned_fraction: float = Field(DEFAULT_MAX_PINNED_FRACTION, ge=0.0, le=0.9, description=(
        "the share of the smallest local tier that retention pins (StoreAPI.pin) may hold "
        "together; a pin past it is refused"))
    event_token_ids: list[Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]] = Field(
        default_factory=list, max_length=1024, description=(
            "namespace ids (32 hex digits, as kvstore stats lists them) whose 'stored' events "
            "carry their blocks' token ids -- the prompt's text, so an opt-in per namespace, "
            "for routers that hash tokens themselves; default: no event carries token ids"))


class ConnectorConfig(Strict):
    """How an engine's KV connector uses the store (``connector.build.build_connector``)."""

    host_tier: str | None = Field(
        None, description="the host tier loads stage through; default: the first host tier")
    prefetch_policy: Literal["best_effort", "wait_complete", "timeout"] = Field(
        "timeout", description=(
            "matched pages still below the host tier when a load starts: best_effort (load what "
            "host holds, recompute the rest while the prefetch warms host), wait_complete (wait "
            "for every one), timeout (wait up to prefetch_timeout_s, recompute what has not "
            "arrived)"))
    prefetch_timeout_s: PositiveFloat = Field(
        5.0, description="how long the timeout policy waits for pages below the host tier")
    layerwise: bool = Field(True, description=(
        "load layer l+1 while layer l computes; false loads everything before layer 0"))


#: The shortest deployment secret accepted, in bytes (kvstore.record.MIN_SECRET_BYTES).
_MIN_SECRET_BYTES = 16
#: Fields whose values are never echoed in an error message.
_SECRET_FIELDS = frozenset({"secret", "password", "token"})


class SecurityConfig(Strict):
    """The per-deployment secret: it keys every record's MAC on the disk and Redis tiers (so a
    party that can write there cannot have a page of its own served) and the tenant salts (so
    keys cannot be computed from a salt alone). Every node of a deployment needs the same one.
    Give it inline (``KVSTORE_SECURITY__SECRET``) or as a file (``secret_file``: its content,
    trailing whitespace removed), at least 16 bytes, e.g. ``openssl rand -hex 32``. Never
    printed or logged.

    Without one, records carry a MAC under a public key (integrity only: anyone who can write
    a shared tier can forge pages) and keys are computed from the salt alone; a store with a
    Redis tier warns at start.

    ``store_token_ids``: whether disk and Redis records (and the disk index) keep each block's
    token ids in clear. Off by default: a block's key, a hash of its whole prefix, identifies
    its page without them, and whoever can read the disk or Redis does not read prompts. On:
    readers also check that each key hashes from its parent and tokens (``kvstore.record``).
    Turning it off does not rewrite pages already stored."""

    secret: SecretStr | None = Field(None, description="the deployment secret (never printed)")
    secret_file: FilePath | None = Field(None, description="a file holding the secret")
    store_token_ids: bool = Field(
        False, description="keep token ids in clear in disk and Redis records (default: not)"
    )

    @model_validator(mode="after")
    def _one_source(self) -> SecurityConfig:
        if self.secret is not None and self.secret_file is not None:
            raise ValueError("set exactly one of secret and secret_file, or neither")
        if self.secret_file is not None:
            try:
                self.secret_bytes()
            except OSError as exc:
                raise ValueError(f"secret_file {self.secret_file}: {exc.strerror}") from None
        got = self.secret_bytes()
        if got is not None and len(got) < _MIN_SECRET_BYTES:
            raise ValueError(
                f"the secret has {len(got)} bytes, needs at least {_MIN_SECRET_BYTES} "
                "(e.g. `openssl rand -hex 32`)"
            )
        return self

    def secret_bytes(self) -> bytes | None:
        """The secret, or None when none is configured (reads ``secret_file`` each call)."""
        if self.secret is not None:
            return self.secret.get_secret_value().encode()
        if self.secret_file is not None:
            return self.secret_file.read_bytes().rstrip()
        return None


class DaemonConfig(Strict):
    """``kvstore serve``: where the daemon listens and what one request may ask for. A Unix
    socket (mode 0600) by default; TCP only when ``tcp`` is set, and then every call needs
    ``token`` (``KVSTORE_DAEMON__TOKEN``) as a bearer token."""

    socket: Path | None = Field(
        None, description="Unix socket path; default <data_dir>/kvstore.sock")
    tcp: str | None = Field(None, pattern=r"^\[?[0-9A-Za-z.:-]+\]?:[0-9]{1,5}$",
                            description="host:port to listen on as well, e.g. 127.0.0.1:50051")
    token: SecretStr | None = Field(None, description="bearer token TCP clients must send")
    data_dir: Path | None = Field(None, description=(
        "the daemon's directory: its socket and, when serve has no config file, its disk tier; "
        "default: $XDG_DATA_HOME/kvstore, else ./kvstore-data"))
    max_message_bytes: Size = Field(ByteSize(64 << 20), ge=1 << 16, description=(
        "the largest gRPC message, sent or received, and the largest lane frame"))
    max_keys_per_call: PositiveInt = Field(
        1 << 16, description="keys one call (or one lookup stream) may name")
    max_handles_per_session: PositiveInt = Field(
        4096, description="saves one session may hold open (not completed or aborted)")
    max_sessions: PositiveInt = Field(
        256, description="client sessions open at once; also bounds the open lookup streams")
    max_watchers: PositiveInt = Field(
        64, description="WatchEvents streams open at once (each holds a handler thread)")
    namespace_quota: Size | None = Field(
        None, description="bytes of the staging tier one namespace may hold; unset: no quota")
    drain_timeout_s: PositiveFloat = Field(10.0, description="SIGTERM: wait this long for calls")
    workers: int = Field(32, ge=4, le=1024, description="gRPC handler threads per listener")
    lane: bool = Field(True, description="serve the local lane: lookups, leases and the staging "
                       "calls of same-node clients on <socket>.lane (0600), beside gRPC")
    lane_connections: PositiveInt = Field(
        1024, description="lane connections open at once (a client opens up to 4)")
    staging_bytes: Size | None = Field(None, ge=1, description=(
        "each session's staging area: its saves in flight are written there (clients map the "
        "slab read-only) and copied into the slab at complete_store; default: as large as the "
        "host tier. Memory is taken only as written (a session keeps its largest save in "
        "flight resident); saves past it are refused (counted)"))
    copy_threads: int = Field(default_factory=lambda: min(8, max(1, usable_cores() // 2)),
                              ge=1, le=64, description=(
        "threads that copy a large completed save from a staging area into the slab "
        "(default: half the cores this process may run on, at most 8)"))
    peer_copy: bool = Field(True, description=(
        "copy a same-node client's saves and loads of host-memory pages straight between its "
        "memory and the slab (process_vm_readv / writev: one copy, on the copy threads) where "
        "the kernel lets the daemon (same user, Yama scope <= 1); false, or where it does not: "
        "saves go through the staging area"))

    @model_validator(mode="after")
    def _tcp_needs_token(self) -> DaemonConfig:
        if self.tcp is not None and (self.token is None or not self.token.get_secret_value()):
            raise ValueError("tcp is set but token is not: TCP clients must authenticate "
                             "(set daemon.token or KVSTORE_DAEMON__TOKEN)")
        return self


class AdminConfig(Strict):
    """The admin REST API and dashboard of ``kvstore serve`` (``server.admin``). It runs when
    ``token`` is set (``KVSTORE_ADMIN__TOKEN``); every route but ``/healthz`` and ``/readyz``
    needs it, checked before any request body is read."""

    listen: str = Field("127.0.0.1:8470", pattern=r"^\[?[0-9A-Za-z.:-]+\]?:[0-9]{1,5}$",
                        description="host:port; loopback unless you set another address")
    token: SecretStr | None = Field(None, description="bearer token of the admin API (never printed)")
    sample_interval_s: PositiveFloat = Field(2.0, le=60, description="stats sampling period")
    max_body_bytes: Size = Field(ByteSize(8 << 20), ge=1024, description=(
        "the largest request body (a lookup of a 1M-token prompt fits 8 MiB); larger: 413"))


#: Z85 (ZMQ's text form of a CURVE key): 40 characters of this alphabet encode 32 bytes.
_Z85 = re.compile(r"^[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}$")
#: a ZMQ certificate file's secret key line (``zmq.auth.create_certificates``' ``.key_secret``)
_CERT_SECRET = re.compile(r"""^\s*secret-key\s*=\s*"([^"]*)"\s*$""", re.M)


class EventsConfig(Strict):
    """``kvstore serve``: the store's event log published in the wire format of vLLM's KV events
    (``server.vllm_events``: a ZMQ PUB socket, msgpack ``KVEventBatch`` of ``BlockStored`` /
    ``BlockRemoved`` / ``AllBlocksCleared``), so a router that consumes vLLM's events consumes
    the daemon's. Off unless ``zmq_endpoint`` is set. An ``ipc://`` path is created mode 0600
    (only this user reads); a ``tcp://`` address needs a CURVE secret key, and then only
    subscribers that know its public key (logged at start) receive anything. Events carry
    block hashes, never token ids."""

    zmq_endpoint: str | None = Field(None, description=(
        "where the PUB socket binds: ipc:///path/kv-events, or tcp://host:port with a CURVE "
        "key; unset: no publisher"))
    zmq_topic: str = Field("", max_length=256, description=(
        "the first frame of every message (vLLM's KVEventsConfig.topic)"))
    zmq_curve_secret_key: SecretStr | None = Field(None, description=(
        "the publisher's CURVE secret key, 40 Z85 characters (never printed); subscribers set "
        "its public key as curve_serverkey"))
    zmq_curve_secret_key_file: FilePath | None = Field(None, description=(
        "a file holding the CURVE secret key: the Z85 text, or a ZMQ certificate "
        "(.key_secret) with a secret-key line"))

    @model_validator(mode="after")
    def _endpoint_and_key(self) -> EventsConfig:
        # errors are reported at the table (whose input is never shown): a key is never echoed
        if self.zmq_curve_secret_key is not None and self.zmq_curve_secret_key_file is not None:
            raise ValueError("set exactly one of zmq_curve_secret_key and "
                             "zmq_curve_secret_key_file, or neither")
        key = self.curve_secret_key()  # checks the key's form, from either source
        ep = self.zmq_endpoint
        if ep is None:
            if key is not None:
                raise ValueError("a CURVE key is set but zmq_endpoint is not: set the endpoint "
                                 "the publisher binds")
            return self
        scheme, sep, rest = ep.partition("://")
        if not sep or not rest or scheme not in ("ipc", "tcp"):
            raise _field_error("events.zmq_endpoint", (
                f"{ep!r} is not an ipc:// path or a tcp://host:port address (the publisher "
                "binds only those)"))
        if scheme == "tcp" and key is None:
            raise _field_error("events.zmq_endpoint", (
                f"{ep!r} is TCP without CURVE: it would publish every event to anyone who "
                "connects; set zmq_curve_secret_key or zmq_curve_secret_key_file (a key pair "
                "from server.vllm_events.curve_keypair()), or bind an ipc:// path"))
        if scheme == "ipc" and rest.startswith("@") and key is None:
            raise _field_error("events.zmq_endpoint", (
                f"{ep!r} is in Linux's abstract socket namespace, which has no file "
                "permissions: any local process could read every event; bind a path "
                "(ipc:///run/kvstore/kv-events), or set a CURVE key"))
        return self

    def curve_secret_key(self) -> str | None:
        """The CURVE secret key (Z85), or None; reads ``zmq_curve_secret_key_file`` each call.
        ValueError, never naming the key, when it is not one."""
        if self.zmq_curve_secret_key is not None:
            key = self.zmq_curve_secret_key.get_secret_value().strip()
            where = "zmq_curve_secret_key"
        elif self.zmq_curve_secret_key_file is not None:
            try:
                text = self.zmq_curve_secret_key_file.read_text()
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"zmq_curve_secret_key_file {self.zmq_curve_secret_key_file}: "
                                 f"{getattr(exc, 'strerror', None) or 'not text'}") from None
            cert = _CERT_SECRET.search(text)
            key = (cert.group(1) if cert else text).strip()
            where = f"zmq_curve_secret_key_file {self.zmq_curve_secret_key_file}"
        else:
            return None
        if not _Z85.match(key):
            raise ValueError(f"{where} is not a CURVE key: it needs 40 Z85 characters "
                             "(server.vllm_events.curve_keypair() makes a pair)")
        return key


class KVStoreConfig(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="KVSTORE_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    model_id: str = Field("default", min_length=1, description=(
        "the model's name; part of every key, so two models never share pages"))
    tenant_salt: str = Field("", description=(
        "operator-set tenant salt, part of every key: pages of two salts are invisible to "
        "each other"))
    layout: LayoutConfig = Field(LayoutConfig(), description="the model's KV shape")
    store: StoreConfig = Field(StoreConfig(), description="how pages move between the tiers")
    tiers: list[TierConfig] = Field(
        default_factory=lambda: [_default_tier()], min_length=1,
        description="the tiers, fastest first; names must be unique")
    connector: ConnectorConfig = Field(
        ConnectorConfig(), description="how an engine's KV connector uses the store")
    security: SecurityConfig = Field(
        SecurityConfig(), description="the deployment secret and what records keep")
    daemon: DaemonConfig = Field(DaemonConfig(), description="kvstore serve: listeners and limits")
    admin: AdminConfig = Field(
        AdminConfig(), description="kvstore serve: the admin API and dashboard")
    events: EventsConfig = Field(EventsConfig(), description=(
        "kvstore serve: the event log published as vLLM's KV events (ZMQ)"))

    @model_validator(mode="after")
    def _tiers_fit(self) -> KVStoreConfig:
        page = self.layout.build().page_bytes
        names = [t.name for t in self.tiers]
        if len(set(names)) != len(names):
            raise _field_error("tiers", f"tier names must be unique, got {names}")
        for i, t in enumerate(self.tiers):
            if t.capacity < page:
                raise _field_error(
                    f"tiers.{i}.capacity",
                    f"{format_size(t.capacity)} holds no page of {format_size(page)} for this "
                    "layout (a number without a unit is bytes)",
                )
        conn = self.connector
        if conn.host_tier is not None:
            kinds = {t.name: t.kind for t in self.tiers}
            if kinds.get(conn.host_tier) != "host":
                raise _field_error(
                    "connector.host_tier",
                    f"{conn.host_tier!r} is not a host tier of this store "
                    f"(host tiers: {[n for n, k in kinds.items() if k == 'host']})",
                )
        if self.events.zmq_endpoint is not None and self.store.event_log_events == 0:
            raise _field_error(
                "events.zmq_endpoint",
                "the publisher reads the store's event log, and store.event_log_events is 0 "
                "(the log is off): set it above 0, or unset events.zmq_endpoint")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The file's values arrive as init kwargs; the environment must win over them.
        return (_Environment(settings_cls), init_settings)


#: ``KVSTORE_*`` variables that are not configuration fields: switches read by the native-op
#: loader and by the scripts. Anything else under the prefix that is no field is refused as a typo.
OTHER_VARIABLES: dict[str, str] = {
    "KVSTORE_NATIVE": "auto | 0 | 1: native ops when a C compiler is available, never, always",
    "KVSTORE_NATIVE_CACHE": "where compiled native ops are cached (default ~/.cache/kvstore/native)",
    "KVSTORE_CUDA_ARCH": "nvcc -arch for the CUDA ops (default: the GPUs present)",
    "KVSTORE_COPY_BLOCKS": "thread blocks per copy_rows launch (tuning)",
    "KVSTORE_SAVE_BLOCKS": "thread blocks of a save's copy_rows launch (tuning)",
    "KVSTORE_TORCH_SPEC": "scripts/bootstrap.sh: the torch requirement to install",
    "KVSTORE_SKIP_TORCH": "scripts/bootstrap.sh: 1 keeps the torch already in .venv",
    "KVSTORE_WITH_VLLM": "scripts/bootstrap.sh: 1 installs vLLM's CPU build (tests/vllm)",
    "KVSTORE_WITH_PEERS": "scripts/bootstrap.sh: 1 installs LMCache 0.5.6 (bench.tiers' peer)",
    "KVSTORE_GIT_COMMIT": "scripts/gpu.sh: the commit recorded with benchmark results",
    "KVSTORE_CRASH_CYCLES": "tests: kill cycles of the disk crash test",
    "KVSTORE_TEST_FULLFS": "tests: 'rlimit' forces that variant of the full-disk test",
}
_NATIVE_MODES = ("auto", "0", "1")


def setting_variables() -> set[str]:
    """Every ``KVSTORE_*`` name that sets a configuration field: a top-level field (JSON for a
    table or list) or, with ``__``, a field of a table."""
    names = set()
    for name, field in KVStoreConfig.model_fields.items():
        names.add(f"KVSTORE_{name.upper()}")
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            names |= {f"KVSTORE_{name.upper()}__{sub.upper()}" for sub in field.annotation.model_fields}
    return names


class _Environment(EnvSettingsSource):
    """The ``KVSTORE_*`` variables, refused with a ConfigError naming the variable when a name is
    unknown, a JSON value malformed or ``KVSTORE_NATIVE`` not a mode, instead of ignored or
    reported as a pydantic-settings traceback."""

    def __call__(self) -> dict[str, Any]:
        ours = {k.upper(): v for k, v in self.env_vars.items() if k.upper().startswith("KVSTORE_")}
        known = setting_variables()
        unknown = sorted(set(ours) - known - set(OTHER_VARIABLES))
        if unknown:
            lines = []
            for name in unknown:
                close = difflib.get_close_matches(name, sorted(known | set(OTHER_VARIABLES)), 1)
                lines.append(f"  {name}" + (f" (did you mean {close[0]}?)" if close else ""))
            raise ConfigError(
                "unknown KVSTORE_* variables:\n" + "\n".join(lines),
                hint="KVSTORE_* variables set the fields of the configuration reference "
                "(docs/configuration.md); rename or unset these",
            )
        native = ours.get("KVSTORE_NATIVE")
        if native is not None and native.strip().lower() not in _NATIVE_MODES:
            raise ConfigError(
                f"KVSTORE_NATIVE={native!r}: must be auto, 0 or 1",
                hint="0 forces the pure-Python ops, 1 the native ones (a failed build is an "
                "error); auto, or unset, uses native ops when a C compiler is available",
            )
        try:
            return super().__call__()
        except SettingsError as exc:
            if isinstance(exc.__cause__, ConfigError):
                raise exc.__cause__ from None
            raise

    def prepare_field_value(
        self, field_name: str, field: FieldInfo, value: Any, value_is_complex: bool
    ) -> Any:
        try:
            return super().prepare_field_value(field_name, field, value, value_is_complex)
        except ValueError as exc:  # json.JSONDecodeError
            raise ConfigError(
                f"KVSTORE_{field_name.upper()} is not valid JSON: {exc}",
                hint="tables and lists in KVSTORE_* variables are JSON, e.g. "
                """KVSTORE_TIERS='[{"kind": "host", "capacity": "8GiB"}]'""",
            ) from None

    def sources(self) -> dict[tuple[str, ...], str]:
        """Which variable set each field path, e.g. ``("store", "prefetch_workers")``."""
        return {
            tuple(k[len("kvstore_"):].split("__")): k.upper()
            for k in self.env_vars
            if k.upper().startswith("KVSTORE_") and k.upper() not in OTHER_VARIABLES
        }


def load_config(
    path: str | os.PathLike[str] | None = None, *, overrides: Mapping[str, Any] | None = None
) -> KVStoreConfig:
    """Read ``path`` (``.toml``, ``.yaml``/``.yml``; None for defaults), apply ``overrides``
    and ``KVSTORE_*`` variables, validate. Raises ConfigError naming every bad field, and the
    variable that set it where one did."""
    data: dict[str, Any] = {}
    if path is not None:
        data = _read_file(Path(path))
    if overrides:
        data.update(overrides)
    try:
        return KVStoreConfig(**data)
    except ValidationError as exc:
        lines, from_env = _describe(exc, _Environment(KVStoreConfig).sources())
        where = []
        if not all(from_env):
            where.append("the field(s) named above" + (f" in {path}" if path else ""))
        if any(from_env):
            where.append("the variable(s) named above")
        raise ConfigError(
            "invalid kvstore configuration:\n" + "\n".join(lines),
            hint="fix " + " and ".join(where),
        ) from None


# Credentials inside a value: a URL's (or a node's) ``user:password@``, and a ``password=``
# query parameter. Everything from the start of the token to its last ``@`` is masked (a
# password may hold ``/`` or ``:``), keeping a scheme so the reader still sees which URL it was.
_USERINFO = re.compile(r"""([a-z][a-z0-9+.-]*://)?[^\s'",\[\]]*@""", re.I)
_PASSWORD_PARAM = re.compile(r"""(password=)[^&#\s'"]*""", re.I)


def _shown_input(err: Any) -> str:
    """`` (got <value>)`` for an error's line, or nothing where the value is a table or may be a
    secret: a secret field's, an unknown field's (perhaps a misspelt ``password``). Credentials
    in any other value are masked."""
    given = err.get("input")
    loc = err["loc"]
    if (isinstance(given, dict) or err["type"] == "extra_forbidden" or "security" in loc
            or any(p in _SECRET_FIELDS for p in loc)):
        return ""
    text = _PASSWORD_PARAM.sub(r"\1***", _USERINFO.sub(r"\1***@", repr(given)))
    return f" (got {text:.80})"


def _read_file(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(raw.decode())
        elif path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(raw) or {}
        else:
            raise ConfigError(
                f"config file {path}: kvstore reads TOML (.toml) and YAML (.yaml, .yml), "
                f"not {path.suffix or 'a file without a suffix'}",
                hint="write the settings as TOML or YAML (docs/configuration.md)",
            )
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    except ImportError:  # pragma: no cover - pyyaml is a dependency
        raise ConfigError("YAML config needs pyyaml installed") from None
    except Exception as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"config file {path} is not valid YAML: {_yaml_problem(exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


def _yaml_problem(exc: Exception) -> str:
    """What PyYAML found wrong and where, without the excerpt of the line it quotes (that line
    may hold a password)."""
    problem, mark = getattr(exc, "problem", None), getattr(exc, "problem_mark", None)
    if problem is None or mark is None:
        return type(exc).__name__
    return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"


def _field_error(field: str, detail: str) -> PydanticCustomError:
    """A check across fields, reported at ``field`` (a model validator's own location is the
    whole model)."""
    return PydanticCustomError("kvstore_field", "{field}: {detail}", {"field": field, "detail": detail})


def tier_config_error(exc: ValidationError, name: str | None = None) -> ConfigError:
    """The ConfigError for a tier config (of tier ``name``, where known) that failed validation:
    one line per bad field, as a whole configuration's (a secret's input never shown)."""
    lines, _ = _describe(exc, {})
    of = "" if name is None else f" of tier {name!r}"
    return ConfigError(f"invalid tier configuration{of}:\n" + "\n".join(lines),
                       hint="fix the field(s) named above")


def _describe(
    exc: ValidationError, env: Mapping[tuple[str, ...], str]
) -> tuple[list[str], list[bool]]:
    """One line per error, naming the field (and the variable that set it), and for each whether
    a variable set it. Inputs of secret fields are never shown."""
    lines, from_env = [], []
    for err in exc.errors():
        if err["type"] == "kvstore_field":
            loc, msg, shown = err["ctx"]["field"], err["ctx"]["detail"], ""
        else:
            loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
            msg = err["msg"].removeprefix("Value error, ")
            shown = _shown_input(err)
        parts = tuple(loc.split("."))
        var = next((v for p, v in sorted(env.items(), key=lambda pv: -len(pv[0]))
                    if parts[: len(p)] == p), None)
        lines.append(f"  {loc}{f' ({var})' if var else ''}: {msg}{shown}")
        from_env.append(var is not None)
    return lines, from_env
