"""The one typed configuration: a TOML or YAML file, overridden by ``KVSTORE_*`` variables.

Environment overrides use ``__`` for nesting and JSON for lists, e.g.::

    KVSTORE_MODEL_ID=meta-llama/Llama-3.1-8B
    KVSTORE_LAYOUT__BLOCK_SIZE=32
    KVSTORE_STORE__WRITE_POLICY=write_through
    KVSTORE_CONNECTOR__PREFETCH_POLICY=wait_complete
    KVSTORE_TIERS='[{"kind": "host", "capacity": "8GiB", "policy": "s3fifo"}]'

Environment beats file beats defaults. Any bad value raises :class:`ConfigError` whose message
names the field, the value given and what is allowed. Only this module reads the environment.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    FilePath,
    PositiveFloat,
    PositiveInt,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from kvstore.errors import ConfigError, KVStoreError
from kvstore.layout import DTYPE_SIZES, KVLayout

DType = Literal["float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int8", "uint8"]
assert set(DType.__args__) == set(DTYPE_SIZES)  # type: ignore[attr-defined]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LayoutConfig(_Strict):
    """The model's KV shape. Defaults are Llama-3-8B's (32 layers, 8 KV heads of 128, bf16)."""

    num_layers: PositiveInt = 32
    num_kv_heads: PositiveInt = 8
    head_dim: PositiveInt = 128
    block_size: int = Field(16, ge=1, le=65535)
    dtype: DType = "bfloat16"

    def build(self) -> KVLayout:
        return KVLayout(self.num_layers, self.num_kv_heads, self.head_dim, self.block_size, self.dtype)


def _check_policy(spec: str) -> str:
    from kvstore.policy import make_policy

    try:
        make_policy(spec, 1)
    except KVStoreError as exc:
        raise ValueError(exc.message) from None
    return spec


class HostTierConfig(_Strict):
    """Host memory: one slab of page slots, pinned when CUDA is present."""

    kind: Literal["host"] = "host"
    name: str = "host"
    capacity: ByteSize = Field(ByteSize(1 << 30), description="bytes, e.g. '8GiB'")
    policy: str = "lru"
    pin_memory: Literal["auto"] | bool = "auto"

    _v_policy = field_validator("policy")(_check_policy)

    def tier_kwargs(self) -> dict[str, Any]:
        return {"pin_memory": None if self.pin_memory == "auto" else self.pin_memory}


class HBMTierConfig(_Strict):
    """GPU memory: the page pool an engine allocates its paged KV cache from (torch's CPU device
    where there is no GPU)."""

    kind: Literal["hbm"] = "hbm"
    name: str = "hbm"
    capacity: ByteSize = Field(ByteSize(8 << 30), description="bytes of GPU memory for pages")
    # Leaf-first: a hit touches a chain head to tail, so LRU would evict heads first and leave
    # tails an engine can only recompute (its prefix stops at the first missing block).
    policy: str = "lineage"
    device: str | None = Field(None, description="torch device; default cuda if present, else cpu")

    _v_policy = field_validator("policy")(_check_policy)

    def tier_kwargs(self) -> dict[str, Any]:
        return {"device": self.device}


class DiskTierConfig(_Strict):
    """NVMe: a preallocated slab of record slots with an LMDB index, in a directory of its own
    on a local filesystem (see kvstore/tiers/disk.py for the guarantees)."""

    kind: Literal["disk"] = "disk"
    name: str = "disk"
    capacity: ByteSize = Field(ByteSize(64 << 30), description="bytes of pages, e.g. '500GiB'")
    policy: str = "lru"
    path: Path = Field(description="the tier's own directory (created if missing)")
    io_threads: int = Field(8, ge=1, le=256, description="parallel preadv/pwritev workers")
    o_direct: Literal["auto"] | bool = "auto"
    fsync: bool = Field(True, description="durable across power loss, not only process crashes")
    preallocate: bool = True
    allow_network_fs: bool = False
    check_index: bool = True
    max_io_bytes: ByteSize = Field(ByteSize(8 << 20), ge=4096, description="bytes per syscall")

    _v_policy = field_validator("policy")(_check_policy)

    def tier_kwargs(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "io_threads": self.io_threads,
            "o_direct": self.o_direct,
            "fsync": self.fsync,
            "preallocate": self.preallocate,
            "allow_network_fs": self.allow_network_fs,
            "check_index": self.check_index,
            "max_io_bytes": int(self.max_io_bytes),
        }


class RedisTierConfig(_Strict):
    """Redis or a Redis Cluster shared by many nodes: pages as verified records.

    ``capacity`` is this node's budget in the shared cache (its eviction policy evicts within
    it); bound the cache as a whole with ``ttl_s`` and/or the server's ``maxmemory``.
    """

    kind: Literal["redis"] = "redis"
    name: str = "redis"
    capacity: ByteSize = Field(ByteSize(16 << 30), description="this node's budget, e.g. '64GiB'")
    policy: str = "lru"
    url: str | None = Field(
        None, description="one server: redis://[user@]host:6379/0, rediss:// for TLS"
    )
    cluster_nodes: list[str] | None = Field(
        None, min_length=1, description="a Redis Cluster: seed nodes as 'host:port'"
    )
    username: str | None = Field(None, description="ACL user (default: the 'default' user)")
    password: SecretStr | None = None
    tls: bool = Field(False, description="TLS (implied by a rediss:// url)")
    tls_ca_certs: FilePath | None = None
    tls_certfile: FilePath | None = None
    tls_keyfile: FilePath | None = None
    tls_verify: bool = Field(True, description="verify the server certificate and host name")
    connect_timeout_s: PositiveFloat = 0.5
    timeout_s: PositiveFloat = Field(
        1.0, description="longest wait on a server that makes no progress; then misses"
    )
    retries: int = Field(2, ge=0, le=10, description="reconnect attempts within timeout_s")
    breaker_failures: PositiveInt = Field(3, description="failed calls that open the breaker")
    breaker_cooldown_s: PositiveFloat = Field(1.0, description="open time before a probe")
    ttl_s: float | None = Field(None, ge=0.001, description="sliding expiry; None: no TTL")
    compression: Literal["none", "zstd"] = Field(
        "none", description="'zstd' needs the zstandard package; saves ~22 % memory, costs speed"
    )
    key_prefix: str = Field("kvstore", min_length=1, pattern=r"^[^{}\s]+$")

    _v_policy = field_validator("policy")(_check_policy)

    @field_validator("url")
    @classmethod
    def _no_secret_in_url(cls, url: str | None) -> str | None:
        if url is None:
            return url
        if not url.startswith(("redis://", "rediss://")):
            raise ValueError("must start with redis:// or rediss://")
        userinfo = url.split("://", 1)[1].split("/", 1)[0].rpartition("@")[0]
        if ":" in userinfo:
            raise ValueError("put the password in the 'password' field (a secret), not in url")
        return url

    @model_validator(mode="after")
    def _one_endpoint(self) -> RedisTierConfig:
        if (self.url is None) == (self.cluster_nodes is None):
            raise ValueError("set exactly one of url (one server) and cluster_nodes (a cluster)")
        return self

    def tier_kwargs(self) -> dict[str, Any]:
        def path(p: Any) -> str | None:
            return None if p is None else str(p)

        return {
            "url": self.url,
            "cluster_nodes": self.cluster_nodes,
            "username": self.username,
            "password": None if self.password is None else self.password.get_secret_value(),
            "tls": self.tls,
            "tls_ca_certs": path(self.tls_ca_certs),
            "tls_certfile": path(self.tls_certfile),
            "tls_keyfile": path(self.tls_keyfile),
            "tls_verify": self.tls_verify,
            "connect_timeout_s": self.connect_timeout_s,
            "timeout_s": self.timeout_s,
            "retries": self.retries,
            "breaker_failures": self.breaker_failures,
            "breaker_cooldown_s": self.breaker_cooldown_s,
            "ttl_s": self.ttl_s,
            "compression": self.compression,
            "key_prefix": self.key_prefix,
        }


TierConfig = Annotated[
    Union[HBMTierConfig, HostTierConfig, DiskTierConfig, RedisTierConfig],
    Field(discriminator="kind"),
]


def _default_tier() -> TierConfig:
    return HostTierConfig()


class StoreConfig(_Strict):
    write_policy: Literal["write_through", "write_back", "selective"] = "write_back"
    selective_hits: PositiveInt = 2
    promote_on_hit: bool = True
    lease_ttl_s: PositiveFloat = 30.0
    prefetch_workers: int = Field(2, ge=1, le=64)


class ConnectorConfig(_Strict):
    """How an engine's KV connector uses the store (``connector.build.build_connector``)."""

    host_tier: str | None = Field(
        None, description="the host tier loads stage through; default: the first host tier")
    prefetch_policy: Literal["best_effort", "wait_complete", "timeout"] = "timeout"
    prefetch_timeout_s: PositiveFloat = 5.0
    layerwise: bool = True


