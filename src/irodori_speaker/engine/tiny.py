"""The `tiny-random` preset: a small random DiT, codec and tokenizer in the real file formats.

The whole pipeline runs offline on it (tests, CI, a first try of the CLI). Its output is
noise, and everything that prints it says so. Files are built once, deterministically,
into the cache directory and reused.

`--tiny-random` / `tiny_random=True` build `DEFAULT_KIND`, the family of the default model
(v4.1-MF: the ModernBERT tokenizer folder, the duration predictor, the 4-step MeanFlow sampler),
so an offline first try runs the default model's code path; `--tiny-kind` / `tiny_random="v2"`
pick another. `$IRODORI_TINY_KIND` moves the default: the test suite sets v2, the kind most of
its tests were written against (a single tokenizer.json, estimated lengths of a few seconds).
"""

from __future__ import annotations

import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import InputError
from ..text.backbone_tokenizer import build_tiny_backbone_tokenizer, build_tiny_gemma_tokenizer
from ..text.tokenizer import build_tiny_tokenizer
from .checkpoint import build_model, save_checkpoint
from .codec import TINY_CODEC_KWARGS, convert_codec, save_random_codec_pth
from .config import InferenceConfig, ModelConfig, parse_backbone_config
from .sampler import SamplerConfig, draw_noise, sample

TINY_VOCAB = 512
#: The kind `tiny_random=True` builds: the default model's family (engine.sources.DEFAULT_MODEL).
DEFAULT_KIND = "v4.1-mf"
KIND_ENV = "IRODORI_TINY_KIND"
FORMAT_VERSION = "2"  # bump when the tiny files change, so stale caches are rebuilt

_BASE = dict(
    latent_dim=32,
    latent_patch_size=1,
    model_dim=64,
    num_layers=2,
    num_heads=4,
    text_vocab_size=TINY_VOCAB,
    text_tokenizer_repo="tiny-random",
    text_dim=32,
    text_layers=2,
    text_heads=2,
    speaker_dim=48,
    speaker_layers=2,
    speaker_heads=2,
    timestep_embed_dim=32,
    adaln_rank=16,
)
TINY_CONFIGS = {
    "v2": dict(_BASE),
    "v3": dict(_BASE, use_duration_predictor=True, duration_hidden_dim=56, duration_layers=2),
    "v2-voicedesign": dict(
        _BASE,
        use_caption_condition=True,
        caption_vocab_size=TINY_VOCAB,
        caption_dim=40,
        caption_layers=2,
        caption_heads=2,
        caption_mlp_ratio=2.6,
    ),
}
# v4 / v4.1-MF: a tiny ModernBERT backbone (its Hugging Face config, as the file stores it) with
# the release's shape of everything else: projectors, speaker patch 4, dual duration predictor.
TINY_BACKBONE = dict(
    model_type="modernbert",
    vocab_size=TINY_VOCAB,
    hidden_size=48,
    intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    layer_types=["full_attention", "sliding_attention", "sliding_attention"],
    rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 160000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    },
    local_attention=8,
    hidden_activation="gelu",
    norm_eps=1e-5,
    pad_token_id=3,
    bos_token_id=1,
    eos_token_id=2,
    cls_token_id=6,
    sep_token_id=4,
)
_V4 = dict(
    _BASE,
    text_encoder_type="pretrained",
    text_tokenizer_repo="tiny-random/modernbert-ja",
    caption_tokenizer_repo="tiny-random/modernbert-ja",
    caption_add_bos=True,
    pretrained_projector_type="residual_mlp",
    use_caption_condition=True,
    use_speaker_condition=True,
    caption_dim=32,
    speaker_patch_size=4,
    use_duration_predictor=True,
    duration_architecture="token_sum_dual_adarn_zero_no_aux",
    duration_hidden_dim=56,
    duration_layers=2,
)
TINY_CONFIGS["v4"] = _V4
TINY_CONFIGS["v4.1-mf"] = dict(_V4, flow_parameterization="meanflow")
# v4-Large: the T5Gemma 2 text encoder of the golden fixture (tests/data/dit_v4_large): GQA,
# head_dim != hidden / heads, query_pre_attn_scalar != head_dim, linear RoPE on the full layer,
# an asymmetric window of 6, the end-of-image token at 300; stored as a whole T5Gemma2Config
# (only the encoder's text_config and eoi_token_index are read).
T5GEMMA_VOCAB = 320
TINY_T5GEMMA_BACKBONE: dict[str, object] = dict(
    model_type="t5gemma2",
    encoder=dict(
        model_type="t5gemma2_encoder",
        text_config=dict(
            model_type="t5gemma2_text",
            vocab_size=T5GEMMA_VOCAB,
            hidden_size=48,
            intermediate_size=64,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            query_pre_attn_scalar=24,
            hidden_activation="gelu_pytorch_tanh",
            rms_norm_eps=1e-6,
            sliding_window=6,
            layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            },
            attention_bias=False,
            attn_logit_softcapping=None,
            pad_token_id=0,
            eos_token_id=1,
            bos_token_id=2,
        ),
        eoi_token_index=300,
    ),
    eoi_token_index=300,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=2,
    vocab_size=T5GEMMA_VOCAB,
)
TINY_CONFIGS["v4-large"] = dict(
    _V4,
    text_tokenizer_repo="tiny-random/t5gemma-2",
    caption_tokenizer_repo="tiny-random/t5gemma-2",
    text_vocab_size=T5GEMMA_VOCAB,
    caption_vocab_size=T5GEMMA_VOCAB,
    text_dim=40,
    caption_dim=40,
    duration_hidden_dim=40,
    duration_attention_heads=4,
)
TINY_BACKBONES = {"v4": TINY_BACKBONE, "v4.1-mf": TINY_BACKBONE, "v4-large": TINY_T5GEMMA_BACKBONE}
# What the v4 releases store beside the model config.
V4_INFERENCE = InferenceConfig(max_text_len=256, max_caption_len=512, ref_max_seconds=120.0)


