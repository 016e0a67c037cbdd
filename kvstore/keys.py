"""Namespaces and block keys (key spec v1; docs/keys-and-pages.md documents it with a test vector).

Namespace seed (16 bytes)::

    seed = xxh3_128( b"kvstore-ns/v1\\0"
                     || layout.fingerprint                       (8 bytes)
                     || u32le(len(model_id)) || model_id (UTF-8)
                     || u32le(len(salt))     || salt     (UTF-8) )

With a deployment secret (``security.secret``) the salt field holds the tenant salt keyed by it
instead of the salt itself::

    salt = BLAKE3( salt (UTF-8), key = BLAKE3-derive_key("kvstore tenant salt v1", secret) )

(32 bytes), so a namespace's seed — hence its keys — cannot be computed from the tenant salt
alone, and two deployments with different secrets never share keys. Without a secret the seed
is exactly as above (the spec's test vector).

Block keys, one per *full* block of ``block_size`` tokens (a trailing partial block gets none)::

    key[-1] = seed
    key[i]  = xxh3_128( key[i-1] || int32le(tokens[i*B : (i+1)*B]) )

Tensor-parallel shards: an engine whose KV heads are split over ``world`` workers stores each
worker's share of a block as its own page, in the namespace of the model id
``shard_model_id(model_id, rank, world) = model_id || "#tp" || rank || "/" || world`` (decimal;
``model_id`` itself when ``world == 1``), so shards never share keys and a page says which
shard it is.

``xxh3_128`` is XXH3-128 with seed 0 and its canonical (big-endian) 16-byte digest. There is no
per-process state: the same namespace and tokens give the same keys in every process on every
machine. Because each key covers its parent, key *i* names the whole prefix ``tokens[:(i+1)*B]``
in that namespace.
"""

from __future__ import annotations

import array
import struct
import sys
from collections.abc import Sequence
from dataclasses import InitVar, dataclass, field
from typing import Any

import blake3
import numpy as np
import xxhash

from kvstore import native_chain as native_chain_module
from kvstore.errors import InvalidArgument
from kvstore.layout import KVLayout
from kvstore.namespace_labels import label_of

KEY_BYTES = 16
_MAX_TOKEN_ID = 2**31 - 1
_h128 = xxhash.xxh3_128_digest
SALT_CONTEXT = "kvstore tenant salt v1"  # BLAKE3 derive_key context of the salt key


@dataclass(frozen=True, slots=True)
class Namespace:
    """Who may see a page: a model, a page layout and a tenant salt (set by the operator or
    gateway, never by end users; pages of two salts are invisible to each other).

    ``secret``: the deployment secret the salt is keyed with (see the module docstring), or
    None. It is not kept: only the seed it gives, which is part of equality."""

    model_id: str
    layout: KVLayout
    tenant_salt: str = ""
    secret: InitVar[bytes | None] = None
    seed: bytes = field(init=False, repr=False)

    def __post_init__(self, secret: bytes | None) -> None:
        if not isinstance(self.model_id, str) or not self.model_id:
            raise InvalidArgument(
                f"model_id must be a non-empty string, got {self.model_id!r}",
                hint="name the model, e.g. 'meta-llama/Llama-3.1-8B'",
            )
        if not isinstance(self.tenant_salt, str):
            raise InvalidArgument(f"tenant_salt must be a string, got {self.tenant_salt!r}")
        model = self.model_id.encode()
        salt = self.tenant_salt.encode()
        if secret is not None:
            key = blake3.blake3(secret, derive_key_context=SALT_CONTEXT).digest()
            salt = blake3.blake3(salt, key=key).digest()
        material = b"".join(
            (
                b"kvstore-ns/v1\0",
                self.layout.fingerprint,
                struct.pack("<I", len(model)),
                model,
                struct.pack("<I", len(salt)),
                salt,
            )
        )
        object.__setattr__(self, "seed", _h128(material))

    @property
    def id(self) -> bytes:
        """The 16-byte namespace id carried in every record header (the seed)."""
        return self.seed

    @property
    def label(self) -> str:
        """What stats and the admin API show for this namespace: the model id and the tenant
        salt, never the secret or the seed (see :mod:`kvstore.namespace_labels`)."""
        return label_of(self.model_id, self.tenant_salt)

    def chain(self, token_ids: Any) -> BlockChain:
        """Keys of every full block of ``token_ids``."""
        data = token_bytes(token_ids)
        return BlockChain(self, data, chain_keys(self.seed, data, self.layout.block_size))


