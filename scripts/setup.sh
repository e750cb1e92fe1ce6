#!/usr/bin/env bash
# Create .venv (if needed) and install kvtier with everything its jobs and tests use.
# Idempotent: a second run only checks. torch is pinned to a CPU-friendly build here;
# the package itself accepts any torch>=2.4.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.kvtier-installed
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  python -m pip install -q --upgrade pip
  python -m pip install -q "torch==2.13.0"
  python -m pip install -q -e ".[engine,dev]" \
    "ruff==0.17.6" "mypy==2.4.1" "pytest==9.2.0" "hypothesis==6.170.15"
  echo "$want" > "$stamp"
fi
