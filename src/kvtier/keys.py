"""Block keys: prefix-chained digests that name offloaded blocks (format v2).

Runs anywhere; pure Python (hashlib). The format is specified in ``docs/keys.md``;
any change to the bytes hashed here is a new format version.

A key commits to the model, the tenant and the whole token prefix::

    root    = H("kvtier/root/v2" || alg || canonical(fingerprint))
    key[0]  = H("kvtier/block/v2" || root   || tokens[0:B]  || extra[0])
    key[i]  = H("kvtier/block/v2" || key[i-1] || tokens[iB:(i+1)B] || extra[i])

Format v2 added the weights digest to the fingerprint (v1 keys of two models with the
same config but other weights were equal).

Token ids are encoded as unsigned 32-bit little endian, each part is length-prefixed,
so no two different inputs hash the same bytes. Python's ``hash()`` is never used:
keys are stable across processes and machines, which is what lets engines share a
remote tier, and what keeps two models or two tenants from ever sharing a block.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from kvtier.blocks import BlockHash
from kvtier.errors import ConfigError

KEY_FORMAT_VERSION = 2
_ROOT_TAG = b"kvtier/root/v2"
_BLOCK_TAG = b"kvtier/block/v2"
_MAX_TOKEN = 2**32 - 1

HASH_ALGORITHMS: dict[str, Callable[[bytes], bytes]] = {
    "sha256": lambda data: hashlib.sha256(data).digest(),
    "blake2b": lambda data: hashlib.blake2b(data, digest_size=32).digest(),
}


@dataclass(frozen=True, slots=True)
class ModelFingerprint:
    """What must match for two engines to share KV bytes.

    Attributes:
        model_id: model identity: name (path or class) and a digest of the config.
        dtype: KV cache dtype, e.g. ``"float16"``.
        kv_layout: how a block's bytes are laid out (layers, heads, head size, order).
        block_size: tokens per offloaded block.
        parallel: tensor/pipeline-parallel layout and this worker's rank, e.g.
            ``"tp1/rank0"``; shards of different ranks must never mix.
        extra: anything else that changes the KV bytes (sorted ``(name, value)`` pairs).
        weights: digest of the weights this worker holds (``kvtier.weights``; for a
            sharded model, of this rank's shard). Empty only when ``model_id`` alone
            names the weights exactly (an immutable revision): then two checkpoints
            under one name would share blocks, so engines should always set it.
    """

    model_id: str
    dtype: str
    kv_layout: str
    block_size: int
    parallel: str = "tp1/rank0"
    extra: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    weights: str = ""

    def canonical(self) -> bytes:
        """The fingerprint as canonical JSON bytes (sorted keys, no spaces)."""
        data = asdict(self)
        data["extra"] = sorted([list(pair) for pair in self.extra])
        return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class BlockExtras:
    """Extra identity hashed into a block: tenant, adapter, multimodal inputs.

    Attributes:
        cache_salt: a tenant's secret salt; blocks of different salts never match.
        lora_name: the LoRA adapter that produced the KV, if any.
        mm_hashes: digests of multimodal inputs whose placeholders lie in the block.
    """

    cache_salt: str | None = None
    lora_name: str | None = None
    mm_hashes: tuple[str, ...] = ()

    def encode(self) -> bytes:
        """Length-prefixed encoding; empty extras encode as a single zero count."""
        parts = [
            b"s" + self.cache_salt.encode() if self.cache_salt is not None else None,
            b"l" + self.lora_name.encode() if self.lora_name is not None else None,
            *(b"m" + h.encode() for h in self.mm_hashes),
        ]
        present = [p for p in parts if p is not None]
        return struct.pack("<I", len(present)) + b"".join(_lp(p) for p in present)


NO_EXTRAS = BlockExtras()


def _lp(data: bytes) -> bytes:
    return struct.pack("<I", len(data)) + data


def _check_algorithm(algorithm: str) -> Callable[[bytes], bytes]:
    try:
        return HASH_ALGORITHMS[algorithm]
    except KeyError:
        raise ConfigError(
            "hash_algorithm",
            f"unknown algorithm {algorithm!r}; choose one of {', '.join(HASH_ALGORITHMS)}",
        ) from None


def root_key(fingerprint: ModelFingerprint, algorithm: str = "sha256") -> BlockHash:
    """The parent of every first block of this model (format v2)."""
    digest = _check_algorithm(algorithm)
    return BlockHash(digest(_ROOT_TAG + _lp(algorithm.encode()) + _lp(fingerprint.canonical())))


def block_key(
    parent: bytes,
    token_ids: Sequence[int],
    extras: BlockExtras = NO_EXTRAS,
    algorithm: str = "sha256",
) -> BlockHash:
    """The key of one block given its parent's key (format v2).

    Raises:
        ValueError: a token id is outside ``0 .. 2**32 - 1``.
    """
    digest = _check_algorithm(algorithm)
    try:
        tokens = struct.pack(f"<{len(token_ids)}I", *token_ids)
    except struct.error:
        bad = next(t for t in token_ids if not 0 <= t <= _MAX_TOKEN)
        raise ValueError(f"token id {bad} is outside 0..{_MAX_TOKEN}") from None
    return BlockHash(digest(_BLOCK_TAG + _lp(parent) + _lp(tokens) + extras.encode()))


class BlockHasher:
    """Hashes token sequences into block keys for one model and block size.

    Example::

        hasher = BlockHasher(fingerprint)           # block size from the fingerprint
        keys = hasher.hash_prompt(token_ids, cache_salt="tenant-a")

    Only full blocks get keys; a trailing partial block has none.
    """

    def __init__(self, fingerprint: ModelFingerprint, algorithm: str = "sha256") -> None:
        if fingerprint.block_size <= 0:
            raise ConfigError("block_size", f"must be positive, got {fingerprint.block_size}")
        self.fingerprint = fingerprint
        self.algorithm = algorithm
        self.block_size = fingerprint.block_size
        self.root = root_key(fingerprint, algorithm)

    def hash_prompt(
        self,
        token_ids: Sequence[int],
        cache_salt: str | None = None,
        lora_name: str | None = None,
        parent: bytes | None = None,
        start_block: int = 0,
    ) -> list[BlockHash]:
        """Keys of the full blocks of ``token_ids``.

        The tenant salt and LoRA name go into the first block of the chain (block 0)
        and so into every key after it. To extend an earlier chain, pass the last key
        as ``parent`` and the number of blocks it covered as ``start_block``.
        """
        bs = self.block_size
        keys: list[BlockHash] = []
        prev = self.root if parent is None else parent
        first = NO_EXTRAS
        if start_block == 0 and (cache_salt is not None or lora_name is not None):
            first = BlockExtras(cache_salt=cache_salt, lora_name=lora_name)
        for i in range(len(token_ids) // bs):
            extras = first if i == 0 else NO_EXTRAS
            prev = block_key(prev, token_ids[i * bs : (i + 1) * bs], extras, self.algorithm)
            keys.append(prev)
        return keys


def engine_key(key: bytes | int) -> BlockHash:
    """Accept a key computed by an engine: bytes as they are, ints as 16 bytes (LE, signed).

    Engines with their own prefix hashes (vLLM's block hashes, trace ids) pass them
    through; kvtier treats every key as opaque bytes.
    """
    if isinstance(key, bytes):
        return BlockHash(key)
    if isinstance(key, int) and not isinstance(key, bool):
        return BlockHash(key.to_bytes(16, "little", signed=True))
    raise TypeError(f"a block key is bytes or int, got {type(key).__name__}")
