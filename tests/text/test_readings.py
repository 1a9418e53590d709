"""The readings pass (issue 16 "Readings", issue 12's text-stream defects): stall flushes,
emoji sentence ends, URLs, numbers, English, laughter, tags; switchable, in the cache key."""

from __future__ import annotations

import pytest

from irodori_speaker.errors import InputError
from irodori_speaker.options import SynthesisOptions
from irodori_speaker.text import english
from irodori_speaker.text.normalize import normalize_text
from irodori_speaker.text.numbers import read_numbers
from irodori_speaker.text.readings import apply_readings, read_urls
from irodori_speaker.text.segment import StreamSegmenter
from irodori_speaker.text.tags import TagMap, find_tags, strip_tags

HAS_E2K = english._e2k() is not None
needs_e2k = pytest.mark.skipif(not HAS_E2K, reason="the english extra (e2k) is not installed")


# ---- issue 12: the text stream -------------------------------------------------------------


def test_after_a_stall_flush_the_next_segment_does_not_start_with_punctuation():
    for mark in ("、", "。", "！", ",", "」、"):
        seg = StreamSegmenter()
        assert seg.feed("今日はとても") == []
        assert seg.flush(final=False) == ["今日はとても"]
        out = seg.feed(mark + "いい天気ですね。") + seg.flush()
        assert out == ["いい天気ですね。"], mark


@pytest.mark.parametrize(
    "text, expected",
    [
        ("楽しかったね😊また明日", ["楽しかったね😊", "また明日"]),
        ("今日もありがとう✨またね", ["今日もありがとう✨", "またね"]),
        ("いくよ🎉みんな準備はいい", ["いくよ🎉", "みんな準備はいい"]),
        ("🍣が好き", ["🍣が好き"]),  # an emoji used as a word stays in its sentence
        ("お昼は🍣を食べた", ["お昼は🍣を食べた"]),
    ],
)
def test_an_emoji_after_a_sentence_final_ending_ends_the_sentence(text, expected):
    for chunks in ([text], list(text)):
        seg = StreamSegmenter()
        out = [s for c in chunks for s in seg.feed(c)] + seg.flush()
        assert out == expected, chunks


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("word", "詳しくは URL を見てね。"),
        ("domain", "詳しくは exampleドットcom を見てね。"),
        ("drop", "詳しくは を見てね。"),
        ("keep", "詳しくは https://example.com/docs?a=1&b=2 を見てね。"),
    ],
)
def test_a_url_inside_a_sentence_is_not_read_letter_by_letter(mode, expected):
    text = "詳しくは https://example.com/docs?a=1&b=2 を見てね。"
    assert read_urls(text, mode) == expected


def test_url_rules_keep_trailing_punctuation_and_bare_www_hosts():
    assert read_urls("見て: https://a.jp/x.") == "見て: URL."
    assert read_urls("www.youtube.com/watch?v=1で見れる", "domain") == "youtubeドットcomで見れる"
    assert read_urls("no links here") == "no links here"


def test_the_segmenter_keeps_the_url_in_one_segment_and_the_synthesizer_says_url(synth):
    seg = StreamSegmenter()
    text = "詳しくはこちら https://example.com/a/very/long/path?x=1 を見てください。次の話です。"
    segments = [s for ch in text for s in seg.feed(ch)] + seg.flush()
    assert (
        segments[0].endswith("を見てください。") and "https://example.com/a/very/long/path?x=1" in segments[0]
    )
    spoken = synth.spoken_text(segments[0], SynthesisOptions(read_english=False))
    assert spoken == "詳しくはこちら URL を見てください。"
    assert "http" not in synth.spoken_text(segments[0])


# ---- numbers -------------------------------------------------------------------------------

