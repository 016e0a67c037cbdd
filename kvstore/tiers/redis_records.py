"""Redis tier records: the value stored under each page's name, how a put builds it and how a
read verifies it.

Storage layout
    One page is one Redis string ``<key_prefix>:<key hex>`` (e.g. ``kvstore:3f9a…``, 32 hex
    digits), whose value is a :mod:`kvstore.record` record: the fixed header (namespace id,
    layout fingerprint, key, parent, payload length and checksum, header checksum; the block's
    token ids only with ``store_token_ids``) followed by the page bytes, raw or compressed by
    the codec the header names. The name holds the key only — ``contains`` and ``delete`` get
    keys without a namespace — and the key already identifies its namespace (it chains from the
    namespace seed); the namespace is checked from the verified header on every read. The name
    has no hash tag, so in a cluster the pages of one prompt spread over all shards.

Compression
    ``compression="zstd"`` (needs the ``zstandard`` package) compresses each page at level 1 and
    stores it raw when that does not make it smaller. Measured on bf16 KV-like pages (normal
    values with per-channel scales) on the 2-core CPU machine: 21-22 % fewer bytes, at
    ~0.6 GB/s compress / ~0.5 GB/s decompress per core; through the tier on loopback, puts ran
    at ~0.45x and gets at ~0.35x of uncompressed. So it does not pay for speed on loopback or
    any link faster than ~2-4 Gb/s; it pays for capacity (the same Redis memory holds ~1.4x
    the pages: 22 % fewer bytes, and the values drop out of jemalloc's 2.5 MiB size class) or on
    slow links. lz4 gains nothing on bf16 (ratio 1.00); zlib level 1 compresses at ~0.01 GB/s.
    Off by default. Readers decode compressed records whatever their own setting, so nodes may
    differ.

Thread-safety: a :class:`Records` is shared by every call of its tier; the zstd (de)compressors
it uses are per thread.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvstore.errors import RecordError
from kvstore.keys import BlockMeta
from kvstore.layout import KVLayout
from kvstore.record import (
    MacJobs,
    RecordMac,
    decode_record,
    encode_header,
    header_bytes,
    parse_header,
    verify_identity,
    verify_layout,
    verify_payload,
)
from kvstore.tiers.redis_setup import CODECS

CODEC_ZSTD = CODECS["zstd"]  # record codec id of zstd-compressed payloads

#: Failed checks after which the stored value is deleted (it can never be read by anyone).
#: Other reasons (namespace, layout, version, codec) mean "well-formed but not for us".
DAMAGED = frozenset(
    {"truncated", "magic", "header_checksum", "key", "chain", "length", "payload_checksum",
     "mac"}
)


class Records:
    """The names and records of one Redis tier's pages: ``name(key)``; ``record`` for a put;
    ``verify`` / ``verify_slow`` for a read (each raises RecordError); ``damaged`` says which
    failed values to delete."""

    def __init__(
        self, layout: KVLayout, key_prefix: str, mac: RecordMac, codec: int, zstd: Any
    ) -> None:
        """``codec``: the record codec id puts compress with (0: none); ``zstd``: the
        ``zstandard`` module, or None where it is missing (compressed records are then foreign)."""
        self.layout = layout
        self.prefix = key_prefix.encode() + b":"
        self.mac = mac
        self._codec = codec
        self._zstd = zstd
        self._local = threading.local()  # zstd (de)compressors are not thread-safe
        #: Bytes of a record's header, and of a whole raw record of this layout.
        self.header_bytes = header_bytes(layout)
        self.record_bytes = self.header_bytes + layout.page_bytes
        #: The largest value read as a record: raw, or compressed with overhead.
        self.max_bytes = self.header_bytes + layout.page_bytes + layout.page_bytes // 64 + 4096

    def name(self, key: bytes) -> bytes:
        return self.prefix + key.hex().encode()

    def record(self, meta: BlockMeta, page: np.ndarray) -> tuple[bytes, Any]:
        """The header and payload of ``page``'s record (encoded by the codec, tagged by the MAC)."""
        payload, flags = self._encode(page)
        return encode_header(meta, self.layout, payload, self.mac, flags=flags), payload

    def _encode(self, page: np.ndarray) -> tuple[Any, int]:
        if not self._codec:
            return page, 0
        packed = self._compressor().compress(page)
        if len(packed) >= page.nbytes:
            return page, 0
        return packed, self._codec

    def verify(
        self, hdr: Any, out: np.ndarray, digest: Any, ns: bytes, key: bytes
    ) -> BlockMeta:
        """Verify a raw record whose page already sits in ``out``, the caller's buffer: ``hdr``
        its header; ``digest`` the MAC's hasher (``record.payload_digest``) that the page was fed
        to as it arrived, or None to hash it here (on the MAC pool). Raises RecordError."""
        header = parse_header(hdr, self.layout)
        verify_layout(header, self.layout)
        if header.codec:
            raise RecordError(f"a page-sized payload of codec {header.codec}", reason="length")
        verify_payload(header, out, self.mac, digest)
        verify_identity(header, namespace_id=ns, key=key)  # authenticated by now
        return header.meta()

    def verify_slow(self, rec: bytearray, out: np.ndarray, ns: bytes, key: bytes) -> BlockMeta:
        """Verify a record of another size (compressed, or damaged) and decode it into ``out``.
        Raises RecordError."""
        view = memoryview(rec)
        page_bytes = self.layout.page_bytes
        header, payload = decode_record(view, self.layout, self.mac, namespace_id=ns, key=key)
        if header.codec == 0:
            raise RecordError("raw payload of the wrong size", reason="length")
        if header.codec != CODEC_ZSTD or self._zstd is None:
            raise RecordError(f"unknown or unavailable codec {header.codec}", reason="codec")
        try:
            data = self._decompressor().decompress(payload, max_output_size=page_bytes)
        except self._zstd.ZstdError as exc:
            raise RecordError(f"zstd: {exc}", reason="codec") from None
        if len(data) != page_bytes:
            raise RecordError(f"decoded {len(data)} bytes", reason="length")
        out[:] = np.frombuffer(data, np.uint8)
        return header.meta()

    def identify(self, value: bytearray | tuple[int, bytearray], key: bytes) -> BlockMeta | str:
        """The authenticated identity of ``key``'s value read whole (for ``meta``), or why it is
        not a page: a value of a size a record of this layout has (the ``bytearray``) is
        decoded and verified (its MAC covers header and payload); one of any other size
        (``(its size, its first bytes)``) is classed by its header, as a read classes it."""
        if isinstance(value, tuple):
            return size_reason(value[1], value[0], self.layout)
        try:
            header, _ = decode_record(value, self.layout, self.mac, namespace_id=None, key=key)
        except RecordError as exc:
            return exc.reason
        return header.meta()

    def damaged(self, key: bytes, reason: str, hdr: Any = None) -> bool:
        """Whether a value of ``key`` that failed verification for ``reason`` is to be deleted.
        ``hdr``: its header, authenticated when ``reason`` is ``namespace`` (the only identity
        failure that leaves a value alone, and only once the MAC verified it)."""
        return reason in DAMAGED or (
            reason == "namespace" and not genuine(hdr, key, self.layout)
        )

    def _compressor(self) -> Any:
        c = getattr(self._local, "c", None)
        if c is None:
            c = self._local.c = self._zstd.ZstdCompressor(level=1)
        return c

    def _decompressor(self) -> Any:
        d = getattr(self._local, "d", None)
        if d is None:
            d = self._local.d = self._zstd.ZstdDecompressor()
        return d


