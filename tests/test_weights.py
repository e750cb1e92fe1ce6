"""The weights digest (docs/keys.md, "Weights digest"): defined byte for byte, and it sees edits."""

from __future__ import annotations

import hashlib
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

from kvtier.weights import sample_offsets, weights_digest


def tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    big = torch.randn(300, 100, generator=gen)  # 120,000 bytes: sampled
    odd = torch.randn(5, 3, generator=gen).to(torch.bfloat16)  # 30 bytes: nbytes % 8 == 6
    base = torch.randn(70, generator=gen)
    shifted = base[1:]  # storage offset 4 bytes: not 8-byte aligned
    return {"layer.big": big, "a.odd": odd, "b.shifted": shifted, "c.int": torch.arange(9)}


def by_the_doc(named: dict[str, torch.Tensor]) -> str:
    """docs/keys.md written out with hashlib, struct and numpy."""

    def lp(b: bytes) -> bytes:
        return struct.pack("<I", len(b)) + b

    h = hashlib.sha256(b"kvtier/weights/v1" + struct.pack("<I", len(named)))
    for name in sorted(named):
        t = named[name]
        data = t.contiguous().view(torch.uint8).numpy().tobytes()
        n = len(data)
        words = np.frombuffer(data[: n - n % 8], dtype="<i8")
        total = sum(int(w) for w in words) % 2**64
        if n <= 65536:
            sample = data
        else:
            sample = b"".join(data[i * (n - 1024) // 63 :][:1024] for i in range(64))
        h.update(lp(name.encode()) + lp(str(t.dtype).removeprefix("torch.").encode()))
        h.update(lp(struct.pack(f"<{t.dim()}Q", *t.shape)) + struct.pack("<QQ", n, total))
        h.update(lp(sample))
    return h.hexdigest()


def test_digest_matches_the_documented_definition() -> None:
    named = tensors()
    assert weights_digest(named.items()) == by_the_doc(named)
    assert weights_digest(reversed(list(named.items()))) == by_the_doc(named), "name order"


def test_sample_offsets_cover_first_and_last_kib() -> None:
    assert sample_offsets(65536) == [0]
    offsets = sample_offsets(120_000)
    assert len(offsets) == 64
    assert offsets[0] == 0 and offsets[-1] == 120_000 - 1024
    assert offsets[1] == (120_000 - 1024) // 63


@pytest.mark.parametrize(
    "edit",
    [
        "element_outside_the_sample",
        "element_in_the_sample",
        "tail_bytes",
        "dtype",
        "shape",
        "name",
        "dense",
    ],
)
def test_every_kind_of_edit_changes_the_digest(edit: str) -> None:
    named = tensors()
    before = weights_digest(named.items())
    big = named["layer.big"].clone()
    offsets = sample_offsets(big.numel() * 4)
    gap = (offsets[0] + 1024 + offsets[1]) // 2 // 4  # a float between two windows
    if edit == "element_outside_the_sample":
        big.view(-1)[gap] += 1.0
        named["layer.big"] = big
    elif edit == "element_in_the_sample":
        big.view(-1)[0] = -big.view(-1)[0]
        named["layer.big"] = big
    elif edit == "tail_bytes":  # the 6 bytes the 64-bit sum leaves out
        odd = named["a.odd"].clone()
        odd.view(-1)[-1] += 1
        named["a.odd"] = odd
    elif edit == "dtype":
        named["c.int"] = named["c.int"].to(torch.int32)
    elif edit == "shape":
        named["layer.big"] = big.reshape(100, 300)
    elif edit == "name":
        named["layer.bigger"] = named.pop("layer.big")
    else:  # a fine-tune: every weight moves a little
        named["layer.big"] = big + 1e-3 * torch.randn_like(big)
    assert weights_digest(named.items()) != before
    assert weights_digest(named.items()) == by_the_doc(named)


def test_a_name_given_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        weights_digest([("w", torch.zeros(2)), ("w", torch.ones(2))])


def test_digest_is_stable_across_processes() -> None:
    code = (
        "import torch; from tests.test_weights import tensors;"
        "from kvtier.weights import weights_digest;"
        "print(weights_digest(tensors().items()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "321", "PYTHONPATH": ":".join(sys.path)},
    )
    assert out.stdout.strip() == weights_digest(tensors().items())
