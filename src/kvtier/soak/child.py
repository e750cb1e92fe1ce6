"""The engine process of the soak: ``python -m kvtier.soak.child '<config JSON>'``.

Runs as a child of the soak, which may SIGKILL it at any moment. It builds the
reference engine with offloading from the config, says ``ready``, then answers one
request per line on stdin with one line on stdout (only lines starting with
``PREFIX`` are the protocol; anything a library prints is ignored):

    in:  {"prompt": [token ids], "max_new_tokens": n}       out: {"tokens": [...], ...}
    in:  {"close": true}                                   out: {"closed": true}

An exception inside the engine is answered ``{"error": "<traceback>"}``: that is an
engine crash, which the soak counts and then restarts the process.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from typing import Any

PREFIX = "KVTIER-SOAK "


def _say(doc: dict[str, Any]) -> None:
    sys.stdout.write(PREFIX + json.dumps(doc) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    cfg = json.loads(argv[0])
    start = time.perf_counter()
    import torch

    torch.set_num_threads(1)
    from kvtier.engine import LLM, ModelSize, build_model
    from kvtier.engine.offload_connector import OffloadingConnector

    model = build_model(ModelSize(**cfg["model_size"]), seed=cfg["seed"], device="cpu")
    llm = LLM(
        model=model,
        num_gpu_blocks=cfg["num_gpu_blocks"],
        block_size=cfg["block_size"],
        offload=cfg["offload"],
    )
    assert isinstance(llm.connector, OffloadingConnector)
    spec = llm.connector.spec
    recovered = len(spec.disk_store().recovered) if spec.has_disk else 0
    _say({"ready": True, "recovered": recovered, "startup_s": time.perf_counter() - start})
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("close"):
            llm.close()
            _say({"closed": True})
            return 0
        try:
            t0 = time.perf_counter()
            tokens = llm.generate([msg["prompt"]], max_new_tokens=msg["max_new_tokens"])[0]
            st = llm.last_stats
            assert st is not None
            off = st.offload
            _say(
                {
                    "tokens": tokens,
                    "service_s": time.perf_counter() - t0,
                    "failed_loads": off.failed_loads,
                    "loaded_blocks": off.loaded_blocks,
                    "hits": {m.name: n for m, n in off.hit_blocks.items()},
                    "stored_blocks": off.stored_blocks,
                    "gpu_hit_blocks": st.requests[0].gpu_hit_blocks,
                }
            )
        except Exception:  # an engine crash: reported, counted by the soak
            _say({"error": traceback.format_exc()})
    llm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
