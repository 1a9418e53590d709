"""Quantise a float DiT checkpoint to the release's int4 format: GPTQ (Hessian-aware, calibrated on real
activations) or RTN, with the release's layer selection, and a per-layer output-error report.

GPTQ here: H = 2 X^T X / n from each target Linear's captured inputs (forward pre-hooks while a callable
runs the float model on calibration items), damping ``damp * mean(diag H)``, the upper Cholesky factor of
H^-1, then column by column: quantise (group parameters taken from the current, error-updated weights at
each group's first column), push the scaled error onto the remaining columns, in lazy blocks of 128.
Group size 32, no act-order, symmetric by default like the producer (z = 8, scale = 2 max|w| / 15).
Capturing the calibration inputs: `calibration` (its names are re-exported here).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from ...errors import QuantError
from ...text.tokenizer import TextTokenizer
from ..checkpoint import load_checkpoint, read_header
from ..model import TextToLatentRFDiT
from ..torchao import is_torchao_file, read_float_state
from .calibration import (
    DEFAULT_CALIBRATION_TEXTS,
    DEFAULT_HELDOUT_TEXTS,
    CalibrationItem,
    RunItem,
    capture_hessians,
    capture_inputs,
    make_sampler_runner,
)
from .checkpoint import Int4Checkpoint, save_int4_checkpoint
from .formats import gptq_group_params, pack_gptq, quantize_codes, rtn_quantize
from .selection import (
    COMPACT_SELECTION,
    PACKINGS,
    RELEASE_SELECTION,
    LayerPlan,
    LayerSelection,
    matches,
    plan_layers,
)

__all__ = [
    "COMPACT_SELECTION",
    "DEFAULT_CALIBRATION_TEXTS",
    "DEFAULT_HELDOUT_TEXTS",
    "PACKINGS",
    "RELEASE_SELECTION",
    "CalibrationItem",
    "LayerError",
    "LayerPlan",
    "LayerSelection",
    "QuantizeReport",
    "capture_hessians",
    "capture_inputs",
    "format_error_table",
    "gptq_quantize_weight",
    "layer_error_table",
    "make_sampler_runner",
    "plan_layers",
    "quantize_checkpoint",
    "quantize_state",
    "rtn_quantize_weight",
]

# ----------------------------------------------------------------------------------------- GPTQ core


def rtn_quantize_weight(
    w: torch.Tensor, *, group_size: int = 32, symmetric: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest in the GPTQ layout: (codes (N, K), zeros (N, G), scales (N, G)), fp16-exact scales."""
    n, k = w.shape
    wg = w.to(torch.float32).reshape(n, k // group_size, group_size)
    s, z = gptq_group_params(wg, symmetric=symmetric)
    q = quantize_codes(wg, s[..., None], z[..., None]).reshape(n, k)
    return q, z, s


def gptq_quantize_weight(
    w: torch.Tensor,
    hessian: torch.Tensor,
    *,
    group_size: int = 32,
    symmetric: bool = True,
    damp: float = 0.01,
    block_size: int = 128,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GPTQ (no act-order) of `w` (N, K) given H (K, K): (codes (N, K), zeros (N, G), scales (N, G))."""
    n, k = w.shape
    if hessian.shape != (k, k):
        raise QuantError(f"gptq: Hessian is {tuple(hessian.shape)}, weight has {k} inputs")
    if k % group_size:
        raise QuantError(f"gptq: in_features {k} is not a multiple of group_size {group_size}")
    block_size = max(group_size, block_size // group_size * group_size)
    W = w.detach().to(torch.float32).clone()
    H = hessian.detach().to(torch.float64).clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    U = None
    lam = damp * float(torch.diag(H).mean())
    eye = torch.eye(k, dtype=H.dtype, device=H.device)
    for _ in range(6):  # increase damping until H is numerically positive definite
        try:
            L = torch.linalg.cholesky(H + lam * eye)
            U = torch.linalg.cholesky(torch.cholesky_inverse(L), upper=True)
            break
        except RuntimeError:
            lam *= 10.0
    if U is None or not bool(torch.isfinite(U).all()):
        raise QuantError("gptq: the Hessian is not positive definite even after damping")
    U = U.to(torch.float32)
    g = k // group_size
    codes = torch.zeros(n, k, dtype=torch.float32, device=W.device)
    scales = torch.zeros(n, g, dtype=torch.float32, device=W.device)
    zeros = torch.zeros(n, g, dtype=torch.float32, device=W.device)
    for i1 in range(0, k, block_size):
        i2 = min(i1 + block_size, k)
        W1 = W[:, i1:i2].clone()
        E1 = torch.zeros_like(W1)
        U1 = U[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if col % group_size == 0:  # params from the group's current (error-updated) weights
                s, z = gptq_group_params(W1[:, i : i + group_size], symmetric=symmetric)
                scales[:, col // group_size], zeros[:, col // group_size] = s, z
            s, z = scales[:, col // group_size], zeros[:, col // group_size]
            wcol = W1[:, i]
            q = quantize_codes(wcol, s, z)
            codes[:, col] = q
            err = (wcol - s * (q - z)) / U1[i, i]
            W1[:, i:] -= err[:, None] * U1[i, i:][None, :]
            E1[:, i] = err
        W[:, i2:] -= E1 @ U[i1:i2, i2:]
    return codes, zeros, scales


# -------------------------------------------------------------------------------------------- report


@dataclass
class LayerError:
    """Relative output error ||X (W_q - W)^T|| / ||X W^T|| of one layer on held-out inputs."""

    name: str
    in_features: int
    out_features: int
    rtn: float
    gptq: float | None
    used: str  # what went into the file: "gptq", "rtn", "kept (...)"


def _rel_out_err(x: torch.Tensor, w: torch.Tensor, wq: torch.Tensor) -> float:
    y = x @ w.t()
    return float((x @ (wq - w).t()).norm() / y.norm().clamp(min=1e-30))


def layer_error_table(
    weights: dict[str, torch.Tensor],
    quantised: dict[str, dict[str, torch.Tensor]],
    heldout: dict[str, torch.Tensor],
    used: dict[str, str] | None = None,
) -> list[LayerError]:
    """Per layer: held-out relative output error of each method's dequantised weight.

    `quantised[method][name]` is that method's dequantised weight (N, K); `heldout[name]` inputs (rows, K).
    """
    rows = []
    for name in sorted(heldout):
        if name not in weights:
            continue
        w = weights[name].float()
        x = heldout[name].float()
        rtn = quantised.get("rtn", {}).get(name)
        gq = quantised.get("gptq", {}).get(name)
        rows.append(
            LayerError(
                name,
                w.shape[1],
                w.shape[0],
                _rel_out_err(x, w, rtn.float()) if rtn is not None else float("nan"),
                _rel_out_err(x, w, gq.float()) if gq is not None else None,
                (used or {}).get(name, "gptq" if gq is not None else "rtn"),
            )
        )
    return rows


def format_error_table(rows: Sequence[LayerError]) -> str:
    """A fixed-width text table of `layer_error_table` rows."""
    head = f"{'layer':48s} {'in':>5s} {'out':>5s} {'rtn err':>9s} {'gptq err':>9s} {'gptq/rtn':>8s}  used"
    lines = [head, "-" * len(head)]
    for r in rows:
        g = "-" if r.gptq is None else f"{r.gptq:9.5f}"
        ratio = "-" if r.gptq is None or not r.rtn else f"{r.gptq / r.rtn:8.3f}"
        lines.append(
            f"{r.name:48s} {r.in_features:5d} {r.out_features:5d} {r.rtn:9.5f} {g:>9s} {ratio:>8s}  {r.used}"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ drivers


@dataclass
class QuantizeReport:
    checkpoint: Int4Checkpoint
    plan: LayerPlan
    used: dict[str, str]  # packed-GPTQ layer -> "gptq" | "rtn" | "kept (...)"
    dequantised: dict[str, torch.Tensor]  # what the quantiser's own dequant of each packed layer is
    rtn_dequantised: dict[str, torch.Tensor] = field(default_factory=dict)  # RTN of each GPTQ target
    errors: list[LayerError] = field(default_factory=list)
    path: Path | None = None

    def table(self) -> str:
        return format_error_table(self.errors)


def _fits_calibration(h: torch.Tensor, rows: int, k: int, min_rank: int) -> tuple[bool, str]:
    """Enough rows, and inputs that are not (nearly) constant.

    Low rank as such is not a defect: the first DiT block sees in_proj of a 32-dim latent, so its inputs
    span ~33 of 1280 dimensions at inference too, and GPTQ is right to use that. What must not be
    calibrated is a branch the items never exercised (e.g. the speaker encoder on the zero "no
    reference" latent: rank 1-2); `quantize_checkpoint` also names those branches explicitly."""
    if rows < k:
        return False, f"{rows} calibration rows < {k} inputs"
    # rank of the correlation matrix, so per-channel scale (outlier channels) does not matter
    h = h.double()
    d = torch.diag(h)
    live = d > 0
    inv = torch.where(live, d.clamp(min=1e-300).rsqrt(), torch.zeros_like(d))
    ev = torch.linalg.eigvalsh(h * inv[:, None] * inv[None, :])
    rank = int((ev > ev.max() * 1e-4).sum())
    if rank < min_rank:
        return False, f"calibration inputs are nearly constant (rank {rank} of {k})"
    return True, ""


def quantize_state(
    state: dict[str, torch.Tensor],
    config: dict,
    *,
    method: str = "gptq",
    plan: LayerPlan,
    hessians: dict[str, tuple[torch.Tensor, int]] | None = None,
    group_size: int = 32,
    symmetric: bool = True,
    damp: float = 0.01,
    checkpoint_format: str = "gptq",
    fallback: str = "keep",
    min_rank: int = 4,
    uncovered: dict[str, str] | None = None,
    device: torch.device | str = "cpu",
    keep_rtn: bool = False,
    embed_group_size: int = RELEASE_SELECTION.embed_group_size,
) -> QuantizeReport:
    """Quantise a float state dict per `plan`. With method "gptq", a layer whose calibration is missing,
    degenerate (fewer rows than inputs, or correlation rank < `min_rank`) or named in `uncovered`
    (name -> why) is kept float (`fallback="keep"`, the default: blind rounding is what broke the encoders
    upstream) or rounded to nearest (`fallback="rtn"`)."""
    if method not in ("gptq", "rtn"):
        raise QuantError(f"unknown quantisation method {method!r} (gptq, rtn)")
    if fallback not in ("keep", "rtn"):
        raise QuantError(f"unknown fallback {fallback!r} (keep, rtn)")
    ckpt = Int4Checkpoint(config=dict(config), checkpoint_format=checkpoint_format)
    tensors = {k: v for k, v in state.items()}
    used: dict[str, str] = {}
    deq: dict[str, torch.Tensor] = {}
    rtn_deq: dict[str, torch.Tensor] = {}
    for name in [*plan.gptq, *plan.rtn]:
        w = tensors[f"{name}.weight"].to(device=device, dtype=torch.float32)
        q, z, s = rtn_quantize_weight(w, group_size=group_size, symmetric=symmetric)
        if keep_rtn and name in plan.gptq:
            rtn_deq[name] = (
                s.repeat_interleave(group_size, 1) * (q - z.repeat_interleave(group_size, 1))
            ).cpu()
        choice = "rtn"
        if method == "gptq" and name not in plan.rtn:
            h = (hessians or {}).get(name)
            if name in (uncovered or {}):
                ok, why = False, (uncovered or {})[name]
            elif h is None:
                ok, why = False, "no calibration inputs"
            else:
                ok, why = _fits_calibration(h[0], h[1], w.shape[1], min_rank)
            if ok and h is not None:
                q, z, s = gptq_quantize_weight(
                    w, h[0].to(device), group_size=group_size, symmetric=symmetric, damp=damp
                )
                choice = "gptq"
            elif fallback == "keep":
                used[name] = f"kept ({why})"
                continue
            else:
                choice = f"rtn ({why})"
        bias = tensors.get(f"{name}.bias")
        packed = pack_gptq(
            q.cpu(),
            z.cpu(),
            s.cpu(),
            group_size=group_size,
            checkpoint_format=checkpoint_format,
            bias=bias,
            name=name,
        )
        ckpt.gptq[name] = packed
        deq[name] = (s.repeat_interleave(group_size, 1) * (q - z.repeat_interleave(group_size, 1))).cpu()
        used[name] = choice
        del tensors[f"{name}.weight"]
    for name in plan.embed:
        p = rtn_quantize(tensors.pop(f"{name}.weight"), group_size=embed_group_size, ragged=True)
        ckpt.embed[name] = p
        deq[name] = p.dequantize()
        used[name] = "rtn"
    for name in plan.extra:
        p = rtn_quantize(tensors.pop(f"{name}.weight"), group_size=group_size, ragged=True)
        ckpt.extra[name] = p
        deq[name] = p.dequantize()
        used[name] = "rtn"
    ckpt.tensors = {k: v.to(torch.float16) if v.is_floating_point() else v for k, v in tensors.items()}
    return QuantizeReport(ckpt, plan, used, deq, rtn_deq)


_SPEAKER_BRANCH = (r"speaker_encoder\..*", r"blocks\.\d+\.attention\.w[kv]_speaker")
_CAPTION_BRANCH = (r"caption_encoder\..*", r"blocks\.\d+\.attention\.w[kv]_caption")


def _uncovered_branches(names: Sequence[str], items: Sequence[object], config: dict) -> dict[str, str]:
    """Condition branches that text / `CalibrationItem` calibration never feeds real inputs: the speaker
    branch when no item has a reference latent, the caption branch when none has a caption. (Other item
    types come with a caller's own `run_item`, which is trusted.)"""
    if not items or not all(isinstance(it, (str, CalibrationItem)) for it in items):
        return {}
    out: dict[str, str] = {}
    if not any(isinstance(it, CalibrationItem) and it.ref_latent is not None for it in items):
        out.update(
            {n: "no calibration item has a reference latent" for n in names if matches(n, _SPEAKER_BRANCH)}
        )
    if not any(isinstance(it, CalibrationItem) and it.caption is not None for it in items):
        out.update({n: "no calibration item has a caption" for n in names if matches(n, _CAPTION_BRANCH)})
    return out


def quantize_checkpoint(
    src: str | Path,
    dst: str | Path | None,
    *,
    method: str = "gptq",
    calibration_texts: Sequence[str | CalibrationItem] | None = None,
    heldout_texts: Sequence[str | CalibrationItem] | None = None,
    layers: LayerSelection | None = None,
    group_size: int = 32,
    symmetric: bool = True,
    damp: float = 0.01,
    checkpoint_format: str = "gptq",
    fallback: str | None = None,
    packing: str = "compact",
    tokenizer=None,
    caption_tokenizer=None,
    run_item: RunItem | None = None,
    model: TextToLatentRFDiT | None = None,
    device: torch.device | str = "cpu",
    report_errors: bool = True,
    num_steps: int = 8,
) -> QuantizeReport:
    """Quantise the float checkpoint `src` and write the int4 file `dst` (None: do not write).

    method "gptq" calibrates on real activations: `run_item(item)` must run the float `model` on one item
    (default: the engine's sampler on `calibration_texts`, which needs `tokenizer`, a `TextTokenizer` or a
    tokenizer.json path). "rtn" needs no calibration.
    `packing`: "compact" (the default: the release's GPTQ layers, and every other Linear and the
    embeddings RTN-packed, as small as the seed's file) or "fp16-rest" (the remaining layers fp16, the
    older files); `layers` (a `LayerSelection`) overrides it. `fallback` defaults to "rtn" for
    compact (a layer calibration cannot cover is rounded like the rest) and "keep" for fp16-rest.
    When `report_errors`, each packed Linear's output error on held-out items (`heldout_texts`) is
    measured for RTN and (with "gptq") GPTQ; the table is `report.table()`.
    """
    if packing not in PACKINGS:
        raise QuantError(f"unknown packing {packing!r} ({', '.join(PACKINGS)})")
    layers = layers or PACKINGS[packing]
    if fallback is None:
        fallback = "rtn" if packing == "compact" else "keep"
    src = Path(src)
    if not src.is_file():
        raise QuantError(f"checkpoint not found: {src}")
    meta, shapes = read_header(src)
    if "quant_method" in meta:
        raise QuantError(f"{src} is already quantised ({meta['quant_method']})")
    if is_torchao_file(meta, shapes):  # a -Quantized int8 copy: its dequantised weights
        meta, state = read_float_state(str(src), meta, shapes)
    else:
        with safe_open(str(src), framework="pt") as f:
            state = {k: f.get_tensor(k).to(torch.float32) for k in f.keys()}  # noqa: SIM118
    try:
        config = json.loads(meta["config_json"])
    except (KeyError, ValueError) as e:
        raise QuantError(f"{src}: no readable config_json metadata") from e
    shapes = {k[: -len(".weight")]: tuple(v.shape) for k, v in state.items() if k.endswith(".weight")}
    plan = plan_layers(shapes, layers, group_size=group_size)

    hessians = None
    uncovered: dict[str, str] = {}
    heldout: dict[str, torch.Tensor] = {}
    need_model = method == "gptq" or report_errors
    if need_model and (
        method == "gptq" or run_item is not None or tokenizer is not None or model is not None
    ):
        if model is None:
            model = load_checkpoint(src, dtype=torch.float32, device=device).model
        if run_item is None:
            if tokenizer is None:
                raise QuantError(
                    "GPTQ calibration runs the model on real sentences and needs the text tokenizer",
                    hint="pass tokenizer= (tokenizer.json of llm-jp/llm-jp-3-150m), or run_item=",
                )
            if not hasattr(tokenizer, "batch"):
                tokenizer = TextTokenizer.from_file(
                    tokenizer,
                    add_bos=config.get("text_add_bos", True),
                    expected_vocab_size=config.get("text_vocab_size"),
                )
            run_item = make_sampler_runner(
                model, tokenizer, caption_tokenizer=caption_tokenizer, num_steps=num_steps
            )
        items = list(calibration_texts or DEFAULT_CALIBRATION_TEXTS)
        uncovered = _uncovered_branches(plan.gptq, items, config)
        if method == "gptq":
            names = [n for n in plan.gptq if n not in uncovered]
            hessians = capture_hessians(model, names, items, run_item, device=device)
        if report_errors:
            held = list(heldout_texts or DEFAULT_HELDOUT_TEXTS)
            heldout = capture_inputs(model, plan.gptq, held, run_item)
    report = quantize_state(
        state,
        config,
        method=method,
        plan=plan,
        hessians=hessians,
        group_size=group_size,
        symmetric=symmetric,
        damp=damp,
        checkpoint_format=checkpoint_format,
        fallback=fallback,
        uncovered=uncovered,
        device=device,
        keep_rtn=report_errors,
        embed_group_size=layers.embed_group_size,
    )
    report.checkpoint.metadata = {k: v for k, v in meta.items() if k not in ("config_json", "format")}
    report.checkpoint.metadata["quantized_by"] = "irodori-speaker"
    if heldout:
        weights = {n: state[f"{n}.weight"] for n in plan.gptq}
        qd = {"rtn": report.rtn_dequantised}
        if method == "gptq":
            qd["gptq"] = {n: report.dequantised[n] for n, u in report.used.items() if u == "gptq"}
        report.errors = layer_error_table(weights, qd, heldout, report.used)
    if dst is not None:
        save_int4_checkpoint(dst, report.checkpoint)
        report.path = Path(dst)
    return report
