"""Shared test fixtures: the test data in the repository (golden outputs), a tiny-random synthesizer."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
#: Golden outputs of the reference implementations and release manifests (tests/data/README.md).
TEST_DATA = REPO / "tests" / "data"
#: The five-sentence news benchmark (the benchmarks read it from here too).
NEWS5_JSON = REPO / "benchmarks" / "data" / "news5.json"

# One intra-op thread: the tiny models gain nothing from more, and on a shared 2-core machine
# OpenMP's spinning threads made them ~100x slower whenever the other core was busy.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")  # for the subprocesses tests start
# The CPU preset picks bf16 / int8 from the CPU's flags: the tests see a CPU without them (fp32, as
# on every machine before), so results do not depend on the machine. tests/backends/test_cpu_preset.py
# fakes the flags it needs.
os.environ["IRODORI_CPU_FLAGS"] = "none"
# The model's CPU threads: one, as above (the product's default is half the usable CPUs).
os.environ["IRODORI_THREADS"] = "1"
# tiny_random=True / --tiny-random: the v2 layout most tests were written against (the product's
# default is the default model's family, v4.1-MF; tests/test_first_hour.py tests that default).
os.environ["IRODORI_TINY_KIND"] = "v2"
# Int4 kernel choices are timed afresh in every test run (GPU): never read from or written to the
# user's cache; tests/quant/test_triton_interp.py sets its own file to test the persistence.
os.environ["IRODORI_INT4_TUNE_CACHE"] = "off"
# The user dictionary every Synthesizer applies: an empty one of the test run, never the user's.
os.environ["IRODORI_DICT"] = os.path.join(tempfile.mkdtemp(prefix="irodori-dict-"), "user_dict.sqlite3")


@pytest.fixture(scope="session")
def test_data() -> Path:
    """tests/data: part of the repository, so a missing file is a failure, never a skip."""
    return TEST_DATA


@pytest.fixture(scope="session")
def dit_fixtures(test_data: Path) -> Path:
    return test_data / "dit"


@pytest.fixture(scope="session")
def codec_fixtures(test_data: Path) -> Path:
    return test_data / "dacvae"


@pytest.fixture(scope="session")
def news5_sentences() -> list[str]:
    return list(json.loads(NEWS5_JSON.read_text(encoding="utf-8"))["sentences"])


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model fails the test: what is checked must be checked before it."""
    from irodori_speaker.synthesis import loading

    def load(*a, **k):
        pytest.fail("the model was loaded before the mistake was found")

    monkeypatch.setattr(loading, "load_synthesizer", load)


@pytest.fixture(scope="module")
def irodori_home(tmp_path_factory):
    """A fresh IRODORI_CACHE for one test module (tiny-random files, voices, phrase caches)."""
    mp = pytest.MonkeyPatch()
    home = tmp_path_factory.mktemp("irodori-home")
    mp.setenv("IRODORI_CACHE", str(home))
    yield home
    mp.undo()


@pytest.fixture(scope="module")
def synth(irodori_home):
    """The tiny-random v2 synthesizer on the CPU (its output is noise), one per module."""
    from irodori_speaker.synthesis.loading import load_synthesizer

    return load_synthesizer(tiny_random=True, backend="cpu", voice_cache_dir=False)


@pytest.fixture(scope="module")
def hostile_loop():
    """One event loop for a module's hostile cases (tests/hostile.py)."""
    import asyncio

    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


@pytest.fixture(scope="module")
def hostile_speaker(synth, hostile_loop, tmp_path_factory):
    """One Speaker for a module's hostile cases: the tiny model, NullOutput, a phrase cache that
    stores every line. Each case hands it bad input, then has it speak a normal line."""
    import asyncio

    from hostile import OPTS
    from irodori_speaker.cache import PhraseCache
    from irodori_speaker.outputs import NullOutput
    from irodori_speaker.speaker import Speaker

    cache = PhraseCache(tmp_path_factory.mktemp("hostile") / "phrases")
    s = Speaker(synth, output=NullOutput(speed=float("inf")), options=OPTS, cache=cache, cache_store="all")
    hostile_loop.run_until_complete(s.open())
    yield s
    hostile_loop.run_until_complete(asyncio.wait_for(s.aclose(), 10))
    cache.close()


