"""The GPU memory budget on the device: the allocator's cap, the batch size and graph buckets it
allows, and a clean error past it. The value itself is parsed in `options/memory.py`.

On CUDA, `apply_budget` (at load, once the weights are on the device):
- caps PyTorch's caching allocator with `torch.cuda.set_per_process_memory_fraction`, so an
  allocation past the budget fails (and `budget_errors` turns that failure into `OverBudgetError`
  with a hint, not a raw out-of-memory traceback);
- lowers the preset's `max_batch` to the largest batch bucket whose work fits beside the weights
  (`max_batch_within`), and `prewarm_seconds` to the longest graph frame bucket one line fits in,
  so prewarm captures only graphs within the budget;
- decodes whole lines in stream-window chunks (`decode_chunk_frames`, exact) where a whole 30 s
  line's decode would take more than 1/8 of the budget.
The budget counts what PyTorch allocates (weights, graph pools, activations, cuBLAS workspaces);
the CUDA context itself (~0.5 GiB, what nvidia-smi adds) is outside it. On the CPU and MPS there
is no such cap: the budget is logged as not applicable.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from ...options.memory import MemoryBudget, OverBudgetError, format_bytes
from ..batch import BATCH_BUCKETS, batch_bucket
from ..checkpoint import config_from_metadata, read_header
from ..codec.config import FULL_CODEC_KWARGS, CodecConfig
from ..config import InferenceConfig, ModelConfig
from ..duration import FRAMES_PER_SECOND, MAX_SECONDS
from .presets import Preset

__all__ = [
    "BudgetPlan",
    "activation_bytes_per_line",
    "apply_budget",
    "budget_errors",
    "guidance_rows",
    "max_batch_within",
    "peak_bytes",
    "plan_from_files",
    "step_pool_size",
]

log = logging.getLogger("irodori_speaker.engine")

T = TypeVar("T")

#: Live copies of each decoder stage's output at its peak (a residual unit's input, its two
#: convolutions, the sum): the full-size DACVAE decoding 10 s (250 frames) in one pass peaked at
#: 886 MiB in fp32 on the CPU (docs/codec.md), 2.19 times the sum of its stages' outputs.
CODEC_LIVE_COPIES = 2.5
#: Frames of context a stream window decodes beside its own (engine/codec/streaming.py: 8 each side).
CODEC_CONTEXT_FRAMES = 16
#: A whole line's decode may take this share of the budget at most (1/8); past it, whole lines
#: decode in stream-window chunks, exact with their context: the released codec's 30 s line takes
#: ~1.5 GiB in one pass and ~0.1 GiB in 50-frame chunks.
DECODE_SHARE = 8
#: What else the allocator holds while lines run: cuBLAS workspaces (32 MiB per stream on an H200,
#: engine/cuda_graphs.py), the sampler's noise and latents, the allocator's rounding.
FIXED_RESERVE = 128 * 2**20


def guidance_rows(config: ModelConfig, meanflow: bool | None = None) -> int:
    """Rows the sampler runs per line at most: 1 for MeanFlow (no guidance), else the conditional
    row plus one dropped row per condition the model has (independent guidance)."""
    if config.meanflow if meanflow is None else meanflow:
        return 1
    return 2 + int(config.speaker_enabled) + int(config.caption_enabled)


#: The reference voice the plan makes room for (seconds): v2 / v3's cap. v4 takes up to 120 s; the
#: keys and values of so long a reference take 4x those of 30 s (2 GiB per line for the full-size
#: model), so planning every line for it would leave a 16 GiB budget a batch of 2. A line with a
#: longer reference needs more; where the budget cannot hold it, it is refused (OverBudgetError).
PLAN_REFERENCE_SECONDS = 30.0


def context_tokens(config: ModelConfig, inference: InferenceConfig | None = None) -> int:
    """The longest condition the plan makes room for: text tokens, reference voice patches (up to
    PLAN_REFERENCE_SECONDS), caption tokens."""
    inference = inference or InferenceConfig()
    tokens = inference.max_text_len or 256
    if config.speaker_enabled:
        seconds = min(inference.reference_seconds, PLAN_REFERENCE_SECONDS)
        tokens += math.ceil(math.ceil(seconds * FRAMES_PER_SECOND) / config.speaker_patch_size)
    if config.caption_enabled:
        tokens += inference.max_caption_len or inference.max_text_len or 256
    return tokens


def step_pool_size(
    config: ModelConfig, inference: InferenceConfig | None, max_batch: int, context_bucket: int = 32
) -> tuple[int, int]:
    """The step batcher's fixed context pool (engine/context_pool.py) for CUDA graphs: slots for
    `max_batch`'s batch bucket of lines at `guidance_rows` each, and the longest condition the
    plan makes room for (`context_tokens`), each of its up to three parts padded to
    `context_bucket` as the sampler pads them. The same rows x context keys/values that
    `activation_bytes_per_line` counts per line (`held`), so the budget already holds it."""
    lines = batch_bucket(max_batch) if max_batch > 1 else 1
    tokens = context_tokens(config, inference)
    parts = 1 + int(config.speaker_enabled) + int(config.caption_enabled)
    length = -(-tokens // context_bucket) * context_bucket + (parts - 1) * context_bucket
    return lines * guidance_rows(config), length


def activation_bytes_per_line(
    config: ModelConfig,
    frames: int,
    *,
    context: int,
    dtype_bytes: int = 2,
    rows: int | None = None,
) -> int:
    """Bytes one line's sampling holds on top of the weights, at its peak (an estimate).

    Per sampler row (`rows`, default `guidance_rows`), with D = model_dim, H = the MLP's hidden
    width, L = layers, S = latent tokens (frames / latent_patch_size), C = `context` tokens:
    - the conditions' keys and values of every layer, held for the whole line: 2 L C D;
    - the one block running: the residual and its normalised copy (2 S D), the SwiGLU's gate,
      up and product (3 S H, the larger half of a block), the keys and values joined with the
      context (2 (S + C) D) — one block's worth, freed before the next;
    - no attention probabilities: PyTorch's fused attention (flash / memory-efficient on CUDA,
      flash on the CPU, masks included) keeps none.
    Everything in `dtype_bytes` (2: bf16 / fp16). Against the tensor bytes the tiny models' sampler
    holds at its peak on the CPU (counted, fp32, 200-400 frames) it is within 0.96-1.13x
    (tests/engine/test_memory_budget.py); tests/engine/test_memory_budget_cuda.py checks it
    against `torch.cuda.max_memory_allocated` on a GPU.
    """
    rows = guidance_rows(config) if rows is None else rows
    D, H, L = config.model_dim, config.mlp_hidden, config.num_layers
    S = math.ceil(frames / config.latent_patch_size)
    held = 2 * L * context * D
    block = 2 * S * D + 3 * S * H + 2 * (S + context) * D
    return rows * (held + block) * dtype_bytes


def codec_bytes(codec: CodecConfig, frames: int, dtype_bytes: int = 2) -> int:
    """The decoder's activations for `frames` latent frames at once: each upsampling stage's output
    (channels halve, time grows by its rate) times CODEC_LIVE_COPIES."""
    elements, channels, length = 0, codec.decoder_dim, 1
    for rate in codec.decoder_rates:
        channels //= 2
        length *= rate
        elements += channels * length
    return int(frames * elements * dtype_bytes * CODEC_LIVE_COPIES)


def max_batch_within(budget: int, resident: int, per_line: int, reserve: int, wanted: int) -> int:
    """The largest batch size the budget holds, at most `wanted`: `wanted` itself or a smaller batch
    bucket, counting the rows of the bucket it fills up to (engine/batch.py), such that `resident`
    (weights, codec) + `reserve` (decode, workspaces) + rows x `per_line` (one line's share of the
    graph pool and of an eager batch) <= `budget`. 1 when even one line does not fit (such a line
    is refused when it runs)."""
    wanted = max(1, int(wanted))
    sizes = [b for b in BATCH_BUCKETS if b < wanted] + [wanted]
    fits = [n for n in sizes if n == 1 or resident + reserve + batch_bucket(n) * per_line <= budget]
    return max(fits, default=1)


@dataclass(frozen=True)
class BudgetPlan:
    """What a budget allows on one device: for the startup log, `devices` and `/metrics`."""

    budget: int  # bytes
    total: int  # the device's memory
    resident: int  # bytes allocated once the model loaded
    per_line: int  # estimated bytes of one line: its share of the graph pool and of an eager run
    max_batch: int
    prewarm_seconds: float
    text: str  # the budget as given
    decode_chunk_frames: int | None = None  # whole lines decoded in chunks of this many frames
    decode_batch: int = 1  # stream windows of lines that meet decoded as one batch of up to this
    # the preset's window plan, less the lengths whose graphs would cost sampling rows (None: as is)
    stream_window_plan: tuple[int, ...] | None = None

    def describe(self) -> str:
        chunks = f", decode in {self.decode_chunk_frames}-frame chunks" if self.decode_chunk_frames else ""
        if self.decode_batch > 1:
            chunks += f", stream windows decoded {self.decode_batch} at a time"
        if self.stream_window_plan is not None:
            plan = ", ".join(map(str, self.stream_window_plan)) or "none"
            chunks += f", stream window plan cut to ({plan})"
        return (
            f"GPU memory budget {format_bytes(self.budget)} of {format_bytes(self.total)} "
            f"({self.text}): model {format_bytes(self.resident)}, ~{format_bytes(self.per_line)} per line; "
            f"max batch {self.max_batch}, graphs up to {self.prewarm_seconds:g} s{chunks}"
        )


def plan_budget(
    budget: int,
    total: int,
    resident: int,
    config: ModelConfig,
    inference: InferenceConfig | None,
    preset: Any,
    text: str = "",
    codec: CodecConfig | None = None,
    *,
    cut: bool = True,
) -> BudgetPlan:
    """The batch size and graph length `budget` allows beside `resident` bytes (pure arithmetic);
    `codec`: the codec's config (None: the released codec's).

    Sampling rows come before decode windows: where the graph of a window plan's longest window
    would take a line from the sampling batch, the plan loses its longest lengths until the batch is
    what it would be without them (the plan's windows save decode time; a line of batch saves more
    under load). `cut=False`: the preset's plan as it is, whatever its windows cost."""
    dtype_bytes = torch.finfo(preset.dtype).bits // 8 if preset.dtype.is_floating_point else 2
    ctx = context_tokens(config, inference)
    longest = math.ceil(MAX_SECONDS * FRAMES_PER_SECOND)
    codec = codec or CodecConfig.from_kwargs(FULL_CODEC_KWARGS)
    width = torch.finfo(preset.codec_dtype).bits // 8
    middle = preset.stream_chunk_frames + CODEC_CONTEXT_FRAMES

    def per_line(seconds: float) -> int:
        frames = math.ceil(seconds * FRAMES_PER_SECOND)
        return activation_bytes_per_line(config, frames, context=ctx, dtype_bytes=dtype_bytes)

    def with_plan(window_plan: tuple[int, ...]) -> BudgetPlan:
        reserve, chunk = FIXED_RESERVE, preset.decode_chunk_frames
        decode_batch = max(1, min(int(preset.decode_batch), int(preset.max_batch)))
        window = 0  # one stream window's decode with graphs (their pool), or none
        if torch.device(preset.codec_device or preset.device).type == "cuda":
            if chunk is None and codec_bytes(codec, longest, width) > budget // DECODE_SHARE:
                chunk = preset.stream_chunk_frames  # exact (engine/codec/streaming.py), far less memory
            # a whole line's decode (or one chunk's window), and the codec graphs' shared pool
            reserve += codec_bytes(codec, longest if chunk is None else chunk + CODEC_CONTEXT_FRAMES, width)
            if preset.codec_graphs:  # the longest window graphed: the middle one's, or a plan's longest
                window = codec_bytes(codec, max((middle, *window_plan)), width)
                reserve += window
        # the graph pool holds the longest captured shape; a longer line (up to 30 s) runs eagerly
        seconds, longest_line = float(preset.prewarm_seconds), per_line(MAX_SECONDS)
        while seconds > 1 and resident + reserve + per_line(seconds) + longest_line > budget:
            seconds = max(1.0, seconds / 2)
        each = per_line(seconds) + longest_line
        batch = max_batch_within(budget, resident, each, reserve, int(preset.max_batch))
        if window:  # windows of lines that meet decode as one batch, in what the sampling leaves
            left = budget - resident - reserve - (batch_bucket(batch) if batch > 1 else 1) * each
            rows = batch_bucket(decode_batch) if decode_batch > 1 else 1
            while rows > 1 and (rows - 1) * window > left:
                rows //= 2
            decode_batch = min(decode_batch, rows)
        return BudgetPlan(budget, total, resident, each, batch, seconds, text, chunk, decode_batch)

    plan = tuple(preset.stream_window_plan)
    whole = with_plan(plan)
    if not cut or not preset.codec_graphs or max(plan, default=0) <= middle:
        return whole
    shortest = tuple(n for n in plan if n <= middle)  # no window past the middle one's
    least = with_plan(shortest)
    if whole.max_batch >= least.max_batch:
        return whole
    for cut in sorted({n for n in plan if n > middle}, reverse=True)[1:]:
        kept = tuple(n for n in plan if n <= cut)
        trimmed = with_plan(kept)
        if trimmed.max_batch >= least.max_batch:
            return dataclasses.replace(trimmed, stream_window_plan=kept)
    return dataclasses.replace(least, stream_window_plan=shortest)


