"""The record format: how a page travels when it leaves the process (disk, Redis, shared memory).

A record is a fixed-format header followed by the payload (the page bytes, optionally encoded by
the codec named in ``flags``). All integers little-endian::

    offset  size  field
    0       4     magic            b"KVPG"
    4       2     record version   RECORD_VERSION (4)
    6       2     flags            low byte: payload codec (0 = raw); other bits reserved, must be 0
    8       4     header_bytes     132 + 4 * n (the whole header), n = layout.block_size
    12      16    namespace id     Namespace.seed
    28      8     layout fingerprint
    36      16    key
    52      16    parent key       (the namespace seed for a prefix's first block)
    68      8     payload bytes    stored length (after the codec)
    76      8     payload checksum xxh3_64 of the stored payload
    84      4     num_tokens       0 (no token ids stored: the default) or n
    88      4     reserved, 0
    92      4*n   token ids        int32le when num_tokens = n, else 0-filled
    92+4n   4     reserved, 0
    96+4n   12    nonce            random, fresh for every record written
    108+4n  8     header checksum  xxh3_64 of every header byte before it
    116+4n  16    MAC              AES-256-GMAC (the nonce) of every header byte before it, then
                                   the payload

Token ids are stored only where configured (``security.store_token_ids``, off by default; the
disk and Redis tiers take it as ``store_token_ids``): the key already names the page -- it is
a hash of the whole prefix (``kvstore.keys``) -- so a record without them loses nothing a
reader needs, and whoever reads the disk or Redis does not read prompts. Their room stays in
the header either way (0-filled: 4 bytes per token, against the KV of every layer the page
holds per token), so every record of a layout has one size whatever the writer's setting:
nodes that differ share one Redis, the Redis tier still recognises a raw record by its size,
and the disk slab's header region is fixed. :func:`stored_meta` is what a tier applies to a
page's identity before writing it.

Reading verifies everything against what was asked for: magic, version, header checksum, the
layout, the payload length and the MAC (the payload checksum only when the MAC fails, to name
the failure), then the namespace and key asked for and, when the record carries token ids,
that ``key == xxh3_128(parent || tokens)``. Without them the identity is the authenticated
namespace and key (and the parent, reported as written): only a holder of the secret wrote
that header, and every writer checks the chain before a page is stored
(``checks.check_metas``). Any mismatch raises :class:`RecordError` with a ``reason`` that
tiers count; a tier turns it into a miss. Nothing beyond this fixed header is ever
deserialised.

No decision uses a header field before the MAC has authenticated it: the identity fields
(namespace, key, parent, tokens) are read only after :func:`verify_payload` passed
(:func:`decode_record` shows the order). Before it, only what describes the bytes themselves
(magic, version, sizes, layout, codec) is looked at, and a mismatch there only classes the
value as damaged or another layout's -- never as some namespace's page. Whoever can write a
shared tier but lacks the secret can therefore rewrite a header (say, the namespace, with the
header checksum recomputed) and get no more than a record that reads as ``mac``: it is no
namespace's, so a flush of the namespace it claims does not delete the key elsewhere. There is
no MAC over the header alone: to learn whose a stored record is, a reader reads and verifies
the whole record (``RedisTier.meta``).

The checksums tell damage from forgery and reject garbage early; only the MAC authenticates.
A verified read hashes its payload once (the MAC); writes compute both.
It is GMAC: AES-256-GCM under the record's nonce, with no plaintext and every header byte before
the tag, then the *stored payload itself* (never a digest of it), as associated data; its tag
is 16 bytes. The key is derived from the deployment's secret
(BLAKE3 ``derive_key("kvstore record MAC v3", secret)``); the nonce is 12 random bytes per record
(``os.urandom``), so a key sees colliding nonces only after some 2^32 records' worth of birthday
bound, and a forger may pick any nonce without that helping them. GMAC rather than keyed BLAKE3
(records v2): on AES-NI/VAES and carry-less multiply it runs at 15-19 GB/s on one core of the
2-core machine against BLAKE3's 5.9, and the MAC was what held the Redis and disk tiers below
LMCache's unauthenticated adapters. :class:`RecordMac` is the one implementation: the disk and
Redis tiers use it, and the daemon's wire seals each page it moves (ReadPages, WritePages) with
it: ``RecordMac.seal`` over the page and :func:`wire_fields` (direction, namespace, key; a
write's parent and tokens too) under the same key and a fresh nonce, the associated data starting with
``WIRE_CONTEXT``.
Without a secret the key is derived from the empty string: a public key, so the MAC is then an
integrity check only, and anyone who can write a shared tier can forge records.

Hashing a batch in parallel: a tier that moves a batch of pages hashes them on the shared MAC
pool (:func:`mac_jobs`) where the machine has the cores for it — each page on one thread, so a
put hashes the next pages while the calling thread sends this one, and a get verifies each page
as soon as it arrived while the calling thread receives the next. Same MAC, same checks, same
results: only the thread that computes them differs. By default (:func:`default_mac_threads`)
the pool has ``min(MAX_MAC_THREADS, cores // 2)`` threads from ``PARALLEL_MIN_CORES`` usable
cores up, else none (hashing stays on the calling thread, fed while the bytes arrive); a tier's
``mac_threads`` setting overrides it (0: none); ``python -m bench.mac`` measures the pool at
several thread counts.

Records of versions 1 (no MAC), 2 (keyed BLAKE3) and 3 (GMAC; token ids always stored) read
as a miss counted under ``version``: after an upgrade a disk tier's old pages are recomputed
once. (Reading v3 would cost a line -- v4 with tokens is v3 but for the version -- but would
keep serving, and keep on disk, the prompts that v4 no longer stores; a v3 node reads v4 as
``version`` the same way, so a rolling upgrade recomputes pages, never mixes them up.) The
record version is separate from ``layout.FORMAT_VERSION``, which versions keys and
fingerprints: the MAC changes no key, and neither does leaving the token ids out.
"""

