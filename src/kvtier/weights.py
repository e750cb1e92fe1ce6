"""The weights digest: which weights computed a block's KV (part of the model fingerprint).

Runs where the model is loaded (the engine process, or each worker for its own shard),
on the weights' device; imports torch. Called once at load. The definition is in
``docs/keys.md`` ("Weights digest"); any change to the bytes hashed here is a new key
format version.

Two models with the same architecture and config but other weights (a fine-tune saved
under the same name, another random init, a new revision in the same directory) compute
other KV for the same tokens, so they must never share blocks. Hashing every byte of a
70B checkpoint at load would cost minutes; the digest instead covers, for every tensor:

- its name, dtype and shape (exactly);
- the wrapping 64-bit sum of its bytes read as 8-byte little-endian signed integers
  (the last ``nbytes mod 8`` bytes, which lie in the last sampled window, are left
  out): exact, independent of summation order and device, and it sees every element,
  so a change to one element (and any dense change, as a fine-tune makes) changes it;
- a fixed sample of its bytes: 64 windows of 1 KiB spread evenly over the tensor (the
  whole tensor when it has at most 64 KiB).

Everything is hashed with SHA-256; the result is its hex digest. It does not depend on
the process, the device or ``PYTHONHASHSEED``; it does depend on the dtype the weights
are held in (a model cast to bfloat16 is another model, and computes other KV).
Hosts are little-endian (every platform torch runs on); bytes are read as they lie in
memory.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable

import torch

WEIGHTS_DIGEST_VERSION = 1
_TAG = b"kvtier/weights/v1"
SAMPLE_WINDOWS = 64
"""Byte windows sampled per tensor."""
WINDOW_BYTES = 1024
"""Bytes per window."""


def _lp(data: bytes) -> bytes:
    return struct.pack("<I", len(data)) + data


def sample_offsets(nbytes: int) -> list[int]:
    """Start offsets of the sampled windows of a tensor of ``nbytes`` bytes.

    ``[0]`` with one window of the whole tensor when ``nbytes <= 64 KiB``; else
    ``floor(i * (nbytes - 1024) / 63)`` for ``i`` in ``0 .. 63`` (first and last KiB
    included).
    """
    if nbytes <= SAMPLE_WINDOWS * WINDOW_BYTES:
        return [0]
    last = nbytes - WINDOW_BYTES
    return [i * last // (SAMPLE_WINDOWS - 1) for i in range(SAMPLE_WINDOWS)]


def _tensor_record(name: str, tensor: torch.Tensor) -> bytes:
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    nbytes = raw.numel()
    whole = raw[: nbytes - nbytes % 8]
    if whole.storage_offset() % 8:
        whole = whole.clone()  # an int64 view needs 8-byte aligned storage
    # int64 sums run at memory speed; an int32 -> int64 widening sum runs 37x slower.
    total = int(whole.view(torch.int64).sum().item()) & (2**64 - 1)
    offsets = sample_offsets(nbytes)
    if offsets == [0]:
        sample = raw
    else:
        index = torch.tensor(offsets, device=raw.device).unsqueeze(1) + torch.arange(
            WINDOW_BYTES, device=raw.device
        )
        sample = raw[index.reshape(-1)]
    shape = struct.pack(f"<{len(tensor.shape)}Q", *tensor.shape)
    return (
        _lp(name.encode())
        + _lp(str(tensor.dtype).removeprefix("torch.").encode())
        + _lp(shape)
        + struct.pack("<QQ", nbytes, total)
        + _lp(sample.cpu().numpy().tobytes())
    )


def weights_digest(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """SHA-256 hex digest of named tensors (a ``state_dict``'s items), in name order.

    Args:
        named_tensors: ``(name, tensor)`` pairs; each name at most once.

    Raises:
        ValueError: a name appears twice.
    """
    tensors = dict[str, torch.Tensor]()
    for name, tensor in named_tensors:
        if name in tensors:
            raise ValueError(f"tensor {name!r} appears twice")
        tensors[name] = tensor
    h = hashlib.sha256(_TAG + struct.pack("<I", len(tensors)))
    with torch.no_grad():
        for name in sorted(tensors):
            h.update(_tensor_record(name, tensors[name]))
    return h.hexdigest()
