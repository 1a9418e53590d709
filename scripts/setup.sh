#!/usr/bin/env bash
# Set up a fresh machine: system audio libraries, a virtual environment, CPU torch, the project.
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
# The machines carry the CPU wheel of torch 2.13.0 offline; take it first so nothing pulls a CUDA build.
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e ".[ja,audio,yaml,serve,dev]"
echo "ready: . .venv/bin/activate"