from __future__ import annotations

import hmac
import os
import struct
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import Any, NoReturn

import blake3
import xxhash
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from kvstore.errors import InvalidArgument, RecordError
from kvstore.keys import KEY_BYTES, BlockMeta
from kvstore.layout import KVLayout

MAGIC = b"KVPG"
#: Version of the record header (4: token ids optional; 3 always stored them; GMAC with a
#: per-record nonce since 3; 2 was keyed BLAKE3). Independent of keys
#: (``layout.FORMAT_VERSION``).
RECORD_VERSION = 4
#: Bytes of the MAC at the end of the header: GCM's full 128-bit tag.
TAG_BYTES = 16
#: Bytes of the per-record nonce (GCM's 96-bit IV).
NONCE_BYTES = 12
#: Shortest deployment secret accepted (bytes).
MIN_SECRET_BYTES = 16
MAC_CONTEXT = "kvstore record MAC v3"  # BLAKE3 derive_key context of the AES-256 MAC key
#: The first associated data of a page sealed for the daemon's wire (a record's starts with
#: ``MAGIC``, so no seal is ever a record's tag, nor the reverse).
WIRE_CONTEXT = b"kvstore wire page v1\x00"
#: Bytes of a wire seal: the nonce, then the tag.
WIRE_SEAL_BYTES = NONCE_BYTES + TAG_BYTES
#: The ``tier`` label under which pages with a bad wire seal are counted (``corrupt`` metric).
WIRE = "wire"
_FIXED = struct.Struct("<4sHHI16s8s16s16sQQII")  # 92 bytes, up to the token ids
_TAIL = struct.Struct("<I12sQ")  # reserved, nonce, header checksum; then the tag
assert _FIXED.size == 92 and _TAIL.size == 24

#: Reasons a record can fail verification; each is a counter label.
REASONS = (
    "truncated",
    "magic",
    "version",
    "header_checksum",
    "namespace",
    "layout",
    "key",
    "chain",
    "length",
    "payload_checksum",
    "codec",
    "mac",
)


def header_bytes(layout: KVLayout) -> int:
    return _FIXED.size + 4 * layout.block_size + _TAIL.size + TAG_BYTES


def payload_checksum(payload: Any) -> int:
    return xxhash.xxh3_64_intdigest(payload)


