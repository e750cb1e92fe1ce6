#!/usr/bin/env bash
# Set everything up, then run the whole suite: lint, types, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
ruff check src tests
ruff format --check src tests
mypy
python -m pytest -q "$@"
