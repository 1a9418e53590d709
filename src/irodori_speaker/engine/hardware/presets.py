"""Device presets: which device, precision and sampler defaults a backend uses.

`auto` picks CUDA, else MPS, else CPU. Every field can be overridden by name.
Facts behind the defaults: docs/backends.md.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from ...errors import BackendError
from ..codec.streaming import RECEPTIVE_FIELD_FRAMES, plan_args, stream_args
from .cpu_features import CpuFeatures, choose_threads, cpu_features

#: FP8 tensor cores: Ada (sm_89) and Hopper (sm_90) onwards (engine/quant/fp8.py uses the same).
FP8_MIN_CAPABILITY = (8, 9)

MPS_FALLBACK_ENV = "PYTORCH_ENABLE_MPS_FALLBACK"

BACKENDS = ("auto", "cuda", "mps", "cpu")


@dataclass(frozen=True)
class Preset:
    name: str
    device: str
    dtype: torch.dtype = torch.float32  # DiT weights / activations
    codec_dtype: torch.dtype = torch.float32
    steps: int = 8
    schedule: str = "sway"
    sway_coeff: float = -1.0
    # whole lines decoded in windows of this many frames (None: in one pass); on the stateful
    # stream (`stream_stateful`) a whole line takes a streamed line's chunks instead
    decode_chunk_frames: int | None = None
    stream_chunk_frames: int = 25  # streaming decode: 1 s of audio per chunk ...
    stream_first_chunk_frames: int | None = 8  # ... after a short first chunk (first audio sooner)
    # chunks after the first grow by this factor up to stream_chunk_frames (None: straight there);
    # where decode is slow next to real time, each window decodes while the shorter chunk before
    # it plays, and the longer windows later cost less context overhead
    stream_chunk_growth: float | None = None
    # with codec graphs: shorter window lengths a line's last window may take (graphed too)
    # instead of being stretched to the middle windows' length (engine/codec/streaming.py
    # `chunk_windows`): fewer frames decoded for the same audio, e.g. (40,): news5 decoded 1.44x
    # its frames instead of 1.59x (benchmarks/decode_frames.py). Off until measured on a GPU
    # (`concurrency.py --tail-windows 40`); more window lengths also split the batches of windows
    stream_tail_windows: tuple[int, ...] = ()
    # with codec graphs: a window plan, the window lengths (each graphed at prewarm) that the rest
    # of a line after its first chunk is cut into with the fewest frames decoded (`chunk_windows`
    # `plan_lengths`; stream_chunk_frames and stream_tail_windows then unused, not with
    # stream_chunk_growth); the longest counts in the memory budget's window (engine/hardware/
    # memory.py). The CUDA preset's is (40, 66, 116), measured there
    stream_window_plan: tuple[int, ...] = ()
    # a streamed line's first window goes to the device before its tail-trim frame reaches the
    # host (synthesis/decoding.py): the GPU runs it straight after the sampler, where the line's
    # thread would otherwise wait for the trim first; the same audio (where the trim falls inside
    # that window it is decoded again). Windows only (not the stateful stream). Off until measured
    # on a GPU (`concurrency.py` kind "line+t")
    stream_first_before_trim: bool = False
    # where the codec decodes on the channels-last path on the CPU (the CPU preset; a GPU replays
    # graphed windows, and eagerly there the stream was 26x slower), a line's chunks come from one
    # stateful stream that carries each conv's left context (engine/codec/stateful.py): every
    # frame decoded once, not again as the next window's context. The same chunks and audio (up to
    # rounding); a whole line takes a streamed line's chunks, so the two are the same samples.
    # news5's lines decoded 1.35x faster (a 37-frame line 1.64x) on one core of the dev CPU in
    # bf16, 1.64x in fp32 (benchmarks/stream_decode.py, RESULTS.md). False: the windows
    stream_stateful: bool = True
    # CPU threads for torch; None: $IRODORI_THREADS, else half the CPUs this process may use
    # (cpu_features.choose_threads: a streaming PC is shared; torch's thread per core collapsed)
    threads: int | None = None
    fast_path: bool = True  # engine.fast: fused projections, precomputed AdaLN, buckets
    cuda_graphs: bool = False  # capture the whole sampling loop per bucket (CUDA only)
    codec_graphs: bool = False  # replay the stream's decode windows from CUDA graphs (CUDA only)
    # decode on (B, T, C) with fused conv epilogues (engine/codec/fast.py): on in the CUDA preset
    # and in the CPU preset with bf16 (docs/codec.md "Channels-last decode")
    codec_channels_last: bool = False
    int4: bool = False  # run the DiT on int4 weights; a float file is quantised at load (RTN)
    # W8A8 FP8 (e4m3) DiT linears on FP8 tensor cores (CUDA, compute capability 8.9+): opt-in, never a
    # default (issue 27: chosen only where it measures faster; engine/quant/fp8.py, docs/int4.md)
    fp8: bool = False
    codec_int4: bool = False  # the codec's decoder convs as RTN int4: least memory, slower decode
    codec_device: str | None = None  # where the codec runs (None: `device`), e.g. "cpu" to spare the GPU
    prewarm_seconds: float = 12.0  # CUDA graphs: capture every length bucket up to this at prewarm
    int8_linears: bool = False  # CPU: the DiT's per-step linears as int8 (W8A8, per-row activations)
    # lines waiting for the sampler at the same time (several Speakers, server requests) are
    # sampled as one batch of up to this many (synthesis/batching.py); 1: one after another (the
    # server's --streams sets it, default `serve_streams`). With more than 1, CUDA prewarm
    # captures a graph per batch bucket. 1 by default: on CUDA, under the device owner, line batches
    # ran at 1.42-2.17x one stream at 16-64 streams (H200 and H100) and one stream with 16 took
    # 1.01x (e) / 0.96x (o) its time, but their graphs held +0.4 GiB (o) / +1.7 GiB (e), and prewarm
    # took 23.3 s with them against 4.8 s without (o; two H100 calls, not one run) (RESULTS.md,
    # thirteenth session): a cost for every Speaker of one stream. Servers take `serve_streams`;
    # Speakers sharing one model pass max_batch=16.
    # On the CPU 4 streams of news5 lines ran at 0.60-0.83x serial (padding, cache misses)
    max_batch: int = 1
    # `serve`'s default --streams (its max_batch): a server is many streams by nature. 16 on CUDA
    # (the 200-request burst: none rejected or lost, RESULTS.md thirteenth session); 1 elsewhere
    serve_streams: int = 1
    # with max_batch > 1: the device owner steps every live line together, lines joining and
    # leaving at step boundaries (synthesis/stepping.py); False: the whole-line batches of the
    # lines that wait together (synthesis/batching.py). Off: with its CUDA graphs (H100, twelfth
    # session) 1.12x one stream at 16 streams (e) and 0.92x (o), line batches 1.43-2.14x there
    step_batching: bool = False
    # a batch's padded frames at most this fraction of its real ones (not tuned: batching is off)
    max_padding: float = 0.5
    # line batches: the longest (s) a line's sampling waits, while the device is busy, for lines in
    # flight to join its batch (synthesis/batching.py `SampleBatcher.admit_s`); 0: none (only the
    # lines already waiting batch). 40 ms, before the encoders, in the CUDA preset (there); 0
    # elsewhere (the CPU and MPS run one line at a time)
    sample_admit_s: float = 0.0
    # with admission: a line waits only while fewer lines than this wait for the sampler (0: up to
    # max_batch), so admission tops up small batches and leaves the large ones that form by
    # themselves under heavy load alone (`SampleBatcher.admit_up_to`)
    sample_admit_up_to: int = 0
    # with admission: a line waits only while the GPU holds more than this many of the device
    # owner's launches unfinished (0: while it runs any); a batch held back while the GPU has work
    # queued loses nothing, its launch would queue behind that work (`SampleBatcher.admit_backlog`)
    sample_admit_backlog: int = 0
    # admission before a line's encoders instead of after: the lines let go together encode as one
    # call and sample as one batch (`SampleBatcher.admit_encoders`)
    sample_admit_encoders: bool = False
    # stream windows of one length from lines that meet on the device owner decode as one batch of
    # up to this many (synthesis/decoding.py); with codec graphs prewarm captures a graph per batch
    # bucket up to it. 1: each window alone. On in the CUDA preset (16 windows in one batch took
    # 4.05 against 5.24 ms a line on the H200, `concurrency.py --ceiling`); off on the CPU, where a
    # batched convolution measured no faster (benchmarks/RESULTS.md)
    decode_batch: int = 1
    # CUDA, lines meeting on the device owner: the most of its launches the GPU may hold unfinished
    # before the owner waits for the oldest (engine/hardware/owner.py): the backlog then waits on
    # the host, where lines batch and a new line's first audio goes first, not in the GPU's queue.
    # 0: no bound (the owner never waits). Process-wide (one owner): a CUDA Synthesizer with a
    # non-zero value sets it. 0: depth 2 measured slower (H200, (o), 16 streams 648 against 679
    # audio s/s, 64 streams 718 against 890 with 37 lines underrun; p95 first audio 103 against 127
    # ms at 16; RESULTS.md seventeenth session, `concurrency.py --batching line,line@2`)
    owner_queue_depth: int = 0
    # CUDA with max_batch > 1, lines meeting on the device owner: the decode windows on a CUDA
    # stream of their own at a higher priority (engine/hardware/owner.py `decode_stream`,
    # `DECODE_PRIORITY`), so the text encoders' and the sampler's small kernels run beside the
    # decoder's wide ones. Process-wide, as the queue depth: a Synthesizer with it on sets it. Off
    # in every preset (the CUDA one says why); `concurrency.py` kinds "+h" (on), "+d" (at the
    # default priority), "+u" (one stream)
    owner_decode_stream: bool = False
    # the GPU memory budget in bytes (None: none), set at load from LoadOptions.max_gpu_memory;
    # max_batch and prewarm_seconds are then within it (engine/hardware/memory.py)
    max_gpu_memory: int | None = None

    def with_overrides(self, **overrides) -> Preset:
        names = {f.name for f in dataclasses.fields(self)}
        bad = sorted(set(overrides) - names)
        if bad:
            raise BackendError(f"unknown preset field(s) {bad}; known: {sorted(names)}")
        return dataclasses.replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def audio_flags(self) -> list[str]:
        """The switched-on fields that change the audio beyond dtype / codec_dtype (cache keys)."""
        return [flag for flag in AUDIO_FLAGS if getattr(self, flag)]


#: Boolean preset fields that change the sound (rounding included): part of the phrase-cache key.
AUDIO_FLAGS = ("int4", "fp8", "codec_int4", "int8_linears", "codec_channels_last")


def cuda_available() -> bool:
    return torch.cuda.is_available()


def mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def base_preset(name: str) -> Preset:
    if name == "cuda":
        return Preset(
            "cuda",
            "cuda",
            dtype=torch.bfloat16,
            codec_dtype=torch.float16,
            steps=8,
            cuda_graphs=True,
            codec_graphs=True,
            # 2 s windows: decoded in ~1 ms with graphs; 100-frame ones were no faster (29.8 against
            # 30.4 ms for news5) and 200-frame ones 20 % faster for +270 MiB (codec_speed, H200)
            stream_chunk_frames=50,
            codec_channels_last=True,  # decode 37-44 % faster on every news5 line (H200, RESULTS.md)
            decode_batch=4,
            serve_streams=16,
            # news5 decodes 1.33x its frames in these windows, 1.59x in 50-frame ones: one stream
            # 1.12-1.13x the audio s/s, 16 streams 1.01x (e) / 1.24x (o), 64 streams 1.01x / 1.17x,
            # no underrun; with 216 added one stream was faster still, but 64 streams underran
            # (10 and 31 lines) (H200, RESULTS.md seventeenth session)
            stream_window_plan=(40, 66, 116),
            # a line is held before its text encoders, up to 40 ms while the GPU holds more than
            # one of the owner's launches and fewer than 8 lines are held or wait, and goes with
            # every line held beside it: they encode as one call and sample as one batch. 16
            # streams 1.05-1.21x the 15 ms / 4-line admission after the encoders in five paired
            # runs (e, o), p95 first audio 105-109 against 116-130 ms (o); 64 streams 0.92-1.08x,
            # 1 line underrun in its four runs against 6 in the older rule's eight (H100,
            # RESULTS.md twenty-third session). A line alone or on the high lane never waits
            sample_admit_s=0.04,
            sample_admit_up_to=8,
            sample_admit_backlog=1,
            sample_admit_encoders=True,
            # owner_decode_stream stays off: with the codec's graphs captured apart from the
            # sampler's (thirtieth session; before, they shared a cuBLAS workspace and (e) stalled at
            # 16 streams), (o) at 64 streams lost with it, 0.92-0.94x with 7-11 lines underrun
            # against none, 16 streams within spread in (o) and (e), (e)'s p95 first audio higher
            # with it (H100, RESULTS.md thirtieth session)
        )
    if name == "mps":
        # fp32 everywhere: bf16 on MPS was 19% slower through CPU fallbacks and mixed precision
        # crashed in MPS matmul; 6 steps left tail noise there, so 8.
        return Preset("mps", "mps", dtype=torch.float32, codec_dtype=torch.float32, steps=8)
    if name == "cpu":
        # A whole line decodes in 25-frame (1 s) chunks: cancellation stops it within one chunk
        # and the model lock is free for the next line; codec_cpu.py measured 10 s of audio at
        # 1.16 s per second (one pass: 1.09) with 155 MiB decode peak instead of 886.
        return Preset("cpu", "cpu", steps=8, decode_chunk_frames=25, **cpu_preset_fields())
    raise BackendError(f"unknown backend {name!r}; use one of {', '.join(BACKENDS)}")


def cpu_preset_fields(features: CpuFeatures | None = None) -> dict[str, Any]:
    """The CPU preset's precision, tricks and threads for `features` (default: this CPU's, read once).

    Each trick only where the instructions that make it pay are there (docs/backends.md has the
    measurements and the error of each; benchmarks/cpu_preset.py measures them on a machine):
    - bf16 DiT and codec with native bf16 dot products (AMX-BF16 or AVX512-BF16); without them
      oneDNN emulates bf16 and it is slower than fp32;
    - int8 linears with native int8 dot products (AMX-INT8, AVX512-VNNI or AVX-VNNI);
    - the channels-last decoder (`codec_channels_last`) on every CPU: the stateful stream
      (`stream_stateful`) runs on it, each frame decoded once (fp32 too: news5 1.64x streamed, 1.60x whole);
    - stream windows 8, 24, then 50 frames (`stream_chunk_growth`) where bf16 makes decode fast
      enough that each window is ready before the chunk before it has played: a 50-frame window
      costs 1.32x its audio in decoded frames, a 25-frame one 1.64x (slower CPUs keep 8 then 25).
    Threads are every preset's (`resolve_threads`).
    """
    f = features if features is not None else cpu_features()
    bf16 = f.bf16_matmul
    return {
        "dtype": torch.bfloat16 if bf16 else torch.float32,
        "codec_dtype": torch.bfloat16 if bf16 else torch.float32,
        "int8_linears": f.int8_matmul,
        "codec_channels_last": True,
        "stream_chunk_frames": 50 if bf16 else 25,
        "stream_chunk_growth": 3.0 if bf16 else None,
    }


def resolve_threads(preset: Preset) -> tuple[Preset, str]:
    """`preset` with its torch CPU threads decided (`preset.threads`, else $IRODORI_THREADS, else
    half the usable CPUs) and why, for the startup log."""
    n, why = choose_threads(preset.threads)
    return dataclasses.replace(preset, threads=n), why


def ensure_mps_fallback_env() -> bool:
    """Set PYTORCH_ENABLE_MPS_FALLBACK=1 unless the user set it; True if the fallback is on.

    Ops MPS lacks then run on the CPU instead of raising. The variable is read when torch starts
    MPS, so this runs at `import irodori_speaker` on macOS; set later it may come too late (warned).
    """
    if MPS_FALLBACK_ENV in os.environ:
        return os.environ[MPS_FALLBACK_ENV] == "1"
    os.environ[MPS_FALLBACK_ENV] = "1"
    return True


def available_devices() -> list[str]:
    """The torch devices this machine can run on, e.g. ["cpu", "cuda:0", "cuda:1"]."""
    found = ["cpu"]
    if cuda_available():
        found += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if mps_available():
        found.append("mps")
    return found


def _check_device(field: str, device: str | None) -> None:
    """`device` parses as a torch device and exists here; else a BackendError naming what does."""
    if device is None:
        return
    have = ", ".join(available_devices())
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise BackendError(
            f"{field} {device!r} is not a torch device (available here: {have})",
            hint="e.g. cuda, cuda:1, mps or cpu",
        ) from e
    if dev.type == "cuda":
        if not cuda_available():
            raise BackendError(
                f"{field} {device!r} asked for, but torch sees no CUDA device (available here: {have})",
                hint="install a CUDA build of torch on a machine with an NVIDIA GPU, or use cpu",
            )
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise BackendError(
                f"{field} {device!r} does not exist: torch sees {count} CUDA device(s) (available: {have})",
                hint=f"use cuda:0 to cuda:{count - 1}",
            )
    elif dev.type == "mps" and not mps_available():
        raise BackendError(
            f"{field} {device!r} asked for, but there is no Apple GPU (MPS) here (available: {have})",
            hint="MPS needs Apple Silicon and macOS 12.3+",
        )
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise BackendError(
            f"{field} {device!r}: irodori-speaker runs on cpu, cuda or mps (available here: {have})",
            hint="e.g. cuda, cuda:1, mps or cpu",
        )


def check_fp8(preset: Preset) -> None:
    """With `preset.fp8`: a BackendError unless the device has FP8 tensor cores and int4 is off."""
    if not preset.fp8:
        return
    if preset.int4:
        raise BackendError(
            "fp8 and int4 together: the DiT runs on one kind of weight",
            hint="pick one: int4 (least memory) or fp8 (FP8 tensor cores, 8-bit weights)",
        )
    dev = torch.device(preset.device)
    cap = torch.cuda.get_device_capability(dev) if dev.type == "cuda" and cuda_available() else None
    if cap is None or cap < FP8_MIN_CAPABILITY:
        where = repr(preset.device) + ("" if cap is None else f" (compute capability {cap[0]}.{cap[1]})")
        raise BackendError(
            "fp8 needs FP8 tensor cores (an NVIDIA GPU of compute capability 8.9+: Ada, Hopper), "
            f"not {where}",
            hint="leave fp8 off here (int4 saves memory on any CUDA GPU)",
        )


def select_preset(backend: str = "auto", **overrides) -> Preset:
    """The preset for `backend` ('auto' picks cuda > mps > cpu), with field overrides."""
    if backend not in BACKENDS:
        raise BackendError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    if backend == "auto":
        backend = "cuda" if cuda_available() else "mps" if mps_available() else "cpu"
    elif backend == "cuda" and not cuda_available():
        raise BackendError(
            "backend 'cuda' asked for, but torch sees no CUDA device",
            hint="install a CUDA build of torch, or use backend='cpu'",
        )
    elif backend == "mps" and not mps_available():
        raise BackendError(
            "backend 'mps' asked for, but torch sees no Apple GPU (MPS)",
            hint="MPS needs Apple Silicon and macOS 12.3+; use backend='cpu'",
        )
    preset = base_preset(backend).with_overrides(**overrides)
    choose_threads(preset.threads)  # a bad threads= or $IRODORI_THREADS fails here, before any model
    # the stream's own checks, before any model loads
    stream_args(preset.stream_chunk_frames, 0, preset.stream_first_chunk_frames, preset.stream_chunk_growth)
    plan_args(preset.stream_window_plan, RECEPTIVE_FIELD_FRAMES, preset.stream_chunk_growth)
    for field in ("device", "codec_device"):
        _check_device(field, getattr(preset, field))
    depth = preset.owner_queue_depth
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        raise BackendError(
            f"owner_queue_depth must be an integer >= 0, got {depth!r}",
            hint="0: no bound; 2 lets the GPU hold two of the owner's launches",
        )
    if preset.int8_linears and torch.device(preset.device).type != "cpu":
        raise BackendError(
            f"int8_linears runs on the CPU only, not on {preset.device!r}",
            hint="on a GPU use int4=True for smaller weights, or leave int8_linears off",
        )
    check_fp8(preset)
    if preset.name == "mps":
        if preset.dtype != torch.float32 or preset.codec_dtype != torch.float32:
            raise BackendError(
                "the MPS backend runs fp32 only",
                hint="bf16 on MPS measured 19% slower (ops fall back to the CPU) and fp16/bf16 mixed "
                "precision crashed in MPS matmul; leave dtype at fp32",
            )
        if not ensure_mps_fallback_env():
            warnings.warn(
                f"{MPS_FALLBACK_ENV} is set to {os.environ[MPS_FALLBACK_ENV]!r}: ops MPS lacks will raise "
                "instead of running on the CPU",
                UserWarning,
                stacklevel=2,
            )
    return preset
