"""The command line as written: flags that never swallow a positional, stdin, --version, -q / -v,
and every mistake a one-line error with a hint, found before the model loads.

Error cases run in process through `cli.run` (the exception type) and `cli.main` (what the user
reads: `error: ...` then `hint: ...`, exit status 1), with the model loader replaced by one that
fails the test: so each check provably happens before any model work. A few run as a subprocess,
as a user runs them, to show no traceback reaches the terminal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from irodori_speaker import __version__, cli
from irodori_speaker.cli.common import FLAG_OPTIONS, TINY_KINDS, option_flag
from irodori_speaker.errors import AudioError, BackendError, InputError
from irodori_speaker.options import SynthesisOptions, option_specs

TINY = ["--tiny-random", "--backend", "cpu", "--steps", "2", "--seconds", "0.5"]


def say(out, *extra) -> list:
    """`say はい -o OUT --tiny-random EXTRA...`"""
    return ["say", "はい", "-o", out, "--tiny-random", *extra]


def run(args, home: Path, *, stdin: str | None = None, timeout: float = 240):
    env = dict(os.environ, IRODORI_CACHE=str(home), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "irodori_speaker.cli", *map(str, args)],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=home,
    )


def fails(argv, exc: type[Exception], match: str, capsys) -> tuple[str, str]:
    """`argv` raises `exc` (message matching `match`, with a hint) and prints two lines, exit 1.

    Returns (the error line, the hint line)."""
    argv = [str(a) for a in argv]
    with pytest.raises(exc, match=match) as e:
        cli.run(argv)
    assert e.value.hint, "every error carries a hint"
    capsys.readouterr()
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("error: ") and err[1].startswith("hint: "), err
    return err[0], err[1]


# ---- commands run as written ---------------------------------------------------------------------


def test_the_readme_run_line_works(irodori_home, tmp_path):
    # `--tiny-random [KIND]` used to swallow the text: now it is a flag
    r = run(["say", "--tiny-random", "こんにちは", "-o", tmp_path / "hello.wav"], irodori_home)
    assert r.returncode == 0, r.stderr
    assert sf.info(str(tmp_path / "hello.wav")).samplerate == 48_000
    assert "noise" in r.stderr


def test_flags_before_positionals_do_not_swallow_them(irodori_home, tmp_path, capsys):
    assert (
        cli.main(["say", "--cache", "--tiny-random", "こんにちは", "-o", str(tmp_path / "a.wav"), *TINY]) == 0
    )
    assert "seed 0" in capsys.readouterr().out  # through the cache: a fixed seed
    phrases = tmp_path / "p.txt"
    phrases.write_text("はい。\n", encoding="utf-8")
    argv = ["prebuild", "--tiny-random", str(phrases), "--cache-dir", str(tmp_path / "c"), *TINY]
    assert cli.main(argv) == 0
    assert "1 rendered" in capsys.readouterr().out


def test_tiny_kind_picks_the_model_and_implies_tiny_random(irodori_home, tmp_path, capsys):
    assert cli.main(["say", "はい", "-o", str(tmp_path / "a.wav"), "--tiny-kind", "v3", "-v"]) == 0
    assert "model load:" in (err := capsys.readouterr().err) and "(tiny-random v3 on cpu" in err


def test_tiny_kinds_listed_by_the_cli_are_the_engines():
    from irodori_speaker.engine.tiny import TINY_CONFIGS

    assert tuple(TINY_CONFIGS) == TINY_KINDS


def test_say_dash_reads_standard_input(irodori_home, tmp_path):
    r = run(["say", "-", "-o", tmp_path / "a.flac", *TINY], irodori_home, stdin="標準入力から読みます。\n")
    assert r.returncode == 0, r.stderr
    assert sf.info(str(tmp_path / "a.flac")).format == "FLAC"
    r = run(["say", "-", "-o", tmp_path / "b.wav", *TINY], irodori_home, stdin="  \n")
    assert r.returncode == 1 and "no text on standard input" in r.stderr and "hint: " in r.stderr


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"irodori-speaker {__version__}"


def test_quiet_and_verbose_set_the_log_level(irodori_home, tmp_path, capsys):
    out = str(tmp_path / "a.wav")
    assert cli.main(["say", "はい", "-o", out, *TINY]) == 0
    err = capsys.readouterr().err
    assert "warning: tiny-random model" in err and "info:" not in err
    assert cli.main(["say", "はい", "-o", out, *TINY, "-q"]) == 0
    assert capsys.readouterr().err == ""
    assert cli.main(["-v", "say", "はい", "-o", out, *TINY]) == 0
    err = capsys.readouterr().err
    assert "info: model load:" in err and "(tiny-random v2 on cpu" in err and "[irodori_speaker.cli]" in err


def test_caption_needs_a_model_with_a_caption_branch(irodori_home, tmp_path, capsys):
    argv = ["say", "はい", "-o", tmp_path / "a.wav", *TINY, "--caption", "明るい声"]
    line, hint = fails(argv, InputError, "no caption branch", capsys)
    assert "--caption needs a VoiceDesign or v4 model" in line and "--tiny-kind v2-voicedesign" in hint
    argv = ["say", "はい", "-o", str(tmp_path / "b.wav"), *TINY, "--tiny-kind", "v2-voicedesign"]
    assert cli.main([*argv, "--caption", "明るい声"]) == 0


# ---- mistakes: a clear error before the model loads ----------------------------------------------


def skip_if(cond: bool, reason: str):
    return pytest.mark.skipif(cond, reason=f"the machine {reason}: the error case cannot happen")


@pytest.mark.parametrize(
    "device, match",
    [
        ("gpu", "'gpu' is not a torch device"),
        pytest.param("cuda", "no CUDA device", marks=skip_if(torch.cuda.is_available(), "has CUDA")),
        pytest.param("cuda:3", "CUDA", marks=skip_if(torch.cuda.device_count() > 3, "has 4 GPUs")),
        pytest.param("mps", "no Apple GPU", marks=skip_if(sys.platform == "darwin", "macOS may have MPS")),
    ],
)
def test_a_device_that_is_not_here_names_what_is(device, match, tmp_path, capsys, monkeypatch):
    # the real loader: select_preset runs before any file is read or built
    monkeypatch.setattr(
        "irodori_speaker.synthesis.identity.tiny_random_files", lambda **k: pytest.fail("built")
    )
    line, _ = fails(say(tmp_path / "a.wav", "--device", device), BackendError, match, capsys)
    assert "available here: cpu" in line or "available: cpu" in line


@pytest.mark.parametrize(
    "name, match",
    [
        ("out.xyz", "unknown file extension '.xyz'"),
        ("out", "no file extension"),
        ("out.WAVE", "unknown file extension"),
    ],
)
def test_an_output_we_cannot_write_fails_first(name, match, tmp_path, capsys, no_model):
    _, hint = fails(say(tmp_path / name), AudioError, match, capsys)
    assert ".wav, .flac, .ogg, .opus, .mp3" in hint


def test_an_unwritable_path_fails_first(tmp_path, capsys, no_model):
    fails(
        ["say", "はい", "-o", "/proc/x.wav", "--tiny-random"], AudioError, "cannot write /proc/x.wav", capsys
    )
    (tmp_path / "d.wav").mkdir()
    fails(say(tmp_path / "d.wav"), AudioError, "is a directory", capsys)


@pytest.mark.parametrize(
    "ext, fmt, subtype",
    [
        (".wav", "WAV", "PCM_16"),
        (".flac", "FLAC", "PCM_16"),
        (".ogg", "OGG", "VORBIS"),
        (".opus", "OGG", "OPUS"),
        (".mp3", "MP3", "MPEG_LAYER_III"),
    ],
)
def test_the_extension_picks_the_format(ext, fmt, subtype, irodori_home, tmp_path):
    out = tmp_path / f"a{ext}"
    assert cli.main(["say", "はい", "-o", str(out), *TINY, "-q"]) == 0
    info = sf.info(str(out))
    assert (info.format, info.subtype, info.samplerate, info.channels) == (fmt, subtype, 48_000, 1)
    audio, _ = sf.read(str(out))
    assert abs(len(audio) - 24_000) < 2_000 and np.abs(audio).max() > 0  # lossy codecs pad a little


def test_a_seed_out_of_range_names_the_range(tmp_path, capsys, no_model):
    """--seed is checked by the seed option's own Check (the range the synthesizer takes)."""
    line, hint = fails(say(tmp_path / "a.wav", "--seed", "99999999999999999999"), InputError, "seed", capsys)
    assert "option seed must be an integer in [0, 2**63)" in line and "or None" not in line
    assert hint.startswith("hint: --seed: ")
    fails(
        ["say", "はい", "-o", tmp_path / "a.wav", "--tiny-random", "--seed", "-1"],
        InputError,
        r"\[0, 2\*\*63\)",
        capsys,
    )


