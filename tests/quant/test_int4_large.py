"""Our int4 for v4-Large: `irodori-speaker quantize` (RTN and GPTQ) of a tiny Large file writes an
int4 file the loader reads and the synthesizer speaks with; the T5Gemma 2 embedding table is packed
(looked-up rows dequantised, sqrt(hidden) and the end-of-image vector kept); the final latent
stays near the float model's (tiny random model: the bounds are loose, the figures are in
docs/int4.md)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from hub_cache import run_cli_offline
from irodori_speaker.engine.checkpoint import load_checkpoint
from irodori_speaker.engine.quant.checkpoint import load_int4_model
from irodori_speaker.engine.quant.layers import Int4Linear, PackedScaledEmbedding
from irodori_speaker.engine.quant.quantize import RELEASE_SELECTION, LayerSelection, quantize_checkpoint
from irodori_speaker.engine.sampler import SamplerConfig, draw_noise, sample
from irodori_speaker.engine.tiny import tiny_random_files
from irodori_speaker.synthesis.loading import load_synthesizer

EMBED = "pretrained_text_backbone.backbone.embed_tokens"
#: The tiny model's hidden size is 48: its table packs in groups of 16 (the release's 1,152 in 32).
TINY_SELECTION = LayerSelection(
    gptq=RELEASE_SELECTION.gptq, embed=RELEASE_SELECTION.embed, embed_group_size=16
)


def final_latent(model, steps: int = 8) -> torch.Tensor:
    """The RF sampler's result on fixed text ids, no reference, no caption, fixed noise."""
    ids = torch.tensor([[2, 17, 40, 99, 123, 250, 7, 300, 31]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    dtype = next(model.parameters()).dtype
    with torch.inference_mode():
        conds = model.encode_conditions(ids, mask)
        noise = draw_noise(0, 1, 40, model.cfg.latent_dim).to(dtype)
        return sample(model, conds, noise, SamplerConfig(steps=steps, schedule="sway")).float()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.fixture(scope="module")
def large(irodori_home):
    return tiny_random_files("v4-large")


@pytest.mark.parametrize("method", ["rtn", "gptq"])
def test_quantize_writes_a_large_int4_file_that_speaks(large, tmp_path, method):
    release = tmp_path / "large-int4"
    shutil.copytree(large.tokenizer.parent, release / "tokenizer")  # the release's folder beside it
    out = release / "model.safetensors"
    r = run_cli_offline(["quantize", large.model, "-o", out, "--method", method], tmp_path / "hf", tmp_path)
    assert r.returncode == 0, r.stderr
    assert f", {method}, " in r.stdout
    if method == "gptq":  # its held-out table names the T5Gemma 2 linears, calibrated
        assert "pretrained_text_backbone.backbone.layers.0.mlp.down_proj" in r.stdout
    q = load_int4_model(out, dtype="fp32")
    assert q.quantized and q.config.family == "v4-large"
    assert isinstance(
        q.model.pretrained_text_backbone.backbone.layers[0].mlp.down_proj, Int4Linear
    )  # 64 inputs: 48 fit no group of 32
    ref = load_checkpoint(large.model).model
    assert rel(final_latent(q.model), final_latent(ref)) < 0.5  # measured: docs/int4.md
    synth = load_synthesizer(out, codec=large.codec, backend="cpu", voice_cache_dir=False, user_dict=False)
    assert synth.config.family == "v4-large"
    assert len(synth.synthesize("こんにちは。", None, {"seed": 1, "steps": 2}).audio) > 0


def test_the_gemma_embedding_table_is_packed_with_its_scale_and_eoi_vector(large, tmp_path):
    out = tmp_path / "q.safetensors"
    report = quantize_checkpoint(large.model, out, method="rtn", layers=TINY_SELECTION, report_errors=False)
    assert EMBED in report.plan.embed and report.used[EMBED] == "rtn"
    ref = load_checkpoint(large.model).model.pretrained_text_backbone.backbone.embed_tokens
    for dtype in (torch.float32, torch.bfloat16):
        emb = load_int4_model(out, dtype=dtype).model.pretrained_text_backbone.backbone.embed_tokens
        assert isinstance(emb, PackedScaledEmbedding)
        ids = torch.tensor([[2, 5, 300, 319, 0]])
        got, want = emb(ids).float(), ref(ids).float()
        assert got.dtype == torch.float32 and got.shape == (1, 5, 48)
        assert torch.equal(got[0, 2], ref.eoi_embedding.to(dtype).float())  # the EOI id: its own vector
        assert 0 < rel(got, want) < 0.15  # 4-bit rows, times sqrt(48)
    # held dequantised (the policy that expands packed layers) it is the float module again
    dense = load_int4_model(out, dtype="fp32", dequantize=lambda name: True)
    table = dense.model.pretrained_text_backbone.backbone.embed_tokens
    assert type(table) is type(ref)
    torch.testing.assert_close(table(ids), emb(ids).float(), atol=0.05, rtol=0.05)


def test_the_release_packs_the_full_size_table_in_groups_of_32():
    from irodori_speaker.engine.quant.quantize import plan_layers

    plan = plan_layers({EMBED: (262_144, 1_152)}, RELEASE_SELECTION)
    assert plan.embed == [EMBED] and not plan.kept


def test_quantize_reads_a_torchao_int8_copy(tmp_path):
    int8 = (
        Path(__file__).resolve().parents[1]
        / "data"
        / "dit_v4_large"
        / "tiny_v4_large.int8-weight-only.safetensors"
    )
    out = tmp_path / "from-int8.safetensors"
    report = quantize_checkpoint(int8, out, method="rtn", report_errors=False)
    assert report.checkpoint.metadata.get("irodori_quantization_json") is None  # torchao's keys dropped
    q = load_int4_model(out, dtype="fp32")
    ref = load_checkpoint(int8).model
    assert q.config.family == "v4-large" and rel(final_latent(q.model), final_latent(ref)) < 0.5
