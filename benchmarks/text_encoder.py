"""The text towers and the duration predictor (released shapes, random weights) eager against
fused, graphed.

A text-encoder call is on the path to every line's first audio, and at 16 streams a v4 call was
nearly as dear for one line as for eight (2.67 against 3.03 ms on an H100, RESULTS.md
"Twenty-second session"). Per tower (`--towers`: "v4", ModernBERT-ja-310m's shape, v4 / v4.1-MF's
backbone; "v2", the v2 500M model's scratch text encoder; "dur", v4.1-MF's duration predictor
over the text states, with a speaker and a caption; "large", v4-Large's T5Gemma 2 text tower) and
rows x tokens (`--shapes`): the forward as the model runs it and with its elementwise work fused
(`fast_text.FastModernBert`, `.FastTextEncoder`, `.FastT5Gemma`,
`fast_duration.FastDurationPredictor`), each captured in a CUDA graph and replayed (the text
towers' path in the product; the predictor runs eagerly there, so its kernel count is the host's
launches), device ms (CUDA events, medians, side by side in one run); the kernels one call
launches (torch.profiler); and the largest difference between the two outputs. The rows' last
quarter of tokens is padding, as a batch's shorter lines are.

    python benchmarks/text_encoder.py
    python benchmarks/text_encoder.py --towers v2,dur --shapes 1x64,8x64,16x96 --dtype bf16 --reps 50
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import news5  # device_ms: the benchmarks' one timer

from irodori_speaker.engine.backbone_config import BackboneConfig, T5Gemma2Config, parse_backbone_config
from irodori_speaker.engine.config import ModelConfig
from irodori_speaker.engine.cuda_graphs import capture
from irodori_speaker.engine.duration import DurationPredictor
from irodori_speaker.engine.encoders import TextEncoder
from irodori_speaker.engine.fast_duration import FastDurationPredictor
from irodori_speaker.engine.fast_text import FastModernBert, FastT5Gemma, FastTextEncoder
from irodori_speaker.engine.t5gemma import T5Gemma2TextEncoder
from irodori_speaker.engine.text_backbone import ModernBert

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def released_backbone(dtype: torch.dtype) -> ModernBert:
    """ModernBERT-ja-310m's shape (its config from the v4.1-Small-MF manifest), random weights."""
    with gzip.open(news5.MF_MANIFEST, "rt", encoding="utf-8") as f:
        cfg = parse_backbone_config(json.load(f)["text_encoder_config"])
    assert isinstance(cfg, BackboneConfig)
    torch.manual_seed(0)
    return ModernBert(cfg).to("cuda", dtype).eval()


def released_text_encoder(dtype: torch.dtype) -> TextEncoder:
    """The v2 500M model's scratch text encoder (its config from the v2 manifest), random weights."""
    cfg = ModelConfig.from_dict(json.loads(news5.V2_MANIFEST.read_text())["config"])
    torch.manual_seed(0)
    encoder = TextEncoder(
        cfg.text_vocab_size, cfg.text_dim, cfg.text_layers, cfg.text_heads, cfg.text_mlp_hidden, cfg.norm_eps
    )
    return encoder.to("cuda", dtype).eval()


Fused = FastModernBert | FastT5Gemma | FastTextEncoder | FastDurationPredictor
Inputs = Callable[[int, int], list[torch.Tensor]]  # (rows, tokens) -> the forward's arguments


def _tokens(vocab: int) -> Inputs:
    def make(rows: int, tokens: int) -> list[torch.Tensor]:
        return [torch.randint(7, vocab, (rows, tokens), device="cuda"), _mask(rows, tokens)]

    return make


