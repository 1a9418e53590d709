"""Request and response bodies: VOICEVOX's shapes (field names, types, required fields as
its OpenAPI document has them) and OpenAI's speech request.

An AudioQuery's fields refuse (422, naming the field) only what means nothing: a negative
length, a speed of 0, NaN. Where VOICEVOX sets no bound and our options do (vv-synth's and
pvv-mcp-server's sliders go past ours), the value is clamped into the option's range with a
`Warning` header (voicevox/query.py); `QUERY_RANGES` are those ranges, each from the option's
spec (`_bounds`) in the field's own units. OpenAI's `speed` keeps its documented 0.25-4.0."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Annotated, Literal

from annotated_types import Interval
from pydantic import BaseModel, ConfigDict, Field

from ..audio.controls import gain_of, voicevox_pitch_scale
from ..options import API_SPEED, Check, SynthesisOptions, option_specs
from ..text import prosody
from ..text.pauses import MAX_PAUSE_S
from .audio_out import MAX_RATE, MIN_RATE

_STRICT = ConfigDict(allow_inf_nan=False)
MAX_PHRASE_MORAS = 500  # moras per accent phrase (longer ones are split: voicevox/tts.py)


def _bounds(option: str | Check, to_field: Callable[[float], float] = float) -> Interval:
    """The bounds of a field that maps onto `option` (a name, or a Check): the option's range,
    each bound through `to_field` (the option's value -> the field's)."""
    check = option_specs(SynthesisOptions)[option].check if isinstance(option, str) else option
    lo = None if check.lo is None else to_field(check.lo)
    hi = None if check.hi is None else to_field(check.hi)
    return Interval(
        ge=None if check.lo_open else lo,
        gt=lo if check.lo_open else None,
        le=None if check.hi_open else hi,
        lt=hi if check.hi_open else None,
    )


class Mora(BaseModel):
    """モーラ（子音＋母音）ごとの情報。"""

    model_config = _STRICT
    text: str = Field(description="文字", max_length=8)
    consonant: str | None = Field(default=None, description="子音の音素", max_length=4)
    consonant_length: float | None = Field(default=None, description="子音の長さ", ge=0)
    vowel: str = Field(description="母音の音素", max_length=4)
    vowel_length: float = Field(description="母音の長さ", ge=0)
    pitch: float = Field(description="音高 (ignored: the model sets its own prosody)")

    @classmethod
    def of(cls, m: prosody.Mora) -> Mora:
        return cls(
            text=m.text,
            consonant=m.consonant,
            consonant_length=m.consonant_length,
            vowel=m.vowel,
            vowel_length=m.vowel_length,
            pitch=m.pitch,
        )

    @property
    def seconds(self) -> float:
        return (self.consonant_length or 0.0) + self.vowel_length


class AccentPhrase(BaseModel):
    """アクセント句ごとの情報。"""

    model_config = _STRICT
    moras: list[Mora] = Field(description="モーラのリスト", max_length=MAX_PHRASE_MORAS)
    accent: int = Field(description="アクセント箇所", ge=0, le=MAX_PHRASE_MORAS)
    pause_mora: Mora | None = Field(default=None, description="アクセント句の末尾につく無音モーラ。")
    is_interrogative: bool = Field(default=False, description="疑問系かどうか")

    @classmethod
    def of(cls, p: prosody.AccentPhrase) -> AccentPhrase:
        return cls(
            moras=[Mora.of(m) for m in p.moras],
            accent=p.accent,
            pause_mora=None if p.pause_mora is None else Mora.of(p.pause_mora),
            is_interrogative=p.is_interrogative,
        )


class AudioQuery(BaseModel):
    """音声合成用のクエリ。`kana` carries the text to speak (as in AivisSpeech, docs/server.md).

    Scales beyond QUERY_RANGES are clamped into them, with a `Warning` header."""

    model_config = _STRICT
    accent_phrases: list[AccentPhrase] = Field(description="アクセント句のリスト", max_length=4000)
    speedScale: float = Field(description="全体の話速 (the speed option)", gt=0)
    pitchScale: float = Field(description="全体の音高 (the pitch option: docs/server.md)")
    intonationScale: float = Field(description="全体の抑揚 (the intonation option)", ge=0)
    volumeScale: float = Field(description="全体の音量 (the volume option)", ge=0)
    prePhonemeLength: float = Field(description="音声の前の無音時間", ge=0)
    postPhonemeLength: float = Field(description="音声の後の無音時間", ge=0)
    pauseLength: float | None = Field(default=None, description="句読点などの無音時間。null: 無視", ge=0)
    pauseLengthScale: float = Field(default=1, description="句読点などの無音時間（倍率）", ge=0)
    outputSamplingRate: int = Field(
        description="音声データの出力サンプリングレート", ge=MIN_RATE, le=MAX_RATE
    )
    outputStereo: bool = Field(description="音声データをステレオ出力するか否か")
    kana: str | None = Field(default=None, description="読み上げテキスト (AivisSpeech と同じ扱い)")
    tempoDynamicsScale: float | None = Field(
        default=None,
        description="AivisSpeech: 話速の緩急 (not supported: ignored, with a Warning header)",
    )


def _range(bounds: Interval) -> tuple[float, float]:
    lo = bounds.ge if bounds.ge is not None else bounds.gt
    hi = bounds.le if bounds.le is not None else bounds.lt
    assert lo is not None and hi is not None
    return float(lo), float(hi)  # type: ignore[arg-type]


#: field -> (lo, hi): the options' ranges in the fields' units; beyond them a value is clamped
QUERY_RANGES: dict[str, tuple[float, float]] = {
    "speedScale": _range(_bounds(API_SPEED)),
    "pitchScale": _range(_bounds("pitch", voicevox_pitch_scale)),
    "intonationScale": _range(_bounds("intonation")),
    "volumeScale": _range(_bounds("volume", gain_of)),
    "prePhonemeLength": _range(_bounds("pre_silence")),
    "postPhonemeLength": _range(_bounds("post_silence")),
    "pauseLength": (0.0, MAX_PAUSE_S),
}


class Preset(BaseModel):
    """プリセット情報 (VOICEVOX's shape)."""

    model_config = _STRICT
    id: int = Field(description="プリセットID")
    name: str = Field(description="プリセット名", max_length=200)
    speaker_uuid: str = Field(description="キャラクターのUUID", max_length=100)
    style_id: int = Field(description="スタイルID")
    speedScale: float = Field(description="全体の話速", gt=0)
    pitchScale: float = Field(description="全体の音高")
    intonationScale: float = Field(description="全体の抑揚", ge=0)
    volumeScale: float = Field(description="全体の音量", ge=0)
    prePhonemeLength: float = Field(description="音声の前の無音時間", ge=0)
    postPhonemeLength: float = Field(description="音声の後の無音時間", ge=0)
    pauseLength: float | None = Field(default=None, description="句読点などの無音時間", ge=0)
    pauseLengthScale: float = Field(default=1, description="句読点などの無音時間（倍率）", ge=0)


class SpeakerStyle(BaseModel):
    name: str
    id: int
    type: Literal["talk", "singing_teacher", "frame_decode", "sing"] = "talk"


class SpeakerSupportedFeatures(BaseModel):
    permitted_synthesis_morphing: Literal["ALL", "SELF_ONLY", "NOTHING"] = "NOTHING"


class Speaker(BaseModel):
    name: str
    speaker_uuid: str
    styles: list[SpeakerStyle]
    version: str
    supported_features: SpeakerSupportedFeatures = SpeakerSupportedFeatures()


class StyleInfo(BaseModel):
    id: int
    icon: str
    portrait: str | None = None
    voice_samples: list[str]


class SpeakerInfo(BaseModel):
    policy: str
    portrait: str
    style_infos: list[StyleInfo]


class SupportedDevicesInfo(BaseModel):
    cpu: bool
    cuda: bool
    dml: bool


class SupportedFeatures(BaseModel):
    streaming_synthesis: bool | None = None
    adjust_mora_pitch: bool
    adjust_phoneme_length: bool
    adjust_speed_scale: bool
    adjust_pitch_scale: bool
    adjust_intonation_scale: bool
    adjust_volume_scale: bool
    adjust_pause_length: bool | None = None
    interrogative_upspeak: bool
    synthesis_morphing: bool
    sing: bool | None = None
    manage_library: bool | None = None
    return_resource_url: bool | None = None
    apply_katakana_english: bool | None = None


class LicenseInfo(BaseModel):
    name: str
    version: str | None = None
    license: str | None = None
    text: str


class UpdateInfo(BaseModel):
    version: str
    descriptions: list[str]
    contributors: list[str] | None = None


class EngineManifest(BaseModel):
    manifest_version: str
    name: str
    brand_name: str
    uuid: str
    url: str
    icon: str
    default_sampling_rate: int
    frame_rate: float
    terms_of_service: str
    update_infos: list[UpdateInfo]
    dependency_licenses: list[LicenseInfo]
    supported_vvlib_manifest_version: str | None = None
    supported_features: SupportedFeatures


class WordTypes(str, Enum):
    """品詞"""

    PROPER_NOUN = "PROPER_NOUN"
    COMMON_NOUN = "COMMON_NOUN"
    VERB = "VERB"
    ADJECTIVE = "ADJECTIVE"
    SUFFIX = "SUFFIX"


class UserDictWord(BaseModel):
    """辞書のコンパイルに使われる情報。"""

    surface: str
    priority: int = Field(ge=0, le=10)
    context_id: int = 1348
    part_of_speech: str
    part_of_speech_detail_1: str
    part_of_speech_detail_2: str
    part_of_speech_detail_3: str
    inflectional_type: str
    inflectional_form: str
    stem: str
    yomi: str
    pronunciation: str
    accent_type: int
    mora_count: int | None = None
    accent_associative_rule: str


class ParseKanaBadRequest(BaseModel):
    text: str
    error_name: str
    error_args: dict[str, str]


class ParseKanaError(BaseModel):
    """The 400 body of /accent_phrases?is_kana=true, as VOICEVOX sends it: {"detail": {...}}."""

    detail: ParseKanaBadRequest


class SpeechRequest(BaseModel):
    """OpenAI's POST /v1/audio/speech body."""

    model_config = ConfigDict(allow_inf_nan=False, extra="ignore")
    model: str = Field(description="any name: one model is loaded (GET /v1/models lists it)", max_length=200)
    input: str = Field(
        description="the text to speak (at most the server's --max-input-chars, 4096)", min_length=1
    )
    voice: str | dict = Field(description="a style id, speaker or style name, alias, or an OpenAI voice name")
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: Annotated[float, _bounds(API_SPEED)] = Field(
        default=1.0,
        description="speaking rate: the speed option, beyond its range the length (docs/options.md)",
    )
    instructions: str | None = Field(default=None, description="accepted and ignored", max_length=4096)
    stream_format: Literal["audio", "sse"] | None = Field(
        default=None,
        description="'audio' (the default): the audio bytes; 'sse': speech.audio.delta / .done events",
    )
    # ours (the openai SDK's extra_body): the readings options of this request (server/readings.py)
    tags: str | None = Field(default=None, description="readings: 'strip' or 'keep' tags ([happy])")
    urls: str | None = Field(default=None, description="readings: 'word', 'domain', 'drop' or 'keep'")
    laughter: str | None = Field(default=None, description="readings: www as 'read', 'drop' or 'keep'")
    read_numbers: bool | None = Field(default=None, description="readings: times, dates, units")
    read_english: bool | None = Field(default=None, description="readings: Latin words in katakana")
    pause_markup: bool | None = Field(default=None, description="readings: pause markup as silence")
