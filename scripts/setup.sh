#!/usr/bin/env bash
# Set up a fresh machine: system audio libraries, a virtual environment, CPU torch, the project.
set -euo pipefail
cd "$(dirname "$0")/.."

# PortAudio (sounddevice), and a virtual ALSA output so the real playback path runs without a sound
# card. "irodori_virtual" is ALSA's file plugin over its null device: it discards the audio, or writes
# the raw stream to the file or FIFO named by $IRODORI_ALSA_TAP (tests read a FIFO at real-time pace,
# which also gives the device a real-time clock). It goes to /etc/alsa/conf.d, leaving asound.conf alone.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  if ! ldconfig -p 2>/dev/null | grep -q 'libportaudio\.so\.2'; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libportaudio2 >/dev/null
  fi
  mkdir -p /etc/alsa/conf.d
  cat > /etc/alsa/conf.d/60-irodori-virtual.conf <<'ALSA'
# Written by irodori-speaker's scripts/setup.sh: a virtual output for tests and headless servers.
pcm.irodori_virtual {
    type plug
    slave.pcm {
        type file
        slave.pcm "null"
        file {
            @func getenv
            vars [ IRODORI_ALSA_TAP ]
            default "/dev/null"
        }
        format "raw"
    }
    hint {
        show on
        description "irodori-speaker virtual output (null; IRODORI_ALSA_TAP=path records)"
    }
}
ALSA
elif ! ldconfig -p 2>/dev/null | grep -q libportaudio; then
  echo "note: PortAudio is missing; install libportaudio2 for sound output (the real-playback test skips)" >&2
fi

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# The machines carry the CPU wheel of torch 2.13.0 offline; take it first so nothing pulls a CUDA build.
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e ".[ja,audio,dev]"
echo "ready: . .venv/bin/activate"
