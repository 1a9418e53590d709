"""Which W4A16 path a layer runs: `w4a16_linear` asks `choose_impl`, which measures the fused kernel's
candidate tiles (`w4a16_kernel`) against the scratch path (`w4a16_dequant`) once per (GPU, dtype, N, K,
zero kind, group size, M bucket), keeps the fastest, and persists the measurements in `tune_file()`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ...dirs import cache_root
from ...errors import QuantError
from ..cuda_graphs import capture
from ..kernels.triton_common import HAS_TRITON
from ..kernels.tuning import is_tuning_allowed
from .w4a16_dequant import reference_w4a16, w4a16_scratch
from .w4a16_kernel import NUM_SMS_DEFAULT, KernelConfig, auto_split_k, default_config, w4a16_kernel

if HAS_TRITON:  # optional (the "cuda" extra): without it nothing is measured
    import triton

__all__ = [
    "Choice",
    "candidate_configs",
    "choose_impl",
    "clear_choices",
    "m_bucket",
    "nearest_choice",
    "tune_file",
    "w4a16_linear",
]


def m_bucket(m: int) -> int:
    """Power-of-two bucket of M (16 .. 4096): tiles and the kernel/scratch choice are cached per bucket."""
    b = 16
    while b < m and b < 4096:
        b *= 2
    return b


def candidate_configs(m: int, n: int, k: int, num_sms: int = NUM_SMS_DEFAULT) -> list[KernelConfig]:
    """The small tile list tried for M's bucket (BM 16-128, BN 64-256, BK 64/128), plus split-K variants."""
    b = m_bucket(m)
    # (bm, bn, bk, warps, stages, swap, gather); measured on an H200 (docs/int4.md)
    if b <= 32:
        tiles = [(16, 64, 128, 4, 3, False, False), (32, 64, 64, 4, 4, False, False),
                 (16, 64, 128, 4, 4, True, False), (32, 64, 128, 4, 4, True, False),
                 (16, 128, 128, 4, 4, True, False), (16, 64, 64, 4, 3, False, True),
                 (16, 64, 64, 4, 3, True, True)]  # fmt: skip
    elif b <= 128:
        tiles = [(64, 64, 64, 4, 4, False, False), (64, 128, 64, 4, 4, False, False),
                 (32, 128, 64, 4, 4, True, False), (64, 128, 64, 4, 4, True, False),
                 (64, 64, 128, 4, 3, True, False), (32, 64, 64, 4, 3, True, True)]  # fmt: skip
    elif b <= 256:
        tiles = [(64, 128, 64, 4, 4, False, False), (128, 64, 64, 4, 4, False, False),
                 (128, 128, 64, 8, 3, False, False), (64, 128, 64, 4, 4, True, False),
                 (128, 128, 64, 8, 3, True, False)]  # fmt: skip
    else:
        tiles = [(128, 128, 64, 8, 3, False, False), (128, 256, 64, 8, 3, False, False),
                 (128, 128, 128, 8, 3, False, False), (64, 256, 64, 8, 3, False, False),
                 (128, 128, 64, 8, 3, True, False), (128, 256, 64, 8, 3, True, False)]  # fmt: skip
    out: list[KernelConfig] = []
    for bm, bn, bk, w, s, swap, gather in tiles:
        cfg = KernelConfig(bm=bm, bn=bn, bk=bk, num_warps=w, num_stages=s, swap=swap, gather=gather)
        out.append(cfg)
        split = auto_split_k(m, n, k, cfg, num_sms)
        if split > 1:
            out.append(KernelConfig(**{**asdict(cfg), "split_k": split}))
    return out


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return NUM_SMS_DEFAULT


@dataclass(frozen=True)
class Choice:
    """What `w4a16_linear` runs for one (device, dtype, N, K, zero kind, M bucket)."""

    impl: str  # "kernel" | "scratch"
    config: KernelConfig | None = None
    time_ms: float | None = None
    timings: tuple[tuple[str, float], ...] = ()  # every candidate measured: (name, ms)


_CHOICES: dict[tuple, Choice] = {}
_CHOICES_LOCK = threading.Lock()
_TUNE_FILE_ENV = "IRODORI_INT4_TUNE_CACHE"


_DEVICE_NAMES: dict[int, str] = {}


def _device_name(device: torch.device) -> str:
    if device.type != "cuda":
        return device.type
    idx = device.index if device.index is not None else torch.cuda.current_device()
    name = _DEVICE_NAMES.get(idx)
    if name is None:
        name = _DEVICE_NAMES[idx] = torch.cuda.get_device_name(idx)
    return name


def _choice_key(x: torch.Tensor, n: int, k: int, sym: bool, group_size: int) -> tuple:
    return (_device_name(x.device), str(x.dtype), n, k, sym, group_size, m_bucket(x.shape[0]))


