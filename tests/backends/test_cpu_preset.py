"""The CPU preset's tricks per CPU: flags read from (fake) /proc/cpuinfo text, the picks, overrides."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from irodori_speaker.engine.hardware import cpu_features as cf
from irodori_speaker.engine.hardware import presets
from irodori_speaker.engine.hardware.cpu_features import CpuFeatures, parse_cpuinfo
from irodori_speaker.engine.hardware.presets import (
    AUDIO_FLAGS,
    cpu_preset_fields,
    resolve_threads,
    select_preset,
)
from irodori_speaker.errors import BackendError


def _cpuinfo(flags: str, model: str = "Test CPU") -> str:
    """Two processors of /proc/cpuinfo as Linux prints them (the parser reads the first)."""
    block = (
        "processor\t: {n}\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n"
        f"model name\t: {model}\nflags\t\t: {flags}\nbugs\t\t: spectre_v1\n\n"
    )
    return block.format(n=0) + block.format(n=1).replace(flags, "fpu")


SAPPHIRE_RAPIDS = _cpuinfo(
    "fpu sse2 avx avx2 avx512f avx512bw avx512_vnni avx512_bf16 avx_vnni amx_bf16 amx_tile amx_int8",
    "Intel(R) Xeon(R) Platinum 8480+",
)
ZEN4 = _cpuinfo("fpu sse2 avx avx2 avx512f avx512bw avx512_vnni avx512_bf16", "AMD EPYC 9654")
ALDER_LAKE = _cpuinfo("fpu sse2 avx avx2 avx_vnni", "12th Gen Intel(R) Core(TM) i7-12700K")
CASCADE_LAKE = _cpuinfo("fpu sse2 avx avx2 avx512f avx512bw avx512_vnni", "Intel(R) Xeon(R) Gold 6248")
HASWELL = _cpuinfo("fpu sse2 avx avx2 fma", "Intel(R) Core(TM) i7-4770")
ARM = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd bf16 i8mm sve\nCPU implementer\t: 0x41\n"


@pytest.mark.parametrize(
    ("text", "bf16", "int8", "amx"),
    [
        (SAPPHIRE_RAPIDS, True, True, True),
        (ZEN4, True, True, False),
        (ALDER_LAKE, False, True, False),
        (CASCADE_LAKE, False, True, False),
        (HASWELL, False, False, False),
        (ARM, False, False, False),  # Arm's bf16 / i8mm are not the x86 flags the preset measured
        ("", False, False, False),
    ],
)
def test_flags_from_cpuinfo_text(text, bf16, int8, amx):
    f = parse_cpuinfo(text)
    assert (f.bf16_matmul, f.int8_matmul, f.amx) == (bf16, int8, amx)


def test_the_first_processor_and_its_model_are_read():
    f = parse_cpuinfo(SAPPHIRE_RAPIDS)
    assert f.model == "Intel(R) Xeon(R) Platinum 8480+" and f.source == "/proc/cpuinfo"
    assert {"amx_bf16", "amx_int8", "avx512_bf16"} <= f.flags
    assert "amx_bf16" in f.summary() and "8480+" in f.summary()
    assert "bf16" in parse_cpuinfo(ARM).flags  # Arm's `Features` line is read too


@pytest.mark.parametrize(
    ("text", "dtype", "int8"),
    [
        (SAPPHIRE_RAPIDS, torch.bfloat16, True),
        (ZEN4, torch.bfloat16, True),
        (ALDER_LAKE, torch.float32, True),
        (CASCADE_LAKE, torch.float32, True),
        (HASWELL, torch.float32, False),
        (ARM, torch.float32, False),
    ],
)
def test_the_preset_picks_each_trick_only_with_its_instructions(text, dtype, int8):
    picks = cpu_preset_fields(parse_cpuinfo(text))
    bf16 = dtype == torch.bfloat16
    assert picks == {
        "dtype": dtype,
        "codec_dtype": dtype,
        "int8_linears": int8,
        "codec_channels_last": True,  # every CPU: the stateful stream needs it (fp32 too)
        "stream_chunk_frames": 50 if bf16 else 25,
        "stream_chunk_growth": 3.0 if bf16 else None,
    }


@pytest.mark.parametrize(("usable", "threads"), [(1, 1), (2, 1), (3, 1), (8, 4), (16, 8)])
def test_the_default_threads_leave_half_the_usable_cpus_free(usable, threads, monkeypatch):
    # a streaming PC is shared: torch's thread per core collapsed under OBS / a game / an LLM
    monkeypatch.delenv(cf.THREADS_ENV, raising=False)
    n, why = cf.choose_threads(None, usable=usable)
    assert n == threads and f"{usable} CPUs" in why


def test_threads_asked_for_win_over_the_environment_which_wins_over_the_default(monkeypatch):
    monkeypatch.setenv(cf.THREADS_ENV, "3")
    assert cf.choose_threads(None, usable=16) == (3, "$IRODORI_THREADS")
    assert cf.choose_threads(2, usable=16) == (2, "asked for")
    preset, why = resolve_threads(select_preset("cpu"))
    assert preset.threads == 3 and why == "$IRODORI_THREADS"


@pytest.mark.parametrize("bad", ["0", "two", "-1"])
def test_a_bad_thread_count_is_one_line_before_any_model(bad, monkeypatch):
    monkeypatch.setenv(cf.THREADS_ENV, bad)
    with pytest.raises(BackendError, match="IRODORI_THREADS"):
        select_preset("cpu")
    monkeypatch.delenv(cf.THREADS_ENV)
    with pytest.raises(BackendError, match="whole number"):
        select_preset("cpu", threads=0)


def _cgroup(tmp_path, files: dict[str, str], own: str = "") -> tuple:
    root = tmp_path / "cgroup"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    proc = tmp_path / "proc_cgroup"
    proc.write_text(f"0::/{own}\n")
    return root, proc


def test_cgroup_quota_v2_v1_and_unlimited(tmp_path):
    root, proc = _cgroup(
        tmp_path / "a", {"job/cpu.max": "1600000 100000\n", "cpu.max": "max 100000\n"}, "job"
    )
    assert cf.cgroup_cpu_limit(root, proc) == 16.0
    assert cf.usable_cpus(root, proc) <= 16
    root, proc = _cgroup(tmp_path / "b", {"cpu.max": "150000 100000\n"})
    assert cf.cgroup_cpu_limit(root, proc) == 1.5 and cf.usable_cpus(root, proc) == 1
    root, proc = _cgroup(
        tmp_path / "c", {"cpu/cpu.cfs_quota_us": "800000", "cpu/cpu.cfs_period_us": "100000"}
    )
    assert cf.cgroup_cpu_limit(root, proc) == 8.0
    root, proc = _cgroup(tmp_path / "d", {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"})
    assert cf.cgroup_cpu_limit(root, proc) is None
    assert cf.cgroup_cpu_limit(tmp_path / "none", tmp_path / "none") is None


def _picks(p) -> tuple:
    return (p.dtype, p.codec_dtype, p.int8_linears, p.codec_channels_last)


def test_select_preset_reads_this_cpus_flags_and_every_field_overrides(monkeypatch):
    monkeypatch.setattr(presets, "cpu_features", lambda: parse_cpuinfo(SAPPHIRE_RAPIDS))
    cpu = select_preset("cpu")
    assert _picks(cpu) == (torch.bfloat16, torch.bfloat16, True, True)
    assert (cpu.steps, cpu.decode_chunk_frames) == (8, 25)  # the rest as before
    off = select_preset(
        "cpu", dtype=torch.float32, codec_dtype=torch.float32, int8_linears=False, codec_channels_last=False
    )
    assert _picks(off) == (torch.float32, torch.float32, False, False)
    monkeypatch.setattr(presets, "cpu_features", lambda: parse_cpuinfo(HASWELL))
    plain = select_preset("cpu")
    assert (plain.dtype, plain.int8_linears, plain.codec_channels_last) == (torch.float32, False, True)
    assert select_preset("cpu", int8_linears=True).int8_linears  # asked for: given, the flags aside


def test_the_test_suite_sees_a_cpu_without_the_flags():
    # conftest sets IRODORI_CPU_FLAGS=none: every test's CPU preset is the fp32 one, on any machine
    assert cf.cpu_features().flags == frozenset()
    cpu = select_preset("cpu")
    assert _picks(cpu) == (torch.float32, torch.float32, False, True)


def test_env_names_the_flags_or_none(monkeypatch, tmp_path):
    monkeypatch.setenv(cf.FLAGS_ENV, "avx512_bf16, AVX512_VNNI")
    f = cf.detect(tmp_path / "missing")
    assert f.flags == {"avx512_bf16", "avx512_vnni"} and f.source == cf.FLAGS_ENV
    monkeypatch.setenv(cf.FLAGS_ENV, "none")
    assert cf.detect().flags == frozenset()


def test_detect_reads_the_file_else_asks_torch(monkeypatch, tmp_path):
    monkeypatch.delenv(cf.FLAGS_ENV)
    info = tmp_path / "cpuinfo"
    info.write_text(ZEN4)
    assert cf.detect(info).flags == parse_cpuinfo(ZEN4).flags
    asked = []
    monkeypatch.setattr(
        cf, "_from_torch", lambda: asked.append(1) or CpuFeatures(frozenset({"avx2"}), "", "torch")
    )
    assert cf.detect(tmp_path / "missing").source == "torch"  # Windows, macOS: no /proc/cpuinfo
    info.write_text("processor\t: 0\n")
    assert cf.detect(info).source == "torch"  # a cpuinfo without flags (some containers)
    assert len(asked) == 2


def test_torch_fallback_maps_amx_tiles_to_both_units(monkeypatch):
    import torch.cpu

    for name, value in {
        "_is_avx2_supported": True,
        "_is_avx512_supported": True,
        "_is_avx512_bf16_supported": True,
        "_is_vnni_supported": True,
        "_is_amx_tile_supported": True,
    }.items():
        monkeypatch.setattr(torch.cpu, name, lambda v=value: v, raising=False)
    f = cf._from_torch()
    assert f.amx and f.bf16_matmul and f.int8_matmul and f.source == "torch"


def test_cpu_features_imports_without_torch():
    code = (
        "import sys\n"
        "from irodori_speaker.engine.hardware.cpu_features import cpu_features, parse_cpuinfo\n"
        "parse_cpuinfo('flags : avx2'); cpu_features()\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_int8_linears_are_refused_off_the_cpu(monkeypatch):
    monkeypatch.setattr(presets, "cuda_available", lambda: True)
    monkeypatch.setattr(presets, "_check_device", lambda field, device: None)
    with pytest.raises(BackendError, match="CPU only") as e:
        select_preset("cuda", int8_linears=True)
    assert "int4" in e.value.hint
    assert select_preset("cuda", codec_channels_last=True).codec_channels_last  # any device


def test_audio_flags_name_every_switch_that_changes_the_sound():
    cpu = select_preset("cpu")
    assert cpu.audio_flags() == ["codec_channels_last"]  # the channels-last decoder's rounding
    assert select_preset("cpu", codec_channels_last=False).audio_flags() == []
    on = cpu.with_overrides(int8_linears=True, codec_int4=True)
    assert on.audio_flags() == ["codec_int4", "int8_linears", "codec_channels_last"]
    assert set(AUDIO_FLAGS) == {"int4", "fp8", "codec_int4", "int8_linears", "codec_channels_last"}


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"stream_chunk_growth": 0.5}, "growth"),
        ({"stream_chunk_growth": "fast"}, "growth"),
        ({"stream_chunk_frames": 0}, "chunk_frames"),
        ({"stream_first_chunk_frames": -1}, "first_chunk_frames"),
    ],
)
def test_stream_window_fields_are_checked_when_the_preset_is_made(overrides, match):
    from irodori_speaker.errors import InputError

    with pytest.raises(InputError, match=match):
        select_preset("cpu", **overrides)
    assert select_preset("cpu", stream_chunk_growth=2.0).stream_chunk_growth == 2.0
