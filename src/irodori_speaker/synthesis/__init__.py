"""One line end to end: text plan, voice conditions, batching, loading, and the Synthesizer that runs
the engine for a line (text -> tokens -> conditions -> latents -> audio)."""
