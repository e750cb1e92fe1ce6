"""A planted bug: kvtier's spec with one KV cache group's loads misaligned.

The bug users of offloading report on hybrid models is silently wrong output from a
misaligned group -- a sliding window loaded one block off, a Mamba state taken from
another position -- with every byte intact. ``MisalignedSpec`` plants it: the loads of
group ``misalign_group`` (a ``kv_connector_extra_config`` key of this spec only) are
shifted one block towards the prompt's start: each GPU block of the group gets the
bytes of the group's block before it in the load (the first keeps its own), and a load
of one block of the group (a state, or a one-block window) gets the bytes of another
block of the group the CPU tier holds (the request's nearest, else another request's:
vLLM keeps one Mamba state per request, at its last full block). A shift, not a
rotation: attention over a window is a sum over its keys, so a window's blocks
loaded in another order would give the same tokens. vLLM loads this spec by module
path like the real one (``spec_module_path: tests.integrations.vllm_misaligned``).
The engine tests check that it changes the tokens: then their equality checks would
see it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

from kvtier.blocks import BlockHash
from kvtier.integrations.vllm import compat
from kvtier.integrations.vllm.manager import KvtierManager
from kvtier.integrations.vllm.requests import group_of
from kvtier.integrations.vllm.spec import KvtierOffloadingSpec
from kvtier.scheduler.manager import BlockState


class MisalignedManager(KvtierManager):
    """``KvtierManager`` whose loads of ``misalign_group`` read the wrong blocks."""

    misalign_group: int

    def prepare_load(self, keys: Collection[Any], req_context: Any) -> Any:
        """Pins the blocks asked for, as the real manager does; says where other
        blocks of the group are."""
        spec = super().prepare_load(keys, req_context)
        ks = [BlockHash(bytes(k)) for k in keys]
        ids = [int(b) for b in spec.block_ids]
        mine = [i for i, k in enumerate(ks) if group_of(k) == self.misalign_group]
        wrong = list(ids)
        for i, j in zip(mine[1:], mine[:-1], strict=True):  # a window, one block early
            wrong[i] = ids[j]
        if len(mine) == 1:  # one block: another position's
            wrong[mine[0]] = self._other_position(ks[mine[0]], req_context, ids[mine[0]])
        return compat.CPULoadStoreSpec(wrong)

    def _other_position(self, key: BlockHash, req_context: Any, own: int) -> int:
        """The slot of the group's block nearest ``key`` in its request that the CPU
        tier holds, else of any other block of the group it holds (vLLM keeps one
        Mamba state per request: the one at its last block)."""
        request = self._keys.of(req_context, key)
        at = request.index(key)
        nearest = sorted(range(len(request.keys)), key=lambda i: abs(i - at))[1:]
        others = sorted(self.cpu.keys(), key=lambda k: self.cpu.slot(k) or 0)
        for other in [*(request.keys[i] for i in nearest), *others]:
            slot = self.cpu.slot(other)
            if (
                other != key
                and group_of(other) == self.misalign_group
                and slot is not None
                and self.cpu.state(other) is BlockState.READY
            ):
                return int(slot)
        raise AssertionError("the CPU tier holds no other block of the misaligned group")


class MisalignedSpec(KvtierOffloadingSpec):
    """``KvtierOffloadingSpec`` with ``MisalignedManager`` (see the module doc)."""

    def __init__(self, config: Any) -> None:
        extra = dict(config.extra_config)
        self._misalign_group = int(extra.pop("misalign_group"))
        super().__init__(dataclasses.replace(config, extra_config=extra))

    def get_manager(self) -> KvtierManager:
        manager = super().get_manager()
        if not isinstance(manager, MisalignedManager):
            manager.__class__ = MisalignedManager  # the real manager, one method planted
            assert isinstance(manager, MisalignedManager)
            manager.misalign_group = self._misalign_group
        return manager