class _Gmac:
    """One record's MAC in progress: AES-256-GCM under its nonce, fed associated data only."""

    __slots__ = ("_enc",)

    def __init__(self, key: bytes, nonce: bytes) -> None:
        self._enc = Cipher(algorithms.AES(key), modes.GCM(nonce)).encryptor()

    def update(self, data: Any) -> None:
        self._enc.authenticate_additional_data(data)

    def tag(self) -> bytes:
        self._enc.finalize()
        return bytes(self._enc.tag)


class RecordMac:
    """The MAC of records: GMAC (AES-256-GCM, no plaintext) keyed with
    ``derive_key(MAC_CONTEXT, secret)``, under each record's nonce.

    ``secret``: the deployment's secret (at least ``MIN_SECRET_BYTES``), or None for the public
    key (integrity only). Immutable and thread-safe; each record gets its own hasher. The secret
    and the key appear in no repr, message or pickle.
    """

    __slots__ = ("_key", "authenticated")

    def __init__(self, secret: bytes | None = None) -> None:
        if secret is not None:
            if not isinstance(secret, bytes):
                raise InvalidArgument(
                    f"the record MAC secret must be bytes, got {type(secret).__name__}",
                    hint="pass the deployment secret encoded, e.g. secret.encode()",
                )
            if len(secret) < MIN_SECRET_BYTES:
                raise InvalidArgument(
                    f"the record MAC secret has {len(secret)} bytes, needs at least "
                    f"{MIN_SECRET_BYTES}",
                    hint="set security.secret to e.g. the output of `openssl rand -hex 32`",
                )
        self._key = blake3.blake3(secret or b"", derive_key_context=MAC_CONTEXT).digest()
        #: False when keyed with the public key (no secret): integrity, not authenticity.
        self.authenticated = secret is not None

    def begin(self, signed: Any) -> Any:
        """A hasher fed with ``signed`` (the header bytes before the tag, whose last 20 bytes
        are the nonce and the header checksum); feed it the payload with ``update``, then
        :meth:`tag`."""
        view = memoryview(signed).cast("B")
        h = _Gmac(self._key, bytes(view[-8 - NONCE_BYTES: -8]))
        h.update(view)
        return h

    def tag(self, hasher: Any) -> bytes:
        return hasher.tag()  # type: ignore[no-any-return]

    def seal(self, fields: bytes, payload: Any) -> bytes:
        """The seal of a page sent over the daemon's wire (``WIRE_SEAL_BYTES``: a fresh nonce,
        then the GMAC tag of ``WIRE_CONTEXT``, ``fields`` and ``payload`` under it). ``fields``
        names what the page is (see :func:`wire_fields`); nothing is copied."""
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._wire_tag(nonce, fields, payload)

    def verify_seal(self, fields: bytes, payload: Any, seal: bytes) -> bool:
        """Whether ``seal`` (from :meth:`seal` under the same secret) authenticates ``fields``
        and ``payload``; False for a missing or malformed seal."""
        if len(seal) != WIRE_SEAL_BYTES:
            return False
        tag = self._wire_tag(bytes(seal[:NONCE_BYTES]), fields, payload)
        return hmac.compare_digest(tag, bytes(seal[NONCE_BYTES:]))

    def _wire_tag(self, nonce: bytes, fields: bytes, payload: Any) -> bytes:
        h = _Gmac(self._key, nonce)
        h.update(WIRE_CONTEXT)
        h.update(fields)
        h.update(memoryview(payload).cast("B"))
        return h.tag()

    def __repr__(self) -> str:
        return f"RecordMac(authenticated={self.authenticated})"

    def __reduce__(self) -> NoReturn:
        raise TypeError("a RecordMac holds a key and is not pickled; pass the secret instead")


def wire_fields(direction: bytes, namespace_id: bytes, key: bytes, parent: bytes = b"",
                token_ids: bytes = b"") -> bytes:
    """What a wire seal binds besides the page: the direction (``b"R"``: a page the daemon
    read, ``b"W"``: a page a client writes, with its parent and token ids -- the key is a
    non-cryptographic hash of them), the namespace and the key. Every field has a fixed size
    per direction, so the concatenation is unambiguous."""
    return direction + namespace_id + key + parent + token_ids


