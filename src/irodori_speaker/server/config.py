"""The voice config file (TOML or YAML) that maps style ids to voices.

    # voices.toml                                  # voices.yaml: the same keys
    [[speakers]]                                   # speakers:
    name = "いろどり"                                #   - name: いろどり
    # uuid = "..."   (default: derived from name)  #     styles:
    [[speakers.styles]]                            #       - name: ノーマル
    name = "ノーマル"                                #         id: 0
    id = 0                                         #         wav: voices/iro.wav
    wav = "voices/iro.wav"     # or latent = "x.safetensors"; caption = "..." (VoiceDesign)
    aliases = ["alloy"]        # OpenAI voice names that mean this style

    [readings]                 # optional: the readings options of every request
    pause_markup = false       # (server/readings.py; serve flags and each request override)

Paths are relative to the config file. A style without `id` gets a stable id derived from
"speaker/style" (so adding a voice never renumbers the others); ids must be unique. No
config: one speaker with one style, id 0, the model's own voice.
"""

from __future__ import annotations

import os
import sys
import uuid as uuidlib
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError
from .readings import check_readings

NAMESPACE = uuidlib.UUID("6f0d8a52-4a43-4b8e-9a5e-1f9d3c1b7e21")  # speaker uuids derived from names
# OpenAI's built-in voice names: clients send them by default; they mean the default style
# unless a style lists them in `aliases`.
OPENAI_VOICES = (
    "alloy",
    "ash",
    "ballad",
    "coral",
    "echo",
    "fable",
    "onyx",
    "nova",
    "sage",
    "shimmer",
    "verse",
    "marin",
    "cedar",
)


class NotFound(InputError):
    """Something named by id that does not exist (a speaker uuid, a preset): 404."""


@dataclass(frozen=True)
class Style:
    id: int
    name: str
    speaker_name: str
    speaker_uuid: str
    wav: Path | None = None
    latent: Path | None = None
    caption: str | None = None
    aliases: tuple[str, ...] = ()

    def voice(self) -> Any:
        """The Voice of this style (None: the model's own voice)."""
        from ..synthesis.voices import Voice  # imports torch: not when the config is read

        if self.wav is not None:
            return Voice.from_wav(self.wav, caption=self.caption, name=self.name)
        if self.latent is not None:
            return Voice.from_latent(self.latent, caption=self.caption, name=self.name)
        if self.caption:
            return Voice.designed(self.caption, name=self.name)
        return None


@dataclass(frozen=True)
class SpeakerEntry:
    name: str
    uuid: str
    styles: tuple[Style, ...]
    policy: str = ""


@dataclass
class VoiceBook:
    """The configured speakers and their styles, by stable style id."""

    speakers: list[SpeakerEntry]
    default_style: int
    styles: dict[int, Style] = field(default_factory=dict)
    readings: tuple[tuple[str, Any], ...] = ()  # the config's [readings] table, checked

    def __post_init__(self) -> None:
        for sp in self.speakers:
            for st in sp.styles:
                if st.id in self.styles:
                    raise InputError(
                        f"style id {st.id} is used twice ({self.styles[st.id].name!r} and {st.name!r})",
                        hint="give each style its own `id` in the voice config",
                    )
                self.styles[st.id] = st
        if self.default_style not in self.styles:
            raise InputError(f"default_style {self.default_style} is not a configured style id")

    def style(self, style_id: int) -> Style:
        try:
            return self.styles[style_id]
        except KeyError:
            raise InputError(
                f"style id {style_id} is not configured", hint="GET /speakers lists the style ids"
            ) from None

    def speaker(self, speaker_uuid: str) -> SpeakerEntry:
        for sp in self.speakers:
            if sp.uuid == speaker_uuid:
                return sp
        raise NotFound(f"no speaker with uuid {speaker_uuid}", hint="GET /speakers lists them")

    def resolve_openai(self, voice: str) -> Style:
        """An OpenAI `voice`: an alias, a style id, "speaker/style", a speaker or style name."""
        v = voice.strip()
        for st in self.styles.values():
            if v in st.aliases:
                return st
        if v.lstrip("-").isdigit() and int(v) in self.styles:
            return self.styles[int(v)]
        for st in self.styles.values():
            if v in (f"{st.speaker_name}/{st.name}", st.speaker_name):
                return st
        named = [st for st in self.styles.values() if st.name == v]
        if len(named) == 1:
            return named[0]
        if v.lower() in OPENAI_VOICES:
            return self.styles[self.default_style]
        ours = sorted(
            {a for st in self.styles.values() for a in st.aliases}
            | {st.speaker_name for st in self.styles.values()}
            | {str(i) for i in self.styles}
        )
        error = InputError(
            f"unknown voice {voice!r}; accepted: OpenAI's {', '.join(OPENAI_VOICES)} (the default "
            f"voice unless aliased), and this server's {', '.join(ours)[:300]}",
            hint="GET /speakers lists the styles; `aliases` in the voice config names them",
        )
        error.param = "voice"  # type: ignore[attr-defined]  # OpenAI's error names the field
        raise error


