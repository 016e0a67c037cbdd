"""The redis tier's config model (see :mod:`kvstore.tiers.config_base`)."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    ByteSize,
    Field,
    FilePath,
    PositiveFloat,
    PositiveInt,
    SecretStr,
    field_validator,
    model_validator,
)

from kvstore.sizes import Size
from kvstore.tiers.config_base import TierConfigBase


#: Connections a batch of puts of large pages is split over. Measured on the 2-core machine,
#: MAC on, against LMCache's client in the same rounds: 2 MiB pages put 0.75-0.83 of LMCache
#: with 2 lanes, 0.67-0.71 with 1; 4 lanes no faster than 2. Gets were 5-15 % slower with
#: lanes, so gets do not use them.
DEFAULT_WRITE_LANES = 2

#: How page records are stored on the server.
Compression = Literal["none", "zstd"]


class RedisTierConfig(TierConfigBase):
    """Redis or a Redis Cluster shared by many nodes: pages as verified records.

    ``capacity`` is this node's budget in the shared cache (its eviction policy evicts within
    it); bound the cache as a whole with ``ttl_s`` and/or the server's ``maxmemory``. Size
    ``maxmemory`` at about 1.25x the page bytes to keep (jemalloc stores a 2 MiB value in a
    2.5 MiB size class); a server at ``maxmemory`` refuses puts (counted), reads go on.
    """

    kind: Literal["redis"] = Field("redis", description="selects the tier implementation")
    name: str = Field("redis", description="unique name: the metrics label and the tier= argument")
    capacity: Size = Field(ByteSize(16 << 30), description="this node's budget, e.g. '64GiB'")
    policy: str = Field(
        "lru", description="eviction policy: a registered name or package.module:Class")
    url: str | None = Field(
        None, description="one server: redis://[user@]host:6379/0, rediss:// for TLS"
    )
    cluster_nodes: list[str] | None = Field(
        None, min_length=1, description="a Redis Cluster: seed nodes as 'host:port'"
    )
    username: str | None = Field(None, description="ACL user (default: the 'default' user)")
    password: SecretStr | None = Field(
        None, description="the user's password (never printed; not in url or cluster_nodes)")
    tls: bool = Field(False, description="TLS (implied by a rediss:// url)")
    tls_ca_certs: FilePath | None = Field(
        None, description="CA bundle to verify the server with (TLS only); default: the system's")
    tls_certfile: FilePath | None = Field(
        None, description="client certificate for mutual TLS (TLS only)")
    tls_keyfile: FilePath | None = Field(
        None, description="the client certificate's private key (TLS only)")
    tls_verify: bool = Field(True, description="verify the server certificate and host name")
    connect_timeout_s: PositiveFloat = Field(
        0.5, description="longest wait for a connection; at start, no answer in it: unavailable")
    timeout_s: PositiveFloat = Field(
        1.0, description="longest wait on a server that makes no progress; then misses"
    )
    retries: int = Field(2, ge=0, le=10, description="reconnect attempts within timeout_s")
    breaker_failures: PositiveInt = Field(3, description="failed calls that open the breaker")
    breaker_cooldown_s: PositiveFloat = Field(1.0, description="open time before a probe")
    ttl_s: float | None = Field(
        None, ge=0.001, description="sliding expiry (set on put, refreshed on hit); unset: no TTL")
    compression: Compression = Field(
        "none", description="'zstd' needs the zstandard package; saves ~22 % memory, costs speed"
    )
    key_prefix: str = Field("kvstore", min_length=1, pattern=r"^[^{}\s]+$", description=(
        "pages are stored as <key_prefix>:<key hex>; nodes that share pages use the same one"))
    mac_threads: int | None = Field(
        None, ge=0, le=256,
        description="threads hashing a batch's record MACs; unset: by the cores, 0: the caller",
    )
    write_lanes: int = Field(
        DEFAULT_WRITE_LANES, ge=1, le=64,
        description="connections per server one batch of puts of pages >= 1 MiB is split over",
    )

    @field_validator("url")
    @classmethod
    def _no_secret_in_url(cls, url: str | None) -> str | None:
        if url is None:
            return url
        if not url.startswith(("redis://", "rediss://")):
            raise ValueError("must start with redis:// or rediss://")
        userinfo = url.split("://", 1)[1].split("/", 1)[0].rpartition("@")[0]
        if ":" in userinfo or "password=" in url.lower():  # redis-py reads ?password= too
            raise ValueError("put the password in the 'password' field (a secret), not in url")
        return url

    @field_validator("cluster_nodes")
    @classmethod
    def _no_secret_in_nodes(cls, nodes: list[str] | None) -> list[str] | None:
        if any("@" in n for n in nodes or ()):
            raise ValueError("nodes are 'host:port': put the username and password in their "
                             "fields (the password is a secret), not in cluster_nodes")
        return nodes

    @model_validator(mode="after")
    def _one_endpoint(self) -> RedisTierConfig:
        if (self.url is None) == (self.cluster_nodes is None):
            raise ValueError("set exactly one of url (one server) and cluster_nodes (a cluster)")
        return self
