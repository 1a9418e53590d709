"""Many streams on one model: aggregate throughput and first audio with 1, 4, 16, 64 streams.

Each stream is a thread that speaks news5 sentences one after another through ONE shared
`Synthesizer`, streamed (the first chunk is its first audio), as several Speakers or the
server's workers do. Per concurrency N, two runs side by side in this process:

- step: `max_batch` = N, at most `--max-batch`: the device owner runs one sampler step for every
  live line at once, lines joining and leaving at step boundaries (`synthesis/stepping.py`);
- line: the same cap, whole-line batches of the lines that wait together (`synthesis/batching.py`,
  the design before issue 27);
- serial: `max_batch` = 1 (one line after another; lines that meet share the device owner);
- step-eager (only when asked): step, every step launched eagerly instead of from its CUDA graph
  per (rows, frames, context) bucket (engine/step_graphs.py; CUDA only, elsewhere the same as step);
- line-filled (only when asked): line, every waiting line in one batch filled up to its bucket
  (before the fourteenth session; "line" cuts a batch that would be a quarter or more fillers to
  the bucket below, `engine.batch.lines_to_take`; CUDA only, elsewhere the same as line).
`--batching` picks which of step, step-eager, line and line-filled run (default step and line),
serial always runs beside them. A line kind may end in "~MS" (e.g. "line~4"): the run with
lines waiting up to MS ms, while the GPU is busy, for lines in flight to join their sampling
batch (the preset's sample_admit_s, `synthesis/batching.py`), "~MS/N" only while fewer than N
lines wait (its sample_admit_up_to; "line~15/4"), "~MS/N:B" only while the GPU holds more than
B of the device owner's launches unfinished (its sample_admit_backlog; "line~40/0:2", N 0: up to
max_batch), "~MS/N:Be" the same before the lines' encoders, "~MS/N:Ba" after them (its
sample_admit_encoders: the lines let go together encode as one call; neither letter: the
preset's, before them on CUDA: "line~15/4:0a" is the twenty-first session's preset). A kind may
end in "@N" (e.g. "line@2"): the run with the device owner's queue depth N (the preset's
owner_queue_depth: the owner waits for the GPU once N of its launches are unfinished there, so the
backlog queues on the host where lines batch; without it, 0, the owner launches every job the
moment it comes); the row's "owner waited" column is its time spent so. A kind may end in "+"
and letters (after all of that, e.g. "line+th"): "t", each line's first window launched before
its tail-trim frame reaches the host (the preset's stream_first_before_trim), "w" after it, as
without; "h", the decode windows on a CUDA stream of their own at a higher priority than the
sampler's (the preset's owner_decode_stream, off in every preset), "d" the same at the default
priority, "u" one stream for all; "x", the text tower's eager forward, not its fused kernels
(`engine/fast_text.py`; the text graphs captured again); "c", stream windows decoded whole, their
context carried through every block, not cropped (`engine/codec/fast.py` `crop_spans`; the codec's
graphs captured again). A letter left out: the preset's. (Lines
sampled from their encoders' job, "+s", measured slower and left on the branch
sample-with-encoders.)

On CUDA a batch replays a graph per batch bucket and coarse shape (`engine.batch.BATCH_BUCKETS`),
captured by prewarm up to `--max-batch`; a batch of a shape without one runs line by line.

One table per news5 mode (`--modes`, default (e) and (o) on CUDA: v2 and v4.1-MF with int4
weights; (f) and (p), their CPU presets, elsewhere), the model news5's (benchmarks/news5.py:
random full-size weights, the same files). Every mode speaks the same audio: a v4 line is asked
for v2's seconds estimate (`news5.estimate_seconds`, as news5 does; random weights make the v4
duration predictor's lengths arbitrary), and the audio seconds of each sentence are printed per
mode.

Per row: lines, audio seconds, wall seconds, aggregate audio seconds per second, its ratio to
serial and to one stream, the same while every stream was still speaking ("all live": the chunks
that landed before the first stream finished, over that time; its ratio to one stream's whole
run; a short run's ramp-down, when its last lines run with few others, left out), p50 / p95 time
to first audio (from a line's start to its first chunk), underruns (a chunk that arrives after
the audio before it has played out, playback starting at the line's first chunk: events, and the
lines that had one), errors (lines that raised or gave no audio), each stage's mean time a line
(its record's timings: text encoder and length, sampling (a batch's lines each count the batch),
decode), the sampling batch sizes that ran, the text encoders' calls by lines in a call, the
device owner's host time in its rounds as a share of the wall (near 100 %: the owner's launches
are the bound; low: the GPU, or lines alone running inline) and its rounds, the owner's calls
that served several jobs at once (encoders, decode windows, step starts of lines that met) and
the jobs in them, on CUDA the peak memory of the run, and the process's CPU time over the run
as a share of the wall (100 %: one core busy; every thread, the streams' own included).

Then the server stage (`--server N`, default 200; 0 leaves it out): benchmarks/server_load.py's
burst of N mixed VOICEVOX / OpenAI requests at `serve`'s default settings, in its own server
process after the tables (the model freed first): on CUDA the full-size model with the first
mode's weights (`--full int4` / `bf16`), elsewhere news5's tiny files on the CPU preset
(`--full smoke`). Its figures go to the JSON under "server".

    python benchmarks/concurrency.py                           # CUDA: modes e and o, 1,4,16,64
    python benchmarks/concurrency.py --modes f --streams 1,4 --lines 2 --server 0   # CPU preset
    python benchmarks/concurrency.py --smoke --streams 1,4 --server 8   # tiny model, any CPU

Two measurements explain the rows (CUDA):

- `--owner-profile N`: each `--batching` kind at N streams once more with the device owner's
  rounds timed by job kind (its thread only) and under cProfile (owner_time.py).
- `--host-ops N`: each batching kind at N streams once more under torch.profiler on every
  thread: the torch ops and CUDA runtime calls the owner's thread makes a line (owner_time.py).
- `--wait-profile N`: each batching kind at N streams once more under py-spy `--idle`: the share
  of every thread group's wall time running or waiting in each of our functions (spy_profile.py):
  where the lines are while the owner idles.
- `--gil-profile N`: the same under py-spy `--gil`: the share of the wall some thread held the
  GIL (near 100 %: Python is the bound, not the GPU), by part and thread group, ms a line.
- `--profile N`: the batched run at N streams once more under `torch.profiler` (CUDA activity
  only: the kernels' own clock, no host-side op recording): the GPU's busy fraction (the union of
  its kernel and copy intervals over the run's wall), GPU ms a line, and the idle gaps (those over
  1 ms by the kernel that ended them: what the GPU waited for); with the decode on its own stream,
  each stream's busy time and the time two ran at once.
- `--ceiling`: what the GPU could do if every stage were batched perfectly: one line's text
  encoder, sampling graph and stream windows timed alone and as batches of 2..16 rows (CUDA
  events, graphs replayed), and the audio seconds per second each batch size would give with the
  host free: the bound the many-streams target is measured against.
- `--stall-dump S`: a row not done in S seconds writes every thread's stack (the streams', the
  device owner's) under the table and the script exits 3: what a stalled row waits for.

Speed is the ratio batched / serial within one run; absolute times count only on a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

import news5  # noqa: E402  (the shared random full-size files, modes and the approximate tokenizer)
import spy_profile  # noqa: E402
from owner_time import owner_ops, owner_time  # noqa: E402

from irodori_speaker.engine.codec import kernels as codec_kernels  # noqa: E402
from irodori_speaker.engine.duration import HOP  # noqa: E402
from irodori_speaker.engine.fast import TEXT_RUNG_LEAST  # noqa: E402
from irodori_speaker.engine.hardware.lock import hold_model_lock  # noqa: E402
from irodori_speaker.engine.hardware.owner import DECODE_PRIORITY, DEVICE  # noqa: E402
from irodori_speaker.engine.kernels.tuning import tuning_allowed  # noqa: E402
from irodori_speaker.options import SynthesisOptions  # noqa: E402
from irodori_speaker.synthesis.batching import SampleBatcher  # noqa: E402
from irodori_speaker.synthesis.prewarm import codec_graphs, step_graphs, text_graphs  # noqa: E402
from irodori_speaker.synthesis.stepping import StepScheduler  # noqa: E402


@dataclass
class Run:
    streams: int
    batched: str  # "step", "step-eager", "line", "line-filled" or "serial"
    ttfa: list[float] = field(default_factory=list)
    audio_s: float = 0.0
    wall_s: float = 0.0
    lines: int = 0
    batches: dict[int, int] = field(default_factory=dict)
    text_batches: dict[int, int] = field(default_factory=dict)  # the text encoders' calls by lines
    peak_mb: float = float("nan")
    stages: dict[str, float] = field(default_factory=dict)  # summed seconds per stage, every line
    underruns: int = 0  # chunks that came after the audio before them had played out
    underrun_lines: int = 0
    errors: int = 0  # lines that raised or gave no audio
    owner_busy_s: float = 0.0  # the device owner's host time in rounds (engine/hardware/owner.py)
    owner_rounds: int = 0
    owner_batched: tuple[int, int] = (0, 0)  # the owner's calls that served several jobs, and those jobs
    owner_waited_s: float = 0.0  # the owner's time waiting for the GPU's queue (a queue depth)
    cpu_s: float = 0.0  # the process's CPU time over the run, every thread (time.process_time)
    error_text: list[str] = field(default_factory=list)
    start: float = 0.0  # perf_counter when the streams were let go
    chunks: list[tuple[float, int]] = field(default_factory=list)  # (perf_counter, samples) of every chunk
    ends: list[float] = field(default_factory=list)  # perf_counter when each stream finished

    @property
    def all_live_rate(self) -> float:
        return all_live_rate(self.chunks, self.ends, self.start)

    def per_line_ms(self, stage: str) -> float:
        return 1e3 * self.stages.get(stage, 0.0) / max(self.lines, 1)

    def pct(self, q: float) -> float:
        xs = sorted(x for x in self.ttfa if x == x)  # a line that failed has no first audio
        return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else float("nan")


PREDICTOR: list[bool] = [False]  # --predictor: v4 lines leave their length to the duration predictor


def line_options(family: str, text: str, seed: int) -> SynthesisOptions:
    """A line's options: v4 lines get v2's seconds estimate, as news5 does, so every mode speaks
    the same audio (random weights make the v4 duration predictor's lengths arbitrary); with
    `--predictor` they leave it to the predictor, as `serve`'s clients do (lengths arbitrary, but
    the same in every kind of one run)."""
    opts = SynthesisOptions(seed=seed)
    if family == "v2" or PREDICTOR[0]:
        return opts
    return opts.replace(seconds=news5.estimate_seconds(text))


def all_live_rate(chunks: list[tuple[float, int]], ends: list[float], start: float) -> float:
    """Audio seconds a second while every stream was still speaking: the samples of the chunks
    that landed before the first stream finished, over that time (a run's ramp-down left out:
    its last lines run with few others, which a stream that keeps talking never sees)."""
    until = min(ends, default=start)
    if until <= start:
        return float("nan")
    return sum(n for t, n in chunks if t <= until) / 48_000 / (until - start)


def late_chunks(arrivals: list[tuple[float, int]]) -> int:
    """How many chunks came after the audio before them had played out: (arrival s, samples at
    48 kHz) in order, playback starting at the first chunk and waiting (an underrun) for a late one."""
    late, played_until = 0, None
    for t, samples in arrivals:
        if played_until is not None and t > played_until:
            late += 1
        start = t if played_until is None or t > played_until else played_until
        played_until = start + samples / 48_000
    return late


MAX_PADDING: list[float | None] = [None]  # --max-padding (the line batches' bound; None: the preset's)
STALL_S = [0.0]  # --stall-dump: a run not done after this many seconds dumps every thread and exits
DECODE_BATCH: list[int | None] = [None]  # --decode-batch (windows decoded together; None: the preset's)
FIRST_BEFORE_TRIM: list[bool] = [False]  # the preset's stream_first_before_trim (a kind's "+t" / "+w" aside)


def use_text_backbone(synth, fused: bool) -> None:
    """The text tower's fused forward (v4's backbone, v2's encoder) on or off for the next run;
    its text graphs, captured with the other one, captured again (a model without a fused tower:
    nothing to do)."""
    fast = synth.fast_sampler
    backbone = fast.fast.text_backbone if fast is not None else None
    if backbone is None or backbone.on == fused:
        return
    backbone.on = fused
    fast._text_graphs.clear()
    if fast.use_graphs:
        with tuning_allowed(), hold_model_lock(), torch.inference_mode():
            text_graphs(synth, fast.context_bucket, 2 * TEXT_RUNG_LEAST * fast.context_bucket)


def use_crop(synth, on: bool) -> None:
    """Stream windows decoded cropped (the codec's `crop_windows`: the deeper blocks carry only
    what the kept samples depend on) or whole for the next run; the codec's graphs captured again
    for the crops that then apply (in a new memory pool)."""
    codec = synth.codec
    if getattr(codec, "crop_windows", on) == on:
        return
    codec.crop_windows = on
    codec_graphs_again(synth)


#: the codec's residual units as the tree ships them (`kernels.UNIT_THIRDS`)
THIRDS_SHIPPED = codec_kernels.UNIT_THIRDS
#: a kind's "+3": the units packed in thirds (the 96- and 192-channel ones fused, `fast.FUSED_UNIT_WIDTH`);
#: "+1": in one chunk (the 96-channel ones fused)
THIRDS = {"3": True, "1": False}


def use_units(synth, thirds: bool) -> None:
    """The codec's residual units packed in `thirds` or not for the next run; where the decoder
    fuses its units (Hopper), their weights packed again and the codec's graphs captured again at
    each switch only."""
    if thirds == codec_kernels.UNIT_THIRDS:
        return
    codec_kernels.UNIT_THIRDS = thirds
    decoder = getattr(synth.codec, "_channels_last", None)
    if decoder is not None and decoder.fuse_units:
        decoder.fuse_units = True  # packs again, and picks the units to fuse, under the new setting
        codec_graphs_again(synth)


def codec_graphs_again(synth) -> None:
    """The codec's graphs, if it holds any, dropped and captured again (in a new memory pool): the
    decode they replay changed."""
    if synth.codec._graphs is not None:
        synth.codec._drop_graphs()
        codec_graphs(synth)


def use_decode_rows(synth) -> None:
    """The codec's graphs for every window batch the preset's `decode_batch` now allows (captured
    once and kept: a run with fewer rows replays its own buckets' graphs as prewarm left them)."""
    graphs = synth.codec._graphs if hasattr(synth.codec, "prewarm_graphs") else None
    if graphs is None or not synth.preset.codec_graphs:
        return
    keys = len(synth._window_keys()) * (1 + len(synth._decode_rows()))
    graphs.max_graphs = max(graphs.max_graphs, keys)
    codec_graphs(synth)


def use_sampling(synth, kind: str, streams: int, voices: list) -> None:
    """Put the sampling under test in place on `synth` (a measurement knob: the preset's max_batch,
    what prewarm captured batch graphs for, caps the batch); `voices`: those the streams speak.
    A kind may end in "@N": the device owner's queue depth N for the run (the preset's
    owner_queue_depth; "line@2"), else none (0); a line kind may end in "~MS" (before any "@"):
    its admission wait in ms ("line~4": `SampleBatcher.admit_s` 0.004), else the preset's, and
    "~MS/N" admits only while fewer than N lines wait ("line~15/4": `admit_up_to` 4), "~MS/N:B"
    only while the GPU holds more than B of the owner's launches ("line~40/16:2": `admit_backlog`
    2; N 0 is max_batch), "~MS/N:Be" with the lines held before their encoders, "~MS/N:Ba" after
    them (`admit_encoders`; neither letter: the preset's). Any kind may end in "+" and letters:
    "t", a line's first window launched before its tail-trim frame lands (the preset's
    `stream_first_before_trim`), "w" after it; "h", the decode on a stream of its own at a higher
    priority (the preset's `owner_decode_stream`), "d" the same at the default priority, "u" one
    stream; "x" the text tower's eager forward (`use_text_backbone`); "c" stream windows decoded
    whole, not cropped (`use_crop`); "s" the copy waiter's events spin in the driver, as before
    `DeviceOwner.spin_copies` was off (else they block); "b" a line alone's inline copy blocks
    (`DeviceOwner.spin_inline` off; else it spins); "3" the codec's 96- and 192-channel units
    fused in thirds, "1" its 96-channel ones in one chunk (`use_units`; neither: as the tree
    ships them); a letter left out, the preset's. "#N"
    before the "+": up to N stream windows decoded as one batch (the preset's `decode_batch`;
    "line#8"), else --decode-batch or the preset's."""
    kind, _, flags = kind.partition("+")
    if set(flags) - set("twdhuxcsb31"):
        raise SystemExit(f"unknown letters after '+' in {kind}+{flags} (t, w, d, h, u, x, c, s, b, 3, 1)")
    kind, _, rows = kind.partition("#")
    # decode windows of lines that meet: one by one when serial (the baseline), else as asked
    windows = 1 if kind == "serial" else int(rows) if rows else DECODE_BATCH[0] or 1
    synth.preset = dataclasses.replace(synth.preset, decode_batch=windows)
    use_text_backbone(synth, fused="x" not in flags)
    use_decode_rows(synth)
    use_crop(synth, on="c" not in flags)
    use_units(synth, next((THIRDS[f] for f in flags if f in THIRDS), THIRDS_SHIPPED))
    own = synth.preset.owner_decode_stream and synth.device.type == "cuda"
    DEVICE.decode_stream = bool(set(flags) & set("dh")) or ("u" not in flags and own)
    DEVICE.decode_priority = 0 if "d" in flags else DECODE_PRIORITY
    DEVICE.spin_copies = "s" in flags
    DEVICE.spin_inline = "b" not in flags
    early = True if "t" in flags else False if "w" in flags else FIRST_BEFORE_TRIM[0]
    kind, _, depth = kind.partition("@")
    DEVICE.queue_depth = int(depth or 0)
    kind, _, admit = kind.partition("~")
    top = min(streams, synth.preset.max_batch) if kind != "serial" else 1
    synth._encoders.max_batch = top  # lines' text encoders batch no further (serial stays serial)
    synth.preset = dataclasses.replace(synth.preset, stream_first_before_trim=early)
    if kind in ("step", "step-eager"):
        synth._batcher = StepScheduler(
            synth._start_lines, synth._step_lines, synth._sample_batch, top, synth._release_lines
        )
        use_step_graphs(synth, kind == "step", voices)
    else:
        pad = MAX_PADDING[0] if MAX_PADDING[0] is not None else synth.preset.max_padding
        fast = synth.fast_sampler  # "line": as the Synthesizer builds it; "line-filled": every
        graphed = fast is not None and fast.use_graphs  # waiting line in one batch, filled up
        admit, _, up_to = admit.partition("/")
        up_to, _, backlog = up_to.partition(":")
        where, backlog = backlog[-1:] if backlog[-1:] in ("e", "a") else "", backlog.rstrip("ea")
        admit_s = float(admit) / 1e3 if admit else synth.preset.sample_admit_s
        synth._batcher = SampleBatcher(
            synth._sample_batch,
            top,
            max_padding=pad,
            fill_buckets=graphed and kind == "line",
            admit_s=admit_s,
            admit_up_to=int(up_to) if up_to else synth.preset.sample_admit_up_to,
            admit_backlog=int(backlog) if backlog else synth.preset.sample_admit_backlog,
            admit_encoders=where == "e" if where else synth.preset.sample_admit_encoders,
        )


def use_step_graphs(synth, on: bool, voices: list) -> None:
    """ "step": the step batcher's forward and line starts from their graphs per bucket (captured
    here once for `voices`, as prewarm does with step batching on, engine/step_graphs.py and
    start_graphs.py), where the sampler has graphs; "step-eager": the same fixed pool, every step
    and start launched eagerly (the A/B of the graphs)."""
    fast = synth.fast_sampler
    if fast is None or not fast.use_graphs:
        return
    batcher = synth._step_batcher()
    graphs = getattr(synth, "_bench_step_graphs", None)  # put aside while "step-eager" runs
    if graphs is None:
        with tuning_allowed():
            step_graphs(synth, fast, voices)
        graphs = synth._bench_step_graphs = batcher.graphs, batcher.starts
    batcher.graphs, batcher.starts = graphs if on else (None, None)
    batcher._packed.clear()  # packed for the other kind's buckets


def join_or_dump(threads: list[threading.Thread], limit_s: float | None, file, what: str) -> bool:
    """Join `threads`; if some are still running after `limit_s` seconds (None: wait for ever),
    write every thread's stack to `file` (a real file: faulthandler writes to its descriptor) and
    return False. Where a run stalls (a hang, or a path 100x slower), the stacks say in what."""
    deadline = None if limit_s is None else time.perf_counter() + limit_s
    for t in threads:
        t.join(None if deadline is None else max(0.0, deadline - time.perf_counter()))
        if t.is_alive():
            alive = sum(x.is_alive() for x in threads)
            print(
                f"\n# STALLED: {what} not done after {limit_s:g} s ({alive} of {len(threads)} "
                f"threads still running); every thread's stack:",
                file=file,
                flush=True,
            )
            faulthandler.dump_traceback(file=file, all_threads=True)
            file.flush()
            return False
    return True


def run(
    synth, voice, family: str, sentences: list[str], streams: int, lines: int, batched: str, device: str
) -> Run:
    """`streams` threads, each speaking `lines` sentences (stream i starts at sentence i);
    `batched`: "step", "step-eager", "line", "line-filled" or "serial" (what samples concurrent
    lines)."""
    use_sampling(synth, batched, streams, voice if isinstance(voice, list) else [voice])
    synth._batcher.batches = {}
    synth._encoders.batches = {}
    out = Run(streams, batched)
    lock = threading.Lock()
    start = threading.Barrier(streams + 1)

    def line(i: int, k: int) -> None:
        text = sentences[(i + k) % len(sentences)]
        t0 = time.perf_counter()
        first, samples, arrivals = None, 0, []
        try:
            own = voice[i % len(voice)] if isinstance(voice, list) else voice  # --voices: stream i's
            s = synth.stream(text, own, line_options(family, text, i * 1000 + k))
            for chunk in s:
                if first is None:
                    news5.sync(device)
                    first = time.perf_counter() - t0
                now = time.perf_counter()
                arrivals.append((now - t0, len(chunk)))
                samples += len(chunk)
                with lock:
                    out.chunks.append((now, len(chunk)))
            timings = s.record.timings if s.record is not None else {}
            error = "" if samples else "no audio"
        except Exception as e:  # counted in the row's errors; the stream goes on with its next line
            timings, error = {}, f"{type(e).__name__}: {e}"
        late = late_chunks(arrivals)
        with lock:
            for stage in ("duration", "sampling", "decode"):
                out.stages[stage] = out.stages.get(stage, 0.0) + timings.get(stage, 0.0)
            out.ttfa.append(first if first is not None else float("nan"))
            out.audio_s += samples / 48_000
            out.lines += 1
            out.underruns += late
            out.underrun_lines += late > 0
            if error:
                out.errors += 1
                out.error_text.append(error)

    def stream(i: int) -> None:
        start.wait()
        for k in range(lines):
            line(i, k)
        with lock:
            out.ends.append(time.perf_counter())

    threads = [
        threading.Thread(target=stream, args=(i,), name=f"stream-{i}", daemon=True) for i in range(streams)
    ]
    for t in threads:
        t.start()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    busy0, rounds0, waited0 = DEVICE.busy_s, DEVICE.rounds, DEVICE.depth_wait_s
    batched0 = (DEVICE.batches_run, DEVICE.batched_jobs)
    start.wait()
    t0 = out.start = time.perf_counter()
    cpu0 = time.process_time()
    if not join_or_dump(threads, STALL_S[0] or None, sys.stdout, f"{streams} streams ({batched})"):
        os._exit(3)  # the stuck threads hold the device owner: no later row could run
    news5.sync(device)
    out.wall_s = time.perf_counter() - t0
    out.cpu_s = time.process_time() - cpu0
    out.owner_busy_s, out.owner_rounds = DEVICE.busy_s - busy0, DEVICE.rounds - rounds0
    out.owner_batched = (DEVICE.batches_run - batched0[0], DEVICE.batched_jobs - batched0[1])
    out.owner_waited_s = DEVICE.depth_wait_s - waited0
    if device == "cuda":
        out.peak_mb = torch.cuda.max_memory_allocated() / 2**20
    out.batches = dict(sorted(synth._batcher.batches.items()))
    out.text_batches = dict(sorted(synth._encoders.batches.items()))
    return out


def _sizes(counts: dict[int, int]) -> str:
    """Batch sizes and how often each ran, as "1:10 4:2"."""
    return " ".join(f"{k}:{v}" for k, v in counts.items())


def _union(events: list[tuple]) -> tuple[int, list[tuple[int, tuple]]]:
    """Over (start, end, ...) intervals: the length of their union, and each gap between its pieces
    with the interval that ended it."""
    busy, gaps, end = 0, [], None
    for e in sorted(events):
        a, b = e[0], e[1]
        if end is None or a > end:
            if end is not None:
                gaps.append((a - end, e))
            busy, end = busy + b - a, b
        elif b > end:
            busy, end = busy + b - end, b
    return busy, gaps


def busy_and_gaps(spans: list[tuple[int, int]]) -> tuple[int, list[int]]:
    """The length of the union of (start, end) intervals, and the gaps between its pieces."""
    busy, gaps = _union(spans)
    return busy, [g for g, _ in gaps]


def gaps_by_next(events: list[tuple[int, int, str]], over: int) -> dict[str, list[int]]:
    """The idle gaps longer than `over` between (start, end, name) intervals, by the name of the
    kernel or copy that ended each: name -> [gaps, their total length]. What the GPU waited for
    (a sampler kernel after a gap: the line's length read; a decode window's: its trim; ...)."""
    out: dict[str, list[int]] = {}
    for gap, (_, _, name) in _union(events)[1]:
        if gap > over:
            tally = out.setdefault(name, [0, 0])
            tally[0], tally[1] = tally[0] + 1, tally[1] + gap
    return out


# the codec's kernels by name: cuDNN's convolutions and transposed convolutions, and its Triton ones
CODEC_KERNELS = ("implicit_gemm", "_residual_unit", "_conv_epilogue", "_snake", "conv")


def codec_share(events: list[tuple[int, int, str]]) -> float:
    """The share of the GPU's kernel time in the codec's kernels (`CODEC_KERNELS`, by name)."""
    total = sum(b - a for a, b, _ in events)
    codec = sum(b - a for a, b, name in events if any(k in name for k in CODEC_KERNELS))
    return codec / total if total else float("nan")


def by_kernel(events: list[tuple[int, int, str]], lines: int, top: int = 25) -> list[dict]:
    """GPU time by kernel name, longest total first: the `top` names' ms and launches a line (a
    kernel replayed from a CUDA graph counts as its own name; overlapping streams count twice)."""
    tally: dict[str, list[int]] = {}
    for a, b, name in events:
        t = tally.setdefault(name, [0, 0])
        t[0], t[1] = t[0] + 1, t[1] + (b - a)
    n = max(lines, 1)
    ranked = sorted(tally.items(), key=lambda kv: -kv[1][1])[:top]
    return [{"kernel": k, "ms_a_line": ns / 1e6 / n, "calls_a_line": c / n} for k, (c, ns) in ranked]


def busy_by_stream(events: list[tuple[int, int, int]]) -> tuple[dict[int, int], int]:
    """Each stream's busy time (the union of its (start, end, stream) intervals), and the time two
    or more streams ran at once (their sum less the union of all: the decode stream's overlap)."""
    spans: dict[int, list[tuple[int, int]]] = {}
    for a, b, stream in events:
        spans.setdefault(stream, []).append((a, b))
    each = {stream: busy_and_gaps(s)[0] for stream, s in spans.items()}
    return each, sum(each.values()) - busy_and_gaps([(a, b) for a, b, _ in events])[0]


def profiled(fn, *args) -> tuple[Run, dict]:
    """`fn(*args)` under torch.profiler, CUDA activity only; the GPU's busy time is the union of its
    kernel / copy intervals (streams overlapping count once)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        r = fn(*args)
    cuda = [e for e in prof.profiler.kineto_results.events() if e.device_type() == DeviceType.CUDA]
    events = [(e.start_ns(), e.start_ns() + e.duration_ns(), e.name()) for e in cuda]
    streams = [e.device_resource_id() for e in cuda]  # the CUDA stream each ran on
    each, both = busy_by_stream([(a, b, s) for (a, b, _), s in zip(events, streams)])
    spans = [(a, b) for a, b, _ in events]
    busy, gaps = busy_and_gaps(spans)
    after = sorted(gaps_by_next(events, 10**6).items(), key=lambda kv: -kv[1][1])
    wall_ns = r.wall_s * 1e9
    stats = {
        "events": len(spans),
        "busy_ms": busy / 1e6,
        "busy_frac": busy / wall_ns if wall_ns else float("nan"),
        "gpu_ms_a_line": busy / 1e6 / max(r.lines, 1),
        "busy_ms_by_stream": {str(k): v / 1e6 for k, v in sorted(each.items())},
        "overlap_ms": both / 1e6,  # two streams (the decode's and the rest) running at once
        "gaps_over_1ms": sum(1 for g in gaps if g > 1e6),
        "gap_ms_over_1ms": sum(g for g in gaps if g > 1e6) / 1e6,
        "gap_ms_under_1ms": sum(g for g in gaps if g <= 1e6) / 1e6,
        # the gaps over 1 ms by the kernel that ended them, longest total first
        "gaps_over_1ms_by_next": [{"kernel": k, "gaps": n, "ms": ns / 1e6} for k, (n, ns) in after],
        "by_kernel": by_kernel(events, r.lines),
        "codec_share": codec_share(events),
    }
    return r, stats


def ceiling(synth, voice, frames: int, text_tokens: int, batches: list[int]) -> list[dict]:
    """GPU ms of each stage of a line of `frames` latent frames, alone and as batches; the audio
    seconds per second of the GPU if lines did nothing else (the host free, every stage batched),
    and with the sampling alone batched (text encoder and windows one line at a time, as now).
    Batch graphs prewarm did not capture are captured here (the sampler's and the codec's)."""
    from irodori_speaker.engine.batch import stack_conditions
    from irodori_speaker.engine.codec.streaming import RECEPTIVE_FIELD_FRAMES
    from irodori_speaker.engine.hardware.lock import hold_model_lock

    fast, codec, preset = synth.fast_sampler, synth.codec, synth.preset
    device = synth.device.type
    cfg = synth.resolve_options()
    # the windows a streamed line takes (the preset's window plan and tail windows, as decoding.py)
    windows = codec.stream_windows(
        frames,
        preset.stream_chunk_frames,
        RECEPTIVE_FIELD_FRAMES,
        preset.stream_first_chunk_frames,
        growth=preset.stream_chunk_growth,
        tail_lengths=tuple(preset.stream_tail_windows),
        plan_lengths=tuple(preset.stream_window_plan),
    )
    lengths = [hi - lo for lo, _, _, hi in windows]
    graphed = codec._graphs is not None and codec._graphs.applies_to(codec.device)
    audio_s = frames * HOP / 48_000
    rows = []
    with hold_model_lock(), torch.inference_mode(), tuning_allowed():
        states = synth.voices.states(voice)
        ids = torch.full((1, text_tokens), 5, dtype=torch.long)
        one = synth._conditions(ids, torch.ones_like(ids, dtype=torch.bool), states)
        for b in batches:
            conds = one if b == 1 else stack_conditions([one] * b)
            noise = torch.randn(b, frames, synth.config.latent_dim, device=synth.device)
            rows_frames = None if b == 1 else [frames] * b
            ids_b = ids.expand(b, -1).contiguous().to(synth.device)
            mask_b = torch.ones_like(ids_b, dtype=torch.bool)
            t_text = news5.device_ms(device, fast.encode_text, ids_b, mask_b)
            t_sample = news5.device_ms(
                device, synth.sample_latent, conds, noise, cfg, frames=rows_frames, reps=10
            )
            t_windows = 0.0
            for n in lengths:
                z = torch.randn(b, codec.latent_channels, n, device=codec.device, dtype=codec.dtype)
                # a graph per (rows, window) captured here, as the stream's are in prewarm
                run = codec._capture_window((b, n)) if graphed else codec._decode_frames
                t_windows += news5.device_ms(device, run, z, reps=10)
            total = t_text + t_sample + t_windows
            rows.append(
                {
                    "rows": b,
                    "text_ms": t_text,
                    "sampling_ms": t_sample,
                    "windows_ms": t_windows,
                    "ms_a_line": total / b,
                    "audio_s_per_s": b * audio_s / (total / 1e3),
                }
            )
    clock = "GPU ms by CUDA events, graphs replayed" if device == "cuda" else "host ms"
    one_row = rows[0]
    for r in rows:  # sampling batched, the rest one line at a time
        per_line = one_row["text_ms"] + one_row["windows_ms"] + r["sampling_ms"] / r["rows"]
        r["sampling_only_audio_s_per_s"] = audio_s / (per_line / 1e3)
    print(
        f"\n# ceiling: a line of {frames} frames ({audio_s:.2f} s), {text_tokens} text tokens, "
        f"windows {lengths}; {clock}"
    )
    print(
        "| rows | text ms | sampling ms | windows ms | GPU ms a line | audio s/s, all batched "
        "| x 1 row | audio s/s, sampling batched only |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['rows']} | {r['text_ms']:.2f} | {r['sampling_ms']:.2f} | {r['windows_ms']:.2f} "
            f"| {r['ms_a_line']:.2f} | {r['audio_s_per_s']:.0f} "
            f"| {r['audio_s_per_s'] / one_row['audio_s_per_s']:.2f} "
            f"| {r['sampling_only_audio_s_per_s']:.0f} |",
            flush=True,
        )
    return rows


def reference_cuts(voice, count: int) -> list:
    """`count` voices: news5's reference, then shorter cuts of it (45 % and 20 % of its frames:
    other reference rungs, engine.fast.context_rung), as a server's voice book of several voices."""
    if count <= 1:
        return [voice]
    from safetensors.torch import load_file, save_file

    from irodori_speaker import Voice

    latent = load_file(str(voice.latent))["latent"]
    folder = Path(tempfile.mkdtemp(prefix="irodori-voices-"))
    out = [voice]
    for k, share in enumerate((0.45, 0.2, 0.7, 0.3)[: count - 1]):
        path = folder / f"ref{k}.safetensors"
        save_file({"latent": latent[: max(8, int(share * latent.shape[0]))].contiguous()}, str(path))
        out.append(Voice.from_latent(path))
    return out


