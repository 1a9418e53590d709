#!/usr/bin/env bash
# Issue 12: closing a Speaker must be bounded on every Python we support (the hang was specific to
# 3.10 / 3.11's asyncio.wait_for). The Speaker runtime imports no torch, so each interpreter gets a
# small venv with the runtime's dependencies only and runs the shutdown tests (a fake synthesizer).
# Interpreters this machine lacks are skipped and said.
set -euo pipefail
cd "$(dirname "$0")/.."
for v in 3.10 3.12 3.13; do
  py=$(ls -d "$HOME"/.pyenv/versions/"$v".*/bin/python 2>/dev/null | tail -n 1 || true)
  if [ -z "$py" ]; then echo "python $v: not on this machine, skipped"; continue; fi
  venv=$(mktemp -d)/venv
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check numpy soundfile soxr sounddevice pytest pytest-timeout 2>&1 | grep -v "^WARNING: Location" || true
  echo "python $v ($py):"
  PYTHONPATH="$PWD/src:$PWD/tests" "$venv/bin/python" -m pytest -q -p no:cacheprovider -o addopts="" --timeout=60 \
    --confcutdir=tests/speaker tests/speaker/test_shutdown.py
  rm -rf "$(dirname "$venv")"
done
