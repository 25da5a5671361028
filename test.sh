#!/usr/bin/env bash
# Runs the whole test suite (installs what it needs first: see scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
