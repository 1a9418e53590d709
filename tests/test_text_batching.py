"""The encoders of lines that meet on the device owner run as one batch (synthesis/encoding.py).

The real tiny models on the CPU in fp32 (conftest hides the CPU's bf16): a batch's text states
and predicted lengths equal each line's alone, lines from several threads are encoded by one
text-encoder call and sound as alone, a line whose encoder raises fails alone, and with
`max_batch` 1 nothing is batched. The CUDA-graph side (batch buckets, fill rows, no capture
outside warm-up) has a test that needs a GPU; its eager fallback is checked here on the CPU.

Tolerance of the text states: a batch pads the rows to the longest, so its GEMMs have other row
counts and its attention takes a key mask where a lone line's has none: the same sums rounded in
another order, a few fp32 ulps (measured <= 1e-6 on states of magnitude ~3). 1e-5 leaves ~10x.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from irodori_speaker.engine.batch import fill_tokens, stack_tokens
from irodori_speaker.engine.fast import FastSampler
from irodori_speaker.engine.hardware.lock import MODEL_LOCK
from irodori_speaker.engine.hardware.owner import DEVICE
from irodori_speaker.engine.kernels.tuning import tuning_allowed
from irodori_speaker.engine.model import Conditions
from test_batching import TEXTS, opts

TOL = dict(atol=1e-5, rtol=1e-5)


def _load(tiny_random: object = True, **kw):
    from irodori_speaker.synthesis.loading import load_synthesizer

    return load_synthesizer(tiny_random=tiny_random, backend="cpu", voice_cache_dir=False, **kw)


def _tokens(synth, texts=TEXTS) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [synth.tokenizer.batch([synth.spoken_text(t)]) for t in texts]


def together(synth, jobs: list) -> list:
    """Each (text, options) from its own thread, every encoder job queued on the device owner
    (the model lock held here) before any runs; each result or the exception it raised."""
    results: list = [None] * len(jobs)

    def work(i: int) -> None:
        try:
            results[i] = synth.synthesize(jobs[i][0], options=jobs[i][1])
        except Exception as e:
            results[i] = e

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    with MODEL_LOCK:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while DEVICE.queued() < len(jobs) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert DEVICE.queued() == len(jobs)
    for t in threads:
        t.join(120)
    return results


def _counting_many(encoders, sizes: list[int]):
    """`encoders.many`, recording each call's number of items."""
    many = encoders.many
    return lambda items: sizes.append(len(items)) or many(items)


def _text_rows(model, rows: list[int]):
    """`model.encode_text` of each batch size in `rows` (wrapping the model's own method)."""
    real = model.encode_text

    def encode_text(ids, mask):
        rows.append(int(ids.shape[0]))
        return real(ids, mask)

    return encode_text


@pytest.mark.parametrize("kind", ["v2", "v3", "v4.1-mf"])  # scratch encoder, + predictor, backbone
def test_texts_encoded_in_one_batch_equal_each_encoded_alone(irodori_home, kind):
    synth = _load(kind, max_batch=8)
    enc, tokens = synth._encoders, _tokens(synth)
    assert len({int(i.shape[1]) for i, _ in tokens}) > 1  # rows of other lengths: padding is used
    with torch.inference_mode():
        batch = enc.text_states([i for i, _ in tokens], [m for _, m in tokens])
        alone = [enc.text_states([i], [m])[0] for i, m in tokens]
        for (bs, bm), (s, m) in zip(batch, alone):
            assert bs.shape == s.shape and torch.equal(bm, m)  # cut back to the lone line's shape
            torch.testing.assert_close(bs, s, **TOL)
        if not synth.config.use_duration_predictor:
            return
        voice = synth.voices.states(None)[1]
        preds = enc.predict([Conditions(s, m, *voice) for s, m in batch], [False] * len(batch))
        for pred, (s, m) in zip(preds, alone):
            torch.testing.assert_close(pred, enc.predict([Conditions(s, m, *voice)], [False])[0], **TOL)


