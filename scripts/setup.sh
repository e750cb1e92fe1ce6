#!/usr/bin/env bash
# Create .venv (if needed) and install kvtier with everything its jobs and tests use.
# Idempotent: a second run only checks. Afterwards `. .venv/bin/activate` puts the
# `kvtier` command on PATH. torch is pinned to a CPU-friendly build here;
# the package itself accepts any torch>=2.4.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# The remote tier's tests start real redis-server processes (Debian's package), some
# with TLS certificates made by openssl.
if ! command -v redis-server >/dev/null 2>&1 || ! command -v openssl >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server openssl >/dev/null
    # Debian starts a system-wide server on 6379; the tests start their own on free ports.
    (service redis-server stop || systemctl stop redis-server) >/dev/null 2>&1 || true
  else
    # Not root (or no apt): nothing is installed system-wide. kvtier itself needs no
    # redis-server; only the remote tier's tests (and `kvtier bench remote`) start one.
    echo "setup: redis-server or openssl is not on PATH and setup installs system packages" \
         "only as root. Install them (sudo apt-get install -y redis-server openssl, or any" \
         "redis-server on PATH), or run the tests with KVTIER_SKIP_REDIS=1 to skip the remote" \
         "tier's tests." >&2
  fi
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.kvtier-installed
want=$(cat pyproject.toml scripts/setup.sh scripts/constraints.txt | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  python -m pip install -q --upgrade pip
  python -m pip install -q "torch==2.13.0"
  # scripts/constraints.txt: the versions the suite last passed with (its header says why)
  python -m pip install -q -c scripts/constraints.txt -e ".[engine,remote,metrics,dev]" \
    "ruff==0.17.6" "mypy==2.4.1" "pytest==9.2.0" "pytest-timeout==2.4.0" "hypothesis==6.170.15" \
    "prometheus-client==0.26.0" "pyzmq==27.3.0" "msgspec==0.22.0"
  echo "$want" > "$stamp"
fi
