"""The step graphs through the Synthesizer, as Speakers and the server use it (CUDA only).

prewarm fixes the step batcher's context pool and captures its forward per bucket
(engine/step_graphs.py) and its line starts (engine/start_graphs.py); lines that meet on the
device owner start and step through those graphs and sound as they do alone. The CPU covers the
same buckets eagerly (tests/engine/test_step_graphs.py, test_start_graphs.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from test_batching import TEXTS, opts, together

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA graphs need a GPU (docs/status.md)"
)


def test_prewarm_captures_the_step_graphs_and_lines_that_meet_replay_them(irodori_home):
    from irodori_speaker.synthesis.loading import load_synthesizer

    synth = load_synthesizer(
        tiny_random=True, backend="cuda", voice_cache_dir=False, max_batch=4, step_batching=True
    )
    synth.prewarm()
    assert synth.prewarm_report["step_graphs_captured"] > 0 and synth._steps.pool.fixed
    assert synth.prewarm_report["start_graphs_captured"] > 0  # the prewarm voice's line starts
    jobs = [(t, opts(seed=i)) for i, t in enumerate(TEXTS)]
    alone = [synth.synthesize(t, options=o).audio for t, o in jobs]
    results = together(synth, jobs)
    assert all(not isinstance(r, Exception) for r in results), results
    assert synth._steps.graphs is not None and synth._steps.graphs.replays > 0
    assert synth._steps.starts is not None and synth._steps.starts.replays > 0
    for a, r in zip(alone, results):
        assert len(a) == len(r.audio)
        scale = float(np.abs(a).max())  # bf16: a larger GEMM rounds apart, within 5 % of the peak
        assert float(np.abs(r.audio - a).max()) <= 0.05 * scale
