"""The GPU memory budget as users give it (issue 27): its values, refused in one line before any
model loads; the keyword, the flag and the environment variable; on the CPU accepted and reported
as not applicable. Its effect on CUDA: tests/engine/test_memory_budget_cuda.py."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from irodori_speaker.errors import InputError, IrodoriError
from irodori_speaker.options.memory import (
    BUDGET_ENV,
    BudgetValueError,
    MemoryBudget,
    budget_from,
    format_bytes,
    parse_memory_budget,
)
from irodori_speaker.synthesis.load_options import LoadOptions
from test_cli import run_cli

GIB, MIB = 2**30, 2**20


@pytest.mark.parametrize(
    ("value", "budget"),
    [
        ("3GiB", MemoryBudget(bytes=3 * GIB, text="3GiB")),
        ("3 GiB", MemoryBudget(bytes=3 * GIB, text="3 GiB")),
        ("3000MB", MemoryBudget(bytes=3_000_000_000, text="3000MB")),
        ("512MiB", MemoryBudget(bytes=512 * MIB, text="512MiB")),
        ("512mib", MemoryBudget(bytes=512 * MIB, text="512mib")),
        ("1.5GiB", MemoryBudget(bytes=int(1.5 * GIB), text="1.5GiB")),
        ("3g", MemoryBudget(bytes=3 * GIB, text="3g")),
        ("0.25", MemoryBudget(fraction=0.25, text="0.25")),
        ("1", MemoryBudget(fraction=1.0, text="1")),
        ("25%", MemoryBudget(fraction=0.25, text="25%")),
        (0.5, MemoryBudget(fraction=0.5, text="0.5")),
        (4 * GIB, MemoryBudget(bytes=4 * GIB, text=str(4 * GIB))),
    ],
)
def test_good_values_parse(value, budget):
    assert parse_memory_budget(value) == budget


@pytest.mark.parametrize(
    ("value", "says", "hint"),
    [
        ("3 GB?", "is not a size", "3GiB"),
        ("-1", "more than 0", "leave it out"),
        ("0", "more than 0", "leave it out"),
        ("0GiB", "more than 0 bytes", "leave it out"),
        (0, "more than 0 bytes", "leave it out"),
        ("1.5", "fraction of the card, in (0, 1]", "1.5GiB"),
        (1.5, "fraction of the card, in (0, 1]", "1.5GiB"),
        ("150%", "at most 100 %", "25%"),
        ("-5%", "more than 0", "leave it out"),
        ("3 parsecs", "unknown unit", "GiB"),
        ("lots", "is not a size", "0.25"),
        (True, "is not a size", "3GiB"),
        (float("nan"), "more than 0", "leave it out"),
    ],
)
def test_bad_values_are_one_line_errors_with_a_hint(value, says, hint):
    with pytest.raises(BudgetValueError) as e:
        parse_memory_budget(value, where="--max-gpu-memory")
    err = e.value
    assert isinstance(err, InputError) and isinstance(err, IrodoriError)
    assert says in str(err) and "--max-gpu-memory" in str(err) and hint in (err.hint or "")
    assert "\n" not in str(err)


def test_none_and_empty_mean_no_budget():
    assert parse_memory_budget(None) is None and parse_memory_budget("  ") is None


def test_a_fraction_resolves_against_the_card_and_a_size_never_past_it():
    assert MemoryBudget(fraction=0.25).resolve(80 * GIB) == 20 * GIB
    assert MemoryBudget(bytes=3 * GIB).resolve(80 * GIB) == 3 * GIB
    assert MemoryBudget(bytes=300 * GIB).resolve(80 * GIB) == 80 * GIB
    assert MemoryBudget(fraction=0.25).describe(80 * GIB) == "25 % of the card (20 GiB)"
    assert format_bytes(3 * GIB) == "3 GiB" and format_bytes(512 * MIB) == "512 MiB"


def test_the_environment_variable_is_read_below_the_keyword():
    assert budget_from(None, env={}) == (None, "")
    budget, source = budget_from(None, env={BUDGET_ENV: "2GiB"})
    assert budget == MemoryBudget(bytes=2 * GIB, text="2GiB") and source == f"${BUDGET_ENV}"
    budget, source = budget_from("1GiB", env={BUDGET_ENV: "2GiB"})
    assert budget is not None and budget.bytes == GIB and source == "max_gpu_memory"
    with pytest.raises(BudgetValueError, match=rf"\${BUDGET_ENV} '3 GB\?'"):
        budget_from(None, env={BUDGET_ENV: "3 GB?"})


def test_load_options_check_the_budget_when_built():
    assert LoadOptions(max_gpu_memory="3GiB").max_gpu_memory == "3GiB"
    assert LoadOptions(max_gpu_memory=0.25).given() == {"max_gpu_memory": 0.25}
    with pytest.raises(BudgetValueError, match=r"max_gpu_memory '1\.5'"):
        LoadOptions(max_gpu_memory="1.5")
    with pytest.raises(BudgetValueError):
        LoadOptions().replace(max_gpu_memory="-1")


def test_speaker_takes_the_keyword_and_refuses_a_bad_one_before_loading():
    from irodori_speaker import Speaker

    with pytest.raises(BudgetValueError, match="3 GB"):
        Speaker(tiny_random=True, max_gpu_memory="3 GB?")
    speaker = Speaker(tiny_random=True, backend="cpu", max_gpu_memory="2GiB")  # nothing loads yet
    assert speaker is not None


def test_a_speaker_on_the_cpu_runs_with_a_budget_and_warns_it_is_not_applicable(caplog):
    from irodori_speaker import Speaker

    async def go():
        async with Speaker(
            tiny_random=True, backend="cpu", output="null", max_gpu_memory="2GiB", prewarm=False
        ) as s:
            await s.say("こんにちは。", seconds=0.5)
            return s.synthesizer.preset.max_gpu_memory

    caplog.set_level(logging.WARNING, logger="irodori_speaker")
    assert asyncio.run(go()) is None  # nothing capped on the CPU
    notes = [r.getMessage() for r in caplog.records if "GPU memory budget" in r.getMessage()]
    assert notes and "not applicable on cpu" in notes[0] and "2 GiB" in notes[0]


def test_say_with_a_budget_runs_on_the_cpu_and_reports_it_not_applicable(tmp_path):
    out = tmp_path / "hi.wav"
    r = run_cli(
        "say", "こんにちは", "--tiny-random", "--backend", "cpu", "--max-gpu-memory", "2GiB", "-o", str(out)
    )
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 0
    assert "GPU memory budget 2 GiB" in r.stderr and "not applicable on cpu" in r.stderr


@pytest.mark.parametrize("value", ["3 GB?", "1.5", "0", "-1"])
def test_say_refuses_a_bad_budget_in_one_line_before_loading(tmp_path, value):
    r = run_cli(
        "say", "こんにちは", "--tiny-random", f"--max-gpu-memory={value}", "-o", str(tmp_path / "x.wav")
    )
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("error: --max-gpu-memory") and lines[1].startswith("hint:")
    assert "Traceback" not in r.stderr and "tiny-random model" not in r.stderr  # before any load
    assert not (tmp_path / "x.wav").exists()


def test_a_bad_environment_budget_is_refused_by_serve_before_loading(tmp_path):
    r = run_cli("serve", "--tiny-random", "--port", "1", env={BUDGET_ENV: "lots"})
    assert r.returncode == 1
    assert f"${BUDGET_ENV} 'lots'" in r.stderr and "Traceback" not in r.stderr


def test_devices_prints_the_budget_and_the_batch_it_would_allow():
    r = run_cli("devices", "--max-gpu-memory", "2GiB", "--tiny-random")
    assert "GPU memory budget: 2 GiB (--max-gpu-memory)" in r.stdout, r.stderr
    import torch

    if torch.cuda.is_available():
        assert "allows max batch" in r.stdout
    else:
        assert "not applicable here" in r.stdout
        assert "would allow max batch 64 for the tiny-random model" in r.stdout
    small = run_cli("devices", "--max-gpu-memory", "100MiB", "--tiny-random")
    assert "max batch 1 " in small.stdout, small.stdout  # the whole-line decode alone fills 100 MiB
    env = run_cli("devices", env={BUDGET_ENV: "0.25"})
    assert f"GPU memory budget: 25 % of the card (${BUDGET_ENV})" in env.stdout
    plain = run_cli("devices")
    assert "GPU memory" not in plain.stdout  # no budget: the list as before
    as_json = run_cli("devices", "--json", "--max-gpu-memory", "2GiB")
    assert "GPU memory budget: 2 GiB" in as_json.stderr and isinstance(json.loads(as_json.stdout), list)
