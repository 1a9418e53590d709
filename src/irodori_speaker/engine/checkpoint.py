"""Load and save float DiT checkpoints (`model.safetensors` with `config_json` metadata), strictly.

Int4 files are read by `irodori_speaker.engine.quant.checkpoint` (quant imports the engine, never
the reverse).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from ..errors import CheckpointError
from .config import InferenceConfig, ModelConfig, parse_config_json
from .model import TextToLatentRFDiT
from .torchao import int8_layout, is_torchao_file, read_int8_state

DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise CheckpointError(f"unsupported model dtype {dtype}; use fp32, bf16 or fp16")
        return dtype
    try:
        return DTYPES[dtype.lower()]
    except KeyError:
        raise CheckpointError(f"unknown dtype {dtype!r}; use one of fp32, bf16, fp16") from None


@dataclass
class LoadedModel:
    model: TextToLatentRFDiT
    config: ModelConfig
    inference: InferenceConfig
    source: str
    quantized: bool = False


def read_header(path: str | Path) -> tuple[dict[str, str], dict[str, tuple[int, ...]]]:
    """(metadata, name -> shape) of a safetensors file, without reading the tensors."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from e
    return meta, shapes


def config_from_metadata(meta: dict[str, str], source: str) -> tuple[ModelConfig, InferenceConfig]:
    if "config_json" not in meta:
        raise CheckpointError(
            f"{source}: the safetensors metadata has no 'config_json'",
            hint="this is not an Irodori-TTS DiT checkpoint, or it was saved without its config",
        )
    return parse_config_json(
        meta["config_json"], source=source, text_encoder_config=meta.get("text_encoder_config_json")
    )


def build_model(
    cfg: ModelConfig, *, device: str | torch.device = "meta", dtype=torch.float32
) -> TextToLatentRFDiT:
    with torch.device(device):
        model = TextToLatentRFDiT(cfg)
    return model.to(dtype=dtype)


def check_tensor_names(
    expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]], source: str
) -> None:
    """Strict match: any missing, unexpected or mis-shaped tensor is an error naming it."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    shaped = sorted(
        f"{k} (file {list(found[k])}, model {list(expected[k])})"
        for k in set(expected) & set(found)
        if tuple(found[k]) != tuple(expected[k])
    )
    problems = []
    for label, names in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", shaped)):
        if names:
            more = f" and {len(names) - 5} more" if len(names) > 5 else ""
            problems.append(f"{label} tensors: {', '.join(names[:5])}{more}")
    if problems:
        raise CheckpointError(f"{source}: checkpoint does not match its config_json: " + "; ".join(problems))


def load_checkpoint(
    path: str | Path, *, dtype: str | torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> LoadedModel:
    """Load a float DiT checkpoint; the stored dtype may be fp32, bf16 or fp16, `dtype` is the one wanted.

    A torchao int8 weight-only file (the `-Quantized` releases' `int8-weight-only/`) loads too:
    its weights dequantised (qdata * scale) to `dtype` (bf16 is what the reference computes in
    on CUDA; fp32 or bf16 on the CPU). Other torchao files are refused (engine/torchao.py).

    The engine knows no int4: an int4 file (metadata `quant_method`) is a `CheckpointError` naming
    `irodori_speaker.engine.quant.checkpoint.load_int4_model`, which builds this engine's model and swaps
    in the packed layers (`synthesis.loading.load_dit` picks the loader by the file).
    """
    path = Path(path)
    dtype = resolve_dtype(dtype)
    source = str(path)
    meta, shapes = read_header(path)
    if "quant_method" in meta:
        raise CheckpointError(
            f"{source} is an int4 checkpoint (quant_method {meta['quant_method']!r})",
            hint="load it with irodori_speaker.engine.quant.checkpoint.load_int4_model(path), or through "
            "load_synthesizer / synthesizer.load_dit, which pick the loader by the file",
        )
    int8 = int8_layout(meta, shapes, source) if is_torchao_file(meta, shapes) else None
    cfg, inference = config_from_metadata(meta, source)
    model = build_model(cfg, device="meta", dtype=dtype)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    check_tensor_names(expected, int8.shapes if int8 is not None else shapes, source)
    state = {}
    with safe_open(str(path), framework="pt", device="cpu") as f:
        if int8 is not None:
            try:
                state = read_int8_state(f, int8, expected, dtype=dtype, device=device)
            except CheckpointError as e:
                raise CheckpointError(f"{source}: {e}") from e
        for name in expected.keys() - state.keys():
            t = f.get_tensor(name)
            if not t.is_floating_point():
                raise CheckpointError(f"{source}: tensor {name} has non-float dtype {t.dtype}")
            state[name] = t.to(device=device, dtype=dtype)
    model.load_state_dict(state, strict=True, assign=True)
    model.eval().requires_grad_(False)
    return LoadedModel(model, cfg, inference, source)


def save_checkpoint(
    model: TextToLatentRFDiT,
    path: str | Path,
    *,
    inference: InferenceConfig | None = None,
    dtype: torch.dtype | None = None,
) -> None:
    """Write the released file format: tensors + `config_json` (model config plus inference keys)."""
    data = model.cfg.to_dict()
    if inference is not None:
        data.update({k: v for k, v in vars(inference).items() if v is not None})
    state = {
        k: (v.to(dtype) if dtype is not None else v).detach().contiguous().cpu()
        for k, v in model.state_dict().items()
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    metadata = {"config_json": json.dumps(data, ensure_ascii=False)}
    if model.cfg.text_backbone is not None:
        backbone = model.cfg.text_backbone.to_dict()
        metadata["text_encoder_config_json"] = json.dumps(backbone, ensure_ascii=False)
    save_file(state, str(path), metadata=metadata)