def ahead(
    jobs: MacJobs, i: int, n: int, record: Any, metas: Sequence[BlockMeta],
    pages: Sequence[np.ndarray],
) -> tuple[bytes, Any]:
    """Item ``i``'s ``record(metas[i], pages[i])`` from the MAC pool, having started the
    records of the items after it (in index order, two per pool thread ahead): the pool hashes
    the next pages while the calling thread sends this one."""
    for k in range(i, min(n, i + 1 + 2 * jobs.threads)):
        if k not in jobs:
            jobs.start(k, record, metas[k], pages[k])
    return jobs.result(i)


def size_reason(hdr: Any, n: int, layout: KVLayout) -> str:
    """Why a value of ``n`` bytes, a size no record of ``layout`` has, is not a page, by its
    first bytes ``hdr``: another layout's or version's reason (left for its readers), else
    ``length`` (damage)."""
    try:
        verify_layout(parse_header(hdr, layout), layout)
    except RecordError as exc:
        return exc.reason
    return "length"


def genuine(hdr: Any, key: bytes, layout: KVLayout) -> bool:
    """Whether an authenticated header that failed the namespace check is nonetheless a
    self-consistent record of ``key`` (another tenant's page asked for under the wrong
    namespace: leave it alone)."""
    if hdr is None:
        return False
    try:
        header = parse_header(hdr, layout)
    except RecordError:
        return False
    return header.key == key and header.chains()