def default_kind() -> str:
    """`$IRODORI_TINY_KIND` if set, else `DEFAULT_KIND`."""
    return os.environ.get(KIND_ENV, "").strip() or DEFAULT_KIND


def is_v4_kind(kind: str) -> bool:
    return TINY_CONFIGS[kind].get("text_encoder_type") == "pretrained"


@dataclass(frozen=True)
class TinyFiles:
    model: Path
    codec: Path
    tokenizer: Path


_lock = threading.Lock()


def default_dir() -> Path:
    base = os.environ.get("IRODORI_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "irodori-speaker"
    )
    return Path(base) / f"tiny-random-v{FORMAT_VERSION}"


def tiny_random_files(kind: str | None = None, directory: str | os.PathLike | None = None) -> TinyFiles:
    """Paths of the tiny-random model `kind` (one of TINY_CONFIGS; None: `default_kind()`),
    building them if absent.

    v4 kinds are laid out as a release: `dit-<kind>/model.safetensors` with its `tokenizer/`
    folder beside it (`tokenizer` is that folder's tokenizer.json)."""

    kind = default_kind() if kind is None else kind
    if kind not in TINY_CONFIGS:
        raise InputError(f"unknown tiny-random kind {kind!r}", hint=f"one of {', '.join(TINY_CONFIGS)}")
    root = Path(directory) if directory is not None else default_dir()
    if is_v4_kind(kind):
        release = root / f"dit-{kind}"
        files = TinyFiles(
            release / "model.safetensors",
            root / "codec.safetensors",
            release / "tokenizer" / "tokenizer.json",
        )
    else:
        files = TinyFiles(
            root / f"dit-{kind}.safetensors", root / "codec.safetensors", root / "tokenizer.json"
        )
    with _lock:
        root.mkdir(parents=True, exist_ok=True)
        if is_v4_kind(kind) and not files.tokenizer.is_file():
            tmp_dir = files.tokenizer.parent.with_name(f"tokenizer.tmp{os.getpid()}")
            if kind == "v4-large":
                build_tiny_gemma_tokenizer(T5GEMMA_VOCAB, tmp_dir, eoi_token_index=300)
            else:
                build_tiny_backbone_tokenizer(TINY_VOCAB, tmp_dir)
            try:
                os.replace(tmp_dir, files.tokenizer.parent)
            except OSError:  # another process made the folder first: keep its copy
                if not files.tokenizer.is_file():
                    raise
                shutil.rmtree(tmp_dir, ignore_errors=True)
        elif not files.tokenizer.is_file():
            tmp = root / f"tokenizer.json.tmp{os.getpid()}"
            build_tiny_tokenizer(TINY_VOCAB, tmp)
            os.replace(tmp, files.tokenizer)
        if not files.codec.is_file():
            pth = root / f"codec.pth.tmp{os.getpid()}"
            tmp = root / f"codec.safetensors.tmp{os.getpid()}"
            save_random_codec_pth(pth, TINY_CODEC_KWARGS, seed=0, watermark=False)
            convert_codec(pth, tmp)
            pth.unlink()
            os.replace(tmp, files.codec)
        if not files.model.is_file():
            tmp = files.model.with_name(f"{files.model.name}.tmp{os.getpid()}")
            inference = V4_INFERENCE if is_v4_kind(kind) else InferenceConfig(max_text_len=256)
            save_checkpoint(random_model(kind), tmp, inference=inference)
            os.replace(tmp, files.model)
    return files


