"""Model files: `convert-codec` (weights.pth to safetensors) and `quantize` (int4 checkpoints)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from ..errors import IrodoriError
from .common import EXIT_OK, sub_parser


def cmd_convert_codec(args: argparse.Namespace) -> int:
    from ..engine.codec import convert_codec
    from ..engine.sources import CODEC_REPO, resolve

    src = resolve(args.source or CODEC_REPO, "codec")
    out = convert_codec(src, args.output)
    print(f"wrote {out} (folded weights, loads without pickle)")
    return EXIT_OK


# ---- quantize ------------------------------------------------------------------------------------


def cmd_quantize(args: argparse.Namespace) -> int:
    from ..engine.quant.quantize import quantize_checkpoint
    from ..engine.sources import resolve

    src = resolve(args.model, "model")
    calibration = None
    if args.calibration_file:
        lines = Path(args.calibration_file).read_text(encoding="utf-8").splitlines()
        calibration = [t.strip() for t in lines if t.strip() and not t.lstrip().startswith("#")]
        if not calibration:
            raise IrodoriError(f"{args.calibration_file}: no sentences in the calibration file")
    tokenizer: Any = None
    if args.method == "gptq":
        from ..engine.checkpoint import config_from_metadata, read_header
        from ..engine.sources import TOKENIZER_REPO

        cfg, _ = config_from_metadata(read_header(src)[0], str(src))
        if cfg.pretrained_text:  # v4: the release's tokenizer/ folder (beside the model, or --tokenizer)
            from ..text.backbone_tokenizer import tokenizer_for_model

            tokenizer = tokenizer_for_model(args.tokenizer, src, cfg.text_backbone)
        else:
            tokenizer = resolve(args.tokenizer or cfg.text_tokenizer_repo or TOKENIZER_REPO, "tokenizer")
    t0 = time.perf_counter()
    report = quantize_checkpoint(
        src,
        args.output,
        method=args.method,
        calibration_texts=calibration,
        checkpoint_format=args.format,
        symmetric=not args.asym,
        fallback=args.fallback,
        packing=args.packing,
        tokenizer=tokenizer,
        device=args.device or "cpu",
        report_errors=not args.no_report,
    )
    if not args.no_report:
        print(report.table())
    out = Path(args.output)
    print(
        f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB, {args.method}, {args.packing}, "
        f"{time.perf_counter() - t0:.1f} s)"
    )
    return EXIT_OK


def register(sub: Any) -> None:
    p = sub_parser(
        sub,
        "convert-codec",
        "convert the codec's weights.pth to a pickle-free safetensors file",
        "One-time conversion of the DACVAE weights.pth (weight norm folded).",
    )
    p.add_argument("source", nargs="?", help="weights.pth path or repo id (default: the released codec repo)")
    p.add_argument("-o", "--output", required=True, help="destination .safetensors file")
    p.set_defaults(func=cmd_convert_codec)

    p = sub_parser(
        sub,
        "quantize",
        "write an int4 checkpoint (the Irodori-TTS-Lite format) from a float one",
        "Quantise a DiT checkpoint to int4 in the format of the int4 releases (GPTQ-packed\n"
        "block Linears; with the default --packing compact every other Linear and the token\n"
        "tables RTN-packed too, as small as the seed's Irodori-TTS-Lite file; --packing\n"
        "fp16-rest keeps them fp16 as older files do), loadable by --model.\n"
        "GPTQ calibrates on the model's real activations over Japanese sentences (built-in,\n"
        "or --calibration-file) and needs the text tokenizer; RTN needs nothing.\n"
        "Prints each packed layer's output error on held-out sentences, RTN vs GPTQ.\n\n"
        "  irodori-speaker quantize model.safetensors -o model-int4.safetensors\n"
        "  irodori-speaker quantize v2 -o v2-int4.safetensors --method rtn",
    )
    p.add_argument("model", help="float DiT checkpoint: path, hf://org/repo/file, repo id or alias")
    p.add_argument("-o", "--output", required=True, help="destination int4 .safetensors file")
    p.add_argument("--method", choices=["gptq", "rtn"], default="gptq", help="rounding (default gptq)")
    p.add_argument("--tokenizer", help="tokenizer.json for GPTQ calibration (default: the model's)")
    p.add_argument("--calibration-file", help="calibration sentences, one a line (# comments)")
    p.add_argument(
        "--format",
        choices=["gptq", "gptq_v2"],
        default="gptq",
        help="zero-point storage: gptq = v1 (z-1, the release's), gptq_v2",
    )
    p.add_argument("--asym", action="store_true", help="asymmetric groups (default symmetric, z=8)")
    p.add_argument(
        "--packing",
        choices=["compact", "fp16-rest"],
        default="compact",
        help="the layers GPTQ does not cover: RTN-packed (compact, default) or fp16 (fp16-rest)",
    )
    p.add_argument(
        "--fallback",
        choices=["keep", "rtn"],
        default=None,
        help="a layer calibration cannot cover: keep it fp16 or round it with RTN "
        "(default: rtn with --packing compact, keep with fp16-rest)",
    )
    p.add_argument("--device", help="where calibration and rounding run (default cpu; cuda is faster)")
    p.add_argument("--no-report", action="store_true", help="skip the held-out error table")
    p.set_defaults(func=cmd_quantize)