def apply_budget(
    preset: Preset,
    budget: MemoryBudget,
    config: ModelConfig,
    inference: Any,
    codec: CodecConfig | None = None,
) -> tuple[Preset, BudgetPlan]:
    """Cap the allocator of `preset.device` (CUDA) at `budget` and return the preset with the
    batch size and graph length it allows. Raises OverBudgetError when the loaded weights alone
    are over it."""
    device = torch.device(preset.device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    limit = budget.resolve(total)
    resident = torch.cuda.memory_allocated(index)
    if resident > limit:
        raise OverBudgetError(
            f"the model alone takes {format_bytes(resident)} of GPU memory, over the budget of "
            f"{budget.describe(total)}",
            hint="raise --max-gpu-memory, or use int4 (--int4) for about a third of the weights",
        )
    torch.cuda.set_per_process_memory_fraction(limit / total, index)
    plan = plan_budget(limit, total, resident, config, inference, preset, budget.text, codec)
    capped = dataclasses.replace(
        preset,
        max_batch=min(int(preset.max_batch), plan.max_batch),
        prewarm_seconds=plan.prewarm_seconds,
        decode_chunk_frames=plan.decode_chunk_frames,
        decode_batch=plan.decode_batch,
        max_gpu_memory=limit,
        stream_window_plan=preset.stream_window_plan
        if plan.stream_window_plan is None
        else plan.stream_window_plan,
    )
    return capped, plan


def over_budget(error: BaseException, budget: int) -> OverBudgetError:
    """The one-line error for an allocation the budget refused."""
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    return OverBudgetError(
        f"over the GPU memory budget of {format_bytes(budget)}: {first[:160]}",
        hint="raise --max-gpu-memory, or use int4 (--int4); shorter lines and fewer streams need less",
    )


def budget_errors(chunks: Iterator[T], budget: int | None) -> Iterator[T]:
    """`chunks`, with CUDA's out-of-memory under a budget raised as `OverBudgetError` (no budget:
    `chunks` itself, no wrapper on every line)."""
    return chunks if budget is None else _over_budget_as_error(chunks, budget)


def _over_budget_as_error(chunks: Iterator[T], budget: int) -> Iterator[T]:
    try:
        yield from chunks
    except torch.cuda.OutOfMemoryError as e:
        torch.cuda.empty_cache()  # the failed line's blocks go back: the next line may fit
        raise over_budget(e, budget) from None


def plan_from_files(
    model: Any, codec: Any, budget: int, total: int, preset: Any, codec_config: CodecConfig | None = None
) -> BudgetPlan:
    """What `budget` would allow for these model and codec files, from their headers and sizes (no
    weight is read): the DiT's tensors at the preset's dtype, the codec at its size on disk (fp32
    files: twice what loads in fp16, so on the safe side); batch sizes up to the largest bucket."""
    meta, shapes = read_header(model)
    config, inference = config_from_metadata(meta, str(model))
    width = torch.finfo(preset.dtype).bits // 8
    resident = sum(math.prod(shape) for shape in shapes.values()) * width + os.path.getsize(codec)
    wide = dataclasses.replace(preset, max_batch=BATCH_BUCKETS[-1])
    return plan_budget(budget, total, resident, config, inference, wide, format_bytes(budget), codec_config)


def peak_bytes(device: Any) -> int | None:
    """`torch.cuda.max_memory_allocated` of a CUDA device, else None."""
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    return int(torch.cuda.max_memory_allocated(dev))