def tune_file() -> Path | None:
    """Where the chooser's measurements persist: ``$IRODORI_INT4_TUNE_CACHE`` if set ("" or "off":
    nowhere), else ``kernels/int4-tune.json`` under the cache root (`dirs.cache_root`). Without it
    every process start re-times every (layer shape, M bucket) in prewarm."""
    env = os.environ.get(_TUNE_FILE_ENV)
    if env is not None:
        return None if env.strip().lower() in ("", "0", "off", "none") else Path(env)
    return cache_root() / "kernels" / "int4-tune.json"


def _tune_stamp() -> str:
    """What a saved choice was measured with: another torch or triton re-measures."""
    return f"torch {torch.__version__}, triton {getattr(triton, '__version__', '?') if HAS_TRITON else '-'}"


def _read_tune_rows(path: Path) -> list[dict]:
    try:
        rows = json.loads(path.read_text())
    except (OSError, ValueError):
        return []  # a stale or broken file only costs a re-measurement
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def _load_tune_file() -> None:
    path = tune_file()
    if path is None or not path.is_file():
        return
    stamp = _tune_stamp()
    for row in _read_tune_rows(path):
        try:
            if row.get("stamp") != stamp:
                continue
            cfg = KernelConfig(**row["config"]) if row.get("config") else None
            timings = tuple((str(a), float(b)) for a, b in row.get("timings", []))
            _CHOICES.setdefault(tuple(row["key"]), Choice(row["impl"], cfg, row.get("time_ms"), timings))
        except (KeyError, TypeError, ValueError):
            continue


def _save_tune_file() -> None:
    """Merge this process's measured choices into the file (atomically: another process may read)."""
    path = tune_file()
    if path is None:
        return
    stamp = _tune_stamp()
    ours = {
        json.dumps(list(key)): {
            "key": list(key),
            "impl": c.impl,
            "config": asdict(c.config) if c.config else None,
            "time_ms": c.time_ms,
            "stamp": stamp,
        }
        for key, c in _CHOICES.items()
        if c.time_ms is not None
    }
    rows = {json.dumps(r.get("key")): r for r in _read_tune_rows(path)}
    rows.update(ours)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(list(rows.values()), indent=1))
        os.replace(tmp, path)


_TUNE_MODE_ENV = "IRODORI_INT4_TUNE_MODE"


