"""benchmarks/codec_units.py: the block configurations it sweeps fit the kernel they are for, in
either packing of a unit's outputs. Its timings need CUDA (a GPU benchmark)."""

from __future__ import annotations

from bench_script import load
from irodori_speaker.engine.codec import kernels


def test_the_sweep_fits_each_packing_and_names_it():
    mod = load("codec_units")
    assert [mod.packing(C, t) for C in (96, 192) for t in (False, True)] == ["128", "3x32", "256", "3x64"]
    for C in (96, 192):
        for thirds in (False, True):
            n, width = kernels.unit_chunks(C, thirds)
            configs = mod.sweep(C, thirds)
            assert len(configs) >= 8 and len(set(configs)) == len(configs)
            for bt, bk, bn, warps, stages in configs:
                assert bn <= width and width % bn == 0  # an output block within one chunk
                assert bt * n * width <= 128 * 32 * warps  # the accumulators in registers
                assert bk in (32, 64) and stages in (2, 3)
            # the three-chunk packing of 96 channels can only take 32-wide output blocks
            assert any(c[2] == 32 for c in configs) == (width == 32)