def payload_digest(mac: RecordMac, header: Any) -> Any:
    """The MAC's hasher for the record whose raw ``header`` (``header_bytes(layout)`` bytes, not
    yet parsed or verified) was just read: feed it the payload piece by piece while it arrives
    (``update``), then pass it to :func:`verify_payload` with the parsed header."""
    return mac.begin(memoryview(header).cast("B")[:-TAG_BYTES])


@dataclass(frozen=True, slots=True)
class RecordHeader:
    flags: int
    namespace_id: bytes
    layout_fingerprint: bytes
    key: bytes
    parent: bytes
    payload_bytes: int
    payload_checksum: int
    token_ids: bytes
    tag: bytes
    signed: bytes  # the header bytes the tag covers (all before it)

    @property
    def codec(self) -> int:
        return self.flags & 0xFF

    def meta(self) -> BlockMeta:
        return BlockMeta(self.namespace_id, self.key, self.parent, self.token_ids)

    def chains(self) -> bool:
        """Whether the key hashes from the parent and the token ids; True for a record that
        carries none (its authenticated key is then its identity)."""
        return not self.token_ids or self.meta().verify_chain()


def stored_meta(meta: BlockMeta, store_token_ids: bool) -> BlockMeta:
    """``meta`` as a record (or a tier's index) stores it: without its token ids unless
    ``store_token_ids`` (``security.store_token_ids``)."""
    return meta if store_token_ids or not meta.token_ids else replace(meta, token_ids=b"")


def pack_header(
    meta: BlockMeta,
    layout: KVLayout,
    payload: Any,
    mac: RecordMac,
    *,
    checksum: int,
    flags: int = 0,
) -> bytes:
    """The header of ``payload`` whose ``payload_checksum`` the caller computed already. It
    holds ``meta.token_ids`` as given: all ``block_size`` of them, or none (see
    :func:`stored_meta`)."""
    view = memoryview(payload).cast("B")
    room = 4 * layout.block_size
    if len(meta.token_ids) not in (0, room):
        raise InvalidArgument(
            f"block has {len(meta.token_ids) // 4} tokens, layout block_size is "
            f"{layout.block_size} (or none, where token ids are not stored)"
        )
    size = header_bytes(layout)
    head = _FIXED.pack(
        MAGIC,
        RECORD_VERSION,
        flags,
        size,
        meta.namespace_id,
        layout.fingerprint,
        meta.key,
        meta.parent,
        view.nbytes,
        checksum,
        len(meta.token_ids) // 4,
        0,
    )
    body = head + (meta.token_ids or bytes(room)) + b"\0\0\0\0" + os.urandom(NONCE_BYTES)
    signed = body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body))
    h = mac.begin(signed)
    h.update(view)
    return signed + mac.tag(h)


def encode_header(
    meta: BlockMeta, layout: KVLayout, payload: Any, mac: RecordMac, *, flags: int = 0
) -> bytes:
    """Header for ``payload`` (any buffer: bytes, memoryview, numpy array), tagged by ``mac``."""
    view = memoryview(payload).cast("B")
    return pack_header(meta, layout, view, mac, checksum=payload_checksum(view), flags=flags)


def parse_header(buf: Any, layout: KVLayout) -> RecordHeader:
    """Parse and self-check a header (magic, version, size, header checksum)."""
    view = memoryview(buf).cast("B")
    size = header_bytes(layout)
    if view.nbytes < size:
        raise _fail("truncated", f"record header truncated: {view.nbytes} < {size} bytes")
    (magic, version, flags, hsize, ns, fp, key, parent, plen, pcsum, ntok, _r) = _FIXED.unpack_from(
        view
    )
    if magic != MAGIC:
        raise _fail("magic", f"bad magic {bytes(magic)!r}")
    if version != RECORD_VERSION:
        raise _fail("version", f"record format v{version}, this build reads v{RECORD_VERSION}")
    if hsize != size or ntok not in (0, layout.block_size):
        raise _fail("layout", f"header for {ntok} tokens ({hsize} bytes), expected {size}")
    end = size - TAG_BYTES  # the tag follows the header checksum
    (stored,) = struct.unpack_from("<Q", view, end - 8)
    if xxhash.xxh3_64_intdigest(view[: end - 8]) != stored:
        raise _fail("header_checksum", "header checksum mismatch")
    tokens = bytes(view[_FIXED.size : _FIXED.size + 4 * ntok])
    return RecordHeader(
        flags, bytes(ns), bytes(fp), bytes(key), bytes(parent), plen, pcsum, tokens,
        bytes(view[end:size]), bytes(view[:end]),
    )