def stable_style_id(speaker: str, style: str) -> int:
    """A style id that depends only on the names (fits VOICEVOX's 32-bit signed ints)."""
    return zlib.crc32(f"{speaker}/{style}".encode()) & 0x3FFFFFFF


def default_voice_book() -> VoiceBook:
    sp_uuid = str(uuidlib.uuid5(NAMESPACE, "irodori"))
    style = Style(0, "ノーマル", "Irodori", sp_uuid)
    return VoiceBook([SpeakerEntry("Irodori", sp_uuid, (style,))], 0)


def _read_config(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(f"cannot read the voice config {path}: {e}") from e
    if path.suffix.lower() == ".toml":
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # Python 3.10: the `serve` extra brings tomli
            import tomli as tomllib
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise InputError(f"{path}: not valid TOML: {e}") from e
    elif path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml  # type: ignore[import-untyped,unused-ignore]
        except ModuleNotFoundError as e:
            raise InputError("a YAML voice config needs PyYAML", hint="pip install pyyaml") from e
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise InputError(f"{path}: not valid YAML: {e}") from e
    else:
        raise InputError(f"{path}: the voice config must be .toml, .yaml or .yml")
    if not isinstance(data, dict):
        raise InputError(f"{path}: the voice config must be a table/mapping with `speakers`")
    return data


def load_voice_book(path: str | os.PathLike | None) -> VoiceBook:
    """The voices of a config file (None: the model's own voice as style 0)."""
    if path is None:
        return default_voice_book()
    path = Path(path)
    data = _read_config(path)
    base = path.resolve().parent
    speakers_data = data.get("speakers")
    if not isinstance(speakers_data, list) or not speakers_data:
        raise InputError(f"{path}: `speakers` must be a non-empty list")
    speakers: list[SpeakerEntry] = []
    for i, sp in enumerate(speakers_data):
        if not isinstance(sp, dict) or not isinstance(sp.get("name"), str):
            raise InputError(f"{path}: speaker #{i + 1} needs a `name`")
        name = sp["name"]
        sp_uuid = str(sp.get("uuid") or uuidlib.uuid5(NAMESPACE, name))
        styles_data = sp.get("styles") or [{"name": "ノーマル"}]
        styles = []
        for j, st in enumerate(styles_data):
            if not isinstance(st, dict) or not isinstance(st.get("name"), str):
                raise InputError(f"{path}: style #{j + 1} of {name!r} needs a `name`")
            sid = st.get("id", stable_style_id(name, st["name"]))
            if not isinstance(sid, int) or not 0 <= sid < 2**31:
                raise InputError(f"{path}: style {st['name']!r}: `id` must be an integer 0..2^31-1")
            files = {}
            for key in ("wav", "latent"):
                if st.get(key) is not None:
                    p = Path(str(st[key])).expanduser()
                    p = p if p.is_absolute() else base / p
                    if not p.is_file():
                        raise InputError(f"{path}: style {st['name']!r}: {key} file {p} does not exist")
                    files[key] = p
            if len(files) > 1:
                raise InputError(f"{path}: style {st['name']!r}: give `wav` or `latent`, not both")
            aliases = st.get("aliases") or []
            if isinstance(aliases, str):
                aliases = [aliases]
            styles.append(
                Style(
                    sid,
                    st["name"],
                    name,
                    sp_uuid,
                    files.get("wav"),
                    files.get("latent"),
                    st.get("caption"),
                    tuple(str(a) for a in aliases),
                )
            )
        speakers.append(SpeakerEntry(name, sp_uuid, tuple(styles), str(sp.get("policy", ""))))
    first = speakers[0].styles[0].id
    readings = data.get("readings") or {}
    if not isinstance(readings, dict):
        raise InputError(f"{path}: `readings` must be a table of options, e.g. pause_markup = false")
    checked = check_readings(readings, f"{path}: [readings]")
    return VoiceBook(speakers, int(data.get("default_style", first)), readings=tuple(checked.items()))
