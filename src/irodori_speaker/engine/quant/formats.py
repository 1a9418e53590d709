"""Int4 tensor formats: GPTQ (v1/v2) and RTN nibbles, their exact pack/unpack, dequant and quantisers.

Layouts (K = in_features, N = out_features, gs = group size, G = K / gs):

* GPTQ ``qweight`` int32 (K/8, N): code (k, n) is ``(qweight[k // 8, n] >> 4 * (k % 8)) & 0xF``.
* GPTQ ``qzeros`` int32 (G, N/8): zero (g, n) sits in nibble ``n % 8`` of ``qzeros[g, n // 8]``;
  v1 (``checkpoint_format="gptq"``) stores ``z - 1`` modulo 16, v2 (``"gptq_v2"``) stores ``z``.
* GPTQ ``scales`` fp16 (G, N), ``g_idx`` int32 (K,) = k // gs.
  ``W[n, k] = scales[k // gs, n] * (q[k, n] - z[k // gs, n])`` (``nn.Linear`` layout [N, K]).
* RTN ``qweight_u8`` uint8 (rows, ceil(cols/2)): column 2j in the low nibble of byte j, 2j+1 in the high
  nibble (odd column counts padded with code 0); ``scales``/``zeros`` fp16 (rows, num_groups), contiguous
  groups of cols / num_groups columns; ``W = (q - z) * s``.

Every pack function is the exact inverse of its unpack function on valid codes (0..15).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch
from torch.nn import functional as F

from ...errors import QuantError

__all__ = [
    "GPTQ_FORMATS",
    "GPTQPacked",
    "QuantCorruptionWarning",
    "RTNPacked",
    "dequantize_gptq",
    "dequantize_rtn",
    "detect_unmasked_zero_corruption",
    "gptq_group_params",
    "gptq_is_packable",
    "pack_gptq",
    "pack_gptq_qweight",
    "pack_gptq_qzeros",
    "pack_nibbles",
    "quantize_codes",
    "rtn_quantize",
    "unpack_gptq_qweight",
    "unpack_gptq_qzeros",
    "unpack_nibbles",
    "warn_if_corrupted",
]

GPTQ_FORMATS = ("gptq", "gptq_v2")
_SHIFTS8 = torch.arange(0, 32, 4, dtype=torch.int32)  # nibble j of an int32 word sits at bit 4j


class QuantCorruptionWarning(UserWarning):
    """A packed tensor shows the signature of a known buggy packer (see `detect_unmasked_zero_corruption`)."""


def _check_codes(q: torch.Tensor, what: str) -> None:
    if q.is_floating_point() or q.is_complex():
        raise QuantError(f"{what}: integer codes expected, got {q.dtype}")
    if q.numel() and (int(q.min()) < 0 or int(q.max()) > 15):
        raise QuantError(f"{what}: 4-bit codes must lie in 0..15 (got {int(q.min())}..{int(q.max())})")


def _as_int_codes(t: torch.Tensor, what: str) -> torch.Tensor:
    if t.is_floating_point():
        if not bool((t == torch.round(t)).all()):
            raise QuantError(f"{what}: float codes must hold whole numbers")
        return t.to(torch.int32)
    return t


def _format_version(checkpoint_format: str) -> int:
    if checkpoint_format == "gptq":
        return 1
    if checkpoint_format == "gptq_v2":
        return 2
    raise QuantError(
        f"unknown GPTQ checkpoint_format {checkpoint_format!r} (known: {', '.join(GPTQ_FORMATS)})"
    )


def _pack_words(codes: torch.Tensor) -> torch.Tensor:
    """(..., 8) codes -> (...) int32 with element j in nibble j (two's complement for bit 31)."""
    words = (codes.to(torch.int64) << _SHIFTS8.to(torch.int64).to(codes.device)).sum(dim=-1)
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32)


def _unpack_words(words: torch.Tensor) -> torch.Tensor:
    """(...) int32 -> (..., 8) int32 codes, nibble j first."""
    return (words.to(torch.int32).unsqueeze(-1) >> _SHIFTS8.to(words.device)) & 0xF


