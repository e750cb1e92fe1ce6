"""KV events of a real engine run, received by a real ZeroMQ subscriber.

The subscriber knows nothing of kvtier but the vLLM-compatible classes: it decodes
every batch with msgspec and rebuilds which blocks each tier holds. After every
``generate`` call that picture equals the managers' READY blocks exactly; a second
engine on the same disk announces the blocks it recovered; closing clears all.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgspec
import zmq
from transformers import PreTrainedModel

from kvtier.engine import LLM
from kvtier.observability.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)
from kvtier.observability.publisher import END_SEQ

from .engine_run import GPU_BLOCKS, PAGE, chats, disk_cfg, ready_blocks

DEADLINE_S = 30.0


class Subscriber:
    """A router's view: live batches on SUB, gaps filled by replay on a DEALER."""

    def __init__(self, endpoint: str, replay_endpoint: str) -> None:
        ctx = zmq.Context.instance()
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"kvtier")
        self.sub.connect(endpoint)
        self.replay = ctx.socket(zmq.DEALER)
        self.replay.connect(replay_endpoint)
        self.decoder = msgspec.msgpack.Decoder(KVEventBatch)
        self.batches: dict[int, KVEventBatch] = {}
        self.blocks: dict[str, set[Any]] = {}
        self.applied = 0  # batches applied, in sequence order

    def sync(self, published: int) -> None:
        """Receive until batches ``0 .. published - 1`` have all been applied, in order."""
        deadline = time.monotonic() + DEADLINE_S
        while self.applied < published:
            assert time.monotonic() < deadline, f"{self.applied} of {published} batches"
            if self.sub.poll(100):
                topic, seq, payload = self.sub.recv_multipart()
                assert topic == b"kvtier"
                self.batches[int.from_bytes(seq, "big")] = self.decoder.decode(payload)
            elif self.applied not in self.batches:  # missed (slow joiner): ask for replay
                self.replay.send_multipart((b"", self.applied.to_bytes(8, "big")))
                while True:
                    assert self.replay.poll(10_000), "no replay answer"
                    _, topic, seq, payload = self.replay.recv_multipart()
                    if seq == END_SEQ:
                        break
                    self.batches[int.from_bytes(seq, "big")] = self.decoder.decode(payload)
            while self.applied in self.batches:
                self._apply(self.batches[self.applied])
                self.applied += 1

    def _apply(self, batch: KVEventBatch) -> None:
        assert batch.data_parallel_rank == 0
        for event in batch.events:
            if isinstance(event, BlockStored):
                assert event.medium is not None and event.block_size == PAGE
                held = self.blocks.setdefault(event.medium, set())
                assert held.isdisjoint(event.block_hashes)  # stored once until removed
                held.update(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                assert event.medium is not None
                held = self.blocks.setdefault(event.medium, set())
                assert held.issuperset(event.block_hashes)  # only what was stored
                held.difference_update(event.block_hashes)
            else:
                assert isinstance(event, AllBlocksCleared)
                self.blocks.clear()

    def view(self) -> dict[str, set[Any]]:
        return {medium: keys for medium, keys in self.blocks.items() if keys}

    def close(self) -> None:
        self.sub.close(linger=0)
        self.replay.close(linger=0)


def _nonempty(blocks: dict[str, set[bytes]]) -> dict[str, set[bytes]]:
    return {medium: keys for medium, keys in blocks.items() if keys}


def _engine(model: PreTrainedModel, disk: Path, events: dict[str, Any]) -> LLM:
    return LLM(model=model, num_gpu_blocks=GPU_BLOCKS, block_size=PAGE,
               offload=disk_cfg(disk), kv_events=events)  # fmt: skip


def test_a_subscriber_rebuilds_every_tier_exactly(
    tiny_model: PreTrainedModel, tmp_path: Path
) -> None:
    events = {
        "endpoint": f"ipc://{tmp_path}/events",
        "replay_endpoint": f"ipc://{tmp_path}/replay",
        "topic": "kvtier",
    }
    disk = tmp_path / "disk"
    llm = _engine(tiny_model, disk, events)
    publisher = llm.observability.publisher
    assert publisher is not None
    sub = Subscriber(publisher.endpoint, publisher.replay_endpoint or "")
    try:
        cpu_evicted = False
        for prompt in chats():
            llm.generate([prompt], max_new_tokens=4)
            sub.sync(publisher.published)
            assert sub.view() == _nonempty(ready_blocks(llm))
            cpu_evicted |= any(
                isinstance(e, BlockRemoved) and e.medium == "CPU"
                for b in sub.batches.values()
                for e in b.events
            )
        final = _nonempty(ready_blocks(llm))
        assert set(final) == {"CPU", "DISK"} and cpu_evicted  # both tiers moved
        llm.close()  # flushes the write-through queue, then AllBlocksCleared
        sub.sync(publisher.published)
        assert sub.view() == {}
        last = sub.batches[publisher.published - 1].events
        assert isinstance(last[-1], AllBlocksCleared)
        disk_blocks = ready_blocks(llm)["DISK"]
    finally:
        llm.close()  # again after a failure above; a second close does nothing new
        sub.close()

    # A new engine on the same directory recovers the disk tier and says so first.
    again = _engine(tiny_model, disk, events)
    publisher = again.observability.publisher
    assert publisher is not None
    sub = Subscriber(publisher.endpoint, publisher.replay_endpoint or "")
    try:
        sub.sync(publisher.published)
        assert publisher.published == 1
        assert sub.view() == {"DISK": disk_blocks} == _nonempty(ready_blocks(again))
    finally:
        again.close()
        sub.close()


def test_integer_hashes_are_the_keys_low_64_bits(
    tiny_model: PreTrainedModel, tmp_path: Path
) -> None:
    events = {
        "endpoint": f"ipc://{tmp_path}/events",
        "replay_endpoint": f"ipc://{tmp_path}/replay",
        "topic": "kvtier",
        "int_hashes": True,
    }
    llm = _engine(tiny_model, tmp_path / "disk", events)
    publisher = llm.observability.publisher
    assert publisher is not None
    sub = Subscriber(publisher.endpoint, publisher.replay_endpoint or "")
    try:
        for prompt in chats()[:4]:
            llm.generate([prompt], max_new_tokens=4)
        sub.sync(publisher.published)
        want = {
            medium: {int.from_bytes(k, "big") & (2**64 - 1) for k in keys}
            for medium, keys in _nonempty(ready_blocks(llm)).items()
        }
        assert sub.view() == want and want
    finally:
        llm.close()
        sub.close()
