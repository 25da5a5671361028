#!/usr/bin/env bash
# The main job: `maxjax generate` with the bundled SmolLM2 model (installs what it needs first:
# see scripts/setup.sh). Arguments go to `maxjax generate`; with none, a default prompt is used.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
if [[ $# -eq 0 ]]; then
  set -- --chat "What is the capital of France?"
fi
exec .venv/bin/maxjax generate "$@"
