"""W4A16 kernels on a real GPU: every tile the chooser may pick, at the DiT shapes (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.cuda

if not torch.cuda.is_available():
    pytest.skip("needs an NVIDIA GPU", allow_module_level=True)
triton = pytest.importorskip("triton", reason="triton is not installed")

from irodori_speaker.engine.quant.formats import pack_gptq  # noqa: E402
from irodori_speaker.engine.quant.layers import Int4Linear  # noqa: E402
from irodori_speaker.engine.quant.w4a16_chooser import candidate_configs, choose_impl, clear_choices  # noqa: E402
from irodori_speaker.engine.quant.w4a16_dequant import release_scratch, w4a16_scratch  # noqa: E402
from irodori_speaker.engine.quant.w4a16_kernel import w4a16_kernel, zero_bias_from_zeros  # noqa: E402

DEV = torch.device("cuda")
TOL = {torch.float16: 1e-3, torch.bfloat16: 4e-3}


def _layer(n: int, k: int, *, sym: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g)
    z = torch.full((n, k // 32), 8) if sym else torch.randint(0, 16, (n, k // 32), generator=g)
    s = torch.rand(n, k // 32, generator=g) * 0.02 + 0.002
    return pack_gptq(q, z, s)


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("k", "n"), [(1280, 1280), (3680, 1280), (1280, 7360)])
@pytest.mark.parametrize("m", [25, 150, 750, 2250])
def test_every_candidate_tile_is_correct(dtype, k, n, m) -> None:
    p = _layer(n, k, sym=(m % 2 == 0), seed=k + n)
    qw, sc = p.qweight.to(DEV), p.scales.to(DEV)
    zb = None if m % 2 == 0 else zero_bias_from_zeros(p.zeros()).to(DEV)
    x = torch.randn(m, k, device=DEV).to(dtype)
    bias = torch.randn(n, device=DEV).to(dtype)
    ref = x.double() @ p.dequantize().to(DEV).double().t() + bias.double()
    ran = 0
    for cfg in candidate_configs(m, n, k):
        try:
            y = w4a16_kernel(x, qw, sc, zb, bias, config=cfg)
        except Exception as e:  # only resource limits may stop a tile from running
            assert "out of resource" in str(e).lower(), f"{cfg.name()}: {type(e).__name__}: {e}"
            continue
        ran += 1
        assert _rel(y, ref) < TOL[dtype], (cfg.name(), _rel(y, ref))
    assert ran >= 3
    assert _rel(w4a16_scratch(x, qw, sc, zb, bias), ref) < TOL[dtype]


def test_chooser_measures_caches_and_layer_runs() -> None:
    clear_choices()
    p = _layer(1280, 1280, sym=True, seed=1)
    layer = Int4Linear(p).to(DEV)
    x = torch.randn(2, 75, 1280, device=DEV, dtype=torch.bfloat16)
    y = layer(x)
    ref = x.double() @ p.dequantize().to(DEV).double().t()
    assert y.shape == (2, 75, 1280) and _rel(y, ref) < TOL[torch.bfloat16]
    c = choose_impl(x.reshape(-1, 1280), layer.qweight, layer.scales, None)
    assert c.time_ms is not None and len(c.timings) >= 4
    assert choose_impl(x.reshape(-1, 1280), layer.qweight, layer.scales, None) is c
    y32 = layer(x.float())  # fp32 activations: dequant + fp32 GEMM
    assert _rel(y32, ref) < 1e-5


def test_cuda_graph_replay_matches_eager() -> None:
    p = _layer(3680, 1280, sym=False, seed=2)
    layer = Int4Linear(p).to(DEV)
    x = torch.randn(450, 1280, device=DEV, dtype=torch.float16)
    eager = layer(x)  # measures and caches the choice before capture
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        layer(x)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(graph):
        out = layer(x)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.testing.assert_close(out, layer(x), rtol=0, atol=0)
    assert not torch.equal(out, eager)


def test_a_graph_captured_before_the_scratch_grew_still_replays_right() -> None:
    """The v4 fault (H200, 2026-12-03): the text encoder's graph was captured on the 768-wide
    backbone, the DiT's larger layers then grew the shared dequant buffer, and the replay wrote into
    the freed (after empty_cache, unmapped) old one. A grown-out buffer must stay alive."""
    small = Int4Linear(_layer(768, 768, sym=False, seed=5)).to(DEV)
    small.impl = "scratch"
    x = torch.randn(64, 768, device=DEV, dtype=torch.bfloat16)
    release_scratch()  # a fresh buffer, sized by the small layer
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        small(x)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = small(x)
    big = Int4Linear(_layer(7360, 1280, sym=False, seed=6)).to(DEV)
    big.impl = "scratch"
    big(torch.randn(64, 1280, device=DEV, dtype=torch.bfloat16))  # grows the shared buffer
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, small(x), rtol=0, atol=0)


def test_a_new_bucket_is_measured_only_in_warm_up() -> None:
    from irodori_speaker.engine.kernels.tuning import tuning_allowed

    clear_choices()
    p = _layer(1280, 1280, sym=True, seed=3)
    layer = Int4Linear(p).to(DEV)
    x = torch.randn(1100, 1280, device=DEV, dtype=torch.bfloat16)
    first = choose_impl(x[:75], layer.qweight, layer.scales, None)  # never seen: measured (128)
    assert first.time_ms is not None
    assert choose_impl(x[:200], layer.qweight, layer.scales, None) is first  # 256: one octave
    far = choose_impl(x, layer.qweight, layer.scales, None)  # bucket 2048, mid-stream: not timed
    assert far.impl == "scratch" and far.time_ms is None
    with tuning_allowed():
        warm = choose_impl(x, layer.qweight, layer.scales, None)
    assert warm.time_ms is not None and len(warm.timings) >= 4
    assert choose_impl(x, layer.qweight, layer.scales, None) is warm
    y = layer(x)  # the layer runs whatever was picked
    assert _rel(y, x.double() @ p.dequantize().to(DEV).double().t()) < TOL[torch.bfloat16]


def test_measuring_choices_keeps_no_cublas_workspace_per_measurement(monkeypatch) -> None:
    """The chooser's timing runs on the process's warm-up stream: every timed call of the scratch
    path (cuBLAS) ran there or on the caller's stream, and six new buckets measured leave allocated
    memory as it was. Timed on a fresh stream a call (triton's `do_bench_cudagraph`), each such
    stream kept a cuBLAS workspace (32 MiB on an H100 / H200) for the life of the process."""
    from irodori_speaker.engine import cuda_graphs
    from irodori_speaker.engine.kernels.tuning import tuning_allowed
    from irodori_speaker.engine.quant import w4a16_chooser

    streams = []
    real = w4a16_chooser.w4a16_scratch

    def recorded(*args, **kwargs):
        streams.append(torch.cuda.current_stream())
        return real(*args, **kwargs)

    monkeypatch.setattr(w4a16_chooser, "w4a16_scratch", recorded)
    clear_choices()
    p = _layer(1280, 1280, sym=True, seed=4)
    layer = Int4Linear(p).to(DEV)
    x = torch.randn(1100, 1280, device=DEV, dtype=torch.bfloat16)
    with tuning_allowed():
        choose_impl(x[:16], layer.qweight, layer.scales, None)  # the warm-up stream's own workspace
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        picks = [choose_impl(x[:m], layer.qweight, layer.scales, None) for m in (40, 75, 150, 300, 600, 1100)]
        torch.cuda.synchronize()
    assert all(c.time_ms is not None and dict(c.timings)["scratch"] > 0 for c in picks)
    assert len(streams) > 7 * 5  # each bucket's scratch path timed: warm calls and the capture
    assert set(streams) <= {cuda_graphs.warmup_stream(), torch.cuda.current_stream()}
    assert torch.cuda.memory_allocated() - before < 16 * 2**20


def test_the_graph_timing_grows_with_the_work() -> None:
    """`_graph_ms` (the chooser's timing) measures one call: a GEMM of sixteen times the rows takes
    longer than the small one, and neither is zero."""
    from irodori_speaker.engine.quant.w4a16_chooser import _graph_ms

    a = torch.randn(4096, 4096, device=DEV, dtype=torch.bfloat16)
    small, big = (
        torch.randn(256, 4096, device=DEV, dtype=a.dtype),
        torch.randn(4096, 4096, device=DEV, dtype=a.dtype),
    )
    t_small, t_big = _graph_ms(lambda: small @ a), _graph_ms(lambda: big @ a)
    assert 0 < t_small < t_big
