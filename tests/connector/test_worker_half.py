"""ConnectorWorker decides nothing: every job goes to the router as it came, results
come back as the router gave them, and shutdown goes through the spec that built the
router when there is one (a fake router records the calls; no torch)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from kvtier.connector.worker_half import ConnectorWorker
from kvtier.jobs import JobKind, TransferJob, TransferResult
from kvtier.load_store_specs import CPULoadStoreSpec, GPULoadStoreSpec


class Router:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.finished = [TransferResult(7, True, 64, 0.5)]

    def transfer_async(self, job_id: int, spec: object) -> bool:
        self.calls.append(("transfer_async", job_id, spec))
        return True

    def get_finished(self) -> list[TransferResult]:
        self.calls.append(("get_finished",))
        return self.finished

    def wait(self, job_ids: Iterable[int]) -> None:
        self.calls.append(("wait", list(job_ids)))

    def shutdown(self) -> None:
        self.calls.append(("shutdown",))


class Spec:
    def __init__(self) -> None:
        self.shut = 0

    def shutdown(self) -> None:
        self.shut += 1


def job(job_id: int, kind: JobKind) -> TransferJob:
    return TransferJob(job_id, kind, CPULoadStoreSpec((job_id,)), GPULoadStoreSpec((job_id + 1,)))


def test_jobs_reach_the_router_in_order_with_their_specs() -> None:
    router = Router()
    half = ConnectorWorker(cast(Any, router))
    jobs = [job(3, JobKind.LOAD), job(5, JobKind.STORE)]
    half.submit(jobs)
    half.submit([])
    assert router.calls == [
        ("transfer_async", 3, jobs[0].spec),
        ("transfer_async", 5, jobs[1].spec),
    ]
    assert half.get_finished() == [TransferResult(7, True, 64, 0.5)]
    half.wait(iter([3, 5]))
    assert router.calls[-2:] == [("get_finished",), ("wait", [3, 5])]


def test_shutdown_goes_through_the_spec_when_there_is_one() -> None:
    router, spec = Router(), Spec()
    ConnectorWorker(cast(Any, router), cast(Any, spec)).shutdown()
    assert (spec.shut, router.calls) == (1, [])
    alone = Router()
    ConnectorWorker(cast(Any, alone)).shutdown()
    assert alone.calls == [("shutdown",)]


def test_from_spec_builds_over_the_specs_router_and_shuts_down_through_the_spec() -> None:
    router = Router()

    class Built(Spec):
        def __init__(self) -> None:
            super().__init__()
            self.asked: list[object] = []

        def get_worker(self, kv_caches: object) -> Router:
            self.asked.append(kv_caches)
            return router

    spec, caches = Built(), [object()]
    half = ConnectorWorker.from_spec(cast(Any, spec), cast(Any, caches))
    assert spec.asked == [caches] and half.worker is cast(Any, router)
    half.shutdown()
    assert (spec.shut, router.calls) == (1, [])
