"""Which weights a vLLM engine serves, as far as its scheduler process can tell.

Runs where the spec is built (EngineCore and each worker), before any weights are
loaded; pure Python, no vLLM import. vLLM gives an offloading spec the model's name
(``OffloadingModelConfig.name``: a local path, or a Hugging Face id that vLLM resolved
from its local cache) and the dtype, not the weights. Two checkpoints of one
architecture under one name -- a fine-tune written over the base model's directory, a
new revision -- compute other KV for the same tokens, so the name alone must not name
stored blocks (the bug kvtier's own engine fixed with ``kvtier.weights``).

``checkpoint_digest(name)`` digests the checkpoint's files instead: for every regular
file of the model directory (sorted by name; hidden files and subdirectories left
out), its name, its size and a sample of its bytes -- ``SAMPLE_WINDOWS`` windows of
``WINDOW_BYTES`` spread evenly over the file (the whole file when it is no larger).
A fine-tune changes nearly every byte of every weight file, so it changes the sampled
windows; a copy of the checkpoint on another machine (other paths, other mtimes) has
the same digest, so engines on many machines share Redis. It reads
``SAMPLE_WINDOWS x WINDOW_BYTES`` bytes per file at most (256 KiB), whatever the
model's size.

A name that is not a local path is looked up in the Hugging Face cache
(``huggingface_hub``, local files only, never the network); its snapshot directory
is digested. When neither finds files the digest is empty and identity rests on the
name and the user's ``model_identity`` key (``docs/vllm.md``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
from pathlib import Path

logger = logging.getLogger(__name__)

SAMPLE_WINDOWS = 64
"""Byte windows sampled per file."""
WINDOW_BYTES = 4096
"""Bytes per window."""
_TAG = b"kvtier/vllm-checkpoint/v1"


def checkpoint_dir(name: str) -> Path | None:
    """The local directory (or single file) holding checkpoint ``name``, if any."""
    path = Path(name).expanduser()
    if path.is_dir() or path.is_file():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id=name, local_files_only=True))
    except Exception:  # not installed, not a repo id, not cached: nothing to digest
        return None


def checkpoint_digest(name: str) -> str:
    """SHA-256 hex digest of checkpoint ``name``'s files (see the module doc), or ``""``
    when no local files are found."""
    root = checkpoint_dir(name)
    if root is None:
        logger.warning(
            "kvtier: no local files for model %r; stored blocks are named by the model's "
            "name only -- set model_identity in kv_connector_extra_config to a value that "
            "changes with the weights (docs/vllm.md)",
            name,
        )
        return ""
    files = [root] if root.is_file() else sorted(_files(root))
    h = hashlib.sha256(_TAG)
    for path in files:
        size = path.stat().st_size
        label = path.name.encode()
        h.update(struct.pack("<IQ", len(label), size) + label)
        with open(path, "rb") as f:
            for offset in sample_offsets(size):
                f.seek(offset)
                h.update(f.read(WINDOW_BYTES))
    return h.hexdigest()


def sample_offsets(size: int) -> list[int]:
    """Start offsets of the sampled windows of a file of ``size`` bytes: ``[0]`` (one
    read of the whole file) when it fits in the windows, else ``SAMPLE_WINDOWS`` evenly
    spaced offsets from the first to the last window."""
    if size <= SAMPLE_WINDOWS * WINDOW_BYTES:
        return [0] if size <= WINDOW_BYTES else list(range(0, size, WINDOW_BYTES))
    last = size - WINDOW_BYTES
    return [i * last // (SAMPLE_WINDOWS - 1) for i in range(SAMPLE_WINDOWS)]


def _files(root: Path) -> list[Path]:
    """Regular files directly in ``root`` (symlinks followed, as the Hugging Face cache
    links its snapshots), hidden ones left out."""
    out = []
    for entry in os.scandir(root):
        if not entry.name.startswith(".") and entry.is_file(follow_symlinks=True):
            out.append(Path(entry.path))
    return out
