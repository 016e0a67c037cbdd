"""Setting up the Redis tier (its config model has validated its settings): building redis-py
connections (AUTH / ACL user, TLS), probing the server at start, and redis-py's cluster client
for the slot map.

Everything here runs at construction (and on a cluster topology refresh), never per call.
Failures become the kvstore error tree with a hint naming the setting to change. No message
carries a password: a URL is only ever quoted through :func:`redact`.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.exceptions
from redis.backoff import NoBackoff
from redis.retry import Retry

from kvstore.errors import ConfigError, TierUnavailable
from kvstore.tiers.redis_pool import NET_ERRORS

#: Compression setting -> record codec id (the low byte of the record header's flags).
CODECS = {"none": 0, "zstd": 1}


@dataclass(frozen=True, slots=True)
class Connect:
    """How the tier opens connections: one redis-py connection class and its kwargs for every
    server (host and port vary in a cluster), plus the seeds to probe."""

    tier: str
    connection_class: type
    kwargs: dict[str, Any] = field(repr=False)  # holds the password
    seeds: list[tuple[str, int]]
    connect_timeout_s: float

    def connection(self, host: str, port: int) -> Any:
        return self.connection_class(**dict(self.kwargs, host=host, port=port))


def probe(c: Connect, *, cluster: bool) -> tuple[int, ...]:
    """Connect to the first seed that answers, authenticate, and check that the server is of the
    kind configured; return its (major, minor) version. Raises ConfigError for rejected
    credentials or the wrong kind of server, TierUnavailable when no seed answers."""
    errors = []
    for host, port in c.seeds:
        conn = c.connection(host, port)
        conn.socket_connect_timeout = conn.socket_timeout = c.connect_timeout_s
        try:
            conn.connect()
            server, clus = _info(conn, "server"), _info(conn, "cluster")
        except redis.exceptions.AuthenticationError as exc:
            raise ConfigError(
                f"redis tier {c.tier!r}: {host}:{port} rejected the credentials: {exc}",
                hint="set the tier's password (and username for an ACL user) to what the "
                "server expects",
            ) from None
        except redis.exceptions.ResponseError as exc:  # AUTH misuse, NOPERM, SELECT...
            if "DB index" in str(exc):
                db = c.kwargs.get("db", 0)
                raise ConfigError(
                    f"redis tier {c.tier!r}: {host}:{port} has no database {db}: {exc}",
                    hint="set the url's database number (its /N) below the server's "
                    "'databases' setting (16 by default)",
                ) from None
            auth = "AUTH" in str(exc) or "password" in str(exc)
            raise ConfigError(
                f"redis tier {c.tier!r}: {host}:{port} refused the setup commands: {exc}",
                hint="set the tier's password (and username) to what the server expects"
                if auth
                else "give the tier's redis user +@read +@write +@keyspace",
            ) from None
        except NET_ERRORS as exc:
            errors.append(f"{host}:{port}: {exc}")
            continue
        finally:
            conn.disconnect()
        info = _parse_info(server) | _parse_info(clus)
        if not clus:  # INFO not permitted: trust the configuration
            info["cluster_enabled"] = "1" if cluster else "0"
        enabled = info.get("cluster_enabled") == "1"
        if enabled and not cluster:
            raise ConfigError(
                f"redis tier {c.tier!r}: {host}:{port} is a Redis Cluster node",
                hint="list the cluster's nodes in cluster_nodes instead of url",
            )
        if cluster and not enabled:
            raise ConfigError(
                f"redis tier {c.tier!r}: {host}:{port} is not in cluster mode",
                hint="use url for a single server, cluster_nodes for a Redis Cluster",
            )
        # Without INFO permission, assume a server with GETEX (Redis >= 6.2).
        version = tuple(int(x) for x in str(info.get("redis_version", "6.2")).split(".")[:2])
        return version
    where = "cluster_nodes" if cluster else "url"
    tls = c.connection_class is redis.SSLConnection
    if tls:
        for host, port in c.seeds:
            if _speaks_plain_resp(host, port, c.connect_timeout_s):
                raise ConfigError(
                    f"redis tier {c.tier!r}: {host}:{port} answers plain RESP, not TLS",
                    hint=f"use redis:// (and tls=False) for this server, or point the tier's "
                    f"{where} at the server's tls-port",
                )
    raise TierUnavailable(
        f"redis tier {c.tier!r}: no server answered within {c.connect_timeout_s}s: "
        + "; ".join(errors),
        hint=f"start the redis server(s), or fix the tier's {where}"
        + ("" if tls else " (a server that only listens with TLS needs rediss:// or tls=True)"),
    )


def connect_cluster(c: Connect) -> Any:
    """redis-py's cluster client, for the slot map only (the data path has its own sockets)."""
    from redis.cluster import ClusterNode, RedisCluster

    kwargs = dict(c.kwargs)
    kwargs.pop("db", None)
    kwargs.pop("health_check_interval", None)
    if c.connection_class is redis.SSLConnection:
        kwargs["ssl"] = True
    try:
        return RedisCluster(
            startup_nodes=[ClusterNode(h, p) for h, p in c.seeds],
            require_full_coverage=False,
            socket_timeout=c.connect_timeout_s,
            socket_connect_timeout=c.connect_timeout_s,
            **kwargs,
        )
    except redis.exceptions.RedisError as exc:
        raise TierUnavailable(
            f"redis tier {c.tier!r}: cannot read the cluster's slot map: {exc}",
            hint="check that cluster_nodes name nodes of a healthy Redis Cluster",
        ) from None