def _plan(text: str) -> tuple[int, ...]:
    return () if text.strip().lower() in ("", "none") else tuple(int(x) for x in text.split(","))


def measure_mode(args, key: str, device: str, sentences: list[str]) -> dict:
    """Mode `key`'s table (every concurrency, batched and serial) and its --profile / --ceiling."""
    mode = news5.modes_for(device)[key]
    if mode.device == "cuda" and device != "cuda":
        raise SystemExit(f"mode {key} needs CUDA")
    t0 = time.perf_counter()  # each phase's time as it ends: a stage cut short shows where it was
    print(f"\n# mode ({key}): building", flush=True)
    files = news5.prepare_files(int4=mode.int4, smoke=args.smoke, families={mode.family})
    tails = tuple(int(x) for x in args.tail_windows.split(",")) if args.tail_windows else ()
    # the preset's plan unless one is given ("none": the windows without a plan)
    plan = {} if args.window_plan is None else {"stream_window_plan": _plan(args.window_plan)}
    synth, voice = news5.build(
        mode, files, args.int4_impl, max_batch=args.max_batch, stream_tail_windows=tails, **plan
    )
    voices = reference_cuts(voice, args.voices)
    MAX_PADDING[0] = args.max_padding
    STALL_S[0] = args.stall_dump
    PREDICTOR[0] = args.predictor
    DECODE_BATCH[0] = args.decode_batch or synth.preset.decode_batch
    FIRST_BEFORE_TRIM[0] = synth.preset.stream_first_before_trim
    print(f"# mode ({key}): built in {time.perf_counter() - t0:.1f} s; prewarm", flush=True)
    if mode.fast:
        synth.prewarm(voice, batch_voices=voices[1:])
    stages = synth.prewarm_report.get("stage_seconds", {}) if mode.fast else {}
    print(
        f"# mode ({key}): prewarm done at {time.perf_counter() - t0:.1f} s "
        f"({', '.join(f'{k} {v:.1f} s' for k, v in stages.items()) or 'none'}); warm-up lines",
        flush=True,
    )
    sentence_audio, sentence_frames = [], []  # warm-up (kernel selection, graphs of these buckets)
    for text in sentences:
        line = synth.stream(text, voice, line_options(mode.family, text, 0))
        sentence_audio.append(sum(len(c) for c in line) / 48_000)
        sentence_frames.append(line.record.frames if line.record is not None else 0)

    length = "the engine's estimate" if mode.family == "v2" else "v2's seconds estimate, as news5"
    if mode.family != "v2" and PREDICTOR[0]:
        length = "the duration predictor's, random weights (--predictor)"
    print(f"\n# concurrency: mode ({key}) {mode.desc}; device {device}; {args.lines} lines per stream")
    print(
        f"# the {len(sentences)} sentences ({length}): latent frames {sentence_frames} "
        f"= {sum(sentence_frames) * HOP / 48_000:.2f} s asked; audio "
        f"{' + '.join(f'{a:.2f}' for a in sentence_audio)} = {sum(sentence_audio):.2f} s"
    )
    print(
        f"# torch {torch.__version__}; {torch.get_num_threads()} threads; "
        f"line batches' max_padding {MAX_PADDING[0] or synth.preset.max_padding}; thread switch interval "
        f"{1e3 * sys.getswitchinterval():g} ms; stream windows {synth._window_lengths()}; "
        f"window plan {list(synth.preset.stream_window_plan) or 'none'}"
    )
    if len(voices) > 1:
        cuts = [int(synth.voices.states(v)[1][0].shape[1]) for v in voices]
        print(
            f"# {len(voices)} voices (stream i speaks voice i mod {len(voices)}), reference positions {cuts}"
        )
    rows = []
    one_stream = None  # audio s/s of the batched run at one stream (the "x 1 stream" column)
    print(
        "| streams | sampling | lines | audio s | wall s | audio s/s | x serial | x 1 stream "
        "| all live: audio s/s (x 1 stream) | TTFA p50 ms "
        "| TTFA p95 ms | underruns (lines) | errors | text / sampling / decode ms a line "
        "| batches (size: count) | text encoder calls (size: count) | owner busy % (rounds) "
        "| owner batched calls (jobs) | owner waited % | peak MiB | process CPU % |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    default_switch = sys.getswitchinterval()
    intervals = [float(x) for x in args.switch_intervals.split(",")] if args.switch_intervals else [None]
    current = None
    for switch, n in [(s, n) for s in intervals for n in [int(x) for x in args.streams.split(",")]]:
        if switch is not None and switch != current:
            sys.setswitchinterval(switch)
            current, one_stream = switch, None
            print(f"| thread switch interval {1e3 * switch:g} ms |", flush=True)
        lines = max(args.lines, -(-args.min_lines // n))
        every = n > 1 or args.one_stream_kinds
        kinds = args.batching.split(",") if every else args.batching.split(",")[:1]
        pair = [run(synth, voices, mode.family, sentences, n, lines, k, device) for k in kinds]
        if args.serial and n > 1:
            pair.append(run(synth, voices, mode.family, sentences, n, lines, "serial", device))
        serial_rate = pair[-1].audio_s / pair[-1].wall_s  # the batched run itself when alone
        if n == 1:
            serial_rate = pair[0].audio_s / pair[0].wall_s  # every kind against the first
            one_stream = one_stream or serial_rate
        for r in pair:
            rate, live = r.audio_s / r.wall_s, r.all_live_rate
            ratio = rate / serial_rate  # batched: its speed-up over serial; serial: 1
            x_one = rate / one_stream if one_stream else float("nan")
            print(
                f"| {n} | {r.batched} | {r.lines} | {r.audio_s:.1f} "
                f"| {r.wall_s:.2f} | {rate:.1f} | {ratio:.2f} | {x_one:.2f} "
                f"| {live:.1f} ({live / one_stream if one_stream else float('nan'):.2f}) "
                f"| {1e3 * r.pct(0.5):.0f} | {1e3 * r.pct(0.95):.0f} | {r.underruns} ({r.underrun_lines}) "
                f"| {r.errors} | {r.per_line_ms('duration'):.1f} / {r.per_line_ms('sampling'):.1f} / "
                f"{r.per_line_ms('decode'):.1f} "
                f"| {_sizes(r.batches)} | {_sizes(r.text_batches)} "
                f"| {100 * r.owner_busy_s / r.wall_s:.0f} ({r.owner_rounds}) "
                f"| {r.owner_batched[0]} ({r.owner_batched[1]}) "
                f"| {100 * r.owner_waited_s / r.wall_s:.0f} | {r.peak_mb:.0f} "
                f"| {100 * r.cpu_s / r.wall_s:.0f} |",
                flush=True,
            )
            for text in sorted(set(r.error_text))[:3]:
                print(f"|  | error: {text[:200]} |")
            rows.append(
                {
                    **{k: v for k, v in vars(r).items() if k not in ("ttfa", "chunks", "ends")},
                    "all_live_audio_s_per_s": r.all_live_rate,
                    "audio_s_per_s": rate,
                    "x_serial": ratio,
                    "x_one_stream": x_one,
                    "p50_s": r.pct(0.5),
                    "p95_s": r.pct(0.95),
                    "switch_s": sys.getswitchinterval(),
                }
            )
    sys.setswitchinterval(default_switch)
    report: dict = {
        "desc": mode.desc,
        "family": mode.family,
        "sentence_audio_s": sentence_audio,
        "sentence_frames": sentence_frames,
        "rows": rows,
    }
    profiled_runs = [
        (int(n), kind)
        for n in (args.owner_profile.split(",") if args.owner_profile else [])
        for kind in args.batching.split(",")
    ]
    for n, kind in profiled_runs:
        lines = max(args.lines, -(-args.min_lines // n))
        r, top = owner_time(run, synth, voices, mode.family, sentences, n, lines, kind, device)
        print(
            f"\n# where the device owner's rounds went ({key}): {n} streams, {kind}, "
            f"{r.audio_s / r.wall_s:.1f} audio s/s, owner busy {100 * r.owner_busy_s / r.wall_s:.0f} % "
            f"of {r.wall_s:.2f} s\n{top}"
        )
        report.setdefault("owner_profile", []).append({"streams": n, "kind": kind, "top": top})
    streams = [int(n) for n in args.host_ops.split(",")] if args.host_ops else []
    for n, kind in [(n, k) for n in streams for k in args.batching.split(",")]:
        use_sampling(synth, kind, n, voices)  # as --profile: the kind set up first
        lines = max(args.lines, -(-args.min_lines // n))
        r, table = owner_ops(run, synth, voices, mode.family, sentences, n, lines, kind, device)
        busy = 100 * r.owner_busy_s / r.wall_s
        print(
            f"\n# the device owner's ops ({key}): {n} streams, {kind}, {r.audio_s / r.wall_s:.1f} "
            f"audio s/s under torch.profiler (every thread), owner busy {busy:.0f} %\n{table}"
        )
        report.setdefault("host_ops", []).append({"streams": n, "kind": kind, "table": table})
    # under py-spy: where every thread waits (--idle), who holds the GIL (--gil)
    for what, spied, gil in (("wait", args.wait_profile, False), ("gil", args.gil_profile, True)):
        for n in [int(x) for x in spied.split(",")] if spied else []:
            lines = max(args.lines, -(-args.min_lines // n))
            for kind in args.batching.split(","):
                use_sampling(synth, kind, n, voices)  # as --profile
                with tempfile.TemporaryDirectory(prefix="irodori-spy-") as tmp:
                    raw = Path(tmp) / f"{what}.txt"
                    with spy_profile.recording(os.getpid(), raw, gil=gil):
                        r = run(synth, voices, mode.family, sentences, n, lines, kind, device)
                    if gil:
                        table = spy_profile.gil_table(raw, r.lines, unit="line", wall_s=r.wall_s)
                    else:
                        table = spy_profile.wait_table(raw)
                rate = f"{r.audio_s / r.wall_s:.1f} audio s/s"
                if gil:
                    head = f"who holds the GIL ({key}): {n} streams, {kind}, {rate} (py-spy --gil; "
                    head += "the recording starts 1 s before the run)"
                else:
                    head = f"where the threads wait ({key}): {n} streams, {kind}, {rate}, owner busy "
                    head += f"{100 * r.owner_busy_s / r.wall_s:.0f} % of {r.wall_s:.2f} s (py-spy --idle, "
                    head += f"{spy_profile.RATE} samples a second a thread)"
                print(f"\n# {head}\n{table}")
                report.setdefault(f"{what}_profile", []).append({"streams": n, "kind": kind, "table": table})
    for n in [int(x) for x in args.profile.split(",")] if args.profile else []:
        if device != "cuda":
            raise SystemExit("--profile needs CUDA (the GPU's busy time)")
        lines = max(args.lines, -(-args.min_lines // n))
        kind = args.batching.split(",")[0]
        # the kind set up before the profiler starts: a switch (the text tower, the crop) captures
        # graphs again, which is not the run (the thirty-first session's profile counted them)
        use_sampling(synth, kind, n, voices)
        r, stats = profiled(run, synth, voices, mode.family, sentences, n, lines, kind, device)
        rate = r.audio_s / r.wall_s
        print(
            f"\n# profiled ({key}): {n} streams batched, {r.lines} lines, {rate:.1f} audio s/s under the "
            f"profiler; GPU busy {stats['busy_ms']:.1f} of {1e3 * r.wall_s:.1f} ms "
            f"({100 * stats['busy_frac']:.0f} %), {stats['gpu_ms_a_line']:.2f} GPU ms a line, "
            f"{stats['events']} kernels and copies; idle gaps: {stats['gaps_over_1ms']} over 1 ms "
            f"({stats['gap_ms_over_1ms']:.1f} ms in all), {stats['gap_ms_under_1ms']:.1f} ms in "
            f"shorter ones; batches {dict(sorted(r.batches.items()))}",
            flush=True,
        )
        share = 100 * stats["codec_share"]
        print(f"#   the codec's kernels (by name): {share:.0f} % of kernel time", flush=True)
        if len(stats["busy_ms_by_stream"]) > 1:
            by = ", ".join(f"{k}: {v:.1f}" for k, v in stats["busy_ms_by_stream"].items())
            print(f"#   busy ms by stream {by}; two at once {stats['overlap_ms']:.1f} ms", flush=True)
        for g in stats["gaps_over_1ms_by_next"][:8]:  # what the GPU waited for
            print(f"#   {g['gaps']} gaps, {g['ms']:.1f} ms, before {g['kernel'][:100]}", flush=True)
        for k in stats["by_kernel"]:  # where the GPU's time goes
            each = f"{k['ms_a_line']:.3f} ms, {k['calls_a_line']:.1f} calls a line"
            print(f"#   {each}: {k['kernel'][:100]}", flush=True)
        report.setdefault("profile", []).append({"streams": n, "audio_s_per_s": rate, **stats})
    if args.ceiling:
        if synth.fast_sampler is None:
            raise SystemExit("--ceiling needs a fast-path mode")
        top = min(args.max_batch, 16)
        batches = [b for b in (1, 2, 4, 8, 16) if b <= top]
        report["ceiling"] = ceiling(synth, voice, args.ceiling_frames, 32, batches)
    return report


def server_stage(requests: int, weights: str, out: Path) -> dict:
    """benchmarks/server_load.py's burst of `requests` at serve's defaults, in its own process."""
    cmd = [sys.executable, str(HERE / "server_load.py"), "-n", str(requests), "--full", weights]
    print(f"\n# server: {' '.join(cmd[1:])}", flush=True)
    code = subprocess.run([*cmd, "--json", str(out)], check=False).returncode
    figures = json.loads(out.read_text()) if out.exists() else {}
    return {**figures, "exit": code}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    modes_help = "news5 modes, one table each (comma-separated; default: e,o on CUDA, f,p elsewhere)"
    ap.add_argument("--modes", "--mode", default=None, help=modes_help)
    ap.add_argument("--streams", default="1,4,16,64", help="concurrencies to run (comma-separated)")
    ap.add_argument("--lines", type=int, default=3, help="sentences each stream speaks")
    # 40: one stream's 10 lines took 0.15-0.25 s on an H100 and its rate, every row's "x 1 stream",
    # moved 342.6-391.0 audio s/s between calls (RESULTS.md twenty-third session)
    min_help = "every run speaks at least this many lines (few streams speak more each)"
    ap.add_argument("--min-lines", type=int, default=40, help=min_help)
    pred_help = "v4 lines leave their length to the duration predictor (serve's path; random lengths)"
    ap.add_argument("--predictor", action="store_true", help=pred_help)
    ap.add_argument("--profile", help="profile the batched runs at these many streams (comma-separated)")
    ap.add_argument(
        "--wait-profile",
        help="each --batching kind at these many streams once more under py-spy --idle: where every "
        "thread (streams, device owner) runs or waits (spy_profile.py; py-spy needed)",
    )
    ap.add_argument(
        "--gil-profile",
        help="each --batching kind at these many streams once more under py-spy --gil: how much of "
        "the wall some thread held the GIL, by part and thread (spy_profile.py; py-spy needed)",
    )
    ap.add_argument(
        "--owner-profile",
        help="each --batching kind at these many streams once more, the owner's rounds timed (owner_time.py)",
    )
    ap.add_argument(
        "--host-ops",
        help="each --batching kind at these many streams once more under torch.profiler: the torch ops "
        "and CUDA runtime calls the device owner's thread makes a line (owner_time.owner_ops)",
    )
    ap.add_argument("--ceiling", action="store_true", help="time each stage alone and batched (CUDA)")
    ap.add_argument("--ceiling-frames", type=int, default=150, help="the ceiling's line length (frames)")
    ap.add_argument("--smoke", action="store_true", help="tiny-random files: a quick check on any CPU")
    switch_help = (
        "run the table once per Python thread switch interval, in seconds (comma-separated; "
        "default: Python's own, 0.005): is a stream's wait for the GIL what idles the GPU?"
    )
    ap.add_argument("--switch-intervals", help=switch_help)
    serial_help = "also run each concurrency with max_batch 1 (the side-by-side baseline)"
    ap.add_argument("--serial", action=argparse.BooleanOptionalAction, default=True, help=serial_help)
    stall_help = (
        "a run (one row) not done after this many seconds writes every thread's stack and the "
        "script exits (3): what a stalled row waits for (default 0: wait for ever)"
    )
    ap.add_argument("--stall-dump", type=float, default=0.0, help=stall_help)
    ap.add_argument(
        "--max-padding", type=float, help="the line batches' padding bound (default: the preset's)"
    )
    ap.add_argument(
        "--one-stream-kinds",
        action="store_true",
        help="run every --batching kind at one stream too (default: the first only; the one-stream "
        "A/B of a kind that is not about batching, e.g. line,line+b)",
    )
    ap.add_argument(
        "--decode-batch", type=int, help="stream windows decoded as one batch (default: the preset's)"
    )
    ap.add_argument(
        "--tail-windows",
        default="",
        help="the preset's stream_tail_windows: shorter graphed lengths a line's last window may "
        "take (e.g. 40; benchmarks/decode_frames.py); run with and without for the A/B",
    )
    ap.add_argument(
        "--window-plan",
        default=None,
        help="the preset's stream_window_plan: the window lengths a line after its first chunk is "
        "cut into, the fewest frames decoded (e.g. 40,66,116,216; benchmarks/decode_frames.py), or "
        "'none' for 50-frame windows; default: the preset's (CUDA: 40,66,116). Run two for the A/B",
    )
    ap.add_argument(
        "--batching",
        default="step,line",
        help="which batched sampling runs beside serial: step, step-eager, line, line-filled "
        "(comma-separated), each optionally with @N: the device owner's queue depth (line@2); a line "
        "kind with ~MS: its lines' admission wait in ms (line~4), ~MS/N: while fewer than N wait, "
        "~MS/N:B: while the GPU holds more than B launches, ~MS/N:Be / :Ba: that before / after the "
        "encoders; any kind with +t / +w: a line's first window launched before / after its trim lands",
    )
    ap.add_argument("--max-batch", type=int, default=16, help="the preset max_batch: the largest batch")
    ap.add_argument(
        "--voices",
        type=int,
        default=1,
        help="streams speak in this many voices (news5's reference and shorter cuts of it, up to 5), "
        "the others prewarmed as batch voices",
    )
    server_help = "the server stage's burst of requests (benchmarks/server_load.py; 0: no server stage)"
    ap.add_argument("--server", type=int, default=200, help=server_help)
    ap.add_argument("--json", type=Path, help="write the rows here too")
    ap.add_argument(
        "--int4-impl",
        default="auto",
        choices=["auto", "kernel", "scratch"],
        help="int4 GEMM path (auto: the chooser measures each M bucket in prewarm; as news5 --int4-impl)",
    )
    args = ap.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    keys = (args.modes or ("e,o" if device == "cuda" else "f,p")).split(",")
    sentences = json.loads(news5.NEWS5_JSON.read_text())["sentences"]
    report: dict = {"device": device, "modes": {}}
    for key in keys:
        report["modes"][key] = measure_mode(args, key, device, sentences)
        gc.collect()  # the mode's model goes before the next is built
        if device == "cuda":
            torch.cuda.empty_cache()
        if args.json:  # written after every stage: a later stage's timeout keeps what ran
            args.json.write_text(json.dumps(report, indent=1))
    if args.server:
        first = news5.modes_for(device)[keys[0]]
        weights = "smoke" if device != "cuda" else ("int4" if first.int4 else "bf16")
        with tempfile.TemporaryDirectory(prefix="irodori-conc-") as tmp:
            report["server"] = server_stage(args.server, weights, Path(tmp) / "server.json")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    if any(m["rows"] and any(r["errors"] for r in m["rows"]) for m in report["modes"].values()):
        raise SystemExit("some lines failed (the rows' errors column)")
    if args.server and report["server"]["exit"] != 0:
        raise SystemExit("the server stage lost or rejected requests (its table above)")


if __name__ == "__main__":
    main()