class DaemonConfig(_Strict):
    """``kvstore serve``: where the daemon listens and what one request may ask for. A Unix
    socket (mode 0600) by default; TCP only when ``tcp`` is set, and then every call needs
    ``token`` (``KVSTORE_DAEMON__TOKEN``) as a bearer token."""

    socket: Path | None = Field(
        None, description="Unix socket path; default <data_dir>/kvstore.sock")
    tcp: str | None = Field(None, pattern=r"^\[?[0-9A-Za-z.:-]+\]?:[0-9]{1,5}$",
                            description="host:port to listen on as well, e.g. 127.0.0.1:50051")
    token: SecretStr | None = Field(None, description="bearer token TCP clients must send")
    data_dir: Path | None = Field(
        None, description="default: $XDG_DATA_HOME/kvstore, else ./kvstore-data")
    max_message_bytes: ByteSize = Field(ByteSize(64 << 20), ge=1 << 16)
    max_keys_per_call: PositiveInt = 1 << 16
    max_handles_per_session: PositiveInt = 4096
    max_sessions: PositiveInt = 256
    namespace_quota: ByteSize | None = Field(
        None, description="bytes of the staging tier one namespace may hold; None: no quota")
    drain_timeout_s: PositiveFloat = Field(10.0, description="SIGTERM: wait this long for calls")
    workers: int = Field(32, ge=4, le=1024, description="gRPC handler threads per listener")

    @model_validator(mode="after")
    def _tcp_needs_token(self) -> DaemonConfig:
        if self.tcp is not None and (self.token is None or not self.token.get_secret_value()):
            raise ValueError("tcp is set but token is not: TCP clients must authenticate "
                             "(set daemon.token or KVSTORE_DAEMON__TOKEN)")
        return self