NUMERIC_FLAGS = [
    name
    for name in FLAG_OPTIONS
    if option_specs(SynthesisOptions)[name].check.kind in (int, float)
    and option_specs(SynthesisOptions)[name].check.hi is not None
]


@pytest.mark.parametrize("name", NUMERIC_FLAGS)
def test_every_option_flag_checks_its_option_range(name, tmp_path, capsys, no_model):
    """Each option flag is made from its option's spec: a value past the option's upper bound is
    the option's own one-line error (with the flag in the hint), before anything else runs."""
    check = option_specs(SynthesisOptions)[name].check
    too_big = int(check.hi) + 1 if check.kind is int else check.hi + 1  # type: ignore[operator]
    flag = option_flag(name)
    line, hint = fails(
        say(tmp_path / "a.wav", flag, str(too_big)), InputError, f"option {name} must be", capsys
    )
    assert check.allowed(nullable=False) in line and hint.startswith(f"hint: {flag}: ")


def test_option_flag_help_shows_each_range_and_default(capsys):
    """`say --help` shows, for each option flag, its doc's start, allowed values and default."""
    with pytest.raises(SystemExit):
        cli.run(["say", "--help"])
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps the lines
    for name in FLAG_OPTIONS:
        spec = option_specs(SynthesisOptions)[name]
        assert option_flag(name) in shown
        if spec.check.kind is not bool:
            assert spec.check.allowed(nullable=False) in shown, name
        if spec.default is not None and spec.check.kind is not bool:
            default = f"{spec.default:g}" if isinstance(spec.default, float) else spec.default
            assert f"default {default})" in shown, name