#: Whole modules in `-m slow` (the README's quick subset, `-m "not slow"`, leaves them out), and why:
#: each starts processes or servers, or runs a kernel interpreter, for most of its tests. Single
#: slow tests elsewhere carry `@pytest.mark.slow` themselves.
SLOW_MODULES: dict[str, str] = {
    "tests/server/": "real uvicorn servers, Ray, schemathesis",
    "tests/test_docs_commands.py": "every documented command, as a subprocess",
    "tests/test_examples.py": "the examples end to end, as subprocesses",
    "tests/test_cli_commands.py": "every command as a subprocess",
    "tests/test_progress.py": "a real terminal (tmux)",
    "tests/test_offline.py": "fresh processes with an empty Hugging Face cache",
    "tests/test_precommit.py": "pre-commit's own start",
    "tests/engine/test_fused_interp.py": "the Triton interpreter",
    "tests/quant/test_triton_interp.py": "the Triton interpreter",
    "tests/speaker/test_unclosed.py": "interpreters that exit with an open Speaker",
    "tests/test_hostile_speaker.py": "hostile inputs through a real Speaker, each then speaking",
    "tests/test_hostile_input.py": "hostile inputs through the CLI and the server",
    "tests/test_hostile_checkpoint.py": "each damaged file, then a good model loaded and speaking",
    "tests/text/test_properties.py": "hypothesis: hundreds of generated texts",
}


#: Single tests in `-m slow`: those over ~5 s in a `-m "not slow" --durations` run on a busy 2-core
#: machine (2026-12-05), mostly a subprocess with torch's import and a model load each, or real-time
#: playback. The quick subset keeps a faster test of the same behaviour where there is one.
SLOW_TESTS = (
    "tests/backends/test_cpu_tricks.py::test_int8_siblings_share_one_quantisation_and_render_the_same",
    "tests/engine/test_codec.py::test_chunked_decode_equals_full",
    "tests/speaker/test_jitter.py::test_a_line_streamed_slower_than_real_time_never_stops_inside",
    "tests/speaker/test_preempt.py::test_a_high_line_pre_empts_a_normal_prefetch_which_is_requeued_in_order",
    "tests/speaker/test_queue.py::test_lookahead_is_bounded_in_lines_and_seconds",
    "tests/test_batching.py::test_a_line_cancelled_in_a_batch_stops_alone",
    "tests/test_batching.py::test_lines_waiting_together_are_sampled_as_one_batch_and_sound_as_alone",
    "tests/test_batching.py::test_only_lines_with_the_same_plan_share_a_batch",
    "tests/test_cache.py::test_one_writer_and_two_reader_processes_never_see_a_torn_entry",
    "tests/test_cache.py::test_speaker_cache_hit_plays_with_zero_synthesizer_calls_and_the_same_events",
    "tests/test_captions.py::test_say_writes_srt_vtt_and_the_caption_file",
    "tests/test_captions.py::test_speaker_word_events_and_the_caption_file_show_the_original",
    "tests/test_cli.py::",
    "tests/test_controls.py::test_loudness_target_makes_lines_equally_loud",
    "tests/test_controls.py::test_speaker_takes_options_by_name_for_every_line",
    "tests/test_controls.py::test_stream_equals_whole_with_controls",
    "tests/test_controls.py::test_volume_is_a_gain_in_db",
    "tests/test_prebuild.py::test_cli_prebuild_",
    "tests/test_roofline.py::",
    "tests/test_v4_product.py::test_quantize_calibrates_a_v4_model_with_its_tokenizer_folder",
    "tests/test_v4_product.py::test_say_speaks_a_cached_mf_release_offline",
    "tests/text/test_pauses.py::test_say_stream_with_markup_over_two_chunks_gives_exact_silence",
)


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    # the slow marks before `-m` deselects by them; the xdist groups after xdist's own hook
    root = Path(str(config.rootpath))
    for item in items:
        where = Path(str(item.fspath)).relative_to(root).as_posix()
        node = where + "::" + item.name.partition("[")[0]
        module = any(where == m or (m.endswith("/") and where.startswith(m)) for m in SLOW_MODULES)
        if module or node.startswith(SLOW_TESTS):
            item.add_marker(pytest.mark.slow)
    result = yield
    keep_xdist_groups(config, items)
    return result


def keep_xdist_groups(config, items) -> None:
    """`--dist loadgroup` on pytest 9.2: pytest-xdist 3.8 tells the scheduler a test's group by
    rewriting `item._nodeid` to end in `@group`, which pytest 9.2 no longer reads (its node ids are
    structured, `item._id`; pytest-xdist#1386). Every group was handed out test by test: the docs
    commands, which must run in order in one directory, ran on both workers, and a module-scoped
    server started on each. The suffix goes where pytest reads it, as xdist meant; nothing to do
    where xdist's rewrite took (an older pytest, a fixed xdist)."""
    if not getattr(config.option, "loadgroup", False):  # set on xdist's workers under loadgroup
        return
    try:
        from _pytest.nodeid import NodeId
    except ImportError:  # pytest < 9.2: xdist's rewrite works
        return
    for item in items:
        marks = item.iter_markers("xdist_group")
        names = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in marks}
        suffix = "@" + "_".join(sorted(names))
        if names and not item.nodeid.endswith(suffix):
            item._id = NodeId.parse(item.nodeid + suffix)
