"""Full-size DACVAE decode on the CPU: time per second of audio and peak memory, full vs chunked.

Each variant runs in its own subprocess with a freshly built full-size codec
(random weights, the real hyper-parameters). Peak memory is the process's
peak resident set (VmHWM), reset with /proc/self/clear_refs after the codec is
built, so it shows what one decode needs on top of the loaded weights; torch's
CPU allocations are invisible to tracemalloc, RSS sees them.

    python benchmarks/codec_cpu.py                       # 2 s and 10 s; full, chunks of 8/25/50
    python benchmarks/codec_cpu.py --seconds 2 --chunks 25 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path


def _status_mib(field: str) -> float:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"{field}:\s+(\d+) kB", text).group(1)) / 1024


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _random_full_codec(seed: int):
    """The full-size codec with random weights scaled like `random_codec_state_dict`, built in place."""
    import torch

    from irodori_speaker.engine.codec import DACVAE, FULL_CODEC_KWARGS, ResidualUnit, Snake

    gen = torch.Generator().manual_seed(seed)
    model = DACVAE.from_kwargs(FULL_CODEC_KWARGS)
    residual_convs = {
        id(m) for ru in model.modules() if isinstance(ru, ResidualUnit) for m in ru.modules() if m is not ru
    }
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, Snake):
                module.alpha.copy_(0.5 + torch.rand(module.alpha.shape, generator=gen))
            elif isinstance(module, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)):
                w = module.weight
                w.normal_(generator=gen)
                rows = w.flatten(1).norm(dim=1).view(-1, 1, 1)
                scale = 0.3 if id(module) in residual_convs else 1.0
                w.mul_(scale * (0.8 + 0.4 * torch.rand(rows.shape, generator=gen)) / rows)
                module.bias.normal_(generator=gen).mul_(0.01)
    return model.eval().requires_grad_(False)


def worker(seconds: float, chunk: int | None, repeat: int, threads: int | None) -> dict:
    import torch

    if threads:
        torch.set_num_threads(threads)
    model = _random_full_codec(seed=0)
    frames = round(seconds * 25)
    latent = torch.randn(1, frames, 32, generator=torch.Generator().manual_seed(1))
    model.decode(latent[:, :2])  # first-call costs (oneDNN primitive creation)
    baseline = _status_mib("VmRSS")
    exact_peak = _reset_peak()
    times, cpu_times = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        audio = model.decode(latent) if chunk is None else model.decode_chunked(latent, chunk)
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
        assert audio.shape[-1] == frames * 1920
    peak = _status_mib("VmHWM")
    return {
        "seconds": seconds,
        "variant": "full" if chunk is None else f"chunk {chunk}",
        "decode_s": min(times),
        "s_per_audio_s": min(times) / seconds,
        "cpu_s": min(cpu_times),
        "rss_weights_mib": baseline,
        "peak_rss_mib": peak,
        "decode_peak_mib": peak - baseline,
        "exact_peak": exact_peak,
        "threads": torch.get_num_threads(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, nargs="+", default=[2.0, 10.0])
    ap.add_argument("--chunks", type=int, nargs="+", default=[8, 25, 50], help="chunk sizes in latent frames")
    ap.add_argument("--repeat", type=int, default=1, help="decodes per variant (the fastest is reported)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--worker", type=str, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker is not None:
        seconds, chunk = json.loads(args.worker)
        print(json.dumps(worker(seconds, chunk, args.repeat, args.threads)))
        return

    load_before = os.getloadavg()
    rows = []
    for seconds in args.seconds:
        frames = round(seconds * 25)
        variants: list[int | None] = [None] + [c for c in args.chunks if c < frames]
        for chunk in variants:
            cmd = [
                sys.executable,
                __file__,
                "--worker",
                json.dumps([seconds, chunk]),
                "--repeat",
                str(args.repeat),
            ]
            if args.threads:
                cmd += ["--threads", str(args.threads)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=os.environ).stdout
            row = json.loads(out.strip().splitlines()[-1])
            rows.append(row)
            print(f"  done: {seconds:g} s {row['variant']}", file=sys.stderr, flush=True)

    print(f"DACVAE full-size decode on CPU, fp32, {rows[0]['threads']} torch threads, context 8 frames")
    print(f"(weights loaded: {rows[0]['rss_weights_mib']:.0f} MiB RSS; 'decode peak' = peak RSS above that)")
    cols = ("audio", "variant", "decode s", "s / audio s", "CPU s", "peak RSS MiB", "decode peak MiB")
    widths = (6, 9, 8, 11, 6, 12, 15)
    header = " | ".join(f"{c:>{w}}" for c, w in zip(cols, widths))
    print(header)
    print("-" * len(header))
    for r in rows:
        cells = (
            f"{r['seconds']:g}s",
            r["variant"],
            f"{r['decode_s']:.2f}",
            f"{r['s_per_audio_s']:.2f}",
            f"{r['cpu_s']:.1f}",
            f"{r['peak_rss_mib']:.0f}",
            f"{r['decode_peak_mib']:.0f}",
        )
        print(" | ".join(f"{c:>{w}}" for c, w in zip(cells, widths)))
    print(f"load average (1 min) before / after: {load_before[0]:.2f} / {os.getloadavg()[0]:.2f}")
    if not all(r["exact_peak"] for r in rows):
        print("note: /proc/self/clear_refs unavailable: peaks include building the codec")


if __name__ == "__main__":
    main()
