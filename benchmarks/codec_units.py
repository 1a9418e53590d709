"""A codec residual unit in one kernel (`codec.kernels.residual_unit`) against the decoder's unfused ops.

CUDA, fp16, full-size DACVAE with random weights, the channels-last decoder the CUDA preset runs.
1. Per residual unit of the 96- and 192-channel stages (each dilation), on `--rows` windows of
   `--frames` frames: the unfused unit (7-tap conv, epilogue, 1-tap conv, epilogue: the decoder's
   own ops, dilated convs in phases) against `residual_unit` in each block configuration of
   `sweep` (BT/BK/BN/warps/stages), device ms (CUDA events, medians), the best three; per packing
   of its outputs (`--thirds`: also in three chunks, `kernels.unit_chunks`; "128" is one chunk
   of 128 channels, "3x32" three of 32), each measured in the same run.
2. The graphed window per rows x frames (`--shapes`) with units unfused and fused in the best
   configuration per width and packing found in table 1.

    python benchmarks/codec_units.py
    python benchmarks/codec_units.py --rows 16 --shapes 1x16,4x66,16x66 --reps 10
    python benchmarks/codec_units.py --max-width 96     # only the 96-channel stage's units fused
    python benchmarks/codec_units.py --thirds           # one chunk against three, side by side
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import news5  # device_ms: the benchmarks' one timer

from irodori_speaker.engine.codec import (
    FULL_CODEC_KWARGS,
    codec_from_state_dict,
    fast,
    kernels,
    random_codec_state_dict,
)
from irodori_speaker.engine.codec.fast import ChannelsLastDecoder

Config = kernels.UnitConfig


def packing(C: int, thirds: bool) -> str:
    n, width = kernels.unit_chunks(C, thirds)
    return f"{n}x{width}" if n > 1 else str(width)


def sweep(C: int, thirds: bool) -> list[Config]:
    """Block configurations to try for a unit of C channels (the fp32 accumulators of BT x the
    packed width within 128 registers a thread; an output block within one chunk)."""
    n, width = kernels.unit_chunks(C, thirds)
    out = []
    for bt in (32, 64, 128, 256):  # 256: the weights' L2 traffic a tile halved (twentieth session)
        for bk in (32, 64):
            for bn in (32, 64, 128) if width == 32 else (64, 128):
                for warps in (4, 8, 16):
                    for stages in (2, 3):
                        if bn <= width and bt * n * width <= 128 * 32 * warps and bt >= 8 * warps:
                            out.append((bt, bk, bn, warps, stages))
    return out


def unit_table(
    d: ChannelsLastDecoder, rows: int, frames: int, reps: int, packings: list[bool]
) -> dict[tuple[int, bool], Config]:
    """Per width and packing: every configuration of `sweep` on its dilation-3 unit, then the best
    three and the default on each of its units; the configuration with the best mean ratio."""
    print(f"\n1. one residual unit, {rows} windows of {frames} frames, device ms; fused: configurations")
    print("   BT/BK/BN/warps/stages, the whole sweep on the dilation-3 unit, its best three on each")
    head = "| C | packed | dilation | samples a row | unfused | fused: best | 2nd | 3rd | unfused / best |"
    print(head + " default |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    cases: dict[int, list[tuple[int, int]]] = {}  # width -> (place in steps, dilation)
    for i in sorted(d._packs or {}):
        conv = d.steps[i][0]
        if conv.dilation not in [dil for _, dil in cases.get(conv.weight.shape[0], [])]:
            cases.setdefault(conv.weight.shape[0], []).append((i, conv.dilation))
    out = {}
    for C, units in cases.items():
        units.sort(key=lambda u: u[1] != 3)  # the dilation-3 unit first: the sweep runs on it
        for thirds in dict.fromkeys(kernels.unit_chunks(C, t)[0] > 1 for t in packings):
            top: list[Config] = sweep(C, thirds)
            ratios: dict[Config, list[float]] = {}
            for i, dil in units:
                t_u, t_d, ranked = unit_case(d, i, rows, frames, reps, top, thirds)
                for t, config in ranked:
                    ratios.setdefault(config, []).append(t_u / t)
                top = [c for _, c in ranked[:3]]
                cells = " | ".join(f"{'/'.join(map(str, c))}: {t:.3f}" for t, c in ranked[:3])
                T = frames * d_samples_per_frame(C)
                print(
                    f"| {C} | {packing(C, thirds)} | {dil} | {T} | {t_u:.3f} | {cells} | "
                    f"{t_u / ranked[0][0]:.2f}x | {t_d:.3f} |"
                )
            full = [c for c in ratios if len(ratios[c]) == len(units)]
            best = out[C, thirds] = max(full, key=lambda c: sum(ratios[c]) / len(ratios[c]))
            mean = sum(ratios[best]) / len(units)
            print(
                f"best for C = {C} packed {packing(C, thirds)}: {'/'.join(map(str, best))}, "
                f"unfused / fused {mean:.2f}x on average"
            )
    return out


def unit_case(
    d: ChannelsLastDecoder, i: int, rows: int, frames: int, reps: int, configs: list[Config], thirds: bool
) -> tuple[float, float, list[tuple[float, Config]]]:
    """Device ms of the unit at `steps[i]`: unfused, fused in the default configuration, and
    fused in each of `configs` (fastest first), its weights packed in thirds or not."""
    conv, _, alpha, _ = d.steps[i]
    tail, _, nxt, _ = d.steps[i + 1]
    C, dil = conv.weight.shape[0], conv.dilation
    T = frames * d_samples_per_frame(C)
    s, x = (torch.randn(rows, T, C, device="cuda", dtype=torch.float16) for _ in range(2))
    assert alpha is not None and nxt is not None
    packed = kernels.pack_residual_unit(conv.weight, tail.weight, thirds=thirds)

    def unfused() -> None:
        _, mid = kernels.conv_epilogue(conv(s), conv.bias, None, alpha, False)
        assert mid is not None
        kernels.conv_epilogue(tail(mid), tail.bias, x, nxt, True)

    def one(config: Config) -> None:
        kernels.residual_unit(s, packed, conv.bias, alpha, dil, tail.bias, x, nxt, True, config=config)

    with torch.inference_mode():
        t_u = news5.device_ms("cuda", unfused, reps=reps)
        t_d = news5.device_ms("cuda", one, kernels.residual_unit_config(C, thirds), reps=reps)
        ranked = []
        for config in configs:
            try:
                ranked.append((news5.device_ms("cuda", one, config, reps=reps), config))
            except Exception as e:  # a configuration that does not compile (shared memory)
                print(f"  {config}: {type(e).__name__}")
    return t_u, t_d, sorted(ranked)


def d_samples_per_frame(C: int) -> int:
    """Samples a latent frame has at the stage of C channels (the decoder halves channels as it
    doubles or more the rate; the last, narrowest stage runs at the output rate)."""
    return {96: 1920, 192: 960}[C]


def window_table(
    codec,
    shapes: list[tuple[int, int]],
    configs: dict[tuple[int, bool], Config],
    reps: int,
    packings: list[bool],
) -> None:
    names = [f"fused{' in thirds' if t else ''}" for t in packings]
    print("\n2. the graphed window, units unfused and fused (best configuration per width), ms a window")
    print(f"| rows x frames | unfused ms | {' | '.join(n + ' ms' for n in names)} | unfused / each |")
    print("|---|---|" + "---|" * len(names) + "---|")
    default, thirds_before = kernels.residual_unit_config, kernels.UNIT_THIRDS
    # the sweep's best block by (channels, packing), else the default's
    kernels.residual_unit_config = lambda C, t: (  # type: ignore[misc]
        configs.get((C, t)) or configs.get((C, False)) or default(C, t)
    )
    d = codec._channels_last
    for rows, frames in shapes:
        z = torch.randn(rows, codec.latent_channels, frames, device="cuda").to(codec.dtype)
        row = []
        for fuse in (None, *packings):
            kernels.UNIT_THIRDS = bool(fuse)
            d.fuse_units = fuse is not None  # packs with UNIT_THIRDS
            codec.use_graphs(True, capture_on_use=None, max_graphs=1)
            codec.prewarm_graphs([frames], batch=rows)
            with torch.inference_mode():
                n = frames * codec.hop_length
                row.append(news5.device_ms("cuda", codec._decode_window, z, 0, n, reps=reps) / rows)
        ratios = ", ".join(f"{row[0] / r:.2f}x" for r in row[1:])
        print(f"| {rows} x {frames} | {' | '.join(f'{r:.3f}' for r in row)} | {ratios} |")
    kernels.residual_unit_config = default  # type: ignore[assignment]
    kernels.UNIT_THIRDS = thirds_before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--frames", type=int, default=66)
    ap.add_argument("--shapes", default="1x16,1x66,4x40,4x66,4x116,16x66")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--max-width", type=int, default=256, help="fuse units of at most this many channels")
    ap.add_argument("--thirds", action="store_true", help="also pack the outputs in three chunks")
    args = ap.parse_args()
    assert torch.cuda.is_available(), "a CUDA benchmark"
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    codec = codec_from_state_dict(
        random_codec_state_dict(FULL_CODEC_KWARGS, seed=0, watermark=False), FULL_CODEC_KWARGS, device="cuda"
    ).to(torch.float16)
    assert codec.use_channels_last(True) and codec._channels_last is not None
    fast.FUSED_UNIT_WIDTH = dict.fromkeys((False, True), args.max_width)  # what fuses, either packing
    codec._channels_last.fuse_units = True
    packings = [False, True] if args.thirds else [False]
    configs = unit_table(codec._channels_last, args.rows, args.frames, args.reps, packings)
    shapes = [(int(r), int(f)) for r, f in (s.split("x") for s in args.shapes.split(","))]
    window_table(codec, shapes, configs, args.reps, packings)


if __name__ == "__main__":
    main()
