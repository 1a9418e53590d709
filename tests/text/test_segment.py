"""StreamSegmenter: rules, and the same segments for every chunking of the stream."""

from __future__ import annotations

import random

import pytest

from irodori_speaker.errors import InputError
from irodori_speaker.text.segment import StreamSegmenter
from irodori_speaker.text.split import SENTENCE_END_CHARS, measure


def run(text: str, chunks: list[str] | None = None, **kw: int) -> list[str]:
    seg = StreamSegmenter(**kw)
    out: list[str] = []
    for chunk in chunks if chunks is not None else [text]:
        out += seg.feed(chunk)
    return out + seg.flush()


def chunkings(text: str, rng: random.Random, n: int) -> list[list[str]]:
    """One char at a time, then `n` random chunkings (cut points drawn at random)."""
    out = [list(text)]
    for _ in range(n):
        k = rng.randint(1, max(1, len(text) // 3))
        cuts = sorted(rng.sample(range(1, len(text)), min(k, len(text) - 1)))
        out.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])])
    return out


STREAMS = [
    "こんにちは、今日は3.5度です。円周率は3.14159、人口は1,000人！本当に？」😊 "
    "次は https://example.com/a?b=1,2.3 を見てね。",
    "[happy]やったー！！\n- 箇条書き1\n- 箇条書き2\n```python\nprint('x。')\n```\n"
    "コードは以上です、わかりましたか？"
    "**重要**なことは[ここ](https://x.com/a_b)にあります…… ね。",
    "えっと、それでね、わたしはきのうとても長い文章を句読点なしで書いてみたのだけれどもやっぱり読みにくいし"
    "どこで切ればいいのかわからないのでとりあえず最後まで書いてしまおうと思ったのだけれどもそれでいいのかなあ",
    "# 見出し\n1. 最初\n2. 次\n> 引用です。\n---\n終わり。値段は１，０００円、３．５％です。"
    "`inline`と~~消し~~と__太字__。",
    "えっ！？マジで……？？　ありがとう😊👨\u200d👩\u200d👧\u200d👦！！"
    "「すごい！」って言われた。Node.jsとv1.2を使います。",
    "！！先頭の記号。[sad]\n[happy] 次の文です、そうです、はい。😊",
]


@pytest.mark.parametrize("text", STREAMS)
def test_every_chunking_gives_the_same_segments(text: str) -> None:
    whole = run(text)
    assert whole, text
    rng = random.Random(1234)
    for chunks in chunkings(text, rng, 25):
        assert run(text, chunks) == whole, chunks


def test_reference_stream() -> None:
    assert run(STREAMS[0]) == [
        "こんにちは、",
        "今日は3.5度です。",
        "円周率は3.14159、",
        "人口は1,000人！",
        "本当に？」😊",
        "次は https://example.com/a?b=1,2.3 を見てね。",
    ]
    assert run(STREAMS[1]) == [
        "[happy]やったー！！",
        "箇条書き1",
        "箇条書き2",
        "コードは以上です、わかりましたか？",
        "重要なことはここにあります……",
        "ね。",
    ]


def test_first_segment_rule_in_every_chunking() -> None:
    text = "えっと、それでね、今日はとても良い天気なので、公園に行って、お弁当を食べようと思います。"
    expected = [
        "えっと、それでね、",  # "えっと、" has 4 < 5 chars, "それでね、" brings it to 9 >= 5
        "今日はとても良い天気なので、",  # later segments need 10: "公園に行って、" (7) does not split
        "公園に行って、お弁当を食べようと思います。",
    ]
    for chunks in chunkings(text, random.Random(7), 30):
        assert run(text, chunks) == expected
    # the same clause later in a turn does not split (needs min_chars)
    seg = StreamSegmenter()
    assert seg.feed("はい。") == []
    assert seg.feed("それでね、今日は") == ["はい。"]
    assert seg.flush() == ["それでね、今日は"]


def test_numbers_arriving_in_pieces() -> None:
    assert run("", ["気温は3.", "5度です。"]) == ["気温は3.5度です。"]
    assert run("", ["値段は1,", "000円です、", "安い！"]) == ["値段は1,000円です、", "安い！"]
    seg = StreamSegmenter()
    assert seg.feed("気温は3.") == []  # undecided until the next character
    assert seg.pending == "気温は3."
    assert seg.feed(" 次") == ["気温は3."]


