#!/usr/bin/env bash
# CI only: a virtual ALSA output so the real playback path (sounddevice -> PortAudio -> ALSA) runs
# on a machine with no sound card. "irodori_virtual" is ALSA's file plugin over its null device: it
# discards the audio, or writes the raw stream to the file or FIFO named by $IRODORI_ALSA_TAP (the
# test reads a FIFO at real-time pace, which also gives the device a clock). Written to
# /etc/alsa/conf.d, leaving asound.conf alone. Not for users' machines: it would become the default
# device where there is no sound card.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "virtual-audio: needs root; the real-playback test will skip" >&2; exit 0; }
mkdir -p /etc/alsa/conf.d
cat > /etc/alsa/conf.d/60-irodori-virtual.conf <<'ALSA'
# Written by irodori-speaker's .ci/virtual-audio.sh: a virtual output for tests and headless servers.
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