def test_a_missing_or_unreadable_voice_fails_first(tmp_path, capsys, no_model):
    fails(say(tmp_path / "a.wav", "--voice", tmp_path / "none.wav"), AudioError, "does not exist", capsys)
    text = tmp_path / "notes.wav"
    text.write_text("not audio", encoding="utf-8")
    fails(say(tmp_path / "a.wav", "--voice", text), AudioError, "not a sound file", capsys)


def test_a_missing_output_device_fails_first(tmp_path, capsys, no_model):
    argv = ["say", "はい", "--play", "--output-device", "No Such Card 9000", "--tiny-random"]
    fails(argv, AudioError, "No Such Card 9000|sound output is unavailable", capsys)


def test_a_missing_phrase_file_fails_first(tmp_path, capsys, no_model):
    fails(["prebuild", tmp_path / "none.txt", "--tiny-random"], InputError, "does not exist", capsys)


def test_an_unknown_tiny_kind_fails_first(tmp_path, capsys, no_model):
    line, hint = fails(
        ["say", "はい", "-o", tmp_path / "a.wav", "--tiny-kind", "v9"], InputError, "v9", capsys
    )
    assert "unknown --tiny-kind" in line and "v2-voicedesign" in hint


def test_errors_reach_the_user_as_one_line_without_a_traceback(irodori_home, tmp_path):
    for args in (
        say(tmp_path / "a.mp4"),
        say(tmp_path / "a.wav", "--device", "gpu"),
        say(tmp_path / "a.wav", "--seed", "99999999999999999999"),
    ):
        r = run(args, irodori_home)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert lines[0].startswith("error: ") and lines[1].startswith("hint: ") and len(lines) == 2, lines


# ---- devices --tone --json, say --play (the virtual ALSA device of .ci/virtual-audio.sh) --------


def _virtual_device():
    try:
        from irodori_speaker.outputs import find_output_device

        return find_output_device("irodori_virtual")
    except AudioError:
        return None


@pytest.fixture
def virtual_device():
    if _virtual_device() is None:
        if os.environ.get("CI"):
            pytest.fail("CI runs .ci/virtual-audio.sh, which provides the irodori_virtual ALSA device")
        pytest.skip("no irodori_virtual ALSA device (.ci/virtual-audio.sh sets one up, as root)")


def test_devices_tone_json(virtual_device, capsys):
    assert cli.main(["devices", "--tone", "irodori_virtual", "--seconds", "0.2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    want = {"played": True, "name": "irodori_virtual", "hostapi": "ALSA", "seconds": 0.2, "frequency": 440.0}
    assert doc == want


def test_say_play_names_the_device(virtual_device, irodori_home, capsys):
    assert cli.main(["say", "はい", "--play", "--output-device", "irodori_virtual", *TINY, "-q"]) == 0
    assert "played on irodori_virtual (ALSA)" in capsys.readouterr().out


# ---- serve: a port it cannot listen on fails before the model loads ------------------------------


def test_serve_refuses_a_port_in_use(tmp_path, capsys, no_model):
    import socket

    pytest.importorskip("fastapi")
    with socket.socket() as held:  # a VOICEVOX engine (or our own second server) on the port
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        line, hint = fails(["serve", "--tiny-random", "--port", port], InputError, "cannot listen", capsys)
    assert f"127.0.0.1:{port}" in line and "--port" in hint


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--port", "70000"], "not a TCP port"),
        (["--port", "52365", "--ray"], "Ray's dashboard agent port"),  # Ray binds it before our proxy
    ],
)
def test_serve_refuses_a_port_it_cannot_have(extra, match, tmp_path, capsys, no_model):
    pytest.importorskip("fastapi")
    fails(["serve", "--tiny-random", *extra], InputError, match, capsys)


def test_serve_refuses_an_address_of_another_machine(capsys, no_model, monkeypatch):
    pytest.importorskip("fastapi")
    monkeypatch.setenv("IRODORI_API_KEY", "k")  # not --api-key: that is warned about (visible in ps)
    # TEST-NET-1 (RFC 5737): no machine here has it, so nothing can bind it
    argv = ["serve", "--tiny-random", "--host", "192.0.2.77"]
    with pytest.raises(InputError, match=r"cannot listen on 192\.0\.2\.77"):
        cli.run(argv)
    capsys.readouterr()
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("warning: listening on 192.0.2.77")  # the exposure warning, then the error
    assert (
        err[1].startswith("error: ")
        and err[2] == "hint: --host must be an address of this machine (127.0.0.1, 0.0.0.0)"
    )
