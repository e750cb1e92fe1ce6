"""The CPU<->remote handlers as a Hypothesis state machine, against a real redis-server
and a plain dict of what each key should hold.

Rules store jobs of distinct keys, load jobs (several in flight at once, over two
connections with small windows, so a job's values cross connections and jobs end out
of order), and spoil values on the server behind the handlers' back (a flipped byte, a
wrong length, a deletion). After each step every job is reported once, in submission
order; a load succeeds exactly when every key of it holds a verified value in the
model, its pages then hold exactly the bytes stored, and the page of a key that was
spoiled or missing is zeroed (never plausible bytes).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from kvtier.blocks import BlockHash, BlockId
from kvtier.load_store_specs import CPULoadStoreSpec, RemoteLoadStoreSpec
from kvtier.media import remote_mux, remote_values
from kvtier.media.remote import RemoteOptions, RemoteStore
from kvtier.worker.cpu_remote import CpuRemoteOffloadingHandlers
from kvtier.worker.handler import TransferResult

from ..redis_server import RedisServer

FP = b"\x3c" * 32
BLOCK = 2048
KEYS = 6
ROWS = 24


def key(i: int) -> BlockHash:
    return BlockHash(bytes([i + 1]) * 32)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    s = RedisServer(Path(tmp_path_factory.mktemp("redis"))).start()
    yield s
    s.stop()


class RemoteHandlers(RuleBasedStateMachine):
    server: RedisServer

    def __init__(self) -> None:
        super().__init__()
        with self.server.client() as c:
            c.flushall()
        self.store = RemoteStore.open(
            FP, RemoteOptions(url=self.server.url, timeout_s=30.0), environ={}
        )
        self.pages = torch.zeros(ROWS, BLOCK, dtype=torch.uint8)
        self.handlers = CpuRemoteOffloadingHandlers(self.pages, self.store, io_threads=2)
        self.model: dict[int, bytes] = {}  # key -> the payload it verifiably holds
        self.job = 0
        self.seed = 0

    def teardown(self) -> None:
        self.handlers.shutdown()
        self.store.close()

    def _run(self, handler: object, specs: list[tuple[object, object]]) -> list[TransferResult]:
        ids = []
        for spec in specs:
            self.job += 1
            assert handler.transfer_async(self.job, spec)  # type: ignore[attr-defined]
            ids.append(self.job)
        handler.wait(ids)  # type: ignore[attr-defined]
        results: list[TransferResult] = handler.get_finished()  # type: ignore[attr-defined]
        assert [r.job_id for r in results] == ids
        return results

    @rule(
        keys=st.lists(st.integers(0, KEYS - 1), min_size=1, max_size=KEYS, unique=True),
        split=st.integers(1, 3),
    )
    def store(self, keys: list[int], split: int) -> None:
        rows = list(range(len(keys)))
        for r in rows:
            self.seed += 1
            self.pages[r] = torch.from_numpy(
                np.random.default_rng(self.seed).integers(0, 256, BLOCK, dtype=np.uint8)
            )
        specs = []
        for part in np.array_split(np.arange(len(keys)), split):
            if len(part):
                ids = tuple(BlockId(int(r)) for r in part)
                remote = RemoteLoadStoreSpec(ids, tuple(key(keys[int(r)]) for r in part))
                specs.append((CPULoadStoreSpec(ids), remote))
        results = self._run(self.handlers.cpu_to_remote_handler, specs)
        assert all(r.success for r in results), results
        for k, r in zip(keys, rows, strict=True):
            self.model[k] = self.pages[r].numpy().tobytes()

    @rule(
        jobs=st.lists(
            st.lists(st.integers(0, KEYS - 1), min_size=1, max_size=4), min_size=1, max_size=4
        )
    )
    def load(self, jobs: list[list[int]]) -> None:
        self.pages[8:].fill_(0xAB)
        specs, rows, row = [], [], 8
        for keys in jobs:
            mine = list(range(row, row + len(keys)))
            row += len(keys)
            ids = tuple(BlockId(r) for r in mine)
            specs.append(
                (RemoteLoadStoreSpec(ids, tuple(key(k) for k in keys)), CPULoadStoreSpec(ids))
            )
            rows.append(mine)
        results = self._run(self.handlers.remote_to_cpu_handler, specs)
        for keys, mine, result in zip(jobs, rows, results, strict=True):
            assert result.success == all(k in self.model for k in keys), result
            for k, r in zip(keys, mine, strict=True):
                got = self.pages[r].numpy().tobytes()
                if k in self.model:
                    assert got == self.model[k]
                else:
                    assert got == bytes(BLOCK)

    @precondition(lambda self: bool(self.model))
    @rule(pick=st.integers(0, KEYS - 1), how=st.sampled_from(["flip", "short", "delete"]))
    def spoil(self, pick: int, how: str) -> None:
        """Spoil a value the model holds (behind the handlers' back), then load it."""
        k = sorted(self.model)[pick % len(self.model)]
        name = self.store.redis_key(key(k))
        with self.server.client() as c:
            if how == "flip":
                value = c.get(name)
                assert value is not None
                c.setrange(name, len(value) - 1 - pick, bytes([value[-1 - pick] ^ 1]))
            elif how == "short":
                c.set(name, b"x" * 100)
            else:
                c.delete(name)
        del self.model[k]
        self.load([[k, *sorted(self.model)[:3]]])

    @invariant()
    def healthy(self) -> None:
        assert self.store.healthy


def test_handlers_against_a_model(server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote_values, "WINDOW_BYTES", 2 * BLOCK)
    monkeypatch.setattr(remote_mux, "STORE_WINDOW_BYTES", 2 * BLOCK)
    RemoteHandlers.server = server
    run_state_machine_as_test(
        RemoteHandlers, settings=settings(max_examples=25, stateful_step_count=12)
    )
