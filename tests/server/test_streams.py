"""`serve --streams N`: several lines in synthesis at once, their sampling batched.

A real uvicorn server (tiny model, CPU). Lines that arrive together are sampled as one batch
(`irodori_sample_batch_lines` shows it), and each seeded line gives the same WAV as it does
alone on a one-stream server.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading

import numpy as np
import pytest
from server_helpers import httpx, start_server, wav_info

# one xdist worker runs this module, so its module-scoped servers starts once (tests/server/conftest.py)
pytestmark = pytest.mark.xdist_group(__name__)

TEXTS = ["こんにちは、今日もよろしく。", "ニュースの時間です。", "明日は晴れるでしょう。", "ありがとう！"]


def _synthesis(url: str, text: str) -> np.ndarray:
    q = httpx.post(url + "/audio_query", params={"text": text, "speaker": 0}, timeout=60)
    q.raise_for_status()
    r = httpx.post(url + "/synthesis", params={"speaker": 0}, json=q.json(), timeout=300)
    r.raise_for_status()
    return wav_info(r.content)[0]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    # 64 steps: a line samples long enough that the others arrive while it runs
    many = start_server(tmp_path_factory.mktemp("many"), "--streams", "4", "--steps", "64", "--no-cache")
    one = start_server(tmp_path_factory.mktemp("one"), "--streams", "1", "--steps", "64", "--no-cache")
    yield many, one
    assert many.stop() == 130 and one.stop() == 130


def test_lines_that_arrive_together_are_sampled_together_and_sound_as_alone(servers):
    many, one = servers
    alone = [_synthesis(one.url, t) for t in TEXTS]
    assert one.metric("irodori_sample_batch_lines_sum") == one.metric("irodori_sample_batch_lines_count")

    start = threading.Barrier(len(TEXTS))

    def together(text: str) -> np.ndarray:
        start.wait()
        return _synthesis(many.url, text)

    with cf.ThreadPoolExecutor(len(TEXTS)) as pool:
        batched = list(pool.map(together, TEXTS))
    lines = many.metric("irodori_sample_batch_lines_count")
    assert lines == len(TEXTS)
    # at least one line was sampled with another (the first may start alone, the rest join)
    assert many.metric("irodori_sample_batch_lines_sum") > lines
    for a, b in zip(alone, batched):
        assert a.shape == b.shape
        # padded rows are masked: the same audio up to the rounding of a larger GEMM
        assert np.abs(a - b).max() <= 2 / 32768  # two steps of the WAV's 16 bits


def test_a_lone_line_on_a_many_stream_server_is_sampled_alone(servers):
    many, _ = servers
    before_sum = many.metric("irodori_sample_batch_lines_sum")
    before = many.metric("irodori_sample_batch_lines_count")
    _synthesis(many.url, "ひとりです。")
    assert many.metric("irodori_sample_batch_lines_count") == before + 1
    assert many.metric("irodori_sample_batch_lines_sum") == before_sum + 1
