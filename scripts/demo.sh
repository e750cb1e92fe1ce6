#!/usr/bin/env bash
# Set everything up, then run kvtier's main job on its embedded defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
exec kvtier simulate --sweep 1%,5%,10%,25%,50% --policy lru --policy arc --policy slru --json benchmarks/results/demo-simulate.json --plot benchmarks/results/demo-simulate.png "$@"
