"""The user dictionary: validation, longest match with priority, sqlite persistence across
instances and processes, VOICEVOX JSON import/export, pyopenjtalk accents, the synthesizer."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from irodori_speaker.errors import InputError
from irodori_speaker.text.segment import StreamSegmenter
from irodori_speaker.text.userdict import DictWord, UserDictionary, resolve_user_dict


@pytest.fixture
def ud(tmp_path):
    return UserDictionary(tmp_path / "dict.sqlite3")


def test_add_apply_and_persist(ud, tmp_path):
    w = ud.add("VTuber", "ぶいちゅーばー", accent_type=4)
    assert w.pronunciation == "ブイチューバー" and w.mora_count == 6
    assert ud.apply("VTuberの配信") == "ブイチューバーの配信"
    # the text is normalised before the dictionary sees it: full-width surfaces are the same word
    assert UserDictionary(tmp_path / "dict.sqlite3").apply("VTuberです") == "ブイチューバーです"
    assert ud.path.is_file()
    assert ud.words() == [w]


def test_nonexistent_file_reads_empty_and_is_not_created(tmp_path):
    ud = UserDictionary(tmp_path / "none" / "d.sqlite3")
    assert ud.apply("テスト") == "テスト" and len(ud) == 0
    assert not ud.path.exists()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"surface": "", "pronunciation": "ア"}, "surface is empty"),
        ({"surface": "a\nb", "pronunciation": "ア"}, "line break"),
        ({"surface": "草", "pronunciation": "grass"}, "katakana"),
        ({"surface": "草", "pronunciation": "クサ", "accent_type": 3}, "accent_type must be 0-2"),
        ({"surface": "草", "pronunciation": "クサ", "priority": 11}, "priority"),
        ({"surface": "草", "pronunciation": "クサ", "word_type": "NOUN"}, "word_type"),
    ],
)
def test_bad_words_are_refused_with_a_clear_error(ud, kwargs, match):
    with pytest.raises(InputError, match=match):
        ud.add(**kwargs)
    assert len(ud) == 0


def test_longest_match_and_priority(ud):
    ud.add("東京", "トーキョー")
    ud.add("東京都", "トーキョート")
    assert ud.apply("東京都に行く") == "トーキョートに行く"  # longer wins at equal priority
    ud.add("都庁", "チョーシャ", priority=9)
    assert ud.apply("東京都庁") == "トーキョーチョーシャ"  # the higher priority takes the overlap
    ud.add("www", "ワラワラ")
    assert ud.apply("wwwって草www") == "ワラワラって草ワラワラ"


def test_update_remove_and_errors(ud):
    w = ud.add("草", "クサ")
    w2 = ud.update(w.uuid, "草", "ワラ", accent_type=1, priority=7)
    assert ud.get(w.uuid) == w2 and ud.apply("草") == "ワラ"
    ud.remove(w.uuid)
    assert ud.apply("草") == "草"
    with pytest.raises(InputError, match="no word"):
        ud.remove(w.uuid)
    with pytest.raises(InputError, match="no word"):
        ud.update(w.uuid, "草", "クサ")


def test_voicevox_json_round_trip(ud, tmp_path):
    ud.add("VTuber", "ブイチューバー", accent_type=4, word_type="COMMON_NOUN", priority=7)
    exported = ud.export_voicevox()
    ((uuid, word),) = exported.items()
    assert word["surface"] == "ＶＴｕｂｅｒ"  # VOICEVOX stores full-width surfaces
    assert word["part_of_speech_detail_1"] == "一般" and word["context_id"] == 1345
    assert word["mora_count"] == 6 and word["priority"] == 7
    path = tmp_path / "export.json"
    path.write_text(json.dumps(exported, ensure_ascii=False), encoding="utf-8")
    other = UserDictionary(tmp_path / "other.sqlite3")
    assert other.import_voicevox(path) == 1
    assert other.export_voicevox() == exported
    # override=False keeps the existing word
    exported[uuid]["pronunciation"] = "ブイ"
    exported[uuid]["accent_type"] = 1
    assert other.import_voicevox(exported, override=False) == 0
    assert other.apply("VTuber") == "ブイチューバー"
    assert other.import_voicevox(exported, override=True) == 1
    assert other.apply("VTuber") == "ブイ"


def test_import_validates_everything_before_writing(ud):
    good = DictWord.make("草", "クサ").to_voicevox()
    with pytest.raises(InputError):
        ud.import_voicevox({"0b4f8c3c-0000-4000-8000-000000000001": good, "not-a-uuid": good})
    assert len(ud) == 0


def test_another_process_sees_changes(ud):
    ud.add("配信", "ハイシン")  # creates the file
    code = (
        "import sys; from irodori_speaker.text.userdict import UserDictionary as U; "
        f"U({str(ud.path)!r}).add('草', 'ワラ')"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert ud.apply("草") == "ワラ"


def test_a_word_split_over_stream_chunks_still_matches(ud):
    ud.add("VTuber", "ブイチューバー")
    seg = StreamSegmenter()
    out = []
    for chunk in ["今日は", "VTu", "berの配", "信です。", "また"]:
        out += seg.feed(chunk)
    out += seg.flush()
    assert ud.apply(out[0]) == "今日はブイチューバーの配信です。"


def test_openjtalk_dictionary_gives_the_accent(ud):
    pytest.importorskip("pyopenjtalk")
    from irodori_speaker.text.prosody import accent_phrases

    ud.add("VTuber", "ブイチューバー", accent_type=1)
    try:
        assert ud.openjtalk_dictionary() is not None
        (first, *_) = accent_phrases(ud.apply("VTuberの配信"))
        # long vowels as VOICEVOX spells them
        assert [m.text for m in first.moras][:6] == ["ブ", "イ", "チュ", "ウ", "バ", "ア"]
        assert first.accent == 1
        ud.clear()
        assert ud.openjtalk_dictionary() is None
    finally:
        ud.clear()
        ud.openjtalk_dictionary()


def test_resolve():
    assert resolve_user_dict(False) is None
    assert isinstance(resolve_user_dict(None), UserDictionary)
    with pytest.raises(InputError):
        resolve_user_dict(3)  # type: ignore[arg-type]


def test_synthesizer_applies_it_and_the_cache_key_sees_it(synth, tmp_path):
    from irodori_speaker.cache import PhraseCache
    from irodori_speaker.options import SynthesisOptions

    cache = PhraseCache(tmp_path / "phrases")
    opts = SynthesisOptions(seed=1, seconds=1.0)  # readings alone say ブイチューバー
    before = cache.key(synth, "VTuberです", None, opts)
    old = synth.user_dict
    synth.user_dict = UserDictionary(tmp_path / "d.sqlite3")
    try:
        synth.user_dict.add("VTuber", "バーチャルユーチューバー")
        assert synth.spoken_text("ＶＴｕｂｅｒです") == "バーチャルユーチューバーです"
        result = synth.synthesize("VTuberです", options=opts)
        assert result.record.text == "バーチャルユーチューバーです"
        after = cache.key(synth, "VTuberです", None, opts)
        assert after != before
        assert after == cache.key(
            synth, "バーチャルユーチューバーです", None, opts
        )  # same spoken text, same line
    finally:
        synth.user_dict = old
