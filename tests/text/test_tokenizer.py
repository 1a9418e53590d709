"""TextTokenizer: plain-text encoding (no special ids from user text), batching, the tiny builder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from irodori_speaker.errors import CheckpointError, InputError
from irodori_speaker.text.tokenizer import (
    LLM_JP3_SPECIAL_TOKENS,
    TINY_TOKENIZER_CORPUS,
    TextTokenizer,
    build_tiny_tokenizer,
)

VOCAB = 300
UNSEEN = [
    "今日は配信に来てくれてありがとう。",
    "ガラパゴス諸島の生態系は独特です。",
    "鬱蒼とした森、麒麟、薔薇。",
    "絵文字もいけます😊👨\u200d👩\u200d👧🇯🇵✨♡",
    "ＡＢＣ half width ｶﾀｶﾅ and English words.",
    "記号〜！？……「」『』【】※",
    "改行を\n含む\n文",
]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_tokenizer(VOCAB, tmp_path_factory.mktemp("tok") / "tokenizer.json")


@pytest.fixture(scope="module")
def tok(tiny_path: Path) -> TextTokenizer:
    return TextTokenizer.from_file(tiny_path, expected_vocab_size=VOCAB)


@pytest.fixture(scope="module")
def raw(tiny_path: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_path))


# -- the tiny builder ------------------------------------------------------------------------


def test_builder_is_deterministic(tmp_path: Path, tiny_path: Path) -> None:
    again = build_tiny_tokenizer(VOCAB, tmp_path / "again.json")
    assert again.read_bytes() == tiny_path.read_bytes()


@pytest.mark.parametrize("size", [265, 300, 333, 1000])
def test_builder_hits_the_exact_size(tmp_path: Path, size: int) -> None:
    path = build_tiny_tokenizer(size, tmp_path / "t.json")
    loaded = Tokenizer.from_file(str(path))
    assert loaded.get_vocab_size(with_added_tokens=True) == size
    assert len(json.loads(path.read_text(encoding="utf-8"))["model"]["vocab"]) == size


def test_builder_rejects_too_small_vocab(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="265"):
        build_tiny_tokenizer(264, tmp_path / "t.json")


def test_builder_layout_mirrors_llm_jp3(raw: Tokenizer) -> None:
    assert [raw.id_to_token(i) for i in range(8)] == list(LLM_JP3_SPECIAL_TOKENS)
    assert raw.id_to_token(1) == "<s>"
    assert raw.id_to_token(4) == "<PAD|LLM-jp>"
    assert [raw.id_to_token(8 + b) for b in range(256)] == [f"<0x{b:02X}>" for b in range(256)]
    added = raw.get_added_tokens_decoder()
    assert sorted(added) == list(range(8))
    assert all(t.special for t in added.values())


# -- loading ---------------------------------------------------------------------------------


def test_vocab_size_mismatch_names_both_numbers(tiny_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"300.*99574|99574.*300"):
        TextTokenizer.from_file(tiny_path, expected_vocab_size=99574)


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="cannot read"):
        TextTokenizer.from_file(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(CheckpointError, match="cannot read"):
        TextTokenizer.from_file(bad)


def test_out_of_range_special_ids(tiny_path: Path) -> None:
    with pytest.raises(CheckpointError, match="pad_id"):
        TextTokenizer.from_file(tiny_path, pad_id=VOCAB)


# -- encoding --------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [*TINY_TOKENIZER_CORPUS[:10], *UNSEEN])
def test_plain_text_ids_match_the_library(tok: TextTokenizer, raw: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert ids[0] == 1
    assert ids[1:] == raw.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("text", UNSEEN)
def test_byte_fallback_covers_everything(tok: TextTokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert 0 not in ids  # no <unk>
    assert not tok.special_ids.intersection(ids[1:])
    assert tok.decode(ids) == text


def test_add_bos_false_and_max_len(tiny_path: Path, tok: TextTokenizer) -> None:
    no_bos = TextTokenizer.from_file(tiny_path, add_bos=False)
    text = "今日はいい天気ですね。"
    assert no_bos.encode(text) == tok.encode(text)[1:]
    assert tok.encode(text, max_len=3) == tok.encode(text)[:3]
    assert tok.encode(text, max_len=1) == [1]
    with pytest.raises(InputError):
        tok.encode(text, max_len=0)


def test_empty_and_non_str(tok: TextTokenizer) -> None:
    with pytest.raises(InputError):
        tok.encode("")
    with pytest.raises(InputError):
        tok.encode(None)  # type: ignore[arg-type]


RESERVED_TEXTS = [
    *(f"前{sp}後" for sp in LLM_JP3_SPECIAL_TOKENS),
    "<PAD|LLM-jp>",
    "<s>こんにちは</s>",
    "<PAD|LLM-jp><PAD|LLM-jp><EOD|LLM-jp>",
    "<<PAD|LLM-jp>>",
    "<s<s>>",
    "バイト<0x41>と<0xE3><0x81><0x82>の綴り",
    "<unk> <MASK|LLM-jp> <CLS|LLM-jp> <SEP|LLM-jp>",
]


@pytest.mark.parametrize("text", RESERVED_TEXTS)
def test_reserved_spellings_stay_plain_text(tok: TextTokenizer, raw: Tokenizer, text: str) -> None:
    # The threat is real: the library maps these spellings to reserved ids...
    reserved_ids = set(range(264))
    lib_ids = raw.encode(text, add_special_tokens=False).ids
    specials_or_bytes_spelled = [i for i in lib_ids if i in reserved_ids and raw.id_to_token(i) in text]
    assert specials_or_bytes_spelled, "the library no longer matches reserved spellings; re-check this test"
    # ...and ours does not: no special id, and the text round-trips.
    ids = tok.encode(text)
    assert ids[0] == 1
    assert not tok.special_ids.intersection(ids[1:])
    assert tok.decode(ids) == text


def test_extra_added_tokens_are_also_plain_text(tmp_path: Path, tiny_path: Path) -> None:
    extended = Tokenizer.from_file(str(tiny_path))
    extended.add_special_tokens(["[EMO]"])
    extended.add_tokens(["<my-token>"])
    path = tmp_path / "extended.json"
    extended.save(str(path))
    tok = TextTokenizer.from_file(path, expected_vocab_size=VOCAB + 2)
    assert extended.encode("a[EMO]b<my-token>", add_special_tokens=False).ids.count(VOCAB) == 1
    ids = tok.encode("a[EMO]b<my-token>")
    assert VOCAB not in ids and VOCAB + 1 not in ids
    assert tok.decode(ids) == "a[EMO]b<my-token>"


# -- batching --------------------------------------------------------------------------------


def test_batch_pads_to_the_longest_row(tok: TextTokenizer) -> None:
    texts = ["はい。", "今日はいい天気ですね。", "ありがとう！"]
    rows = [tok.encode(t) for t in texts]
    ids, mask = tok.batch(texts)
    assert ids.dtype == torch.long and mask.dtype == torch.bool
    assert ids.shape == mask.shape == (3, max(len(r) for r in rows))
    for b, row in enumerate(rows):
        assert ids[b, : len(row)].tolist() == row
        assert ids[b, len(row) :].eq(4).all()
        assert mask[b].tolist() == [True] * len(row) + [False] * (ids.shape[1] - len(row))


def test_batch_fixed_padding_and_cut(tok: TextTokenizer) -> None:
    long_text = "今日はいい天気ですね。" * 40
    ids, mask = tok.batch(["はい。", long_text], pad_to=256)
    assert ids.shape == (2, 256)
    assert mask[1].all()  # cut to 256, BOS included
    assert ids[1].tolist() == tok.encode(long_text)[:256]
    ids, mask = tok.batch(["はい。", long_text], max_len=8)
    assert ids.shape == (2, 8)
    assert ids[1].tolist() == tok.encode(long_text)[:8]


def test_batch_rejects_bad_input(tok: TextTokenizer) -> None:
    with pytest.raises(InputError, match="empty list"):
        tok.batch([])
    with pytest.raises(InputError):
        tok.batch("はい")
    with pytest.raises(InputError, match="larger than pad_to"):
        tok.batch(["はい"], max_len=300, pad_to=256)
