"""The record format: how a page travels when it leaves the process (disk, Redis, shared memory).

A record is a fixed-format header followed by the payload (the page bytes, optionally encoded by
the codec named in ``flags``). All integers little-endian::

    offset  size  field
    0       4     magic            b"KVPG"
    4       2     format version   FORMAT_VERSION
    6       2     flags            low byte: payload codec (0 = raw); other bits reserved, must be 0
    8       4     header_bytes     104 + 4 * num_tokens (the whole header)
    12      16    namespace id     Namespace.seed
    28      8     layout fingerprint
    36      16    key
    52      16    parent key       (the namespace seed for a prefix's first block)
    68      8     payload bytes    stored length (after the codec)
    76      8     payload checksum xxh3_64 of the stored payload
    84      4     num_tokens       = layout.block_size
    88      4     reserved, 0
    92      4*n   token ids        int32le
    92+4n   4     reserved, 0
    96+4n   8     header checksum  xxh3_64 of every header byte before it

Reading verifies everything against what was asked for: magic, version, header checksum, the
namespace, layout and key asked for, that ``key == xxh3_128(parent || tokens)``, the payload
length and its checksum. Any mismatch raises :class:`RecordError` with a ``reason`` that tiers
count; a tier turns it into a miss. Nothing beyond this fixed header is ever deserialised.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import xxhash

from kvstore.errors import InvalidArgument, RecordError
from kvstore.keys import KEY_BYTES, BlockMeta
from kvstore.layout import FORMAT_VERSION, KVLayout

MAGIC = b"KVPG"
_FIXED = struct.Struct("<4sHHI16s8s16s16sQQII")  # 92 bytes, up to the token ids
_TAIL = struct.Struct("<IQ")  # reserved + header checksum
assert _FIXED.size == 92 and _TAIL.size == 12

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
)


def header_bytes(layout: KVLayout) -> int:
    return _FIXED.size + 4 * layout.block_size + _TAIL.size


def payload_checksum(payload: Any) -> int:
    return xxhash.xxh3_64_intdigest(payload)


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

    @property
    def codec(self) -> int:
        return self.flags & 0xFF

    def meta(self) -> BlockMeta:
        return BlockMeta(self.namespace_id, self.key, self.parent, self.token_ids)


def pack_header(
    meta: BlockMeta,
    layout: KVLayout,
    *,
    payload_bytes: int,
    checksum: int,
    flags: int = 0,
) -> bytes:
    if len(meta.token_ids) != 4 * layout.block_size:
        raise InvalidArgument(
            f"block has {len(meta.token_ids) // 4} tokens, layout block_size is {layout.block_size}"
        )
    size = header_bytes(layout)
    head = _FIXED.pack(
        MAGIC,
        FORMAT_VERSION,
        flags,
        size,
        meta.namespace_id,
        layout.fingerprint,
        meta.key,
        meta.parent,
        payload_bytes,
        checksum,
        layout.block_size,
        0,
    )
    body = head + meta.token_ids + b"\0\0\0\0"
    return body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body))


def encode_header(meta: BlockMeta, layout: KVLayout, payload: Any, *, flags: int = 0) -> bytes:
    """Header for ``payload`` (any buffer: bytes, memoryview, numpy array)."""
    view = memoryview(payload).cast("B")
    return pack_header(
        meta, layout, payload_bytes=view.nbytes, checksum=payload_checksum(view), flags=flags
    )


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
    if version != FORMAT_VERSION:
        raise _fail("version", f"record format v{version}, this build reads v{FORMAT_VERSION}")
    if hsize != size or ntok != layout.block_size:
        raise _fail("layout", f"header for {ntok} tokens ({hsize} bytes), expected {size}")
    (stored,) = struct.unpack_from("<Q", view, size - 8)
    if xxhash.xxh3_64_intdigest(view[: size - 8]) != stored:
        raise _fail("header_checksum", "header checksum mismatch")
    tokens = bytes(view[_FIXED.size : _FIXED.size + 4 * ntok])
    return RecordHeader(flags, bytes(ns), bytes(fp), bytes(key), bytes(parent), plen, pcsum, tokens)


def verify_header(
    header: RecordHeader, layout: KVLayout, *, namespace_id: bytes, key: bytes
) -> None:
    """Check a parsed header's identity against what the caller asked for."""
    if header.layout_fingerprint != layout.fingerprint:
        raise _fail("layout", "record written for another page layout")
    if header.namespace_id != namespace_id:
        raise _fail("namespace", "record belongs to another namespace")
    if header.key != key:
        raise _fail("key", "record stored under another key")
    if not header.meta().verify_chain():
        raise _fail("chain", "key does not hash from the record's parent and tokens")


def verify_payload(header: RecordHeader, payload: Any) -> None:
    view = memoryview(payload).cast("B")
    if view.nbytes != header.payload_bytes:
        raise _fail("length", f"payload is {view.nbytes} bytes, header says {header.payload_bytes}")
    if payload_checksum(view) != header.payload_checksum:
        raise _fail("payload_checksum", "payload checksum mismatch")


def decode_record(
    buf: Any, layout: KVLayout, *, namespace_id: bytes, key: bytes
) -> tuple[RecordHeader, memoryview]:
    """Verify a whole record (header || payload) held in one buffer; return its stored payload."""
    view = memoryview(buf).cast("B")
    header = parse_header(view, layout)
    verify_header(header, layout, namespace_id=namespace_id, key=key)
    payload = view[header_bytes(layout) :]
    verify_payload(header, payload)
    return header, payload


def _fail(reason: str, message: str) -> RecordError:
    return RecordError(message, reason=reason)


__all__ = [
    "KEY_BYTES",
    "MAGIC",
    "REASONS",
    "RecordHeader",
    "decode_record",
    "encode_header",
    "header_bytes",
    "pack_header",
    "parse_header",
    "payload_checksum",
    "verify_header",
    "verify_payload",
]
