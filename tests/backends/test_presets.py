"""Backend selection, presets and overrides (availability simulated: this machine has no GPU)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from irodori_speaker.engine.hardware import presets
from irodori_speaker.engine.hardware.presets import MPS_FALLBACK_ENV, select_preset
from irodori_speaker.errors import BackendError


@pytest.fixture
def devices(monkeypatch):
    state = {"cuda": False, "mps": False}
    monkeypatch.setattr(presets, "cuda_available", lambda: state["cuda"])
    monkeypatch.setattr(presets, "mps_available", lambda: state["mps"])
    return state


def test_auto_prefers_cuda_then_mps_then_cpu(devices, monkeypatch):
    monkeypatch.setenv(MPS_FALLBACK_ENV, "1")
    assert select_preset("auto").name == "cpu"
    devices["mps"] = True
    assert select_preset("auto").name == "mps"
    devices["cuda"] = True
    assert select_preset("auto").name == "cuda"


def test_presets_carry_the_tuned_defaults(devices, monkeypatch):
    monkeypatch.setenv(MPS_FALLBACK_ENV, "1")
    devices.update(cuda=True, mps=True)
    cuda, mps, cpu = select_preset("cuda"), select_preset("mps"), select_preset("cpu")
    assert (cuda.dtype, cuda.codec_dtype, cuda.cuda_graphs, cuda.fast_path) == (
        torch.bfloat16,
        torch.float16,
        True,
        True,
    )
    assert (mps.dtype, mps.codec_dtype, mps.steps, mps.schedule) == (torch.float32, torch.float32, 8, "sway")
    assert (cpu.dtype, cpu.steps, cpu.schedule, cpu.cuda_graphs) == (torch.float32, 8, "sway", False)
    assert all(p.sway_coeff == -1.0 for p in (cuda, mps, cpu))


def test_overrides_by_field_name(devices):
    p = select_preset("cpu", steps=6, threads=1, decode_chunk_frames=25)
    assert (p.steps, p.threads, p.decode_chunk_frames) == (6, 1, 25)
    with pytest.raises(BackendError, match="unknown preset field"):
        select_preset("cpu", stepz=6)


def test_unavailable_or_unknown_backends_are_clear_errors(devices):
    with pytest.raises(BackendError, match="no CUDA device"):
        select_preset("cuda")
    with pytest.raises(BackendError, match="no Apple GPU"):
        select_preset("mps")
    with pytest.raises(BackendError, match="unknown backend"):
        select_preset("tpu")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mps_refuses_half_precision_with_the_reason(devices, monkeypatch, dtype):
    monkeypatch.setenv(MPS_FALLBACK_ENV, "1")
    devices["mps"] = True
    with pytest.raises(BackendError, match="fp32 only") as e:
        select_preset("mps", dtype=dtype)
    assert "19% slower" in e.value.hint


def test_mps_sets_the_cpu_fallback_unless_the_user_chose(devices, monkeypatch):
    devices["mps"] = True
    monkeypatch.delenv(MPS_FALLBACK_ENV, raising=False)
    select_preset("mps")
    assert os.environ[MPS_FALLBACK_ENV] == "1"
    monkeypatch.setenv(MPS_FALLBACK_ENV, "0")
    with pytest.warns(UserWarning, match="will raise"):
        select_preset("mps")
    assert os.environ[MPS_FALLBACK_ENV] == "0"  # the user's value stands


def test_package_import_sets_the_fallback_before_torch_on_macos():
    """Simulated macOS: importing irodori_speaker sets the variable and does not load torch."""
    code = (
        "import os, sys; sys.platform = 'darwin'; os.environ.pop('PYTORCH_ENABLE_MPS_FALLBACK', None)\n"
        "import irodori_speaker\n"
        "print(os.environ.get('PYTORCH_ENABLE_MPS_FALLBACK'), 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["1", "False"], out.stderr


def test_int4_preset_quantises_a_float_file_at_load_with_a_warning(dit_fixtures):
    from irodori_speaker.engine.quant.layers import Int4Linear
    from irodori_speaker.synthesis.loading import load_dit

    preset = select_preset("cpu", int4=True)
    with pytest.warns(UserWarning, match="RTN at load"):
        loaded = load_dit(dit_fixtures / "tiny_v2_base.safetensors", preset)
    assert loaded.quantized and isinstance(loaded.model.blocks[0].attention.wq, Int4Linear)


def test_a_device_that_is_not_a_torch_device_is_a_backend_error():
    with pytest.raises(BackendError, match="device 'gpu' is not a torch device"):
        select_preset("cpu", device="gpu")
    with pytest.raises(BackendError, match="codec_device 'npu0'"):
        select_preset("cpu", codec_device="npu0")
    assert select_preset("cpu", codec_device="cpu").codec_device == "cpu"


def test_a_device_this_machine_lacks_names_what_it_has(devices, monkeypatch):
    # the Python API gets the same checks as --device (select_preset makes them)
    with pytest.raises(BackendError, match=r"'cuda' asked for.*no CUDA device \(available here: cpu\)") as e:
        select_preset("cpu", device="cuda")
    assert e.value.hint
    with pytest.raises(BackendError, match="no CUDA device"):
        select_preset("cpu", device="cuda:3")
    with pytest.raises(BackendError, match=r"no Apple GPU \(MPS\) here \(available: cpu\)"):
        select_preset("cpu", device="mps")
    with pytest.raises(BackendError, match="runs on cpu, cuda or mps"):
        select_preset("cpu", device="xpu")
    devices.update(cuda=True, mps=True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert presets.available_devices() == ["cpu", "cuda:0", "cuda:1", "mps"]
    with pytest.raises(BackendError, match=r"'cuda:3' does not exist: torch sees 2 CUDA") as e:
        select_preset("cpu", device="cuda:3")
    assert e.value.hint == "use cuda:0 to cuda:1"
    assert select_preset("cpu", device="cuda:1").device == "cuda:1"
