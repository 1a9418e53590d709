"""The `tiny-random` preset: a small random DiT, codec and tokenizer in the real file formats.

The whole pipeline runs offline on it (tests, CI, a first try of the CLI). Its output is
noise, and everything that prints it says so. Files are built once, deterministically,
into the cache directory and reused.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from .checkpoint import build_model, save_checkpoint
from .config import InferenceConfig, ModelConfig

TINY_VOCAB = 512
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


def tiny_random_files(kind: str = "v2", directory: str | os.PathLike | None = None) -> TinyFiles:
    """Paths of the tiny-random model `kind` ("v2", "v3", "v2-voicedesign"), building them if absent."""
    from ..errors import InputError
    from ..text.tokenizer import build_tiny_tokenizer
    from .codec import TINY_CODEC_KWARGS, convert_codec, save_random_codec_pth

    if kind not in TINY_CONFIGS:
        raise InputError(f"unknown tiny-random kind {kind!r}; use one of {', '.join(TINY_CONFIGS)}")
    root = Path(directory) if directory is not None else default_dir()
    files = TinyFiles(root / f"dit-{kind}.safetensors", root / "codec.safetensors", root / "tokenizer.json")
    with _lock:
        root.mkdir(parents=True, exist_ok=True)
        if not files.tokenizer.is_file():
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
            tmp = root / f"dit-{kind}.safetensors.tmp{os.getpid()}"
            save_checkpoint(random_model(kind), tmp, inference=InferenceConfig(max_text_len=256))
            os.replace(tmp, files.model)
    return files


def random_model(kind: str = "v2", seed: int = 0):
    """A randomly initialised tiny model (PyTorch's default init, seeded)."""
    cfg = ModelConfig.from_dict(TINY_CONFIGS[kind], source=f"tiny-random {kind}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_model(cfg, device="cpu")
        # RMSNorm weights start at one and nn.Linear's init is deterministic under the seed;
        # give the duration predictor's null vectors some value too.
        for name, p in model.named_parameters():
            if name.endswith(("null_speaker", "null_caption")):
                p.data.normal_(0.0, 0.5)
    return model.eval().requires_grad_(False)
