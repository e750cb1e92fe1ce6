#!/usr/bin/env bash
# Mutation testing with mutmut 3 over the code whose bugs change hit rates silently:
# the scheduler side (manager, tiering, every policy) and the block format. Slow (the
# scheduler package is ~1,000 mutants, ~25 min on 2 idle cores), so it is not in CI;
# run it after changing those modules and read every survivor (docs/testing.md).
#
#   scripts/mutate.sh [TARGET...]    TARGET: scheduler | manager | policies | block_format |
#                                            connector
#                                    (default: scheduler block_format)
#   NICE=19 JOBS=2 scripts/mutate.sh scheduler
#
# Each target runs in its own copy of src/, tests/ and pyproject.toml under
# .mutmut/TARGET/, so editing the tree while it runs changes nothing; its survivors are
# listed with `cd .mutmut/TARGET && ../../.mutmut-venv/bin/python -m mutmut results`,
# and `... mutmut show NAME` prints one as a diff. A summary line per target ends the run.
#
# mutmut runs in its own venv (.mutmut-venv) WITHOUT kvtier installed, with
# PYTHONPATH=src: an installed (editable) kvtier would shadow the mutated copies.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=$root/.mutmut-venv
py=$venv/bin/python
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(scheduler block_format)

if [ ! -x "$py" ]; then
  "${PYTHON:-python3}" -m venv "$venv"
fi
stamp=$venv/.kvtier-mutate
want=$(sha256sum scripts/mutate.sh | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  "$py" -m pip install -q "mutmut==3.8.1" "pytest==9.2.0" "pytest-timeout==2.4.0" \
    "hypothesis==6.170.15" "numpy>=1.24" "matplotlib>=3.7" "torch==2.13.0" \
    "xxhash==4.1.0" "cryptography==50.0.2"
  echo "$want" > "$stamp"
fi
if "$py" -c "import kvtier" 2>/dev/null; then
  echo "mutate: kvtier is installed in $venv; it would shadow the mutants" >&2
  exit 1
fi

run_target() {
  local target=$1 sources tests
  case $target in
    scheduler)
      sources='["src/kvtier/scheduler/"]'
      tests='["tests/scheduler/", "tests/sim/test_slru.py"]' ;;
    manager)
      # The scheduler side without the policies (they have their own target).
      sources='["src/kvtier/scheduler/manager.py", "src/kvtier/scheduler/tiering.py", "src/kvtier/scheduler/slots.py", "src/kvtier/scheduler/discovery.py", "src/kvtier/scheduler/protocol.py", "src/kvtier/scheduler/serve.py"]'
      tests='["tests/scheduler/", "tests/connector/"]' ;;
    connector)
      sources='["src/kvtier/connector/scheduler_half.py", "src/kvtier/connector/worker_half.py"]'
      tests='["tests/connector/"]' ;;
    policies)
      sources='["src/kvtier/scheduler/policies/"]'
      tests='["tests/scheduler/policies/", "tests/scheduler/test_manager_contract.py", "tests/sim/test_slru.py"]' ;;
    block_format)
      sources='["src/kvtier/media/block_format.py"]'
      # (test_disk.py's cross-process tests start children that cannot import the
      # mutated tree, so mutmut's clean run fails with them)
      tests='["tests/media/test_block_format.py", "tests/media/test_block_format_details.py"]' ;;
    *) echo "mutate: unknown target $target" >&2; return 2 ;;
  esac
  local work=$root/.mutmut/$target
  rm -rf "$work"
  mkdir -p "$work"
  cp -r src tests pyproject.toml "$work/"
  find "$work" -name __pycache__ -prune -exec rm -rf {} +
  # Point the copy's [tool.mutmut] at this target.
  "$py" - "$work/pyproject.toml" "$sources" "$tests" <<'EOF'
import re, sys
path, sources, tests = sys.argv[1:]
text = open(path).read()
text = re.sub(r"(?m)^source_paths = .*$", f"source_paths = {sources}", text)
text = re.sub(
    r"(?m)^pytest_add_cli_args_test_selection = .*$",
    f"pytest_add_cli_args_test_selection = {tests}",
    text,
)
open(path, "w").write(text)
EOF
  (
    cd "$work"
    export PYTHONPATH=src HYPOTHESIS_PROFILE=mutation
    nice -n "${NICE:-19}" "$py" -m mutmut run --max-children "${JOBS:-2}" > mutmut-run.log 2>&1 || true
    "$py" -m mutmut export-cicd-stats >/dev/null 2>&1 || true
    "$py" -m mutmut results --all true > mutmut-results.txt 2>/dev/null \
      || "$py" -m mutmut results > mutmut-results.txt 2>/dev/null || true
    "$py" - "$target" <<'EOF'
import json, sys
stats = json.load(open("mutants/mutmut-cicd-stats.json"))
killed = stats["killed"] + stats.get("timeout", 0)
total = stats["total"]
print(
    f"{sys.argv[1]}: {killed}/{total} killed ({100 * killed / max(total, 1):.1f} %), "
    f"survived {stats['survived']}, no tests {stats['no_tests']}, "
    f"suspicious {stats.get('suspicious', 0)}, skipped {stats.get('skipped', 0)}"
)
EOF
  )
}

for target in "${targets[@]}"; do
  run_target "$target"
done