NUMBER_CASES = [
    ("2026/12/03", "2026年12月3日"),
    ("2026-12-3", "2026年12月3日"),
    ("12/3は誕生日", "12月3日は誕生日"),
    ("配信は15:30から", "配信は15時30分から"),
    ("12:00に集合", "12時に集合"),
    ("9:05", "9時5分"),
    ("1:02:03", "1時2分3秒"),
    ("3〜5人", "3から5人"),
    ("3~5", "3から5"),
    ("-5度", "マイナス5度"),
    ("気温は-3℃", "気温はマイナス3度"),
    ("25°C", "25度"),
    ("$100", "100ドル"),
    ("¥500", "500円"),
    ("€20", "20ユーロ"),
    ("5GB", "5ギガバイト"),
    ("200ms", "200ミリ秒"),
    ("2L", "2リットル"),
    ("＃1", "ナンバー1"),
    ("#にじさんじ 最高", "にじさんじ 最高"),
    ("1stライブ", "ファーストライブ"),
    ("v1.2", "バージョン1.2"),
    # left alone: pyopenjtalk reads these well already
    ("2026年12月3日", "2026年12月3日"),
    ("3.5kg", "3.5kg"),
    ("20%", "20%"),
    ("1,000円", "1,000円"),
    ("100万円", "100万円"),
    ("090-1234-5678", "090-1234-5678"),
    ("16:9の画面", "16:9の画面"),  # not a clock time: one minute digit
    ("3-5で勝った", "3-5で勝った"),
    ("13/45", "13/45"),  # no such date
]


@pytest.mark.parametrize("written, rewritten", NUMBER_CASES)
def test_numbers_are_rewritten_only_where_pyopenjtalk_misreads_them(written, rewritten):
    assert read_numbers(normalize_text(written)) == rewritten


def test_pyopenjtalk_reads_the_rewritten_numbers_right():
    pj = pytest.importorskip("pyopenjtalk")
    cases = {
        "配信は15:30から": "ハイシンワジューゴジサンジュップンカラ",
        "2026/12/03": "ニセンニジューロクネンジューニガツミッカ",
        "5GB": "ゴギガバイト",
        "$100": "ヒャクドル",
        "＃1": "ナンバーイチ",
        "10℃": "ジュード",
    }
    for written, kana in cases.items():
        assert pj.g2p(normalize_text(written), kana=True) != kana  # misread before
        assert pj.g2p(read_numbers(normalize_text(written)), kana=True) == kana


# ---- English and laughter ------------------------------------------------------------------


def test_laughter_is_read_or_dropped_not_spelt():
    assert english.read_laughter("VTuberの配信でwwwって草") == "VTuberの配信でワラワラって草"
    assert english.read_laughter("草w") == "草ワラ"
    assert english.read_laughter("配信www", "drop") == "配信"
    assert english.read_laughter("wow www.x twitter w") == "wow www.x twitter ワラ"
    assert english.read_laughter("w杯") == "w杯"  # a lone w at the start is a letter


@needs_e2k
def test_the_streamer_sentence_comes_out_sensibly():
    out = apply_readings(normalize_text("VTuberの配信でwwwって草"))
    assert out == "ブイチューバーの配信でワラワラって草"


def test_english_words_from_pyopenjtalk_and_acronyms_need_no_extra():
    pytest.importorskip("pyopenjtalk")
    assert english.word_reading("YouTube") == "ユーチューブ"
    assert english.word_reading("GG") == "ジージー"
    assert english.word_reading("PC") == "ピーシー"


@needs_e2k
def test_english_words_unknown_to_pyopenjtalk_come_from_e2k():
    assert english.read_english("Minecraftとstreamの話") == "マインクラフトとストリームの話"
    assert english.word_reading("subscribe") == "サブスクライブ"


# ---- tags ----------------------------------------------------------------------------------


def test_tags_are_found_in_every_form_and_stripped():
    text = "[happy]こんにちは（笑）今日は*laughs*いい天気[sad]"
    assert [t.name for t in find_tags(text)] == ["happy", "笑", "laughs", "sad"]
    assert strip_tags(text) == "こんにちは今日はいい天気"
    assert strip_tags("[relaxed] ふう *clears throat* では") == "ふう では"


