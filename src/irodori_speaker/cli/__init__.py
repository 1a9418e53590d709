"""The `irodori-speaker` command line (console script `irodori_speaker.cli:main`).

One module per command group: `main` (parser and dispatch), `common` (shared flags, loading,
progress, playback), `say`, `cache` (prebuild and cache), `devices`, `bench`, `models`
(convert-codec, quantize).
"""

from .bench import NEWS5, bench_sentences, bench_totals, run_bench
from .devices import tone
from .main import build_parser, main, run

__all__ = ["NEWS5", "bench_sentences", "bench_totals", "build_parser", "main", "run", "run_bench", "tone"]
