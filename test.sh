#!/usr/bin/env bash
# Runs the whole test suite (installs what it needs first: see scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
# Test files run in MAXJAX_TEST_WORKERS processes (default 2; 0: in this one), each file whole in one
# process (--dist loadfile: a file's module fixtures, servers and compiles are shared by its tests).
workers=${MAXJAX_TEST_WORKERS:-2}
if [[ $workers == 0 ]]; then
  exec .venv/bin/python -m pytest "$@"
fi
exec .venv/bin/python -m pytest -n "$workers" --dist loadfile "$@"
