#!/usr/bin/env bash
# Set everything up, then run kvtier's main job on its embedded defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
exec kvtier run "$@"
