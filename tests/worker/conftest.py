"""Fixtures for the worker tests: KV caches in every layout, filled with random bytes.

Everything runs on CPU tensors standing in for GPU memory; cases marked ``cuda`` run
the same checks on a GPU when one is present.
"""

from __future__ import annotations

import os
import shlex
import shutil

import numpy as np
import pytest
import torch

from kvtier.worker import KVLayout, rowcopy

LAYOUTS = list(KVLayout)
DTYPES = [torch.float16, torch.bfloat16, torch.uint8]
GPU_BLOCK_SIZE = 4
HEADS, HEAD_DIM, LAYERS = 2, 8, 3


def random_bytes_(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Fill ``t`` with random bytes in place (every bit pattern, NaNs included)."""
    raw = t.view(-1).view(torch.uint8)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))
    return t


def make_kv(
    layout: KVLayout,
    dtype: torch.dtype,
    num_blocks: int,
    seed: int = 0,
    device: str = "cpu",
    block_size: int = GPU_BLOCK_SIZE,
) -> list[torch.Tensor]:
    """KV caches as an engine would allocate them, filled with random bytes."""
    gen = torch.Generator().manual_seed(seed)
    per_layer = (block_size, HEADS, HEAD_DIM)
    if layout is KVLayout.KV_FIRST:
        shapes = [(2, num_blocks, *per_layer)] * LAYERS
    elif layout is KVLayout.BLOCKS_FIRST:
        shapes = [(num_blocks, 2, *per_layer)] * LAYERS
    else:
        shapes = [(num_blocks, LAYERS, 2, *per_layer)]
    out = []
    for shape in shapes:
        t = random_bytes_(torch.empty(shape, dtype=dtype), gen)
        out.append(t.to(device))
    return out


def gpu_page(tensors: list[torch.Tensor], layout: KVLayout, block: int) -> np.ndarray:
    """The page of one GPU block, assembled from the tensors' own indexing (not kv_view)."""
    parts = []
    for t in tensors:
        pieces = [t[0, block], t[1, block]] if layout is KVLayout.KV_FIRST else [t[block]]
        parts += [p.contiguous().cpu().view(-1).view(torch.uint8).numpy() for p in pieces]
    return np.concatenate(parts)


def all_pages(tensors: list[torch.Tensor], layout: KVLayout) -> np.ndarray:
    """Every GPU page as a ``(num_blocks, page_bytes)`` array (a copy)."""
    n = tensors[0].shape[1 if layout is KVLayout.KV_FIRST else 0]
    return np.stack([gpu_page(tensors, layout, b) for b in range(n)])


DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
        ],
    ),
]


def require_native() -> rowcopy.NativeRowCopier:
    """The compiled row copier; skips (saying why) only where it cannot have been built.

    The extension is built when kvtier is installed, and only where a C compiler is.
    With a compiler on PATH and no usable extension the test fails: the native path's
    tests must not skip silently where they can run (CI installs gcc before kvtier).
    """
    native = rowcopy.native_row_copier()
    if native is not None:
        return native
    cc = os.environ.get("CC") or "cc"
    if shutil.which(shlex.split(cc)[0]) is None:
        pytest.skip(f"no C compiler ({cc!r} is not on PATH): the row copier was not built")
    pytest.fail(
        f"{cc} is on PATH but {rowcopy.EXTENSION} is not usable: build it with "
        "`pip install -e .` (or `python -c 'from setuptools import setup; setup()' "
        "build_ext --inplace`)"
    )