def connection_settings(
    tier: str,
    connect_timeout_s: float,
    url: str | None,
    cluster_nodes: Sequence[str] | None,
    username: str | None,
    password: str | None,
    tls: bool,
    ca_certs: str | None,
    certfile: str | None,
    keyfile: str | None,
    verify: bool,
) -> Connect:
    """How to open a redis-py connection to any server of the tier, and the seeds."""
    kwargs: dict[str, Any] = {"db": 0}
    if url is not None:
        try:
            parsed = redis.connection.parse_url(url)
            seeds = [(parsed.get("host", "localhost"), int(parsed.get("port", 6379)))]
        except ValueError as exc:
            raise ConfigError(
                f"redis tier {tier!r}: url {redact(url)!r} does not parse: {_scrub(exc, url)}",
                hint="write it as redis://[user:password@]host:port/db (rediss:// for TLS)",
            ) from None
        kwargs.update(parsed)
        if parsed.get("connection_class") is redis.UnixDomainSocketConnection:
            raise ConfigError(
                f"redis tier {tier!r}: url {redact(url)!r}: unix sockets are not supported",
                hint="use redis:// or rediss://",
            )
        tls = tls or parsed.get("connection_class") is redis.SSLConnection
    else:
        seeds = [host_port(n) for n in cluster_nodes or ()]
    kwargs.pop("connection_class", None)
    if username is not None:
        kwargs["username"] = username
    if password is not None:
        kwargs["password"] = password
    kwargs.update(
        retry=Retry(NoBackoff(), 0),  # our own retries, bounded by the call's deadline
        protocol=2,
        health_check_interval=0,
    )
    if tls:
        kwargs.update(
            ssl_ca_certs=ca_certs,
            ssl_certfile=certfile,
            ssl_keyfile=keyfile,
            ssl_cert_reqs="required" if verify else "none",
            ssl_check_hostname=verify,
        )
    cls = redis.SSLConnection if tls else redis.Connection
    return Connect(tier, cls, kwargs, seeds, connect_timeout_s)


def host_port(node: str) -> tuple[str, int]:
    """``"host:port"`` (IPv6 as ``"[::1]:6379"``) -> ``(host, port)``."""
    host, sep, port = str(node).rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(
            f"redis cluster node {node!r} is not host:port", hint="write nodes as '10.0.0.5:6379'"
        )
    return host.strip("[]"), int(port)


def redact(url: str) -> str:
    """``url`` with any password masked (``redis://user:***@host:6379/0``), for messages. A
    userinfo without a colon (perhaps a password that lost its colon) is masked whole."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        userinfo, _, hostpart = rest.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        rest = f"{user}:***@{hostpart}" if colon else f"***@{hostpart}"
    return re.sub(r"(?i)(password=)[^&#]*", r"\1***", f"{scheme}{sep}{rest}")


def _scrub(exc: BaseException, url: str) -> str:
    """An error's text with the url's password masked, in case the error quoted it."""
    text = str(exc)
    password = urlsplit(url).password
    for secret in {password, unquote(password)} if password else ():
        text = text.replace(secret, "***")
    return text


def _speaks_plain_resp(host: str, port: int, timeout_s: float) -> bool:
    """Whether ``host:port`` answers a plain-text PING (for the hint when TLS fails)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(1)[:1] in (b"+", b"-")
    except OSError:
        return False


def _info(conn: Any, section: str) -> Any:
    """``INFO section`` on a redis-py connection; empty when the ACL user may not run INFO."""
    conn.send_command("INFO", section)
    try:
        return conn.read_response()
    except redis.exceptions.NoPermissionError:
        return b""


def _parse_info(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    out = {}
    for line in text.splitlines():
        k, sep, v = line.partition(":")
        if sep:
            out[k.strip()] = v.strip()
    return out


def load_zstd(*, required: bool, tier: str) -> Any:
    try:
        import zstandard
    except ImportError:
        if required:
            raise ConfigError(
                f"redis tier {tier!r}: compression 'zstd' needs the zstandard package",
                hint="pip install zstandard, or set the tier's compression to 'none'",
            ) from None
        return None
    return zstandard


__all__ = ["CODECS", "Connect", "connect_cluster", "connection_settings", "host_port", "load_zstd",
           "probe", "redact"]
