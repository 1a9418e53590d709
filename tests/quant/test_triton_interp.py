"""The W4A16 Triton kernels on the CPU through Triton's interpreter (TRITON_INTERPRET=1).

Triton decides at ``@triton.jit`` time whether a kernel is interpreted, so this module loads its own
copies of the ``quant/w4a16_*.py`` modules and ``kernels/triton_common.py`` with TRITON_INTERPRET=1 set
(the package's shared copies, possibly imported earlier by other tests, are put back afterwards) and keeps
the variable set while the kernels run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton", reason="triton is not installed (the 'cuda' / 'dev' extra)")

import irodori_speaker.engine.kernels.triton_common  # noqa: E402, F401  (the shared copy, restored after the tests)
from irodori_speaker.engine.quant import formats  # noqa: E402
from irodori_speaker.engine.quant.formats import pack_gptq  # noqa: E402


def _exec_copy(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


_INTERPRETED = ("kernels.triton_common", "quant.w4a16_kernel", "quant.w4a16_dequant", "quant.w4a16_chooser")


@pytest.fixture(scope="module")
def interpreted():
    """Private, interpreted copies of the W4A16 modules (and of the shared kernels.triton_common whose jit
    helper their kernels call: it must be interpreted too), by short name ("w4a16_kernel", ...)."""
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    package = Path(formats.__file__).parents[1]  # irodori_speaker/engine
    names = [f"irodori_speaker.engine.{n}" for n in _INTERPRETED]
    shared = {name: sys.modules.get(name) for name in names}
    try:
        # in import order, under their own names, so each copy's relative imports find the copies before it
        mods = {
            name.rpartition(".")[2]: _exec_copy(package.joinpath(*short.split(".")).with_suffix(".py"), name)
            for short, name in zip(_INTERPRETED, names, strict=True)
        }
        if not mods["w4a16_kernel"].HAS_TRITON:
            pytest.skip("triton imported but its language module did not")
        yield mods
    finally:
        for name, mod in shared.items():  # the package's shared copies, as they were
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


@pytest.fixture(scope="module")
def wk(interpreted):
    """The interpreted `quant.w4a16_kernel`."""
    return interpreted["w4a16_kernel"]


@pytest.fixture(scope="module")
def wd(interpreted):
    """The interpreted `quant.w4a16_dequant`."""
    return interpreted["w4a16_dequant"]


@pytest.fixture(scope="module")
def ch(interpreted):
    """The interpreted `quant.w4a16_chooser`."""
    return interpreted["w4a16_chooser"]


def _layer(n: int, k: int, *, sym: bool, seed: int, gs: int = 32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g)
    z = torch.full((n, k // gs), 8) if sym else torch.randint(0, 16, (n, k // gs), generator=g)
    s = torch.rand(n, k // gs, generator=g) * 0.02 + 0.002
    return pack_gptq(q, z, s, group_size=gs)


CASES = [
    # (M, N, K, symmetric, dtype, bias, config)
    (7, 64, 96, True, torch.float16, False, dict(bm=16, bn=64, bk=64)),  # K % BK != 0, odd M
    (7, 64, 96, False, torch.bfloat16, True, dict(bm=16, bn=64, bk=64, swap=True)),
    (33, 128, 160, False, torch.float16, True, dict(bm=32, bn=64, bk=64)),  # M past one tile
    (33, 128, 160, True, torch.bfloat16, False, dict(bm=16, bn=64, bk=128, swap=True)),
    (33, 72, 160, False, torch.bfloat16, True, dict(bm=16, bn=64, bk=64, split_k=2)),  # N % BN != 0
    (33, 128, 160, True, torch.float16, True, dict(bm=16, bn=64, bk=32, swap=True, split_k=3)),
    (3, 3680, 64, True, torch.float16, True, dict(bm=16, bn=128, bk=64, swap=True)),  # the DiT's N
    (7, 72, 96, False, torch.bfloat16, True, dict(bm=16, bn=64, bk=64, gather=True)),  # per-k loads
    (33, 64, 160, False, torch.float16, False, dict(bm=16, bn=64, bk=64, gather=True, swap=True, split_k=2)),
]


@pytest.mark.parametrize(("m", "n", "k", "sym", "dtype", "with_bias", "cfg"), CASES)
def test_kernel_matches_fp32_reference(wk, m, n, k, sym, dtype, with_bias, cfg) -> None:
    p = _layer(n, k, sym=sym, seed=m + n + k)
    zb = None if sym else wk.zero_bias_from_zeros(p.zeros())
    g = torch.Generator().manual_seed(7)
    x = torch.randn(m, k, generator=g).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype) if with_bias else None
    y = wk.w4a16_kernel(x, p.qweight, p.scales, zb, bias, config=wk.KernelConfig(**cfg))
    assert y.shape == (m, n) and y.dtype == dtype

    w32 = p.dequantize(torch.float32)  # [N, K], checked against the spec formula in test_formats
    ref = x.double() @ w32.double().t() + (0 if bias is None else bias.double())
    rel = float((y.double() - ref).norm() / ref.norm())
    # measured on this CPU: fp16 ~2.2e-4, bf16 ~2.0e-3 (a bf16 output alone rounds to ~1.7e-3)
    assert rel < (1e-3 if dtype == torch.float16 else 4e-3), rel

    # tighter: against the weights rounded to the activation dtype, only accumulation order and the
    # final rounding may differ (1 ulp of the output dtype, plus fp32 accumulation noise)
    ref_r = x.double() @ w32.to(dtype).double().t() + (0 if bias is None else bias.double())
    ulp = 2.0**-10 if dtype == torch.float16 else 2.0**-7
    tol = ulp * ref_r.abs() + 1e-5 * ref_r.abs().max()
    assert bool(((y.double() - ref_r).abs() <= tol).all())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("sym", [True, False])
def test_dequant_kernel_is_exact(wk, wd, dtype, sym) -> None:
    p = _layer(72, 160, sym=sym, seed=11)
    zb = None if sym else wk.zero_bias_from_zeros(p.zeros())
    out = torch.empty(160, 72, dtype=dtype)
    wd.dequantize_into(p.qweight, p.scales, zb, out)
    # (q - z) * s is exact in fp32; rounding it once to fp16/bf16 is what the kernel must produce
    assert torch.equal(out, p.dequantize(torch.float32).t().to(dtype))


def test_scratch_path_and_reference_agree(wk, wd, ch) -> None:
    p = _layer(64, 96, sym=False, seed=3)
    zb = wk.zero_bias_from_zeros(p.zeros())
    x = torch.randn(5, 96, dtype=torch.float32).to(torch.float16)
    bias = torch.randn(64).half()
    ref = wd.reference_w4a16(x.float(), p.qweight, p.scales, zb, bias.float())
    y_k = ch.w4a16_linear(x, p.qweight, p.scales, zb, bias, impl="kernel")
    y_s = ch.w4a16_linear(x.float(), p.qweight, p.scales, zb, bias.float(), impl="scratch")
    assert torch.allclose(y_k.float(), ref, rtol=2e-3, atol=2e-3)
    assert torch.allclose(y_s, ref, rtol=1e-5, atol=1e-5)
    # CPU "auto" means the reference path
    y_a = ch.w4a16_linear(x.float().view(1, 5, 96), p.qweight, p.scales, zb, bias.float())
    assert y_a.shape == (1, 5, 64) and torch.allclose(y_a[0], ref, rtol=1e-5, atol=1e-5)


def test_chooser_off_gpu_and_buckets(ch) -> None:
    assert [ch.m_bucket(m) for m in (1, 25, 75, 150, 450, 750, 2250, 9000)] == [
        16, 32, 128, 256, 512, 1024, 4096, 4096,
    ]  # fmt: skip
    for m in (25, 75, 150, 450, 750, 2250):
        cands = ch.candidate_configs(m, 1280, 3680)
        assert 4 <= len(cands) <= 16
        assert len({c.name() for c in cands}) == len(cands)
        for c in cands:
            assert c.bm in (16, 32, 64, 128) and c.bn in (64, 128, 256) and c.bk in (64, 128)
            if c.split_k > 1:  # split only where the plain grid leaves SMs idle
                assert -(-m // c.bm) * -(-1280 // c.bn) < 132
    x = torch.zeros(25, 64, dtype=torch.float16)
    p = _layer(64, 64, sym=True, seed=0)
    choice = ch.choose_impl(x, p.qweight, p.scales, None)
    assert choice.impl == "kernel" and choice.time_ms is None  # CPU: nothing measured


def test_kernel_rejects_bad_operands(wk) -> None:
    from irodori_speaker.errors import QuantError

    p = _layer(64, 64, sym=True, seed=0)
    with pytest.raises(QuantError, match="fp16 or bf16"):
        wk.w4a16_kernel(torch.zeros(2, 64), p.qweight, p.scales, None)
    with pytest.raises(QuantError, match="qweight"):
        wk.w4a16_kernel(torch.zeros(2, 32, dtype=torch.float16), p.qweight, p.scales, None)


@pytest.mark.parametrize(("gs", "bk"), [(64, 32), (64, 128), (128, 64), (32, 32)])
def test_other_group_sizes(wk, wd, gs, bk) -> None:
    p = _layer(64, 256, sym=False, seed=gs + bk, gs=gs)
    zb = wk.zero_bias_from_zeros(p.zeros())
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(1)).half()
    cfg = wk.KernelConfig(bm=16, bn=64, bk=bk, swap=bk == 128)
    y = wk.w4a16_kernel(x, p.qweight, p.scales, zb, group_size=gs, config=cfg)
    ref = x.double() @ p.dequantize().double().t()
    assert float((y.double() - ref).norm() / ref.norm()) < 1e-3
    out = torch.empty(256, 64, dtype=torch.float16)
    wd.dequantize_into(p.qweight, p.scales, zb, out, group_size=gs)
    assert torch.equal(out, p.dequantize().t().half())


def test_new_bucket_mid_stream_takes_a_measured_neighbour_or_a_fixed_pick(wk, ch) -> None:
    """Outside warm-up a new M bucket reuses a measured bucket one octave away (no stall to
    measure), else scratch above M = 64; inside `tuning_allowed()` on a GPU it would measure
    (tests/quant/test_cuda.py). Off the GPU nothing is measured, so the fixed pick is not taken."""
    from irodori_speaker.engine.kernels.tuning import is_tuning_allowed, tuning_allowed

    ch.clear_choices()
    try:
        x = torch.zeros(3000, 64, dtype=torch.float16)
        p = _layer(64, 64, sym=True, seed=0)
        key = ch._choice_key(x[:600], 64, 64, True, 32)  # bucket 1024
        assert ch.nearest_choice(key) is None
        assert ch.choose_impl(x[:600], p.qweight, p.scales, None).time_ms is None  # never measured
        small = ch.Choice("kernel", wk.KernelConfig(bm=16, bn=64, bk=64), 0.01)
        large = ch.Choice("scratch", None, 0.02)
        ch._CHOICES[(*key[:-1], 128)] = small
        ch._CHOICES[(*key[:-1], 4096)] = large
        ch._CHOICES[("other-gpu", *key[1:])] = ch.Choice("kernel", None, 0.0)  # another layer key
        assert ch.nearest_choice(key) is large  # 1024: 2 octaves from 4096, 3 from 128
        assert ch.nearest_choice(key, max_octaves=1) is None
        assert ch.choose_impl(x[:100], p.qweight, p.scales, None) is small  # bucket 128 itself
        assert ch.choose_impl(x[:40], p.qweight, p.scales, None) is small  # 64: one octave from 128
        assert ch.choose_impl(x[:3000], p.qweight, p.scales, None) is large  # 4096 itself
        assert ch.nearest_choice((*key[:-1], 2048), max_octaves=1) is large
        ch._CHOICES[(*key[:-1], 256)] = large
        assert ch.nearest_choice((*key[:-1], 512), max_octaves=1) is large  # 256: one octave away
        assert ch.nearest_choice((*key[:-1], 192), max_octaves=1) is large  # tie 128 / 256: larger
        with tuning_allowed():
            assert is_tuning_allowed()
            with tuning_allowed():
                assert is_tuning_allowed()
        assert not is_tuning_allowed()
    finally:
        ch.clear_choices()


def test_measured_choices_persist_in_the_cache_folder(wk, ch, tmp_path, monkeypatch) -> None:
    """Choices survive the process in `tune_file()` (default: the cache root's kernels/); a file
    from another torch / triton, a broken one, or "off" costs only a re-measurement."""
    monkeypatch.delenv("IRODORI_INT4_TUNE_CACHE", raising=False)
    monkeypatch.setenv("IRODORI_CACHE", str(tmp_path / "home"))
    path = ch.tune_file()
    assert path == tmp_path / "home" / "kernels" / "int4-tune.json"
    ch.clear_choices()
    try:
        key = ("NVIDIA H200", "torch.bfloat16", 1280, 1280, True, 32, 256)
        ch._CHOICES[key] = ch.Choice("kernel", wk.KernelConfig(bm=32, bn=64, bk=64, split_k=2), 0.012)
        ch._CHOICES[(*key[:-1], 512)] = ch.Choice("scratch", None, None)  # unmeasured: not saved
        ch._save_tune_file()
        rows = json.loads(path.read_text())
        assert [r["key"] for r in rows] == [list(key)] and rows[0]["stamp"] == ch._tune_stamp()
        ch.clear_choices()
        ch._load_tune_file()
        assert {
            key: ch.Choice("kernel", wk.KernelConfig(bm=32, bn=64, bk=64, split_k=2), 0.012)
        } == ch._CHOICES
        # another process's rows are merged, not overwritten
        other = (*key[:-1], 1024)
        ch._CHOICES[other] = ch.Choice("scratch", None, 0.02)
        del ch._CHOICES[key]
        ch._save_tune_file()
        assert {tuple(r["key"]) for r in json.loads(path.read_text())} == {key, other}
        # measured with another torch / triton: ignored
        rows = json.loads(path.read_text())
        for r in rows:
            r["stamp"] = "torch 0.0, triton 0.0"
        path.write_text(json.dumps(rows))
        ch.clear_choices()
        ch._load_tune_file()
        assert ch._CHOICES == {}
        path.write_text("{not json")
        ch._load_tune_file()
        assert ch._CHOICES == {}
        monkeypatch.setenv("IRODORI_INT4_TUNE_CACHE", "off")
        assert ch.tune_file() is None
        ch._save_tune_file()  # nowhere: no error
        monkeypatch.setenv("IRODORI_INT4_TUNE_CACHE", str(tmp_path / "mine.json"))
        assert ch.tune_file() == tmp_path / "mine.json"
    finally:
        ch.clear_choices()