def test_a_batch_shape_not_captured_in_warm_up_is_encoded_eagerly_as_the_graphs_pad_it(irodori_home):
    """The graphed encoder's bookkeeping, runnable on the CPU: outside warm-up a batch whose
    (batch bucket, text bucket) has no graph is not captured; its rows come back padded to the
    context bucket as a graph's would. Fill rows (copies of the first line) leave the real rows as
    they are."""
    synth = _load()
    model, tokens = synth.model, _tokens(synth)
    ids, mask = stack_tokens([i for i, _ in tokens], [m for _, m in tokens])
    sampler = FastSampler(model, use_graphs=True)  # never replayed here: nothing is captured
    with torch.inference_mode():
        state, padded = sampler.encode_text(ids, mask)
        assert sampler.text_captures == 0 and not sampler._text_graphs
        assert state.shape[:2] == padded.shape == (len(TEXTS), sampler.text_width(ids.shape[1]))
        for b, (i, m) in enumerate(tokens):
            torch.testing.assert_close(state[b : b + 1, : i.shape[1]], model.encode_text(i, m), **TOL)
        assert not state[~padded].any()  # padding: zero states, masked
        filled = fill_tokens(ids, mask, 8)
        assert filled[0].shape == (8, ids.shape[1])
        assert filled[0][len(TEXTS) :].eq(ids[0]).all() and filled[1][len(TEXTS) :].eq(mask[0]).all()
        real_rows = model.encode_text(*filled)[: len(TEXTS)]
        torch.testing.assert_close(real_rows, model.encode_text(ids, mask), **TOL)


@pytest.fixture(scope="module")
def batched(irodori_home):
    """v3 (a duration predictor: lengths are predicted in the batch too), whole-line sampling
    batches with any padding (their own tests: test_batching.py)."""
    return _load("v3", max_batch=8, max_padding=100.0, step_batching=False)


def test_lines_that_meet_encode_their_texts_in_one_call_and_sound_as_alone(batched, monkeypatch):
    jobs = [(t, opts(seed=i)) for i, t in enumerate(TEXTS)]
    alone = [batched.synthesize(t, options=o) for t, o in jobs]
    rows: list[int] = []
    monkeypatch.setattr(batched.model, "encode_text", _text_rows(batched.model, rows))
    before, calls = DEVICE.batches_run, dict(batched._encoders.batches)
    results = together(batched, jobs)
    assert rows == [len(TEXTS)], rows  # one text-encoder call for the four lines
    assert DEVICE.batches_run > before
    assert batched._encoders.batches == {**calls, len(TEXTS): calls.get(len(TEXTS), 0) + 1}
    for a, b in zip(alone, results):
        assert not isinstance(b, Exception), b
        assert b.record.frames == a.record.frames  # the predicted lengths are the lone ones
        assert b.record.extra["duration_source"] == "predictor"
        np.testing.assert_allclose(b.audio, a.audio, atol=1e-5)  # as test_batching.py's


def test_a_line_whose_encoder_raises_fails_alone_and_the_others_in_its_batch_go_on(batched, monkeypatch):
    jobs = [(t, opts(seed=i)) for i, t in enumerate(TEXTS)]
    alone = [batched.synthesize(t, options=o) for t, o in jobs]
    bad, _ = _tokens(batched, [TEXTS[2]])[0]
    rows: list[int] = []
    counted = _text_rows(batched.model, rows)

    def encode_text(ids, mask):  # the encoder fails on the third line's text, in a batch or alone
        n = bad.shape[1]
        if ids.shape[1] >= n and (ids[:, :n] == bad).all(dim=1).any():
            raise RuntimeError("the encoder failed on this text")
        return counted(ids, mask)

    monkeypatch.setattr(batched.model, "encode_text", encode_text)
    calls = dict(batched._encoders.batches)
    results = together(batched, jobs)
    assert isinstance(results[2], RuntimeError) and "this text" in str(results[2])
    assert rows == [1, 1, 1], rows  # the batch raised; the others were encoded again one by one
    assert batched._encoders.batches == {**calls, 1: calls.get(1, 0) + 3}  # calls that gave results
    for i in (0, 1, 3):
        assert not isinstance(results[i], Exception), results[i]
        np.testing.assert_allclose(results[i].audio, alone[i].audio, atol=1e-5)


