"""The `irodori-speaker` command line (console script `irodori_speaker.cli:main`).

One module per command group: `main` (parser and dispatch), `common` (shared flags, loading,
progress, playback), `say`, `cache` (prebuild and cache), `devices`, `bench`, `models`
(convert-codec, quantize), `serve` (the speech server), `userdict` (dict).

Programs with their own command line (the examples) take the same model options with
`add_model_flags(parser)` and load what they name with `load_from_args(args)`.
"""

from .bench import NEWS5, bench_sentences, bench_totals, run_bench
from .common import add_model_flags, load_from_args
from .devices import tone
from .main import build_parser, main, run

__all__ = [
    "NEWS5",
    "add_model_flags",
    "bench_sentences",
    "bench_totals",
    "build_parser",
    "load_from_args",
    "main",
    "run",
    "run_bench",
    "tone",
]
