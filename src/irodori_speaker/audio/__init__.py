"""Audio signal work on the output side of the engine: signal helpers (read, resample, loudness), the
voice controls (volume, pitch, intonation) and lip-sync levels. numpy only; no torch."""