# --------------------------------------------------------------------------------------------- GPTQ


def pack_gptq_qweight(q: torch.Tensor) -> torch.Tensor:
    """Codes (K, N) in 0..15 -> qweight int32 (K/8, N), sequential nibbles lowest first."""
    _check_codes(q, "pack_gptq_qweight")
    if q.dim() != 2 or q.shape[0] % 8:
        raise QuantError(f"pack_gptq_qweight: codes must be (K, N) with K % 8 == 0, got {tuple(q.shape)}")
    k, n = q.shape
    return _pack_words(q.reshape(k // 8, 8, n).transpose(1, 2)).contiguous()


def unpack_gptq_qweight(qweight: torch.Tensor) -> torch.Tensor:
    """qweight int32 (K/8, N) -> codes int32 (K, N)."""
    if qweight.dtype != torch.int32 or qweight.dim() != 2:
        raise QuantError(f"qweight must be a 2-D int32 tensor, got {qweight.dtype} {tuple(qweight.shape)}")
    k8, n = qweight.shape
    return _unpack_words(qweight).transpose(1, 2).reshape(k8 * 8, n)


def pack_gptq_qzeros(z: torch.Tensor, checkpoint_format: str = "gptq") -> torch.Tensor:
    """Zeros (G, N) in 0..15 -> qzeros int32 (G, N/8); v1 stores (z - 1) & 0xF, v2 stores z."""
    _check_codes(z, "pack_gptq_qzeros")
    if z.dim() != 2 or z.shape[1] % 8:
        raise QuantError(
            f"pack_gptq_qzeros: zeros must be (G, N) with N % 8 == 0 (qzeros packs 8 columns a word), "
            f"got {tuple(z.shape)}"
        )
    stored = (z.to(torch.int32) - 1) & 0xF if _format_version(checkpoint_format) == 1 else z.to(torch.int32)
    g, n = z.shape
    return _pack_words(stored.reshape(g, n // 8, 8)).contiguous()


def unpack_gptq_qzeros(qzeros: torch.Tensor, checkpoint_format: str = "gptq") -> torch.Tensor:
    """qzeros int32 (G, N/8) -> zeros int32 (G, N)."""
    if qzeros.dtype != torch.int32 or qzeros.dim() != 2:
        raise QuantError(f"qzeros must be a 2-D int32 tensor, got {qzeros.dtype} {tuple(qzeros.shape)}")
    g, n8 = qzeros.shape
    stored = _unpack_words(qzeros).reshape(g, n8 * 8)
    return (stored + 1) & 0xF if _format_version(checkpoint_format) == 1 else stored


def gptq_is_packable(in_features: int, out_features: int, group_size: int = 32) -> bool:
    """True when a Linear of this shape fits the GPTQ layout (K % gs == 0, K % 8 == 0, N % 8 == 0)."""
    return in_features % group_size == 0 and in_features % 8 == 0 and out_features % 8 == 0


@dataclass
class GPTQPacked:
    """One GPTQ-packed Linear, tensors exactly as stored in the file."""

    qweight: torch.Tensor  # int32 (K/8, N)
    qzeros: torch.Tensor  # int32 (G, N/8)
    scales: torch.Tensor  # fp16 (G, N)
    g_idx: torch.Tensor  # int32 (K,)
    in_features: int
    out_features: int
    group_size: int = 32
    checkpoint_format: str = "gptq"
    bias: torch.Tensor | None = None
    name: str = field(default="layer", compare=False)  # used in error messages

    def __post_init__(self) -> None:
        self.validate()

    @property
    def num_groups(self) -> int:
        return self.in_features // self.group_size

    def validate(self) -> None:
        """Check shapes, dtypes and g_idx; raise QuantError naming the layer on any mismatch."""
        name = self.name
        k, n, gs = self.in_features, self.out_features, self.group_size
        _format_version(self.checkpoint_format)
        if gs <= 0 or not gptq_is_packable(k, n, gs):
            raise QuantError(
                f"{name}: GPTQ layout needs in_features % group_size == 0 and out_features % 8 == 0 "
                f"(got in={k}, out={n}, group_size={gs})"
            )
        expect = {
            "qweight": ((k // 8, n), torch.int32),
            "qzeros": ((k // gs, n // 8), torch.int32),
            "scales": ((k // gs, n), torch.float16),
            "g_idx": ((k,), torch.int32),
        }
        for attr, (shape, dtype) in expect.items():
            t = getattr(self, attr)
            if tuple(t.shape) != shape:
                raise QuantError(f"{name}.{attr}: shape {tuple(t.shape)}, expected {shape}")
            if t.dtype != dtype:
                raise QuantError(f"{name}.{attr}: dtype {t.dtype}, expected {dtype}")
        if self.bias is not None and tuple(self.bias.shape) != (n,):
            raise QuantError(f"{name}.bias: shape {tuple(self.bias.shape)}, expected ({n},)")
        if self.g_idx.device.type != "meta":
            seq = torch.arange(k, dtype=torch.int32, device=self.g_idx.device) // gs
            if not torch.equal(self.g_idx, seq):
                raise QuantError(
                    f"{name}.g_idx is not sequential (k // {gs}): act-order checkpoints are not supported",
                    hint="re-quantise without actorder (desc_act)",
                )

    def codes(self) -> torch.Tensor:
        """Integer codes (K, N)."""
        return unpack_gptq_qweight(self.qweight)

    def zeros(self) -> torch.Tensor:
        """Integer zeros (G, N)."""
        return unpack_gptq_qzeros(self.qzeros, self.checkpoint_format)

    def is_symmetric(self) -> bool:
        """True when every zero is 8 (the producer's default symmetric quantisation)."""
        return bool((self.zeros() == 8).all())

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize_gptq(self, dtype)

    def to_format(self, checkpoint_format: str) -> GPTQPacked:
        """The same layer re-packed as v1 (``"gptq"``) or v2 (``"gptq_v2"``) zeros."""
        if checkpoint_format == self.checkpoint_format:
            return self
        return GPTQPacked(
            qweight=self.qweight,
            qzeros=pack_gptq_qzeros(self.zeros(), checkpoint_format),
            scales=self.scales,
            g_idx=self.g_idx,
            in_features=self.in_features,
            out_features=self.out_features,
            group_size=self.group_size,
            checkpoint_format=checkpoint_format,
            bias=self.bias,
            name=self.name,
        )


def pack_gptq(
    q: torch.Tensor,
    zeros: torch.Tensor,
    scales: torch.Tensor,
    *,
    group_size: int = 32,
    checkpoint_format: str = "gptq",
    bias: torch.Tensor | None = None,
    name: str = "layer",
) -> GPTQPacked:
    """Pack codes (N, K) [nn.Linear layout], zeros (N, G) and scales (N, G) into a `GPTQPacked`.

    Codes and zeros may be integer tensors or floats holding whole numbers (as quantisers produce them).
    """
    q, zeros = _as_int_codes(q, "codes"), _as_int_codes(zeros, "zeros")
    if q.dim() != 2:
        raise QuantError(f"pack_gptq: codes must be 2-D (N, K), got {tuple(q.shape)}")
    n, k = q.shape
    if not gptq_is_packable(k, n, group_size):
        raise QuantError(
            f"pack_gptq: shape (out={n}, in={k}) does not fit GPTQ (in % {group_size} == 0 and out % 8 == 0)"
        )
    g = k // group_size
    if tuple(zeros.shape) != (n, g) or tuple(scales.shape) != (n, g):
        raise QuantError(f"pack_gptq: zeros/scales must be ({n}, {g}), got {tuple(zeros.shape)}")
    return GPTQPacked(
        qweight=pack_gptq_qweight(q.t().contiguous()),
        qzeros=pack_gptq_qzeros(zeros.t().contiguous(), checkpoint_format),
        scales=scales.t().to(torch.float16).contiguous(),
        g_idx=torch.arange(k, dtype=torch.int32) // group_size,
        in_features=k,
        out_features=n,
        group_size=group_size,
        checkpoint_format=checkpoint_format,
        bias=bias,
        name=name,
    )


def dequantize_gptq(packed: GPTQPacked, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dequantised weight in the nn.Linear layout [N, K], computed in fp32 then cast to `dtype`."""
    q = packed.codes().to(torch.float32)  # (K, N)
    z = packed.zeros().to(torch.float32).repeat_interleave(packed.group_size, dim=0)
    s = packed.scales.to(torch.float32).repeat_interleave(packed.group_size, dim=0)
    return ((q - z) * s).t().contiguous().to(dtype)


# -------------------------------------------------------------------------------- corruption check


def detect_unmasked_zero_corruption(qzeros: torch.Tensor, checkpoint_format: str = "gptq") -> int:
    """Count qzeros words that look written by the old unmasked packer; 0 means clean.

    That packer OR-ed ``(z - 1) << 4j`` into the word without ``& 0xF``: a group whose zero is 0 stores
    -1 = 0xFFFFFFFF, which sets every nibble from j upwards, so all following zeros of the same word read
    back as 0. Signature (v1 only): a stored 0xF nibble at position j <= 6 with every higher nibble 0xF
    too. A clean file shows that only by coincidence (all of those groups having zero 0).
    """
    if _format_version(checkpoint_format) != 1 or qzeros.numel() == 0:
        return 0  # v2 stores z itself: 0 never becomes -1
    nib = _unpack_words(qzeros)  # (..., 8)
    is_f = nib == 0xF
    # suffix_all_f[..., j] = all nibbles j..7 are 0xF
    suffix_all_f = is_f.flip(-1).cumprod(-1).flip(-1).bool()
    hits = suffix_all_f[..., :7].any(-1)
    return int(hits.sum())


def warn_if_corrupted(name: str, qzeros: torch.Tensor, checkpoint_format: str = "gptq") -> int:
    """Warn (`QuantCorruptionWarning`) when `detect_unmasked_zero_corruption` flags `qzeros`."""
    count = detect_unmasked_zero_corruption(qzeros, checkpoint_format)
    if count:
        warnings.warn(
            f"{name}.qzeros: {count} word(s) show the unmasked-packer corruption (a zero of 0 stored as -1 "
            "overwrote the following zeros of its int32 word with 0); outputs of this layer may be wrong. "
            "Re-quantise with a fixed packer.",
            QuantCorruptionWarning,
            stacklevel=2,
        )
    return count


# ---------------------------------------------------------------------------------------- quantisers


def gptq_group_params(w: torch.Tensor, *, symmetric: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero per row of `w` (rows, group) the way the GPTQ producer computes them.

    Symmetric: z = 8, scale = 2 max|w| / 15. Asymmetric: the range is widened to include 0
    (min(w, 0) .. max(w, 0)), scale = range / 15, z = round(-min / scale) (so 0 <= z <= 15).
    Scales are rounded to fp16 (as stored) before use, so the quantiser's dequant equals the file's.
    """
    w = w.to(torch.float32)
    if symmetric:
        scale = 2.0 * w.abs().amax(dim=-1) / 15.0
        zero = torch.full_like(scale, 8.0)
    else:
        lo = w.amin(dim=-1).clamp(max=0.0)
        hi = w.amax(dim=-1).clamp(min=0.0)
        scale = (hi - lo) / 15.0
        scale = scale.to(torch.float16).to(torch.float32)
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        zero = torch.round(-lo / safe).clamp(0, 15)
    return scale.to(torch.float16).to(torch.float32), zero


def quantize_codes(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """q = clamp(round(w / scale) + zero, 0, 15), broadcasting scale/zero; scale 0 gives q = zero."""
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (torch.round(w / safe) + zero).clamp(0, 15)


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """Codes (rows, cols) in 0..15 -> uint8 (rows, ceil(cols/2)); even column low nibble, odd high."""
    _check_codes(q, "pack_nibbles")
    if q.dim() != 2:
        raise QuantError(f"pack_nibbles: codes must be 2-D, got {tuple(q.shape)}")
    rows, cols = q.shape
    q = q.to(torch.uint8)
    if cols % 2:
        q = torch.cat([q, torch.zeros(rows, 1, dtype=torch.uint8, device=q.device)], dim=1)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()


def unpack_nibbles(packed: torch.Tensor, cols: int) -> torch.Tensor:
    """uint8 (rows, ceil(cols/2)) -> codes uint8 (rows, cols)."""
    if packed.dtype != torch.uint8 or packed.dim() != 2:
        raise QuantError(f"qweight_u8 must be a 2-D uint8 tensor, got {packed.dtype} {tuple(packed.shape)}")
    if packed.shape[1] != (cols + 1) // 2:
        raise QuantError(
            f"qweight_u8 has {packed.shape[1]} bytes a row, {cols} columns need {(cols + 1) // 2}"
        )
    both = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(packed.shape[0], -1)
    return both[:, :cols]


@dataclass
class RTNPacked:
    """One RTN-nibble tensor (extras, embeddings, codec convs) as stored: W = (q - z) * s, row-wise groups."""

    qweight_u8: torch.Tensor  # uint8 (rows, ceil(cols/2))
    scales: torch.Tensor  # fp16 (rows, num_groups)
    zeros: torch.Tensor  # fp16 (rows, num_groups)
    rows: int
    cols: int
    num_groups: int
    meta: dict = field(default_factory=dict)
    name: str = field(default="layer", compare=False)  # used in error messages

    def __post_init__(self) -> None:
        self.validate()

    @property
    def group_cols(self) -> int:
        """Columns a group: ceil(cols / num_groups); when that does not divide cols the last group is
        shorter (our compact files' ragged widths, e.g. 1331 = 41 x 32 + 19)."""
        return ragged_group_cols(self.cols, self.num_groups)

    def validate(self) -> None:
        name = self.name
        r, c, g = self.rows, self.cols, self.num_groups
        if g <= 0 or g > c or (g - 1) * ragged_group_cols(c, g) >= c:
            raise QuantError(f"{name}: {c} columns cannot be split into {g} groups")
        expect = {
            "qweight_u8": ((r, (c + 1) // 2), torch.uint8),
            "scales": ((r, g), torch.float16),
            "zeros": ((r, g), torch.float16),
        }
        for attr, (shape, dtype) in expect.items():
            t = getattr(self, attr)
            if tuple(t.shape) != shape:
                raise QuantError(f"{name}.{attr}: shape {tuple(t.shape)}, expected {shape}")
            if t.dtype != dtype:
                raise QuantError(f"{name}.{attr}: dtype {t.dtype}, expected {dtype}")

    def dequantize(
        self, dtype: torch.dtype = torch.float32, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        return dequantize_rtn(self, dtype, rows=rows)


def dequantize_rtn(
    packed: RTNPacked, dtype: torch.dtype = torch.float32, *, rows: torch.Tensor | None = None
) -> torch.Tensor:
    """(q - z) * s as (rows, cols) in `dtype`; `rows` (int tensor) selects rows first (embedding lookup)."""
    qw, s, z = packed.qweight_u8, packed.scales, packed.zeros
    if rows is not None:
        qw, s, z = qw.index_select(0, rows), s.index_select(0, rows), z.index_select(0, rows)
    q = unpack_nibbles(qw, packed.cols).to(torch.float32)
    n, g, cols = q.shape[0], packed.num_groups, packed.cols
    gc = ragged_group_cols(cols, g)
    if g * gc != cols:  # ragged: pad the short last group, drop the padding after
        q = F.pad(q, (0, g * gc - cols))
    q = q.reshape(n, g, gc)
    w = (q - z.to(torch.float32).unsqueeze(-1)) * s.to(torch.float32).unsqueeze(-1)
    return w.reshape(n, g * gc)[:, :cols].to(dtype)


def ragged_group_cols(cols: int, num_groups: int) -> int:
    """Columns of each RTN group: ceil(cols / num_groups) (the last group takes what is left)."""
    return -(-cols // max(num_groups, 1))


def _safe_scale(scale16: torch.Tensor) -> torch.Tensor:
    # A scale that rounds to 0 in fp16 dequantises every code to 0; divide by 1 so the codes stay finite.
    s = scale16.to(torch.float32)
    return torch.where(s > 0, s, torch.ones_like(s))


def rtn_quantize(
    w: torch.Tensor,
    *,
    group_size: int | None = 32,
    num_groups: int | None = None,
    symmetric: bool = False,
    ragged: bool = False,
) -> RTNPacked:
    """Round-to-nearest int4 of a 2-D weight (rows, cols) into the RTN nibble format.

    Asymmetric (the release's formula): scale = max(max - min, 1e-8) / 15,
    zero = clamp(round(-min / scale), 0, 15), q = clamp(round(w / scale + zero), 0, 15).
    Symmetric: zero = 8, scale = max(2 max|w|, 1e-8) / 15, q = clamp(round(w / scale) + 8, 0, 15).
    Groups: `num_groups` equal contiguous column groups, or `group_size` columns each (must divide cols;
    None = one group per row; `ragged`: ceil(cols / group_size) groups of ceil(cols / groups) columns,
    the last one shorter).
    Scales/zeros are stored fp16 and the codes are computed from the stored
    (fp16-rounded) values, so dequantising the packed tensor reproduces the quantiser's own weight.
    """
    if w.dim() != 2:
        raise QuantError(
            f"rtn_quantize: weight must be 2-D (flatten conv weights first), got {tuple(w.shape)}"
        )
    rows, cols = w.shape
    if num_groups is None:
        if group_size is None:
            num_groups = 1
        elif ragged:
            num_groups = -(-cols // group_size)
        elif cols % group_size:
            raise QuantError(f"rtn_quantize: {cols} columns are not a multiple of group_size {group_size}")
        else:
            num_groups = cols // group_size
    if num_groups <= 0 or (cols % num_groups and not ragged):
        raise QuantError(f"rtn_quantize: {cols} columns cannot be split into {num_groups} equal groups")
    gc = ragged_group_cols(cols, num_groups)
    w32 = w.to(torch.float32)
    if num_groups * gc != cols:
        # pad the short last group with copies of its own last column: min/max stay that group's
        w32 = torch.cat([w32, w32[:, -1:].expand(rows, num_groups * gc - cols)], dim=1)
    wg = w32.reshape(rows, num_groups, gc)
    if symmetric:
        scale = torch.clamp(2.0 * wg.abs().amax(-1), min=1e-8) / 15.0
        scale16 = scale.to(torch.float16)
        zero16 = torch.full_like(scale16, 8.0)
        s = _safe_scale(scale16)
        q = (torch.round(wg / s.unsqueeze(-1)) + 8.0).clamp(0, 15)
    else:
        lo, hi = wg.amin(-1), wg.amax(-1)
        scale = torch.clamp(hi - lo, min=1e-8) / 15.0
        scale16 = scale.to(torch.float16)
        s = _safe_scale(scale16)
        zero16 = torch.round(-lo / s).clamp(0, 15).to(torch.float16)
        q = torch.round(wg / s.unsqueeze(-1) + zero16.to(torch.float32).unsqueeze(-1)).clamp(0, 15)
    return RTNPacked(
        qweight_u8=pack_nibbles(q.reshape(rows, num_groups * gc)[:, :cols].to(torch.uint8)),
        scales=scale16.contiguous(),
        zeros=zero16.contiguous(),
        rows=rows,
        cols=cols,
        num_groups=num_groups,
    )
