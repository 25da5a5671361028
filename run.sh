#!/usr/bin/env bash
# The main job (installs what it needs first: see scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
exec .venv/bin/python examples/mlp_three_modes.py "$@"