class KVStoreConfig(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="KVSTORE_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    model_id: str = Field("default", min_length=1)
    tenant_salt: str = ""
    layout: LayoutConfig = LayoutConfig()
    store: StoreConfig = StoreConfig()
    tiers: list[TierConfig] = Field(default_factory=lambda: [_default_tier()], min_length=1)
    connector: ConnectorConfig = ConnectorConfig()
    daemon: DaemonConfig = DaemonConfig()

    @model_validator(mode="after")
    def _tiers_fit(self) -> KVStoreConfig:
        page = self.layout.build().page_bytes
        names = [t.name for t in self.tiers]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must be unique, got {names}")
        for i, t in enumerate(self.tiers):
            if t.capacity < page:
                raise ValueError(
                    f"tiers.{i}.capacity: {t.capacity.human_readable()} holds no page of "
                    f"{ByteSize(page).human_readable()} for this layout"
                )
        conn = self.connector
        if conn.host_tier is not None:
            kinds = {t.name: t.kind for t in self.tiers}
            if kinds.get(conn.host_tier) != "host":
                raise ValueError(
                    f"connector.host_tier: {conn.host_tier!r} is not a host tier of this store "
                    f"(host tiers: {[n for n, k in kinds.items() if k == 'host']})"
                )
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
        return (env_settings, init_settings)


def load_config(
    path: str | os.PathLike[str] | None = None, *, overrides: Mapping[str, Any] | None = None
) -> KVStoreConfig:
    """Read ``path`` (``.toml``, ``.yaml``/``.yml``; None for defaults), apply ``overrides``
    and ``KVSTORE_*`` variables, validate. Raises ConfigError naming every bad field."""
    data: dict[str, Any] = {}
    if path is not None:
        data = _read_file(Path(path))
    if overrides:
        data.update(overrides)
    try:
        return KVStoreConfig(**data)
    except ValidationError as exc:
        raise ConfigError(
            "invalid kvstore configuration:\n" + _describe(exc),
            hint=f"fix the field(s) named above in {path or 'the environment'}",
        ) from None


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
                f"config file {path} must end in .toml, .yaml or .yml", hint="rename the file"
            )
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    except ImportError:  # pragma: no cover - pyyaml is a dependency
        raise ConfigError("YAML config needs pyyaml installed") from None
    except Exception as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


def _describe(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        given = err.get("input")
        shown = "" if isinstance(given, dict) else f" (got {given!r:.80})"
        lines.append(f"  {loc}: {err['msg']}{shown}")
    return "\n".join(lines)
