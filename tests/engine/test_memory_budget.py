"""What a GPU memory budget allows (engine/hardware/memory.py), on the CPU: the activation
estimate against the tensor bytes the tiny models' sampler really holds, the batch cap, the plan,
and the clean error past the budget. On CUDA: test_memory_budget_cuda.py."""

from __future__ import annotations

import dataclasses
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from irodori_speaker.engine.batch import BATCH_BUCKETS
from irodori_speaker.engine.codec.config import FULL_CODEC_KWARGS, TINY_CODEC_KWARGS, CodecConfig
from irodori_speaker.engine.config import InferenceConfig, ModelConfig
from irodori_speaker.engine.fast import FastSampler
from irodori_speaker.engine.hardware.memory import (
    activation_bytes_per_line,
    budget_errors,
    codec_bytes,
    context_tokens,
    guidance_rows,
    max_batch_within,
    plan_budget,
    step_pool_size,
)
from irodori_speaker.engine.hardware.presets import Preset, base_preset
from irodori_speaker.engine.sampler import draw_noise, sample
from irodori_speaker.engine.tiny import V4_INFERENCE, random_model
from irodori_speaker.options import SamplerConfig
from irodori_speaker.options.memory import OverBudgetError


def _line(model, n_text: int, n_ref: int, seed: int):
    """One line's conditions (batch 1): `n_text` random tokens, a reference of `n_ref` frames."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, model.cfg.text_token_vocab, (1, n_text), generator=g)
    ref = torch.randn(1, n_ref, model.cfg.latent_dim, generator=g)
    ones = torch.ones(1, n_text, dtype=torch.bool), torch.ones(1, n_ref, dtype=torch.bool)
    with torch.inference_mode():
        return model.encode_conditions(ids, ones[0], ref, ones[1])


MIB, GIB = 2**20, 2**30


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of the CPU tensor storages ops create while they live, and the peak: the
    CPU's stand-in for `torch.cuda.max_memory_allocated` (storages are freed by refcount, so a
    weakref on each says when its bytes go)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self._seen: set[int] = set()

    def _gone(self, key: int, n: int) -> None:
        self._seen.discard(key)
        self.live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                key, n = storage.data_ptr(), storage.nbytes()
                if n and key not in self._seen:
                    self._seen.add(key)
                    self.live += n
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(storage, self._gone, key, n)
        return out


@pytest.mark.parametrize("kind", ["v2", "v4.1-mf"])
@pytest.mark.parametrize("path", ["reference", "fast"])
@pytest.mark.parametrize(("frames", "text", "ref"), [(200, 32, 100), (400, 64, 200)])
def test_the_estimate_matches_the_bytes_a_line_holds(kind, path, frames, text, ref):
    """Within 0.8-1.3x of the counted peak (measured 0.96-1.13x): the estimate sizes the batch."""
    model = random_model(kind)
    conds = _line(model, text, ref, 0)
    noise = draw_noise(0, 1, frames, model.cfg.latent_dim)
    cfg = SamplerConfig(steps=4, schedule="sway")
    with torch.inference_mode(), LiveBytes() as counted:
        if path == "fast":
            FastSampler(model).sample(conds, noise, cfg)
        else:
            sample(model, conds, noise, cfg)
    context = sum(
        s.shape[1] for s in (conds.text_state, conds.speaker_state, conds.caption_state) if s is not None
    )
    estimate = activation_bytes_per_line(model.cfg, frames, context=context, dtype_bytes=4)
    assert 0.8 <= counted.peak / estimate <= 1.3, (counted.peak, estimate)


def test_guidance_rows_follow_the_conditions_and_meanflow():
    assert guidance_rows(random_model("v2").cfg) == 3  # conditional, no text, no speaker
    assert guidance_rows(random_model("v2-voicedesign").cfg) == 3  # a caption instead of a speaker
    assert guidance_rows(random_model("v4").cfg) == 4  # text, speaker and caption each dropped
    assert guidance_rows(random_model("v4.1-mf").cfg) == 1


def test_the_estimate_grows_with_frames_context_rows_and_width():
    cfg = ModelConfig()
    base = activation_bytes_per_line(cfg, 300, context=500)
    assert activation_bytes_per_line(cfg, 600, context=500) > base
    assert activation_bytes_per_line(cfg, 300, context=1000) > base
    assert activation_bytes_per_line(cfg, 300, context=500, rows=6) == 2 * base  # 3 rows by default
    assert activation_bytes_per_line(cfg, 300, context=500, dtype_bytes=4) == 2 * base


def test_the_plan_makes_room_for_a_30_s_reference_at_most():
    cfg = ModelConfig()
    v2 = context_tokens(cfg, InferenceConfig())
    assert v2 == 256 + 750  # text + 30 s of reference frames
    assert context_tokens(cfg, V4_INFERENCE) == v2  # v4's 120 s cap is not planned for


def test_the_step_pool_holds_the_planned_context_of_a_batch_bucket_of_lines():
    cfg = ModelConfig()
    slots, length = step_pool_size(cfg, InferenceConfig(), 12)
    assert slots == 16 * guidance_rows(cfg)  # max_batch 12 fills up to the bucket of 16
    assert length % 32 == 0 and context_tokens(cfg, InferenceConfig()) + 32 <= length
    assert step_pool_size(cfg, InferenceConfig(), 1)[0] == guidance_rows(cfg)
    mf = random_model("v4.1-mf").cfg
    assert step_pool_size(mf, V4_INFERENCE, 4)[0] == 4  # one row a line


def test_the_codec_estimate_matches_the_measured_full_size_decode():
    full = codec_bytes(CodecConfig.from_kwargs(FULL_CODEC_KWARGS), 250, dtype_bytes=4)
    assert 886 * MIB <= full <= 1.2 * 886 * MIB  # 10 s in one pass, fp32: 886 MiB (docs/codec.md)
    assert codec_bytes(CodecConfig.from_kwargs(TINY_CODEC_KWARGS), 250) < full / 10


@pytest.mark.parametrize(
    ("budget", "wanted", "expect"),
    [
        (100, 64, 64),  # room for everything
        (10 + 5 + 16 * 1, 64, 16),  # buckets only: 16 fits, 32 does not
        (10 + 5 + 20, 64, 16),
        (10 + 5 + 3, 64, 2),
        (10 + 5 + 1, 64, 1),  # one line
        (10 + 5, 64, 1),  # not even one: 1, and the line is refused when it runs
        (100, 8, 8),
        (100, 5, 5),  # 5 lines fill 8 rows: room for 8
        (10 + 5 + 6, 5, 4),  # no room for 8 rows: 4
        (10 + 5 + 6, 3, 3),  # 3 lines fill 4 rows
        (100, 1, 1),
    ],
)
def test_max_batch_is_the_largest_bucket_within_the_budget(budget, wanted, expect):
    assert max_batch_within(budget, resident=10, per_line=1, reserve=5, wanted=wanted) == expect


def test_max_batch_never_passes_the_budget_by_its_own_arithmetic():
    for budget in range(15, 200, 7):
        rows = max_batch_within(budget, 10, 3, 5, 64)
        assert rows in (1, *BATCH_BUCKETS)
        assert rows == 1 or 10 + 5 + rows * 3 <= budget
        assert max_batch_within(budget, 10, 3, 5, 6) in (1, 2, 4, 6)


def test_the_plan_caps_batch_and_graph_length_as_the_budget_shrinks():
    cfg, preset = ModelConfig(), dataclasses.replace(base_preset("cuda"), max_batch=64)
    plans = [plan_budget(gib * GIB, 140 * GIB, int(1.6 * GIB), cfg, None, preset) for gib in (64, 16, 8, 3)]
    batches = [p.max_batch for p in plans]
    assert batches == sorted(batches, reverse=True) and batches[0] > batches[-1]
    assert plans[0].prewarm_seconds == preset.prewarm_seconds
    assert plans[-1].prewarm_seconds < preset.prewarm_seconds  # a small budget captures shorter graphs
    for p in plans:
        assert p.max_batch in (1, *BATCH_BUCKETS)
        assert "max batch" in p.describe() and "GPU memory budget" in p.describe()
    assert plan_budget(64 * GIB, 140 * GIB, GIB, cfg, None, base_preset("cuda")).max_batch == 1  # wanted 1


def test_the_preset_has_no_budget_until_one_is_applied():
    assert Preset("cpu", "cpu").max_gpu_memory is None


def test_an_allocation_past_the_budget_is_a_clean_error():
    def chunks():
        yield 1
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")

    stream = budget_errors(chunks(), 3 * GIB)
    assert next(stream) == 1
    with pytest.raises(OverBudgetError) as e:
        next(stream)
    assert "over the GPU memory budget of 3 GiB" in str(e.value) and "Tried to allocate 2.00 GiB" in str(
        e.value
    )
    assert "--max-gpu-memory" in (e.value.hint or "") and "int4" in (e.value.hint or "")
    assert "\n" not in str(e.value) and e.value.__cause__ is None and e.value.__suppress_context__


def test_without_a_budget_out_of_memory_passes_unchanged():
    def chunks():
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        yield  # pragma: no cover

    with pytest.raises(torch.cuda.OutOfMemoryError):
        list(budget_errors(chunks(), None))


class _FakeCuda:
    """A stand-in for the CUDA calls `apply_budget` makes (no GPU here; the real ones run in
    test_memory_budget_cuda.py): a card of `total` bytes with `allocated` bytes in use."""

    def __init__(self, total: int, allocated: int) -> None:
        self.total, self.allocated, self.fraction = total, allocated, None

    def install(self, monkeypatch) -> None:
        cuda = torch.cuda
        props = type("Props", (), {"total_memory": self.total, "name": "fake"})
        monkeypatch.setattr(cuda, "current_device", lambda: 0)
        monkeypatch.setattr(cuda, "get_device_properties", lambda i: props)
        monkeypatch.setattr(cuda, "memory_allocated", lambda i=None: self.allocated)
        monkeypatch.setattr(cuda, "set_per_process_memory_fraction", self._set)

    def _set(self, fraction: float, device=None) -> None:
        self.fraction = (fraction, device)


def test_applying_a_budget_caps_the_allocator_the_batch_and_the_graphs(monkeypatch):
    from irodori_speaker.engine.hardware.memory import apply_budget
    from irodori_speaker.options.memory import parse_memory_budget

    fake = _FakeCuda(total=80 * GIB, allocated=int(1.6 * GIB))
    fake.install(monkeypatch)
    preset = dataclasses.replace(base_preset("cuda"), max_batch=64)
    capped, plan = apply_budget(preset, parse_memory_budget("0.05"), ModelConfig(), InferenceConfig())
    assert fake.fraction == (plan.budget / (80 * GIB), 0) and plan.budget == int(80 * GIB * 0.05)
    assert capped.max_gpu_memory == plan.budget
    assert capped.max_batch == plan.max_batch < 64 and capped.prewarm_seconds == plan.prewarm_seconds
    assert plan.resident == int(1.6 * GIB)
    roomy, _ = apply_budget(preset, parse_memory_budget("0.9"), ModelConfig(), InferenceConfig())
    assert roomy.max_batch > capped.max_batch and roomy.prewarm_seconds == preset.prewarm_seconds
    mine, _ = apply_budget(
        dataclasses.replace(preset, max_batch=2), parse_memory_budget("0.9"), ModelConfig(), InferenceConfig()
    )
    assert mine.max_batch == 2  # never raised past what was asked for


def test_a_budget_below_the_loaded_weights_is_refused(monkeypatch):
    from irodori_speaker.engine.hardware.memory import apply_budget
    from irodori_speaker.options.memory import parse_memory_budget

    fake = _FakeCuda(total=80 * GIB, allocated=2 * GIB)
    fake.install(monkeypatch)
    with pytest.raises(OverBudgetError) as e:
        apply_budget(base_preset("cuda"), parse_memory_budget("1GiB"), ModelConfig(), InferenceConfig())
    assert "the model alone takes 2 GiB of GPU memory, over the budget of 1 GiB" in str(e.value)
    assert "--int4" in (e.value.hint or "") and fake.fraction is None  # nothing capped


def test_a_codec_on_the_cpu_leaves_its_decode_out_of_the_budget():
    cfg, gpu = ModelConfig(), dataclasses.replace(base_preset("cuda"), max_batch=64)
    cpu = dataclasses.replace(gpu, codec_device="cpu")
    budget = int(2.5 * GIB)  # the codec's chunked decode and its graph pool: 1 s graphs or 12 s
    on_gpu = plan_budget(budget, 80 * GIB, GIB, cfg, None, gpu)
    on_cpu = plan_budget(budget, 80 * GIB, GIB, cfg, None, cpu)
    assert (on_cpu.max_batch, on_cpu.prewarm_seconds) > (on_gpu.max_batch, on_gpu.prewarm_seconds)


def test_a_tight_budget_decodes_whole_lines_in_chunks():
    # 50-frame windows (the CUDA preset's plan is cut at this budget: the next test)
    preset = dataclasses.replace(base_preset("cuda"), max_batch=64, stream_window_plan=())
    cfg = ModelConfig()
    assert preset.decode_chunk_frames is None  # the CUDA preset decodes a whole line in one pass
    tight = plan_budget(4 * GIB, 80 * GIB, GIB, cfg, None, preset)
    roomy = plan_budget(64 * GIB, 80 * GIB, GIB, cfg, None, preset)
    assert tight.decode_chunk_frames == preset.stream_chunk_frames and roomy.decode_chunk_frames is None
    assert "decode in 50-frame chunks" in tight.describe() and "chunks" not in roomy.describe()
    assert tight.max_batch > 1  # a whole 30 s decode (~1.5 GiB) would leave room for one line
    given = plan_budget(
        4 * GIB, 80 * GIB, GIB, cfg, None, dataclasses.replace(preset, decode_chunk_frames=25)
    )
    assert given.decode_chunk_frames == 25  # a chunk the preset already has is kept


def test_the_window_batch_gets_what_the_sampling_leaves():
    """With codec graphs, stream windows of lines that meet decode as one batch (preset
    `decode_batch`, 4 on CUDA); each extra row of the batch's graph is one more window's decode,
    sized from what the sampling batch leaves (the sampling batch is chosen first)."""
    cfg, preset = ModelConfig(), dataclasses.replace(base_preset("cuda"), max_batch=8)
    assert preset.decode_batch == 4
    roomy = plan_budget(64 * GIB, 80 * GIB, GIB, cfg, None, preset)
    assert roomy.decode_batch == 4 and "stream windows decoded 4 at a time" in roomy.describe()
    alone = plan_budget(64 * GIB, 80 * GIB, GIB, cfg, None, dataclasses.replace(preset, max_batch=1))
    assert alone.decode_batch == 1 and "stream windows" not in alone.describe()  # no lines meet
    sizes = {plan_budget(b * GIB // 4, 80 * GIB, GIB, cfg, None, preset).decode_batch for b in range(8, 40)}
    assert 1 in sizes and 4 in sizes  # some budget between holds the sampling but fewer windows


def test_a_window_plans_longest_window_counts_in_the_window_batch():
    """With a window plan (`stream_window_plan`) the graphed windows reach its longest length (216
    frames against the middle 66): the decode's reserve and the window batch are sized from that; a
    plan within the middle length changes nothing."""
    # against no plan (the CUDA preset's own, 40 / 66 / 116, reaches past the middle length too)
    preset = dataclasses.replace(base_preset("cuda"), max_batch=8, stream_window_plan=())
    cfg = ModelConfig()
    plan = dataclasses.replace(preset, stream_window_plan=(40, 66, 116, 216))
    short = dataclasses.replace(preset, stream_window_plan=(40, 66))
    budgets = [b * GIB // 4 for b in range(8, 80)]
    plain = [plan_budget(b, 80 * GIB, GIB, cfg, None, preset) for b in budgets]
    assert [plan_budget(b, 80 * GIB, GIB, cfg, None, short) for b in budgets] == plain
    # the sampling batch is chosen first (a larger reserve may lower it, leaving more to the windows)
    got = [
        (p.max_batch, p.decode_batch)
        for p in (plan_budget(b, 80 * GIB, GIB, cfg, None, plan) for b in budgets)
    ]
    want = [(p.max_batch, p.decode_batch) for p in plain]
    assert all(g <= w for g, w in zip(got, want, strict=True)) and got != want
    assert got[-1] == want[-1] == (8, 4)  # a roomy budget holds them all


def test_a_window_plan_is_cut_where_its_longest_window_would_cost_a_line_of_batch():
    """Sampling rows first: at 4 GiB the CUDA preset's 116-frame window graph would leave one line of
    sampling batch where 50-frame windows leave two; the plan loses its lengths past the middle
    window (66 frames), and apply_budget hands the cut plan on. A roomy budget keeps the plan whole."""
    cfg = ModelConfig()
    preset = dataclasses.replace(base_preset("cuda"), max_batch=64)
    assert preset.stream_window_plan == (40, 66, 116) and preset.codec_graphs
    plain = plan_budget(4 * GIB, 80 * GIB, GIB, cfg, None, dataclasses.replace(preset, stream_window_plan=()))
    # what the whole plan would give: its reserve, as the planner counted it before the cut
    whole = plan_budget(4 * GIB, 80 * GIB, GIB, cfg, None, preset, cut=False)
    assert whole.max_batch < plain.max_batch == 2
    tight = plan_budget(4 * GIB, 80 * GIB, GIB, cfg, None, preset)
    assert tight.stream_window_plan == (40, 66) and tight.max_batch == plain.max_batch
    assert "stream window plan cut to (40, 66)" in tight.describe()
    roomy = plan_budget(64 * GIB, 80 * GIB, GIB, cfg, None, preset)
    assert roomy.stream_window_plan is None and "plan" not in roomy.describe()
    # a longer plan is cut only as far as it must be: each budget keeps the longest plan whose
    # window leaves the batch of 50-frame windows
    long = dataclasses.replace(preset, stream_window_plan=(40, 66, 116, 216))
    none = dataclasses.replace(long, stream_window_plan=())
    cuts = set()
    for budget in (q * GIB // 4 for q in range(12, 97)):  # 3 to 24 GiB
        got = plan_budget(budget, 80 * GIB, GIB, cfg, None, long)
        kept = got.stream_window_plan if got.stream_window_plan is not None else long.stream_window_plan
        base = plan_budget(budget, 80 * GIB, GIB, cfg, None, none)
        assert got.max_batch == base.max_batch
        longer = [n for n in long.stream_window_plan if n not in kept]
        if longer:  # the next length would have cost a line
            cuts.add(kept)
            longer_plan = dataclasses.replace(long, stream_window_plan=(*kept, min(longer)))
            over = plan_budget(budget, 80 * GIB, GIB, cfg, None, longer_plan, cut=False)
            assert over.max_batch < base.max_batch
    assert cuts == {(40, 66), (40, 66, 116)}  # cut to the middle window, and only the 216 dropped
    # no codec graphs: no window graph to hold, nothing cut
    eager = dataclasses.replace(preset, codec_graphs=False)
    assert plan_budget(4 * GIB, 80 * GIB, GIB, cfg, None, eager).stream_window_plan is None


def test_apply_budget_hands_on_the_cut_plan(monkeypatch):
    from irodori_speaker.engine.hardware.memory import apply_budget
    from irodori_speaker.options.memory import parse_memory_budget

    fake = _FakeCuda(total=80 * GIB, allocated=GIB)
    fake.install(monkeypatch)
    preset = dataclasses.replace(base_preset("cuda"), max_batch=64)
    capped, plan = apply_budget(preset, parse_memory_budget("4GiB"), ModelConfig(), InferenceConfig())
    assert plan.stream_window_plan == (40, 66) == capped.stream_window_plan
    assert fake.fraction is not None
    capped, plan = apply_budget(preset, parse_memory_budget("64GiB"), ModelConfig(), InferenceConfig())
    assert capped.stream_window_plan == (40, 66, 116) and plan.stream_window_plan is None
