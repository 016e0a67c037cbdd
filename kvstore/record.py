"""The record format: how a page travels when it leaves the process (disk, Redis, shared memory).

A record is a fixed-format header followed by the payload (the page bytes, optionally encoded by
the codec named in ``flags``). All integers little-endian::

    offset  size  field
    0       4     magic            b"KVPG"
    4       2     record version   RECORD_VERSION (2)
    6       2     flags            low byte: payload codec (0 = raw); other bits reserved, must be 0
    8       4     header_bytes     120 + 4 * num_tokens (the whole header)
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
    104+4n  16    MAC              keyed BLAKE3 of every header byte before it, then the payload

Reading verifies everything against what was asked for: magic, version, header checksum, the
namespace, layout and key asked for, that ``key == xxh3_128(parent || tokens)``, the payload
length, and the MAC (the payload checksum only when the MAC fails, to name the failure). Any mismatch raises :class:`RecordError` with a ``reason``
that tiers count; a tier turns it into a miss. Nothing beyond this fixed header is ever
deserialised.

The checksums tell damage from forgery and reject garbage early; only the MAC authenticates.
A verified read hashes its payload once (the MAC); writes compute both.
It is BLAKE3 in keyed mode, its key derived from the deployment's secret
(``derive_key("kvstore record MAC v2", secret)``), over the header and the *stored payload
itself* — never over a digest of it — truncated to 16 bytes. :class:`RecordMac` is the one
implementation: the disk and Redis tiers use it, and the daemon's wire is to use it as is.
Without a secret the key is derived from the empty string: a public key, so the MAC is then an
integrity check only, and anyone who can write a shared tier can forge records.

Version 1 records (no MAC) read as a miss counted under ``version``. The record version is
separate from ``layout.FORMAT_VERSION``, which versions keys and fingerprints: adding the MAC
changes no key.
"""

from __future__ import annotations

import hmac
import struct
from dataclasses import dataclass
from typing import Any, NoReturn

import blake3
import xxhash

from kvstore.errors import InvalidArgument, RecordError
from kvstore.keys import KEY_BYTES, BlockMeta
from kvstore.layout import KVLayout

MAGIC = b"KVPG"
#: Version of the record header (2: the MAC). Independent of keys (``layout.FORMAT_VERSION``).
RECORD_VERSION = 2
#: Bytes of the MAC at the end of the header: 128 bits, as HMAC-SHA256-128 or Poly1305.
TAG_BYTES = 16
#: Shortest deployment secret accepted (bytes).
MIN_SECRET_BYTES = 16
MAC_CONTEXT = "kvstore record MAC v2"  # BLAKE3 derive_key context of the MAC key
_FIXED = struct.Struct("<4sHHI16s8s16s16sQQII")  # 92 bytes, up to the token ids
_TAIL = struct.Struct("<IQ")  # reserved + header checksum; then the tag
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
    "mac",
)


def header_bytes(layout: KVLayout) -> int:
    return _FIXED.size + 4 * layout.block_size + _TAIL.size + TAG_BYTES


def payload_checksum(payload: Any) -> int:
    return xxhash.xxh3_64_intdigest(payload)


class RecordMac:
    """The MAC of records: BLAKE3 keyed with ``derive_key(MAC_CONTEXT, secret)``.

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
        """A hasher fed with ``signed`` (the header bytes before the tag); feed it the payload
        with ``update``, then :meth:`tag`."""
        h = blake3.blake3(key=self._key)
        h.update(signed)
        return h

    def tag(self, hasher: Any) -> bytes:
        return bytes(hasher.digest(TAG_BYTES))

    def __repr__(self) -> str:
        return f"RecordMac(authenticated={self.authenticated})"

    def __reduce__(self) -> NoReturn:
        raise TypeError("a RecordMac holds a key and is not pickled; pass the secret instead")


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


def pack_header(
    meta: BlockMeta,
    layout: KVLayout,
    payload: Any,
    mac: RecordMac,
    *,
    checksum: int,
    flags: int = 0,
) -> bytes:
    """The header of ``payload`` whose ``payload_checksum`` the caller computed already."""
    view = memoryview(payload).cast("B")
    if len(meta.token_ids) != 4 * layout.block_size:
        raise InvalidArgument(
            f"block has {len(meta.token_ids) // 4} tokens, layout block_size is {layout.block_size}"
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
        layout.block_size,
        0,
    )
    body = head + meta.token_ids + b"\0\0\0\0"
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
    if hsize != size or ntok != layout.block_size:
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
    buf: Any, layout: KVLayout, mac: RecordMac, *, namespace_id: bytes, key: bytes
) -> tuple[RecordHeader, memoryview]:
    """Verify a whole record (header || payload) held in one buffer; return its stored payload."""
    view = memoryview(buf).cast("B")
    header = parse_header(view, layout)
    verify_header(header, layout, namespace_id=namespace_id, key=key)
    payload = view[header_bytes(layout) :]
    verify_payload(header, payload, mac)
    return header, payload


def _fail(reason: str, message: str) -> RecordError:
    return RecordError(message, reason=reason)


__all__ = [
    "KEY_BYTES",
    "MAC_CONTEXT",
    "MAGIC",
    "MIN_SECRET_BYTES",
    "REASONS",
    "RECORD_VERSION",
    "TAG_BYTES",
    "RecordHeader",
    "RecordMac",
    "decode_record",
    "encode_header",
    "header_bytes",
    "pack_header",
    "parse_header",
    "payload_checksum",
    "payload_digest",
    "verify_header",
    "verify_payload",
]
