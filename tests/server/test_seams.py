"""The server's seams: built once from a `ServerSettings` and loaded parts, never from the CLI."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")

from irodori_speaker.cli import build_parser
from irodori_speaker.cli.serve import settings_from_args
from irodori_speaker.server import ServerParts, ServerSettings, build_app, load_voice_book
from irodori_speaker.text.userdict import UserDictionary

SERVER = Path(__file__).resolve().parents[2] / "src" / "irodori_speaker" / "server"


def fake_synth() -> SimpleNamespace:
    """Enough of a Synthesizer to build the app (no request is served)."""
    return SimpleNamespace(user_dict=UserDictionary(), preset=SimpleNamespace(max_batch=1))


def test_the_server_imports_nothing_from_the_command_line():
    for path in sorted(SERVER.rglob("*.py")):
        package = ["irodori_speaker", *path.relative_to(SERVER.parent).parent.parts]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                module = ".".join([*base, *([node.module] if node.module else [])])
                imported = [module] + [f"{module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                imported = [a.name for a in node.names]
            else:
                continue
            assert not any(m.startswith("irodori_speaker.cli") for m in imported), f"{path}:{node.lineno}"


def test_serve_turns_its_flags_into_settings_that_pickle(tmp_path):
    argv = ["serve", "--tiny-random", "--no-cache", "--no-prewarm", "--replicas", "2", "--voices", "v.toml"]
    argv += ["--user-dict", "d.sqlite3", "--no-read-numbers", "--backend", "cpu", "--read-timeout", "2.5"]
    settings = settings_from_args(build_parser().parse_args(argv))
    assert settings.read_timeout_s == 2.5 and ServerSettings().read_timeout_s == 10.0
    assert settings.load["tiny_random"] is True and settings.load["backend"] == "cpu"  # the default kind
    assert (settings.voices, settings.user_dict, settings.replicas) == ("v.toml", "d.sqlite3", 2)
    assert not settings.cache and not settings.prewarm and dict(settings.readings) == {"read_numbers": False}
    assert pickle.loads(pickle.dumps(settings)) == settings  # what a Ray Serve replica is handed


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_a_read_timeout_that_is_no_number_of_seconds_is_a_usage_error(value, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["serve", "--read-timeout", value])
    assert e.value.code == 2 and "--read-timeout" in capsys.readouterr().err


def test_build_app_serves_the_voice_configs_readings_under_the_settings(tmp_path):
    cfg = tmp_path / "voices.toml"
    cfg.write_text(
        '[[speakers]]\nname = "a"\n[readings]\npause_markup = false\nurls = "domain"\n', encoding="utf-8"
    )
    settings = ServerSettings(readings=(("urls", "drop"),), voices=str(cfg), prewarm=False)
    app = build_app(settings, ServerParts(fake_synth(), load_voice_book(settings.voices)))
    assert dict(app.state.irodori.settings.readings) == {"pause_markup": False, "urls": "drop"}
    assert settings.readings == (("urls", "drop"),)  # the caller's settings are left as they were


def test_one_router_per_api_group_keeps_the_document():
    app = build_app(ServerSettings(), ServerParts(fake_synth(), load_voice_book(None)))
    doc = app.openapi()
    paths = doc["paths"]
    tags = {p: sorted({t for op in ops.values() for t in op.get("tags", [])}) for p, ops in paths.items()}
    onscreen = {p for p in tags if p.startswith(("/feed", "/studio"))}  # docs/overlay.md
    assert {tags[p][0] for p in onscreen} == {"Feed", "Studio"} and len(onscreen) == 13
    assert len(tags) - len(onscreen) == 34  # VOICEVOX's routes we serve (docs/server.md), OpenAI's, /metrics
    for path in ("/streaming_synthesis", "/audio_query_from_preset", "/validate_kana", "/connect_waves"):
        assert path in paths
    assert {"/add_preset", "/update_preset", "/delete_preset", "/singers"} <= set(paths)
    assert tags["/version"] == tags["/speakers"] == tags["/presets"] == tags["/metrics"] == ["その他"]
    assert tags["/audio_query"] == ["クエリ作成"] and tags["/mora_pitch"] == ["クエリ編集"]
    assert tags["/multi_synthesis"] == ["音声合成"] and tags["/import_user_dict"] == ["ユーザー辞書"]
    assert tags["/v1/audio/speech"] == ["OpenAI"]
    assert set(doc["paths"]["/user_dict_word/{word_uuid}"]) == {"put", "delete"}


def test_the_server_prewarms_in_its_default_style_with_every_other_style_as_a_batch_voice(tmp_path):
    """Lines of a voice book's styles batch only from graphs of their references' rungs: the
    lifespan's prewarm names the default style's voice and the other styles' (batch_voices)."""
    from fastapi.testclient import TestClient

    for name in ("a", "b", "c"):
        (tmp_path / f"{name}.safetensors").write_bytes(b"")  # the book checks that each file exists
    styles = "".join(
        f'  [[speakers.styles]]\n  name = "{name}"\n  id = {i}\n  latent = "{tmp_path / name}.safetensors"\n'
        for i, name in enumerate("abc")
    )
    cfg = tmp_path / "voices.toml"
    cfg.write_text(f'default_style = 1\n[[speakers]]\nname = "s"\n{styles}', encoding="utf-8")
    calls = []
    synth = fake_synth()
    synth.prewarm = lambda voice=None, *, batch_voices=(): calls.append((voice, list(batch_voices))) or 0.0
    app = build_app(ServerSettings(voices=str(cfg)), ServerParts(synth, load_voice_book(str(cfg))))
    with TestClient(app):
        pass
    [(voice, others)] = calls
    assert voice.latent.name == "b.safetensors"
    assert sorted(v.latent.name for v in others) == ["a.safetensors", "c.safetensors"]


