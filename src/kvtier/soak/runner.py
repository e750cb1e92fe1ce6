"""The soak loop: requests to two engines, faults at random, every token compared.

Runs in the soak process. Each iteration heals the faults that are due, injects the
next fault when its (exponentially distributed) time has come, draws the next turn,
and sends it to engine ``a`` or ``b`` at random. Both engines share the soak's Redis;
each has its own CPU tier and its own disk directory in the soak's disk area. An
``engine_kill`` SIGKILLs the engine a random moment into the request (while it
computes and stores), checks every block file it left, restarts it over the same
directory (``engine_kill_full_disk``: with the disk full) and sends the request again.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from kvtier.engine import LLM, ModelSize, build_model
from kvtier.soak.disk import DiskArea
from kvtier.soak.engines import EngineGone, EngineProcess
from kvtier.soak.faults import FAULT_KINDS, Injector
from kvtier.soak.redis_proc import RedisProcess
from kvtier.soak.workload import Conversations, Turn

SOAK_MODEL = ModelSize(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    max_position_embeddings=2048,
)
"""A small seeded Llama: a page of 16 tokens is 16 KiB of KV, a turn tens of ms."""

PAGE = 16
DISK_AREA_BYTES = 48 * 2**20


@dataclass(frozen=True, slots=True)
class SoakOptions:
    """How long and how hard (the ``kvtier soak`` options of the same names).

    Attributes:
        duration_s: seconds of serving (start-up and the final checks come on top);
            a run goes on past it until every kind of fault was injected once.
        max_requests: stop after this many requests even if time is left.
        seed: seeds the workload and the faults.
        fault_interval_s: mean seconds between faults (exponentially distributed).
        request_timeout_s: an engine that answers nothing for this long has crashed.
        model: the engines' model (``SOAK_MODEL``, or a hybrid of it: ``hybrid``).
    """

    duration_s: float = 180.0
    max_requests: int = 1_000_000
    seed: int = 0
    fault_interval_s: float = 4.0
    request_timeout_s: float = 120.0
    model: ModelSize = SOAK_MODEL


def tail_lines(text: str, limit: int = 500) -> str:
    """The last whole lines of ``text`` that fit in ``limit`` characters (the last line
    whole even when longer): a traceback's end, never cut mid-word."""
    lines = text.rstrip().splitlines() or [""]
    kept = [lines.pop()]
    while lines and sum(map(len, kept)) + len(lines[-1]) + len(kept) <= limit:
        kept.insert(0, lines.pop())
    return " | ".join(line.strip() for line in kept)


def hybrid(sliding_window: int) -> ModelSize:
    """``SOAK_MODEL`` as a Gemma 3-style hybrid: every other layer attends to the last
    ``sliding_window`` tokens only."""
    return replace(SOAK_MODEL, sliding_window=sliding_window, full_every=2)


def engine_config(
    name: str, disk: DiskArea, redis_url: str, seed: int, model: ModelSize = SOAK_MODEL
) -> dict[str, Any]:
    """An engine's configuration: CPU (16 blocks), disk (16 MiB) and the shared Redis."""
    return {
        "model_size": asdict(model),
        "seed": seed,
        "num_gpu_blocks": 48,
        "block_size": PAGE,
        "offload": {
            "cpu_bytes_to_use": "256KiB",
            "block_size": PAGE,
            "disk_path": str(disk.engine_dir(name)),
            "disk_bytes_to_use": "16MiB",
            "remote_url": redis_url,
            "remote_timeout_s": 0.5,
            "remote_backoff_s": 0.2,
        },
    }


@dataclass(slots=True)
class _Served:
    start: float
    end: float
    killed: bool


