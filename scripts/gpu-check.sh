#!/usr/bin/env bash
# The GPU check: on a CUDA machine with torch already installed and no network, run
# kvtier's CUDA-marked tests, `kvtier bench transfer --device cuda` and a short
# `kvtier run --device cuda`, and print one summary line. Bounded to eight minutes.
#
#   bash scripts/gpu-check.sh [WHEELS]      WHEELS: a folder of the wheels kvtier needs
#                                           beyond torch (made here by
#                                           scripts/gpu-wheels.sh); default ./wheels
#
# It makes .venv-gpu with the machine's site packages (its torch), installs kvtier
# from this tree and the wheels from WHEELS only (--no-index), and writes its results
# under kvtier-results/gpu-check/. GPU_CHECK_DEVICE=cpu runs the same steps on the CPU,
# and GPU_CHECK_VENV=.venv in an environment that already has kvtier (the suite does
# both, so the script does not rot); the CUDA-marked tests then skip.
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=${1:-wheels}
DEVICE=${GPU_CHECK_DEVICE:-cuda}
PY=${PYTHON:-python3}
OUT=kvtier-results/gpu-check
mkdir -p "$OUT"
deadline=$((SECONDS + 480))
left() { echo $((deadline - SECONDS > 10 ? deadline - SECONDS : 10)); }
status=()
step() {  # step NAME COMMAND...: run it within the time left, record ok / FAILED
  local name=$1; shift
  echo "== gpu-check: $name"
  if timeout "$(left)" "$@" > "$OUT/$name.log" 2>&1; then
    status+=("$name ok")
  else
    status+=("$name FAILED (exit $?, see $OUT/$name.log)")
    tail -20 "$OUT/$name.log"
  fi
}

# GPU_CHECK_VENV: an environment that already has kvtier (CI's .venv): nothing installed.
VENV=${GPU_CHECK_VENV:-.venv-gpu}
if [ -z "${GPU_CHECK_VENV:-}" ]; then
  [ -x "$VENV/bin/python" ] || "$PY" -m venv --system-site-packages "$VENV" || exit 1
  pip_args=(--no-index --no-build-isolation -q)
  [ -d "$WHEELS" ] && pip_args+=(--find-links "$WHEELS")
  step install "$VENV/bin/python" -m pip install "${pip_args[@]}" -e ".[engine]" \
    pytest pytest-timeout hypothesis
fi
step torch "$VENV/bin/python" -c "
import torch, sys
print('torch', torch.__version__, 'cuda', torch.cuda.is_available())
if '$DEVICE' == 'cuda' and not torch.cuda.is_available():
    sys.exit('no CUDA device visible to torch')
if torch.cuda.is_available():
    print(torch.cuda.get_device_name(0))
"
step cuda-tests "$VENV/bin/python" -m pytest -q -p no:cacheprovider -m cuda tests
step transfer "$VENV/bin/python" -m kvtier bench transfer --device "$DEVICE" \
  --pages 64KiB,1MiB --blocks 16,256 --repeats 3 --json "$OUT/transfer-$(date -u +%Y%m%dT%H%M%SZ).json"
step run "$VENV/bin/python" -m kvtier run --device "$DEVICE" --conversations 4 --turns 4 \
  --no-progress --json "$OUT/run-$(date -u +%Y%m%dT%H%M%SZ).json"

summary=$(IFS=';'; echo "${status[*]}")
echo "gpu-check ($DEVICE, $((SECONDS))s): $summary"
case "$summary" in *FAILED*) exit 1 ;; esac