def _mask(rows: int, tokens: int) -> torch.Tensor:
    mask = torch.ones(rows, tokens, dtype=torch.bool, device="cuda")
    mask[1:, tokens - tokens // 4 :] = False  # every row but the first padded
    return mask


def released_predictor(dtype: torch.dtype) -> tuple[DurationPredictor, ModelConfig]:
    """v4.1-MF's duration predictor (its config from the v4.1-Small-MF manifest), random weights."""
    cfg = news5._full_config("v4.1-mf")
    torch.manual_seed(0)
    return DurationPredictor(cfg).to("cuda", dtype).eval(), cfg


def tower(name: str, dtype: torch.dtype) -> tuple[torch.nn.Module, Fused, str, Inputs]:
    """(eager module, fused forward, what it is, its inputs) of `--towers`' `name`."""
    if name == "v4":
        bb = released_backbone(dtype)
        c = bb.cfg
        heads = c.num_attention_heads
        what = f"v4 backbone: {c.num_hidden_layers} layers, hidden {c.hidden_size}, {heads} heads"
        return bb, FastModernBert(bb), what, _tokens(c.vocab_size)
    if name == "large":
        cfg = news5._full_config("v4-large").text_backbone
        assert isinstance(cfg, T5Gemma2Config)
        torch.manual_seed(0)
        with torch.device("cuda"):  # the 262,144-token table made on the GPU
            t5 = T5Gemma2TextEncoder(cfg).to(dtype).eval()
        heads = f"{cfg.num_attention_heads} heads, {cfg.num_key_value_heads} K/V"
        what = f"v4-Large T5Gemma 2 tower: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, {heads}"
        return t5, FastT5Gemma(t5), what, _tokens(cfg.vocab_size)
    if name == "dur":
        pred, cfg = released_predictor(dtype)

        def inputs(rows: int, tokens: int) -> list[torch.Tensor]:
            def rand(*shape: int) -> torch.Tensor:
                return torch.randn(*shape, device="cuda", dtype=dtype)

            has = torch.ones(rows, dtype=torch.bool, device="cuda")
            has[1::2] = False  # every other row without a reference and caption: the null ones
            state, speaker = rand(rows, tokens, cfg.text_dim), rand(rows, cfg.speaker_dim)
            caption = rand(rows, cfg.caption("dim"))
            return [state, _mask(rows, tokens), speaker, has, caption, has]

        layers, hidden = len(pred.token_blocks), cfg.duration_hidden_dim
        fused = FastDurationPredictor(pred)  # fuses the layers (the eager forward then runs on views)
        what = f"v4.1-MF duration predictor: {layers} blocks, hidden {hidden}"
        return pred, fused, what, inputs
    enc = released_text_encoder(dtype)
    fast = FastTextEncoder(enc)  # fuses the projections (the eager forward then runs on views of them)
    a = enc.blocks[0].attention
    D = a.heads * a.head_dim
    what = f"v2 text encoder: {len(enc.blocks)} layers, hidden {D}, {a.heads} heads"
    return enc, fast, what, _tokens(enc.text_embedding.num_embeddings)


def kernels_a_call(fn, *args) -> int:
    """CUDA kernels launched by one call of `fn(*args)` (eager, under torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--towers",
        default="v4,v2,dur",
        help="v4 (ModernBERT), v2 (the scratch encoder), dur (the predictor), large (v4-Large's T5Gemma 2)",
    )
    ap.add_argument("--shapes", default="1x64,2x64,4x64,8x64,16x64,1x128,8x128")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    assert torch.cuda.is_available(), "a CUDA benchmark"
    dtype = DTYPES[args.dtype]
    print(torch.cuda.get_device_name(), "torch", torch.__version__, args.dtype)
    pool = torch.cuda.graph_pool_handle()
    for name in args.towers.split(","):
        model, fast, what, make_inputs = tower(name, dtype)
        # the predictor's fused forward is its blocks, passed to its forward as `body`
        with_fast = partial(model, body=fast) if isinstance(fast, FastDurationPredictor) else fast
        print(f"\n{what}\n")
        print("| rows x tokens | eager ms | fused ms | eager / fused | kernels eager / fused | max diff |")
        print("|---|---|---|---|---|---|")
        with torch.inference_mode():
            for shape in args.shapes.split(","):
                rows, tokens = (int(v) for v in shape.split("x"))
                inputs = make_inputs(rows, tokens)
                times, outs, counts = [], [], []
                for fn in (model, with_fast):
                    counts.append(kernels_a_call(fn, *inputs))
                    graph, out = capture(fn, inputs, pool)
                    times.append(news5.device_ms("cuda", graph.replay, reps=args.reps))
                    outs.append(out.float().clone())
                assert fast.on, "the fused kernels fell back to the eager forward"
                diff = (outs[0] - outs[1]).abs().max().item()
                print(
                    f"| {rows} x {tokens} | {times[0]:.3f} | {times[1]:.3f} | {times[0] / times[1]:.2f}x | "
                    f"{counts[0]} / {counts[1]} | {diff:.2e} |"
                )


if __name__ == "__main__":
    main()