def test_urls_are_not_split() -> None:
    text = "見て https://example.com/a.b?c=1!d=2、これ。"
    for chunks in chunkings(text, random.Random(3), 10):
        assert run(text, chunks) == ["見て https://example.com/a.b?c=1!d=2、", "これ。"]


def test_code_blocks_are_dropped() -> None:
    text = "説明します。\n```python\nprint('こんにちは。')\n```\n以上です。"
    assert run(text) == ["説明します。", "以上です。"]
    assert run("前です。```\nunclosed('コード。')") == ["前です。"]


def test_markdown_is_stripped() -> None:
    text = (
        "**重要**なお知らせ。\n- 項目一\n* 項目二\n## 見出し\n> 引用\n3. 番号\n[リンク](https://x.y)を見て。"
    )
    assert run(text) == ["重要なお知らせ。", "項目一", "項目二", "見出し", "引用", "番号", "リンクを見て。"]
    assert run("snake_case と #hashtag と [happy] です。") == ["snake_case と #hashtag と [happy] です。"]


def test_tags_are_carried_with_their_segment() -> None:
    assert run("[happy]こんにちは！[sad]さようなら。") == ["[happy]こんにちは！", "[sad]さようなら。"]
    assert run("[happy]\nこんにちは。") == ["[happy]こんにちは。"]
    # tags do not count towards the clause minimum
    assert run("[excited]えっと、はい。") == ["[excited]えっと、はい。"]


def test_enders_runs_and_closers_stay_together() -> None:
    assert run("本当！？」😊次です。") == ["本当！？」😊", "次です。"]
    assert run("えっと……そうだね。") == ["えっと……", "そうだね。"]
    assert run("こんにちは。 ！！ 元気？") == ["こんにちは。 ！！", "元気？"]
    assert run("一行目\n二行目\n\n三行目") == ["一行目", "二行目", "三行目"]


@pytest.mark.parametrize("ender", sorted(SENTENCE_END_CHARS - {"."}))
def test_each_shared_ender_ends_a_segment(ender: str) -> None:
    assert run(f"はい{ender}次です") == [f"はい{ender}".strip(), "次です"]


def test_punctuation_only_is_not_emitted() -> None:
    assert run("！こんにちは。") == ["こんにちは。"]
    assert run("……") == []
    assert run("😊") == []  # nothing to say, nothing after it
    assert run("😊\nこんにちは。") == ["😊こんにちは。"]  # emoji-only: carried to the next segment


def test_max_chars_hard_limit() -> None:
    text = "あいうえおかきくけこさしすせそたちつてと" * 12
    for chunks in chunkings(text, random.Random(5), 5):
        out = run(text, chunks, max_chars=30)
        assert "".join(out) == text
        assert all(measure(s) <= 30 for s in out)


def test_flush_on_stall_keeps_state_and_final_resets() -> None:
    seg = StreamSegmenter()
    assert seg.feed("前。\n```\ncode") == []
    assert seg.flush(final=False) == ["前。"]
    assert seg.feed(" more。\n```\n後です、") == []
    assert seg.flush(final=False) == ["後です、"]
    # still not the first segment: "はい、" (3) does not split, even with first_min_chars 3
    seg2 = StreamSegmenter(first_min_chars=3)
    assert seg2.feed("最初。") == []
    assert seg2.flush(final=False) == ["最初。"]
    assert seg2.feed("はい、そう") == []
    assert seg2.flush() == ["はい、そう"]
    # after final, a new turn: the first-segment rule applies again
    assert seg2.feed("はい、そう") == ["はい、"]
    assert seg2.pending == "そう"
    assert seg2.flush() == ["そう"]
    assert seg2.pending == ""


def test_bad_arguments() -> None:
    with pytest.raises(InputError):
        StreamSegmenter(min_chars=0)
    with pytest.raises(InputError):
        StreamSegmenter(max_chars=4)
    with pytest.raises(InputError):
        StreamSegmenter().feed(None)  # type: ignore[arg-type]
