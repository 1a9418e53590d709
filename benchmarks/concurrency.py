"""Many streams on one model: aggregate throughput and first audio with 1, 4, 16, 64 streams.

Each stream is a thread that speaks news5 sentences one after another through ONE shared
`Synthesizer`, streamed (the first chunk is its first audio), as several Speakers or the
server's workers do. Per concurrency N, two runs side by side in this process:

- batched: `max_batch` = N, at most `--max-batch` (lines waiting for the sampler together are
  sampled as one batch, `batching.py`);
- serial: `max_batch` = 1 (one line after another behind the model lock, as before).

On CUDA a batch replays a graph per batch bucket and coarse shape (`engine.batch.BATCH_BUCKETS`),
captured by prewarm up to `--max-batch`; a batch of a shape without one runs line by line.

Per row: lines, audio seconds, wall seconds, aggregate audio seconds per second, p50 / p95
time to first audio (from a line's start to its first chunk), each stage's mean time a line (its
record's timings: text encoder and length, sampling (a batch's lines each count the batch),
decode), the batch sizes that ran, and on CUDA the peak memory of the run. The model is
news5's (benchmarks/news5.py: random full-size weights, the same files, `--mode` picks its
preset: (e) int4 on CUDA, (f) the CPU preset).

    python benchmarks/concurrency.py                           # CUDA: mode e, 1,4,16,64 streams
    python benchmarks/concurrency.py --mode f --streams 1,4 --lines 2   # the CPU preset
    python benchmarks/concurrency.py --smoke --mode f --streams 1,4     # tiny model, any CPU

Speed is the ratio batched / serial within one run; absolute times count only on a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

import news5  # noqa: E402  (the shared random full-size files, modes and the approximate tokenizer)

from irodori_speaker.synthesizer import SynthesisOptions  # noqa: E402


@dataclass
class Run:
    streams: int
    batched: bool
    ttfa: list[float] = field(default_factory=list)
    audio_s: float = 0.0
    wall_s: float = 0.0
    lines: int = 0
    batches: dict[int, int] = field(default_factory=dict)
    peak_mb: float = float("nan")
    stages: dict[str, float] = field(default_factory=dict)  # summed seconds per stage, every line

    def per_line_ms(self, stage: str) -> float:
        return 1e3 * self.stages.get(stage, 0.0) / max(self.lines, 1)

    def pct(self, q: float) -> float:
        xs = sorted(self.ttfa)
        return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else float("nan")


def run(synth, voice, sentences: list[str], streams: int, lines: int, batched: bool, device: str) -> Run:
    """`streams` threads, each speaking `lines` sentences (stream i starts at sentence i)."""
    # a measurement knob: the preset's max_batch (what prewarm captured batch graphs for) caps it
    synth._batcher.max_batch = min(streams, synth.preset.max_batch) if batched else 1
    synth._batcher.batches = {}
    out = Run(streams, batched)
    lock = threading.Lock()
    start = threading.Barrier(streams + 1)
    opts = SynthesisOptions(seed=0)

    def stream(i: int) -> None:
        start.wait()
        for k in range(lines):
            text = sentences[(i + k) % len(sentences)]
            t0 = time.perf_counter()
            first, samples = None, 0
            s = synth.stream(text, voice, opts.replace(seed=i * 1000 + k))
            for chunk in s:
                if first is None:
                    news5.sync(device)
                    first = time.perf_counter() - t0
                samples += len(chunk)
            timings = s.record.timings if s.record is not None else {}
            with lock:
                for stage in ("duration", "sampling", "decode"):
                    out.stages[stage] = out.stages.get(stage, 0.0) + timings.get(stage, 0.0)
                out.ttfa.append(first if first is not None else float("nan"))
                out.audio_s += samples / 48_000
                out.lines += 1

    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(streams)]
    for t in threads:
        t.start()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    news5.sync(device)
    out.wall_s = time.perf_counter() - t0
    if device == "cuda":
        out.peak_mb = torch.cuda.max_memory_allocated() / 2**20
    out.batches = dict(sorted(synth._batcher.batches.items()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", default=None, help="news5 mode (default: e on CUDA, f elsewhere)")
    ap.add_argument("--streams", default="1,4,16,64", help="concurrencies to run (comma-separated)")
    ap.add_argument("--lines", type=int, default=3, help="sentences each stream speaks")
    ap.add_argument("--smoke", action="store_true", help="tiny-random files: a quick check on any CPU")
    serial_help = "also run each concurrency with max_batch 1 (the side-by-side baseline)"
    ap.add_argument("--serial", action=argparse.BooleanOptionalAction, default=True, help=serial_help)
    ap.add_argument("--max-padding", type=float, help="the batcher's padding bound (default: the preset's)")
    ap.add_argument("--max-batch", type=int, default=16, help="the preset max_batch: the largest batch")
    ap.add_argument("--json", type=Path, help="write the rows here too")
    ap.add_argument(
        "--int4-impl",
        default="auto",
        choices=["auto", "kernel", "scratch"],
        help="int4 GEMM path (auto: the chooser measures each M bucket in prewarm; as news5 --int4-impl)",
    )
    args = ap.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    key = args.mode or ("e" if device == "cuda" else "f")
    mode = news5.modes_for(device)[key]
    if mode.device == "cuda" and device != "cuda":
        raise SystemExit(f"mode {key} needs CUDA")
    files = news5.prepare_files(int4=mode.int4, smoke=args.smoke, families={mode.family})
    sentences = json.loads(news5.NEWS5_JSON.read_text())["sentences"]
    synth, voice = news5.build(mode, files, args.int4_impl, max_batch=args.max_batch)
    if args.max_padding is not None:
        synth._batcher.max_padding = args.max_padding
    if mode.fast:
        synth.prewarm(voice)
    for text in sentences:  # warm-up: kernel selection, graphs of these buckets
        for _ in synth.stream(text, voice, SynthesisOptions(seed=0)):
            pass

    print(f"# concurrency: mode ({key}) {mode.desc}; device {device}; {args.lines} lines per stream")
    print(
        f"# torch {torch.__version__}; {torch.get_num_threads()} threads; "
        f"max_padding {synth._batcher.max_padding}"
    )
    rows = []
    print(
        "| streams | sampling | lines | audio s | wall s | audio s/s | x serial | TTFA p50 ms "
        "| TTFA p95 ms | text / sampling / decode ms a line | batches (size: count) | peak MiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in [int(x) for x in args.streams.split(",")]:
        pair = [run(synth, voice, sentences, n, args.lines, True, device)]
        if args.serial and n > 1:
            pair.append(run(synth, voice, sentences, n, args.lines, False, device))
        serial_rate = pair[-1].audio_s / pair[-1].wall_s  # the batched run itself when alone
        for r in pair:
            rate = r.audio_s / r.wall_s
            ratio = rate / serial_rate  # batched: its speed-up over serial; serial: 1
            print(
                f"| {n} | {'batched' if r.batched else 'serial'} | {r.lines} | {r.audio_s:.1f} "
                f"| {r.wall_s:.2f} "
                f"| {rate:.1f} | {ratio:.2f} | {1e3 * r.pct(0.5):.0f} | {1e3 * r.pct(0.95):.0f} "
                f"| {r.per_line_ms('duration'):.1f} / {r.per_line_ms('sampling'):.1f} / "
                f"{r.per_line_ms('decode'):.1f} "
                f"| {' '.join(f'{k}:{v}' for k, v in r.batches.items())} | {r.peak_mb:.0f} |",
                flush=True,
            )
            rows.append(
                {
                    **{k: v for k, v in vars(r).items() if k != "ttfa"},
                    "p50_s": r.pct(0.5),
                    "p95_s": r.pct(0.95),
                }
            )
    if args.json:
        args.json.write_text(json.dumps({"mode": key, "device": device, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