def verify_layout(header: RecordHeader, layout: KVLayout) -> None:
    """Check that a parsed header is of ``layout``. Safe before the MAC: a mismatch only classes
    the record as another layout's (left for its readers), never as anyone's page."""
    if header.layout_fingerprint != layout.fingerprint:
        raise _fail("layout", "record written for another page layout")


def verify_identity(header: RecordHeader, *, namespace_id: bytes | None, key: bytes) -> None:
    """Check an *authenticated* header's identity (call it after :func:`verify_payload`): the
    namespace asked for (None: any, the header says whose it is), the key it is stored under,
    and, when it carries token ids, that the key hashes from its parent and them."""
    if namespace_id is not None and header.namespace_id != namespace_id:
        raise _fail("namespace", "record belongs to another namespace")
    if header.key != key:
        raise _fail("key", "record stored under another key")
    if not header.chains():
        raise _fail("chain", "key does not hash from the record's parent and tokens")


def verify_payload(
    header: RecordHeader, payload: Any, mac: RecordMac, digest: Any = None
) -> None:
    """Check the stored ``payload`` against its parsed ``header``: its length, then the MAC over
    header and payload, compared in constant time. ``digest``: the hasher from
    :func:`payload_digest` that the payload was fed to as it arrived (else it is hashed here).

    Only a failed MAC costs the checksum, which names the failure: ``payload_checksum`` when the
    payload does not match its own checksum (damage), else ``mac`` (a forgery, or a record
    written under another secret). A verified read hashes the payload once."""
    view = memoryview(payload).cast("B")
    if view.nbytes != header.payload_bytes:
        raise _fail("length", f"payload is {view.nbytes} bytes, header says {header.payload_bytes}")
    if digest is None:
        digest = mac.begin(header.signed)
        digest.update(view)
    if not hmac.compare_digest(mac.tag(digest), header.tag):
        if payload_checksum(view) != header.payload_checksum:
            raise _fail("payload_checksum", "payload checksum mismatch")
        raise _fail("mac", "record MAC mismatch: forged, or written under another secret")


def decode_record(
    buf: Any, layout: KVLayout, mac: RecordMac, *, namespace_id: bytes | None, key: bytes
) -> tuple[RecordHeader, memoryview]:
    """Verify a whole record (header || payload) held in one buffer; return its header, now
    authenticated, and its stored payload. ``namespace_id``: the namespace asked for, or None
    for whichever the authenticated header names (to learn whose a record is).

    The order every reader keeps: parse (self-checks), layout, the MAC over header and payload,
    and only then the identity (namespace, key, chain) -- so no field an attacker without the
    secret could have rewritten decides anything."""
    view = memoryview(buf).cast("B")
    header = parse_header(view, layout)
    verify_layout(header, layout)
    payload = view[header_bytes(layout) :]
    verify_payload(header, payload, mac)
    verify_identity(header, namespace_id=namespace_id, key=key)
    return header, payload


# --------------------------------------------------------------------- hashing batches in parallel