@dataclass(frozen=True, slots=True)
class BlockMeta:
    """The full identity of one stored block; what a record header carries besides the layout."""

    namespace_id: bytes
    key: bytes
    parent: bytes
    #: block_size int32 little-endian; empty for a page read back from a tier that does not
    #: store token ids (``security.store_token_ids``): the key alone names the prefix then.
    token_ids: bytes

    def verify_chain(self) -> bool:
        """True when ``key`` really is the hash of ``parent`` and ``token_ids``."""
        return _h128(self.parent + self.token_ids) == self.key


@dataclass(frozen=True, slots=True)
class BlockChain:
    """The keys of a token sequence's full blocks, with what is needed to rebuild each block's
    :class:`BlockMeta` (so a page can be written as a verifiable record)."""

    namespace: Namespace
    data: bytes  # int32le token ids of the full blocks only
    keys: list[bytes]

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def num_tokens(self) -> int:
        return len(self.keys) * self.namespace.layout.block_size

    def meta(self, i: int) -> BlockMeta:
        step = self.namespace.layout.block_size * 4
        parent = self.keys[i - 1] if i > 0 else self.namespace.seed
        return BlockMeta(
            self.namespace.seed, self.keys[i], parent, self.data[i * step : (i + 1) * step]
        )

    def metas(self, start: int = 0, stop: int | None = None) -> list[BlockMeta]:
        stop = len(self.keys) if stop is None else stop
        return [self.meta(i) for i in range(start, stop)]


#: From this many blocks on, a chain is hashed in one native call (below it, the call's own
#: cost is more than the Python loop's).
_NATIVE_MIN_BLOCKS = 16


def shard_model_id(model_id: str, rank: int, world: int) -> str:
    """The model id of tensor-parallel shard ``rank`` of ``world`` (see the module docstring);
    ``model_id`` when ``world == 1``."""
    if (isinstance(world, bool) or not isinstance(world, int) or world < 1
            or isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world):
        raise InvalidArgument(f"tensor-parallel shard {rank!r} of {world!r}: need 0 <= rank < world")
    return model_id if world == 1 else f"{model_id}#tp{rank}/{world}"


def chain_keys(seed: bytes, data: bytes, block_size: int) -> list[bytes]:
    """Chained keys over ``data`` (int32le token ids); trailing partial block ignored."""
    if len(seed) != KEY_BYTES:
        raise InvalidArgument(f"namespace seed must be {KEY_BYTES} bytes, got {len(seed)}")
    step = block_size * 4
    n = len(data) // step
    if n >= _NATIVE_MIN_BLOCKS and step <= native_chain_module.MAX_STEP:
        native = native_chain_module.native_chain(_chain_reference)
        if native is not None:
            return native(bytes(seed), bytes(data), n, step)
    return _chain_reference(seed, data, n, step)


def _chain_reference(seed: bytes, data: bytes, n: int, step: int) -> list[bytes]:
    """The keys of the first ``n`` blocks of ``step`` bytes of ``data``, in Python."""
    keys: list[bytes] = []
    parent = seed
    for off in range(0, n * step, step):
        parent = _h128(parent + data[off : off + step])
        keys.append(parent)
    return keys