def _bench_ms(fn: Callable[[], object]) -> float:
    """GPU time of `fn` (ms, median). Default: replayed from a CUDA graph, as the sampler runs it, so
    Python launch overhead does not favour single-launch tiles; IRODORI_INT4_TUNE_MODE=eager measures
    eager launches instead (for models run without graphs)."""
    fn()  # compile / allocate outside any capture
    torch.cuda.synchronize()
    if os.environ.get(_TUNE_MODE_ENV, "graph") != "eager":
        try:
            return _graph_ms(fn)
        except Exception:  # capture not possible here (e.g. another capture in progress): measure eagerly
            pass
    return float(triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median"))


def _graph_ms(fn: Callable[[], object], rep_ms: float = 20.0, replays: int = 10) -> float:
    """Median GPU ms of one `fn()`, from a CUDA graph of as many calls as fill ~`rep_ms`, replayed
    `replays` times (the method of triton's `do_bench_cudagraph`). Captured as every graph here is
    (`cuda_graphs.capture`, on the process's one warm-up stream): `do_bench_cudagraph` takes a
    fresh `torch.cuda.Stream()` a call, and each pool stream the scratch path's cuBLAS ran on kept
    a workspace for the life of the process (32 MiB each, up to the pool's 32): a first run on a
    fresh H100 held ~0.9 GB more with it, none since (RESULTS.md thirtieth and thirty-first
    sessions: (o)'s rows 1,715-1,727 against 820-836 MiB)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    end.synchronize()
    calls = max(1, min(10_000, int(rep_ms / max(start.elapsed_time(end) / 5, 1e-4))))

    def unrolled() -> None:
        for _ in range(calls):
            fn()

    graph, _ = capture(unrolled, [], None)
    times = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return float(statistics.median(times))


def choose_impl(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zero_bias: torch.Tensor | None,
    bias: torch.Tensor | None = None,
    *,
    group_size: int = 32,
    measure: bool = True,
) -> Choice:
    """Pick kernel (with its tile config) or scratch+cuBLAS for this shape's M bucket, measuring on first use.

    The choice is cached per (GPU, dtype, N, K, zero kind, group size, M bucket) and persisted to
    `tune_file()` (the cache folder, or ``IRODORI_INT4_TUNE_CACHE``; per torch and triton version).
    A new bucket is measured inside `kernels.tuning.tuning_allowed()` (warm-up) or when the layer
    shape was never measured at all; otherwise it takes a measured bucket's choice one octave away
    at most (`nearest_choice`), else scratch above M = 64 and the fused kernel below (neither
    cached: a later warm-up still measures the bucket). Nothing is measured while a CUDA graph is
    being captured.
    """
    m, n, k = x.shape[0], qweight.shape[1], qweight.shape[0] * 8
    key = _choice_key(x, n, k, zero_bias is None, group_size)
    with _CHOICES_LOCK:
        if not _CHOICES:
            _load_tune_file()
        hit = _CHOICES.get(key)
    if hit is not None:
        return hit
    capturing = x.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    can_measure = x.device.type == "cuda" and measure and not capturing
    if not (can_measure and is_tuning_allowed()):
        near = nearest_choice(key, max_octaves=1)
        if near is not None:  # mid-stream: no stall, a measured neighbour's pick
            return near
        if can_measure and nearest_choice(key) is not None:
            # the layer was measured, but far from this M: no stall to measure here either. Above
            # M = 64 dequantise + cuBLAS was 1.1-1.8x cuBLAS bf16 at every DiT shape (M >= 150) on
            # the H200, the fused kernel up to 10x slower (benchmarks/int4_gpu.py, RESULTS.md)
            return Choice("scratch") if m > 64 else Choice("kernel", default_config(m, n, k))
    if not can_measure:
        return Choice("kernel", default_config(m, n, k))
    timings: list[tuple[str, float]] = []
    t = _bench_ms(lambda: w4a16_scratch(x, qweight, scales, zero_bias, bias, group_size=group_size))
    timings.append(("scratch", t))
    best_impl, best_cfg, best_t = "scratch", None, t
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    for cfg in candidate_configs(m, n, k, _num_sms(x.device)):

        def run(cfg: KernelConfig = cfg) -> torch.Tensor:
            return w4a16_kernel(
                x, qweight, scales, zero_bias, bias, group_size=group_size, config=cfg, out=out
            )

        try:
            t = _bench_ms(run)
        except Exception:  # a tile that does not compile or fit (shared memory) on this GPU is skipped
            continue
        timings.append((cfg.name(), t))
        if t < best_t:
            best_impl, best_cfg, best_t = "kernel", cfg, t
    best = Choice(best_impl, best_cfg, best_t, tuple(timings))
    with _CHOICES_LOCK:
        _CHOICES[key] = best
        _save_tune_file()
    return best


def nearest_choice(key: tuple, max_octaves: float = math.inf) -> Choice | None:
    """The measured choice of the same layer shape at the M bucket nearest `key`'s (ties: the larger
    bucket) within `max_octaves` of it, or None. Used outside `tuning_allowed()` so a line that
    reaches a new bucket mid-stream (a batch of lines, a long line) does not stop to measure."""
    bucket = key[-1]
    with _CHOICES_LOCK:
        same = [
            (abs(math.log2(kk[-1] / bucket)), -kk[-1], c) for kk, c in _CHOICES.items() if kk[:-1] == key[:-1]
        ]
    if not same:
        return None
    octaves, _, choice = min(same, key=lambda t: t[:2])
    return choice if octaves <= max_octaves else None


def clear_choices() -> None:
    """Forget every cached choice (the next call measures again)."""
    with _CHOICES_LOCK:
        _CHOICES.clear()


def w4a16_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zero_bias: torch.Tensor | None,
    bias: torch.Tensor | None = None,
    *,
    group_size: int = 32,
    impl: str = "auto",
) -> torch.Tensor:
    """``x (..., K) @ W^T + bias`` on packed weights; output (..., N) in x.dtype.

    impl: "auto" (CUDA fp16/bf16: measured choice of kernel vs scratch; otherwise the reference),
    "kernel", "scratch" or "reference".
    """
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    n = qweight.shape[1]
    if impl == "auto":
        if HAS_TRITON and x2.is_cuda and x2.dtype in (torch.float16, torch.bfloat16):
            choice = choose_impl(x2, qweight, scales, zero_bias, bias, group_size=group_size)
            impl = choice.impl
            cfg = choice.config
        elif x2.is_cuda and HAS_TRITON:
            impl, cfg = "scratch", None  # fp32 activations on the GPU: dequantise, fp32 cuBLAS
        else:
            impl, cfg = "reference", None
    else:
        cfg = None
    if impl == "kernel":
        y = w4a16_kernel(x2, qweight, scales, zero_bias, bias, group_size=group_size, config=cfg)
    elif impl == "scratch":
        y = w4a16_scratch(x2, qweight, scales, zero_bias, bias, group_size=group_size)
    elif impl == "reference":
        y = reference_w4a16(x2, qweight, scales, zero_bias, bias, group_size=group_size)
    else:
        raise QuantError(f"unknown w4a16 impl {impl!r} (auto, kernel, scratch, reference)")
    return y.reshape(*lead, n)