def test_with_max_batch_one_every_line_is_encoded_alone(irodori_home, monkeypatch):
    synth = _load(max_batch=1)
    rows: list[int] = []
    sizes: list[int] = []
    monkeypatch.setattr(synth.model, "encode_text", _text_rows(synth.model, rows))
    monkeypatch.setattr(synth._encoders, "many", _counting_many(synth._encoders, sizes))
    before = DEVICE.batches_run
    results = together(synth, [(t, opts(seed=i)) for i, t in enumerate(TEXTS)])
    assert all(not isinstance(r, Exception) for r in results), results
    assert rows == [1] * len(TEXTS) and sizes == [1] * len(TEXTS)
    assert DEVICE.batches_run == before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need an NVIDIA GPU (run on the H200)")
def test_graphed_batches_of_texts_equal_eager_and_are_captured_only_in_warm_up(irodori_home):
    synth = _load("v4.1-mf")  # the backbone in the graphs; its model, moved to the GPU
    model = synth.model.float().cuda()
    tokens = [(i.cuda(), m.cuda()) for i, m in _tokens(synth)]
    ids, mask = stack_tokens([i for i, _ in tokens], [m for _, m in tokens])
    graphed = FastSampler(model, use_graphs=True)
    with torch.inference_mode():
        eager, _ = graphed.encode_text(ids, mask)  # not warmed up: eager, nothing captured
        assert graphed.text_captures == 0
        with tuning_allowed():  # warm-up: the (4 rows, 32 tokens) graph
            graphed.encode_text(ids, mask)
        assert graphed.text_captures == 1 and set(graphed._text_graphs) == {(4, 32)}
        replayed, padded = graphed.encode_text(ids[:3], mask[:3])  # 3 rows: 4 with a fill row
        assert graphed.text_captures == 1 and replayed.shape[:2] == padded.shape == (3, 32)
        torch.testing.assert_close(replayed, eager[:3], atol=1e-5, rtol=1e-5)
        for b, (i, m) in enumerate(tokens[:3]):
            torch.testing.assert_close(replayed[b : b + 1, : i.shape[1]], model.encode_text(i, m), **TOL)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need an NVIDIA GPU (run on the H200)")
def test_prewarm_captures_the_text_graphs_of_batches_and_lines_that_meet_capture_none(irodori_home):
    from irodori_speaker.engine.batch import BATCH_BUCKETS
    from irodori_speaker.synthesis.loading import load_synthesizer

    synth = load_synthesizer(tiny_random=True, backend="cuda", voice_cache_dir=False, max_batch=8)
    synth.prewarm()
    fast = synth.fast_sampler
    cb = fast.context_bucket
    want = {(rows, tokens) for rows in (1, *[b for b in BATCH_BUCKETS if b <= 8]) for tokens in (cb, 2 * cb)}
    assert want <= set(fast._text_graphs)
    captured = fast.text_captures
    jobs = [(t, opts(seed=i)) for i, t in enumerate(TEXTS)]
    alone = [synth.synthesize(t, options=o) for t, o in jobs]
    sizes: list[int] = []
    synth._encoders.many = _counting_many(synth._encoders, sizes)
    results = together(synth, jobs)
    assert sizes == [len(TEXTS)]  # one call for the four lines, replayed from prewarm's graph
    assert fast.text_captures == captured
    for a, b in zip(alone, results):
        assert not isinstance(b, Exception), b
        assert len(a.audio) == len(b.audio)
        np.testing.assert_allclose(b.audio, a.audio, atol=2e-2)  # bf16: rows of another GEMM size