def token_bytes(token_ids: Any) -> bytes:
    """Token ids (list, tuple, array, numpy or CPU torch tensor of ints) -> int32le bytes.

    Raises InvalidArgument for negative ids, ids that do not fit int32, non-integers or a
    non-1-D input.
    """
    if isinstance(token_ids, (bytes, bytearray, memoryview)):
        raise InvalidArgument(
            "token_ids must be a sequence of ints, not raw bytes",
            hint="pass a list or a 1-D integer array of token ids",
        )
    if hasattr(token_ids, "numpy") and hasattr(token_ids, "device"):  # torch.Tensor
        token_ids = token_ids.detach().cpu().numpy()
    if isinstance(token_ids, np.ndarray):
        if token_ids.ndim != 1 or not np.issubdtype(token_ids.dtype, np.integer):
            raise InvalidArgument(
                f"token_ids must be a 1-D integer array, got shape {token_ids.shape} "
                f"dtype {token_ids.dtype}"
            )
        if token_ids.size and (token_ids.min() < 0 or token_ids.max() > _MAX_TOKEN_ID):
            raise InvalidArgument(
                f"token ids must lie in [0, {_MAX_TOKEN_ID}], got range "
                f"[{token_ids.min()}, {token_ids.max()}]"
            )
        return np.ascontiguousarray(token_ids, dtype="<i4").tobytes()
    if not isinstance(token_ids, Sequence) and not isinstance(token_ids, array.array):
        raise InvalidArgument(f"token_ids must be a sequence of ints, got {type(token_ids).__name__}")
    if (type(token_ids) is array.array and token_ids.typecode == "I" and token_ids.itemsize == 4
            and sys.byteorder == "little"):  # the runtime's own ids: no copy
        n = len(token_ids)
        # the builtin max for a block's few ids, numpy's (no int objects) for a prompt's
        top = 0 if not n else (max(token_ids) if n <= 64
                               else int(np.frombuffer(token_ids, dtype=np.uint32).max()))
        if top > _MAX_TOKEN_ID:
            raise InvalidArgument(f"token ids must lie in [0, {_MAX_TOKEN_ID}], got {top}")
        return token_ids.tobytes()
    try:
        # 'I' (unsigned) rejects negative ids and non-integers in C, without a Python loop.
        arr = array.array("I", token_ids)
    except (TypeError, OverflowError) as exc:
        raise InvalidArgument(
            f"token ids must be ints in [0, {_MAX_TOKEN_ID}]: {exc}",
            hint="check the tokenizer output",
        ) from None
    if arr.itemsize != 4:  # pragma: no cover - every supported platform has a 4-byte C int
        return token_bytes(np.asarray(arr, dtype=np.int64))
    view = np.frombuffer(arr, dtype=np.uint32)
    if view.size and int(view.max()) > _MAX_TOKEN_ID:
        raise InvalidArgument(f"token ids must lie in [0, {_MAX_TOKEN_ID}], got {int(view.max())}")
    return view.astype("<u4", copy=False).tobytes()


def pack_keys(keys: Sequence[bytes]) -> bytes:
    """``keys`` (checked: 16-byte bytes each) as one byte string, for a wire format."""
    return b"".join(keys)


class CheckedKeys(tuple):  # type: ignore[type-arg]
    """Block keys known to be 16-byte ``bytes`` when they were made (by :func:`unpack_keys`):
    :func:`~kvstore.tiers.base.check_keys` passes them without a look (a 2048-key lookup
    through the daemon saves a pass). A tuple: no bad key can be put into one later."""

    __slots__ = ()


def unpack_keys(packed: bytes, *, limit: int | None = None) -> CheckedKeys:
    """The keys of :func:`pack_keys`'s ``packed``; InvalidArgument if its length is not a
    whole number of keys, or (with ``limit``) it holds more than ``limit``."""
    if len(packed) % KEY_BYTES:
        raise InvalidArgument(f"packed keys are {len(packed)} bytes, not a multiple of "
                              f"{KEY_BYTES}", hint="concatenate 16-byte block keys")
    n = len(packed) // KEY_BYTES
    if limit is not None and n > limit:
        raise InvalidArgument(f"{n} keys in one call; the limit is {limit}", hint="split the call")
    # numpy's 16-byte void items come back as bytes objects of exactly 16 bytes (NULs kept):
    # a C loop, where slicing in Python costs ~5x as much for a 2048-key prompt
    return CheckedKeys(np.frombuffer(packed, f"V{KEY_BYTES}").tolist())