class Soak:
    """One soak run in ``workdir`` (which it fills and, for a tmpfs, mounts on)."""

    def __init__(self, options: SoakOptions, workdir: Path, out: TextIO = sys.stdout) -> None:
        self.opt = options
        self.workdir = workdir
        self.out = out
        self.rng = random.Random(options.seed)
        self.requests: list[_Served] = []
        self.counts = dict.fromkeys(
            ["tokens_compared", "wrong_tokens", "engine_crashes", "engine_restarts"], 0
        )
        self.counts |= {"failed_loads_recomputed": 0, "loaded_blocks": 0, "corrupt_on_restart": 0}
        self.hits: dict[str, int] = {}
        self.kill_lost_s = {"engine_kill": 0.0, "engine_kill_full_disk": 0.0}
        self.restart_s: list[float] = []
        self.messages: list[str] = []
        self.conversations = 0

    def _say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def run(self) -> dict[str, Any]:
        """Run the soak; the figures (``docs/soak.md`` says what each one means)."""
        redis = RedisProcess(self.workdir / "redis")
        disk = DiskArea(self.workdir / "disk", DISK_AREA_BYTES)
        self._say(f"soak: disk area: {disk.mode}; redis-server on port {redis.port}")
        engines = {
            n: EngineProcess(n, engine_config(n, disk, redis.url, 0, self.opt.model), self.workdir)
            for n in "ab"
        }
        injector = Injector(redis, disk, tuple(engines), random.Random(self.opt.seed + 1))
        try:
            redis.start()
            reference = LLM(
                model=build_model(self.opt.model, seed=0, device="cpu"), num_gpu_blocks=2048
            )
            workload = Conversations(reference, self.opt.model.vocab_size, self.opt.seed)
            for e in engines.values():
                e.start(self.opt.request_timeout_s)
            self._loop(engines, injector, workload)
        finally:
            injector.heal(time.monotonic(), everything=True)
            for e in engines.values():
                e.close()
            corrupt_at_end = sum(len(disk.corrupt_blocks(n, injector.damaged)) for n in engines)
            redis.close()
            disk.close()
        return self._figures(injector, disk, corrupt_at_end)

    def _loop(
        self, engines: dict[str, EngineProcess], injector: Injector, workload: Conversations
    ) -> None:
        start = time.monotonic()
        deadline = start + self.opt.duration_s
        next_fault = start + self.rng.expovariate(1 / self.opt.fault_interval_s)
        next_report = start + 30.0
        kill_next: str | None = None
        while (time.monotonic() < deadline or not injector.every_kind_injected) and len(
            self.requests
        ) < self.opt.max_requests:
            now = time.monotonic()
            injector.heal(now)
            if now >= next_fault:
                kind = injector.next_kind()
                injector.inject(kind, now)
                kill_next = kind if kind.startswith("engine_kill") else kill_next
                next_fault = now + self.rng.expovariate(1 / self.opt.fault_interval_s)
            turn = workload.next_turn()
            name = self.rng.choice(sorted(engines))
            self._serve(engines[name], turn, kill_next, injector)
            kill_next = None
            if time.monotonic() >= next_report:
                next_report = time.monotonic() + 30.0
                self._say(
                    f"soak: {time.monotonic() - start:.0f} s, {len(self.requests)} requests, "
                    f"{sum(injector.injected.values())} faults, "
                    f"{self.counts['wrong_tokens']} wrong tokens, "
                    f"{self.counts['engine_crashes']} crashes"
                )
        self.conversations = workload.started

    def _serve(
        self, engine: EngineProcess, turn: Turn, kill: str | None, injector: Injector
    ) -> None:
        t0 = time.monotonic()
        for attempt in range(3):
            try:
                engine.send(list(turn.prompt), len(turn.expected))
                if kill is not None:
                    self._kill_and_restart(engine, injector, t0, kill)
                    kill = None
                    continue  # the request died with the engine: send it again
                reply = engine.receive(self.opt.request_timeout_s)
            except EngineGone as e:
                self.counts["engine_crashes"] += 1
                self.messages.append(str(e)[-2000:])
                self._say(f"soak: ENGINE CRASH ({engine.name}): {tail_lines(str(e))}")
                engine.sigkill()
                self._restart(engine)
                continue
            self._check(turn, reply)
            self.requests.append(_Served(t0, time.monotonic(), killed=attempt > 0))
            return
        self._say("soak: a request failed three times; skipped")

    def _kill_and_restart(
        self, engine: EngineProcess, injector: Injector, t0: float, kind: str
    ) -> None:
        typical = (
            statistics.median(r.end - r.start for r in self.requests[-20:])
            if self.requests
            else 0.1
        )
        time.sleep(self.rng.uniform(0.0, typical))
        engine.sigkill()
        killed_at = time.monotonic()
        bad = injector.disk.corrupt_blocks(engine.name, injector.damaged)
        self.counts["corrupt_on_restart"] += len(bad)
        for line in bad[:5]:
            self._say(f"soak: CORRUPT BLOCK after SIGKILL of engine {engine.name}: {line}")
        disk = injector.disk
        if not disk.mounted:  # read-only directories are a configuration error at start,
            disk.unfill()  # not a full disk: the emulation is lifted for a restart
        fill = kind == "engine_kill_full_disk" and disk.mounted and not injector.active("disk_full")
        if fill:
            disk.fill()
        try:
            self._restart(engine)
        finally:
            if fill:
                disk.unfill()
        self.kill_lost_s[kind] += time.monotonic() - t0
        self.restart_s.append(time.monotonic() - killed_at)

    def _restart(self, engine: EngineProcess) -> None:
        for _ in range(3):
            try:
                engine.start(self.opt.request_timeout_s)
                self.counts["engine_restarts"] += 1
                return
            except EngineGone as e:
                self.counts["engine_crashes"] += 1
                self.messages.append(str(e)[-2000:])
                self._say(f"soak: ENGINE DID NOT START ({engine.name}): {str(e)[-500:]}")
                engine.sigkill()
                time.sleep(1.0)
        raise RuntimeError(f"engine {engine.name} does not start; see the soak's log")

    def _check(self, turn: Turn, reply: dict[str, Any]) -> None:
        got, want = list(reply["tokens"]), list(turn.expected)
        wrong = sum(g != w for g, w in zip(got, want, strict=False)) + abs(len(got) - len(want))
        self.counts["tokens_compared"] += len(want)
        self.counts["wrong_tokens"] += wrong
        if wrong:
            self._say(f"soak: WRONG TOKENS: conversation {turn.conversation}: {got} != {want}")
        self.counts["failed_loads_recomputed"] += int(reply["failed_loads"])
        self.counts["loaded_blocks"] += int(reply["loaded_blocks"])
        self.hits["GPU"] = self.hits.get("GPU", 0) + int(reply["gpu_hit_blocks"])
        for medium, n in reply["hits"].items():
            self.hits[medium] = self.hits.get(medium, 0) + int(n)

    def _figures(self, injector: Injector, disk: DiskArea, corrupt_at_end: int) -> dict[str, Any]:
        windows = [w for w in injector.windows if not w.kind.startswith("engine_kill")]

        def kinds_over(r: _Served) -> list[str]:
            return [w.kind for w in windows if w.start <= r.end and (w.end or r.end) >= r.start]

        plain = [r.end - r.start for r in self.requests if not r.killed and not kinds_over(r)]
        baseline = statistics.median(plain) if plain else 0.0
        lost = dict.fromkeys(FAULT_KINDS, 0.0)
        for r in self.requests:
            over = kinds_over(r)
            if r.killed or not over:
                continue
            excess = max(0.0, r.end - r.start - baseline)
            for kind in over:
                lost[kind] += excess / len(over)
        lost |= self.kill_lost_s
        restarts = sorted(self.restart_s)
        return {
            "requests_served": len(self.requests),
            "conversations": self.conversations,
            **{k: v for k, v in self.counts.items() if k != "corrupt_on_restart"},
            "corrupt_blocks_on_restart": self.counts["corrupt_on_restart"],
            "corrupt_blocks_at_end": corrupt_at_end,
            "faults": dict(injector.injected),
            "faults_that_found_no_block_file": {k: v for k, v in injector.no_effect.items() if v},
            "time_lost_s": {k: round(v, 2) for k, v in lost.items()},
            "baseline_request_s": round(baseline, 4),
            "engine_restart_s_median": round(restarts[len(restarts) // 2], 2) if restarts else None,
            "hit_blocks": dict(sorted(self.hits.items())),
            "disk_area": disk.mode,
            "crash_messages": self.messages[:5],
        }
