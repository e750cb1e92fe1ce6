"""The scheduler half as a state machine: requests admitted, loaded, stored, finished
or aborted at any point of their life, jobs finishing in any order, some failing.

The worker half is played by the test, which holds every emitted job until a rule
finishes it. After every step the tiers must say exactly what the jobs in flight
imply -- an oracle from the jobs alone, not from the scheduler half's books:

* the CPU tier's pins are the blocks of the loads and write-throughs in flight, the
  disk tier's those of the promotions in flight;
* the CPU tier's STORING blocks are those of the stores and promotions in flight, the
  disk tier's those of the write-throughs in flight;
* every tier's slots are either free or hold a block: nothing leaks;
* a request finished while jobs still use its pages (an abort mid-load included) is
  released exactly once, after its last job, and never before;
* each ``take_stats``: hits per tier are never negative and add up to the loaded blocks.

With nothing in flight at the end, no block is pinned or STORING anywhere.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvtier.blocks import BlockHash, BlockId, Medium
from kvtier.connector.scheduler_half import ConnectorScheduler
from kvtier.jobs import JobKind, TransferJob, TransferResult
from kvtier.scheduler import CPUOffloadingManager, TierManager, make_policy
from kvtier.scheduler.manager import BlockState
from kvtier.scheduler.tiering import TieredManager
from tests.budget import examples

PAGE = 4
CPU_BLOCKS = 6
DISK_BLOCKS = 12
PREFIXES = 4  # requests draw their pages from a few shared prefixes


def _keys(prefix: int, n: int) -> list[BlockHash]:
    return [BlockHash(f"p{prefix}-{i}".encode()) for i in range(n)]


class SchedulerHalfMachine(RuleBasedStateMachine):
    @initialize()
    def build(self) -> None:
        cpu = CPUOffloadingManager(num_blocks=CPU_BLOCKS, block_size=PAGE)
        disk = TierManager(
            medium=Medium.DISK,
            num_blocks=DISK_BLOCKS,
            block_size=PAGE,
            policy=make_policy("lru", DISK_BLOCKS),
        )
        self.cpu, self.disk = cpu, disk
        self.half = ConnectorScheduler(
            TieredManager(cpu, [disk]), block_size_factor=1, gpu_block_size=PAGE
        )
        self.jobs: dict[int, TransferJob] = {}
        self.live: dict[str, list[BlockHash]] = {}  # requests not yet finished
        self.held: set[str] = set()  # finished, still used by jobs: to be released
        self.released: list[str] = []
        self.owner: dict[BlockId, str] = {}  # GPU page -> the request it belongs to
        self.next_id = 0

    # -- the engine ------------------------------------------------------------------

    def _take(self) -> None:
        for job in self.half.take_jobs():
            self.jobs[job.job_id] = job

    @rule(prefix=st.integers(0, PREFIXES - 1), pages=st.integers(1, 5), gpu_hit=st.integers(0, 2))
    def admit(self, prefix: int, pages: int, gpu_hit: int) -> None:
        """A new request: look it up, load what is offloaded, store what is not."""
        rid = f"r{self.next_id}"
        self.next_id += 1
        keys = _keys(prefix, pages)
        g = min(gpu_hit, pages - 1)
        hit = self.half.num_external_hit_pages(rid, keys, g, pages * PAGE + 1)
        assert hit is not None  # no shared tier: never "ask again"
        assert 0 <= hit <= pages - g
        self.live[rid] = keys
        base = 1000 * self.next_id  # the request's own GPU pages
        pages_of = [BlockId(base + i) for i in range(pages)]
        self.owner.update(dict.fromkeys(pages_of, rid))
        if hit:
            self.half.start_load(rid, keys, g, pages_of[g : g + hit])
        self.half.pages_full(rid, keys, pages, pages_of)
        self._take()

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def finish_request(self, data: st.DataObject) -> None:
        """A request ends -- done, or aborted with its load or stores in flight."""
        rid = data.draw(st.sampled_from(sorted(self.live)))
        del self.live[rid]
        if self.half.request_finished(rid):
            self.held.add(rid)
        self._take()

    @precondition(lambda self: self.jobs)
    @rule(data=st.data(), ok=st.booleans())
    def finish_jobs(self, data: st.DataObject, ok: bool) -> None:
        """Some jobs finish, in any order; with ``ok`` False one of them fails."""
        ids = data.draw(st.lists(st.sampled_from(sorted(self.jobs)), min_size=1, unique=True))
        results = []
        for i, job_id in enumerate(ids):
            self.jobs.pop(job_id)
            success = ok or i > 0
            results.append(TransferResult(job_id, success, 0, 0.0, None if success else "x"))
        progress = self.half.on_finished(results)
        self._released(progress.released)
        self._take()

    @rule()
    def poll(self) -> None:
        """A step with no job finished (loads with nothing to load report here)."""
        self._released(self.half.on_finished([]).released)
        self._take()

    def _released(self, ids: tuple[str, ...]) -> None:
        for rid in ids:
            assert rid in self.held, f"{rid} released but never held (or twice)"
            self.held.discard(rid)
            self.released.append(rid)

    # -- the oracle ------------------------------------------------------------------

    def _resident(self, tier: TierManager) -> list[BlockHash]:
        return tier.keys()

    def _blocks(self, *kinds: JobKind, side: str) -> int:
        return sum(
            len(getattr(j, side).block_ids)  # type: ignore[attr-defined]
            for j in self.jobs.values()
            if j.kind in kinds
        )

    @invariant()
    def pins_and_storing_blocks_are_what_the_jobs_in_flight_hold(self) -> None:
        cpu_pins = sum(self.cpu.pins(k) for k in self._resident(self.cpu))
        disk_pins = sum(self.disk.pins(k) for k in self._resident(self.disk))
        assert cpu_pins == self._blocks(JobKind.LOAD, JobKind.WRITE, side="src")
        assert disk_pins == self._blocks(JobKind.PROMOTE, side="src")
        storing = BlockState.STORING
        cpu_storing = sum(self.cpu.state(k) is storing for k in self._resident(self.cpu))
        disk_storing = sum(self.disk.state(k) is storing for k in self._resident(self.disk))
        assert cpu_storing == self._blocks(JobKind.STORE, JobKind.PROMOTE, side="dst")
        assert disk_storing == self._blocks(JobKind.WRITE, side="dst")

    @invariant()
    def no_job_uses_the_pages_of_a_request_the_engine_has_freed(self) -> None:
        """A request is freed when it finished and was not held, or once released; a
        load into its pages after that would overwrite another request's KV."""
        for job in self.jobs.values():
            gpu = job.dst if job.kind is JobKind.LOAD else job.src
            if job.kind in (JobKind.LOAD, JobKind.STORE):
                for page in gpu.block_ids:  # type: ignore[attr-defined]
                    rid = self.owner[page]
                    assert rid in self.live or rid in self.held, f"{job.kind} into freed {rid}"

    @invariant()
    def no_slot_leaks(self) -> None:
        for tier in (self.cpu, self.disk):
            assert tier.num_free + len(tier) == tier.num_blocks

    @invariant()
    def hits_add_up_to_the_loaded_blocks(self) -> None:
        stats = self.half.take_stats()
        assert all(n > 0 for n in stats.hit_blocks.values()), stats.hit_blocks
        assert sum(stats.hit_blocks.values()) == stats.loaded_blocks

    def teardown(self) -> None:
        # Drain: every job succeeds, every request ends; then nothing may be held.
        for _ in range(10):
            for rid in sorted(self.live):
                del self.live[rid]
                if self.half.request_finished(rid):
                    self.held.add(rid)
            self._take()
            results = [TransferResult(i, True, 0, 0.0) for i in sorted(self.jobs)]
            self.jobs.clear()
            self._released(self.half.on_finished(results).released)
            self._take()
            if not self.jobs and not self.half.has_pending_work:
                break
        assert not self.jobs and not self.held, (self.jobs, self.held)
        for tier in (self.cpu, self.disk):
            assert all(tier.pins(k) == 0 for k in self._resident(tier))
            assert all(tier.state(k) is BlockState.READY for k in self._resident(tier))


SchedulerHalfMachine.TestCase.settings = settings(
    max_examples=examples(150), stateful_step_count=40
)
test_scheduler_half_state_machine = SchedulerHalfMachine.TestCase
