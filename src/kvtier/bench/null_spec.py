"""``NullOffloadingSpec``: vLLM's OffloadingConnector with a spec that keeps nothing.

The reference of ``kvtier bench vllm``'s ``connector`` configuration, run inside vLLM's
processes (loaded by ``spec_module_path``; imports vLLM). Every lookup misses, nothing
is stored and no byte moves, so a server with it pays for vLLM's connector alone --
its KV layout, its per-step bookkeeping -- and the difference between it and kvtier is
what kvtier itself costs and gains. It is a benchmark's baseline, not an offloading
tier.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from kvtier.integrations.vllm import compat


class NullManager(compat.OffloadingManager):  # type: ignore[misc]
    """Holds nothing: every lookup misses and no store is accepted."""

    def lookup(self, key: Any, req_context: Any) -> Any:
        return compat.LookupResult.MISS

    def prepare_load(self, keys: Collection[Any], req_context: Any) -> Any:
        raise AssertionError("nothing was ever a hit")

    def prepare_store(self, keys: Collection[Any], req_context: Any) -> Any:
        return None

    def on_new_request(self, req_context: Any) -> Any:
        return compat.RequestOffloadingContext()


class NullWorker(compat.OffloadingWorker):  # type: ignore[misc]
    """Is never given a job (the manager accepts none)."""

    def submit_store(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        return True

    def submit_load(
        self, job_id: int, src_spec: Any, dst_spec: Any, expedited: bool = False
    ) -> bool:
        return True

    def get_finished(self) -> list[Any]:
        return []

    def wait(self, job_ids: Iterable[int]) -> None:
        return None

    def shutdown(self) -> None:
        return None


class NullOffloadingSpec(compat.OffloadingSpec):  # type: ignore[misc]
    """See the module docstring."""

    def get_manager(self) -> NullManager:
        return NullManager()

    def get_worker(self, kv_caches: Any) -> NullWorker:
        return NullWorker()
