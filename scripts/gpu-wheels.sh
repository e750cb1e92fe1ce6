#!/usr/bin/env bash
# The wheels scripts/gpu-check.sh needs beyond torch, for a machine without network:
#   bash scripts/gpu-wheels.sh [DIR] [PYTHON_VERSION]     (default: wheels, 3.12)
# Binary wheels only, for x86_64 Linux and that Python, with their dependencies; torch
# and its own dependencies are left out (the GPU machine has them).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-wheels}
PYV=${2:-3.12}
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download -q --only-binary=:all: --python-version "$PYV" --implementation cp \
  "${platforms[@]}" -d "$DIR" -c scripts/constraints.txt \
  "xxhash==4.1.0" "transformers>=4.45" "matplotlib>=3.7" "pytest==9.2.0" \
  "pytest-timeout==2.4.0" "hypothesis==6.170.15" "setuptools>=77"
ls "$DIR" | wc -l | xargs echo "gpu-wheels: wheels in $DIR:"