#: Fewest usable cores at which a batch's pages are hashed on the MAC pool by default. Below it
#: the calling thread hashes them. Measured on the 2-core machine (a shared one: the spread is
#: run to run), Redis MAC on/off with the pool forced to 2 threads vs the calling thread: puts
#: 0.77-0.87 vs 0.79-0.85, gets 0.77-0.95 vs 0.70-0.83 — no gain there worth a thread hop,
#: since the calling thread and a local redis-server already keep both cores busy. From 4 cores
#: there are cores to spare for hashing; ``python -m bench.tiers --tier redis`` measures the
#: pool against the calling thread on a given host (its "calling thread" lines). (GMAC itself
#: does not scale over that machine's two vCPUs: one thread hashed 256 KiB pages in cache at
#: 10.3-11.9 GB/s, two at 8.0-10.6 in all, while xxh3 went from 53-59 to 77-90: they behave
#: like one core's two hyperthreads sharing its AES units. The disk tier's ``hash_in_workers``
#: follows this threshold too.)
PARALLEL_MIN_CORES = 4
#: Most threads of the MAC pool by default (half the usable cores up to this).
MAX_MAC_THREADS = 8


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_mac_threads(cores: int | None = None) -> int:
    """Threads of the MAC pool for ``cores`` usable cores (default: this process's): half of
    them up to ``MAX_MAC_THREADS`` from ``PARALLEL_MIN_CORES`` up, else 0 (no pool)."""
    cores = usable_cores() if cores is None else cores
    return min(MAX_MAC_THREADS, cores // 2) if cores >= PARALLEL_MIN_CORES else 0


_pools: dict[int, ThreadPoolExecutor] = {}  # thread count -> the process's pool of that size
_pools_lock = threading.Lock()


def _reset_after_fork() -> None:  # the parent's pool threads do not exist in a forked child
    global _pools, _pools_lock
    _pools, _pools_lock = {}, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def mac_pool(threads: int) -> ThreadPoolExecutor | None:
    """The process's shared MAC pool of ``threads`` threads (created on first use), or None for
    0: hashing stays on the calling thread."""
    if threads <= 0:
        return None
    pool = _pools.get(threads)
    if pool is None:
        with _pools_lock:
            pool = _pools.get(threads)
            if pool is None:
                pool = ThreadPoolExecutor(threads, thread_name_prefix="kvstore-mac")
                _pools[threads] = pool
    return pool


class MacJobs:
    """The hashing jobs of one batch on the MAC pool, by item. Use it as a context manager: on
    exit every job has finished (or, when the block raised, was cancelled before it started), so
    no job touches a caller's buffer after the call returns."""

    __slots__ = ("_pool", "_jobs", "threads")

    def __init__(self, pool: ThreadPoolExecutor, threads: int) -> None:
        self._pool = pool
        self._jobs: dict[int, Future[Any]] = {}
        #: Threads of the pool: how far ahead of its consumer a batch is worth hashing.
        self.threads = threads

    def __contains__(self, item: int) -> bool:
        return item in self._jobs

    def start(self, item: int, fn: Callable[..., Any], *args: Any) -> None:
        self._jobs[item] = self._pool.submit(fn, *args)

    def result(self, item: int) -> Any:
        """``fn(*args)`` of ``item``'s job (waiting for it); re-raises what it raised."""
        return self._jobs[item].result()

    def results(self) -> Iterator[tuple[int, Any]]:
        for item, job in self._jobs.items():
            yield item, job.result()

    def done(self) -> bool:
        return all(job.done() for job in self._jobs.values())

    def __enter__(self) -> MacJobs:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        jobs = list(self._jobs.values())
        if exc_type is not None:
            for job in jobs:
                job.cancel()
        wait(jobs)


def mac_jobs(items: int, threads: int) -> MacJobs | None:
    """Jobs on the MAC pool of ``threads`` threads for a batch of ``items`` pages, or None: no
    pool (0 threads), or one page (nothing to overlap it with; the calling thread hashes it as
    it moves)."""
    pool = mac_pool(threads) if items > 1 else None
    return None if pool is None else MacJobs(pool, threads)


def _fail(reason: str, message: str) -> RecordError:
    return RecordError(message, reason=reason)


__all__ = [
    "KEY_BYTES",
    "MAC_CONTEXT",
    "MAGIC",
    "MAX_MAC_THREADS",
    "MIN_SECRET_BYTES",
    "NONCE_BYTES",
    "PARALLEL_MIN_CORES",
    "REASONS",
    "RECORD_VERSION",
    "TAG_BYTES",
    "MacJobs",
    "RecordHeader",
    "RecordMac",
    "decode_record",
    "default_mac_threads",
    "encode_header",
    "header_bytes",
    "mac_jobs",
    "mac_pool",
    "pack_header",
    "parse_header",
    "payload_checksum",
    "payload_digest",
    "stored_meta",
    "usable_cores",
    "verify_identity",
    "verify_layout",
    "verify_payload",
]
