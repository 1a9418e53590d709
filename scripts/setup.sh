#!/usr/bin/env bash
# Set up a development checkout (Linux; macOS and Windows: docs/getting-started.md): PortAudio,
# a virtual environment in .venv, torch, and the project in editable mode with the ja, audio, yaml,
# english, serve, controls (pyworld: pitch)
# and dev extras (dev brings pytest, ruff, build, triton for the kernel interpreter tests).
set -euo pipefail
cd "$(dirname "$0")/.."

# PortAudio for sounddevice (sound output).
if ! ldconfig -p 2>/dev/null | grep -q 'libportaudio\.so\.2'; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libportaudio2 >/dev/null
  else
    echo "note: PortAudio is missing; install libportaudio2 for sound output (the real-playback test skips)" >&2
  fi
fi

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch first, so the project's `torch>=2.3` is already met and pip keeps this one. What
# `pip install torch==2.13.0` gets depends on the index: from PyPI on Linux it is the CUDA build
# (it uses an NVIDIA GPU when there is one and runs on the CPU otherwise; ~2 GB with its CUDA
# libraries), on macOS the build with MPS, on Windows the CPU build (a CUDA one needs
# --index-url https://download.pytorch.org/whl/cu124). Our CI machines have no GPU and install a
# local CPU wheel of 2.13.0 from their own index. TORCH_SPEC picks another version
# ("TORCH_SPEC=torch"), TORCH_INDEX another index (https://download.pytorch.org/whl/cpu: the
# small CPU-only build).
torch_args=("${TORCH_SPEC:-torch==2.13.0}")
[ -n "${TORCH_INDEX:-}" ] && torch_args+=(--index-url "$TORCH_INDEX")
.venv/bin/python -m pip install -q "${torch_args[@]}"
.venv/bin/python -m pip install -q -e ".[ja,english,audio,yaml,serve,controls,dev]"
echo "ready: . .venv/bin/activate"