def test_serve_takes_the_backend_presets_streams_unless_told():
    """`--streams` wins; else the preset's serve_streams: 1 on the CPU (16 on CUDA, where line
    batches measured faster; tests/backends for the CUDA preset's value)."""
    from irodori_speaker.engine.hardware.presets import base_preset
    from irodori_speaker.errors import BackendError
    from irodori_speaker.server.parts import server_streams

    assert server_streams(ServerSettings(load={"backend": "cpu", "tiny_random": True})) == 1
    assert server_streams(ServerSettings(load={"backend": "cpu"}, streams=3)) == 3
    assert base_preset("cuda").serve_streams == 16 and base_preset("cuda").max_batch == 1
    with pytest.raises(BackendError, match="unknown backend"):
        server_streams(ServerSettings(load={"backend": "tpu"}))


def test_a_default_style_whose_voice_cannot_be_read_does_not_stop_the_server(tmp_path, caplog):
    """Its requests get their error; the server starts, prewarmed without it."""
    from fastapi.testclient import TestClient

    from irodori_speaker.errors import InputError

    (tmp_path / "a.safetensors").write_bytes(b"")
    cfg = tmp_path / "voices.toml"
    cfg.write_text(
        f'[[speakers]]\nname = "s"\n  [[speakers.styles]]\n  name = "a"\n  id = 0\n'
        f'  latent = "{tmp_path / "a.safetensors"}"\n',
        encoding="utf-8",
    )
    calls = []

    def prewarm(voice=None, *, batch_voices=()):
        calls.append(voice)
        if voice is not None:
            raise InputError("voice latent a.safetensors is not a safetensors file")
        return 0.0

    synth = fake_synth()
    synth.prewarm = prewarm
    app = build_app(ServerSettings(voices=str(cfg)), ServerParts(synth, load_voice_book(str(cfg))))
    with caplog.at_level("WARNING"), TestClient(app) as client:
        assert client.get("/version").status_code == 200
    assert calls[0] is not None and calls[1] is None
    assert "prewarming without it" in caplog.text