def test_pause_markup_and_ordinary_brackets_are_left_alone():
    for text in (
        "[pause:0.5]はい",
        '<break time="1s"/>はい',
        "（テスト）です",
        "*とても*大事",
        "[リンク](x)",
    ):
        assert strip_tags(text) == text
    assert strip_tags("[Google](https://g.co)") == "[Google](https://g.co)"  # a markdown link


def test_a_tag_map_picks_the_first_mapped_tag_and_says_its_words(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "happy.wav").write_bytes(b"")  # a tag's voice file must exist
    tags = TagMap({"happy": {"voice": "happy.wav", "options": {"seed": 3}}, "笑": {"text": "ふふっ"}})
    line = tags.apply("[happy]やったー（笑）")
    assert line.tag == "happy" and line.action.voice == "happy.wav" and line.action.options == {"seed": 3}
    assert line.text == "やったーふふっ"
    assert tags.apply("[sad]うう").tag is None  # unmapped: left for the synthesizer to strip


def test_a_bad_tag_map_is_an_input_error_at_once():
    with pytest.raises(InputError, match="unknown key 'voic'"):
        TagMap({"happy": {"voic": "a.wav"}})
    with pytest.raises(InputError, match="seed"):
        TagMap({"happy": {"options": {"seed": "x"}}})
    with pytest.raises(InputError):
        TagMap(["happy"])


# ---- the options ---------------------------------------------------------------------------


def test_every_reading_switches_off():
    text = normalize_text("[happy]15:30に https://a.jp を見てwww")
    off = SynthesisOptions(tags="keep", urls="keep", laughter="keep", read_numbers=False, read_english=False)
    assert apply_readings(text, off) == text
    on = apply_readings(text, SynthesisOptions(read_english=False))
    assert on == "15時30分に URL を見てワラワラ"
    with pytest.raises(InputError, match="urls"):
        SynthesisOptions(urls="spell")


def test_the_synthesizer_renders_the_readings_and_the_cache_key_follows_them(synth, tmp_path):
    from irodori_speaker.cache import PhraseCache

    cache = PhraseCache(tmp_path / "phrases")
    base = SynthesisOptions(seed=1, seconds=1.0)
    result = synth.synthesize("[happy]15:30からね", options=base)
    assert result.record.text == "15時30分からね"
    assert synth.spoken_text("15:30からね", base.replace(read_numbers=False)) == "15:30からね"
    on = cache.key(synth, "15:30からね", None, base)
    off = cache.key(synth, "15:30からね", None, base.replace(read_numbers=False))
    assert on != off  # the option changes what is said, so the key
    assert on == cache.key(synth, "15時30分からね", None, base)  # the same words, the same line
    plain = cache.key(synth, "こんにちは", None, base)
    assert plain == cache.key(synth, "こんにちは", None, base.replace(read_numbers=False))


def test_a_line_that_is_only_a_tag_is_an_input_error(synth):
    with pytest.raises(InputError, match="nothing to say"):
        synth.spoken_text("[happy]")
    assert synth.spoken_text("[happy]", SynthesisOptions(tags="keep", read_english=False)) == "[happy]"


def test_a_wall_of_random_words_is_bounded(monkeypatch):
    calls = []
    monkeypatch.setattr(english, "e2k_word", lambda w: calls.append(w) or "テスト")
    monkeypatch.setattr(english, "openjtalk_word", lambda w: None)
    spam = " ".join(f"word{chr(97 + i % 26)}{chr(97 + i // 26 % 26)}q" for i in range(500))
    out = english.read_english(spam + " " + "x" * 5000)
    assert len(calls) <= english.MAX_NEW_WORDS
    assert out.endswith("x" * 5000)  # a 5,000-letter "word" is left alone


def test_a_stage_direction_survives_the_stream_markdown_filter_and_is_stripped(synth):
    text = "*laughs* こんにちは。*とても*大事。**太字**です。"
    for chunks in ([text], list(text)):
        seg = StreamSegmenter()
        out = [s for c in chunks for s in seg.feed(c)] + seg.flush()
        assert out == ["*laughs* こんにちは。", "とても大事。", "太字です。"], chunks
    assert synth.spoken_text(out[0]) == "こんにちは。"