def random_model(kind: str = "v2", seed: int = 0):
    """A randomly initialised tiny model (PyTorch's default init, seeded)."""
    backbone = parse_backbone_config(dict(TINY_BACKBONES[kind])) if is_v4_kind(kind) else None
    cfg = ModelConfig.from_dict(TINY_CONFIGS[kind], source=f"tiny-random {kind}", text_backbone=backbone)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_model(cfg, device="cpu")
        # RMSNorm weights start at one and nn.Linear's init is deterministic under the seed;
        # give the duration predictor's null vectors some value too.
        for name, p in model.named_parameters():
            if name.endswith(("null_speaker", "null_caption")):
                p.data.normal_(0.0, 0.5)
    return model.eval().requires_grad_(False)


def random_line_latent(
    model,
    seed: int,
    *,
    text: int = 12,
    reference: int = 24,
    caption: int = 6,
    frames: int = 50,
    cfg: SamplerConfig | None = None,
) -> torch.Tensor:
    """The sampler's final latent (fp32) for one seeded random line of `model`: `text` token ids
    after BOS, a `reference` latent and a `caption` where the model takes them, `frames` of noise;
    `cfg` defaults to the release's sampler (4 MeanFlow steps, else 8 sway). The yardstick of the
    int4 / fp8 accuracy benchmarks and tests: the same line through a quantised copy."""
    mcfg = model.cfg
    gen = torch.Generator().manual_seed(seed)
    vocab = min(mcfg.text_token_vocab, 299)
    ids = torch.cat([torch.tensor([[2]]), torch.randint(3, vocab, (1, text), generator=gen)], 1)
    ref = torch.randn(1, reference, mcfg.latent_dim, generator=gen) if mcfg.speaker_enabled else None
    cap = cap_mask = None
    if mcfg.caption_enabled:
        cap = torch.cat([torch.tensor([[2]]), torch.randint(3, vocab, (1, caption), generator=gen)], 1)
        cap_mask = torch.ones_like(cap, dtype=torch.bool)
    if cfg is None:
        cfg = SamplerConfig(steps=4) if mcfg.meanflow else SamplerConfig(steps=8, schedule="sway")
    with torch.inference_mode():
        conds = model.encode_conditions(ids, torch.ones_like(ids, dtype=torch.bool), ref, None, cap, cap_mask)
        noise = draw_noise(seed, 1, frames, mcfg.latent_dim * mcfg.latent_patch_size)
        return sample(model, conds, noise, cfg).float()
