"""Text tokenizer: the llm-jp-3 Unigram ``tokenizer.json`` with special-token-safe encoding.

The `tokenizers` library matches added tokens in raw text even with
``add_special_tokens=False`` (so user text ``"<PAD|LLM-jp>"`` would become id 4), and the
Unigram model itself matches every vocabulary piece, special pieces and the byte-fallback
spellings ``<0xHH>`` included. `TextTokenizer.encode` therefore runs the file's normaliser,
pre-tokenizer and model directly and cuts the text inside every occurrence of such a
"reserved spelling", so it can only ever be spelled out as ordinary pieces or bytes. For
text without reserved spellings the ids are exactly those of
``Tokenizer.encode(text, add_special_tokens=False)``.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer

from irodori_speaker.errors import CheckpointError, InputError
from irodori_speaker.text.normalize import drop_lone_surrogates

__all__ = [
    "LLM_JP3_SPECIAL_TOKENS",
    "TINY_TOKENIZER_CORPUS",
    "TextTokenizer",
    "build_tiny_tokenizer",
]

# The first eight ids of llm-jp/llm-jp-3-*'s tokenizer (its tokenizer_config: unk "<unk>",
# bos "<s>", eos "</s>", mask/pad/cls/sep "<...|LLM-jp>"; eod shares "</s>"), followed in
# that file by the 256 byte-fallback pieces <0x00>..<0xFF> (ids 8..263).
LLM_JP3_SPECIAL_TOKENS: tuple[str, ...] = (
    "<unk>",
    "<s>",
    "</s>",
    "<MASK|LLM-jp>",
    "<PAD|LLM-jp>",
    "<CLS|LLM-jp>",
    "<SEP|LLM-jp>",
    "<EOD|LLM-jp>",
)


def _byte_piece(value: int) -> str:
    return f"<0x{value:02X}>"


class TextTokenizer:
    """Encodes normalised text to model ids (BOS first), and batches with padding masks."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        add_bos: bool = True,
        bos_id: int = 1,
        pad_id: int = 4,
        source: str = "<memory>",
    ) -> None:
        self._tok = tokenizer
        self.add_bos = bool(add_bos)
        self.bos_id = int(bos_id)
        self.pad_id = int(pad_id)
        self.source = source
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)
        for name, value in (("bos_id", self.bos_id), ("pad_id", self.pad_id)):
            if not 0 <= value < self.vocab_size:
                raise CheckpointError(f"{name} {value} is outside the tokenizer's vocab of {self.vocab_size}")

        vocab = tokenizer.get_vocab(with_added_tokens=True)
        added = tokenizer.get_added_tokens_decoder()
        # Ids user text must never produce: the declared special tokens plus BOS and pad.
        special_ids = {i for i, tok in added.items() if tok.special} | {self.bos_id, self.pad_id}
        self.special_ids: frozenset[int] = frozenset(special_ids)
        id_to_piece = {i: p for p, i in vocab.items()}
        reserved = {id_to_piece[i] for i in special_ids if i in id_to_piece}
        reserved |= {tok.content for tok in added.values()}
        reserved |= {p for p in (_byte_piece(b) for b in range(256)) if p in vocab}
        reserved.discard("")
        by_first: dict[str, list[str]] = {}
        for spelling in sorted(reserved):
            by_first.setdefault(spelling[0], []).append(spelling)
        self._reserved_by_first = by_first
        self.reserved_spellings: frozenset[str] = frozenset(reserved)

    @classmethod
    def from_file(
        cls,
        path: str | os.PathLike[str],
        *,
        add_bos: bool = True,
        bos_id: int = 1,
        pad_id: int = 4,
        expected_vocab_size: int | None = None,
    ) -> TextTokenizer:
        """Load a ``tokenizer.json``; raise `CheckpointError` if unreadable or the vocab size is off."""
        p = Path(path)
        try:
            tok = Tokenizer.from_file(str(p))
        except Exception as exc:  # the library raises bare Exception subclasses
            raise CheckpointError(
                f"cannot read tokenizer file {p}: {exc}",
                hint="pass the tokenizer.json of llm-jp/llm-jp-3-150m (or the model's own)",
            ) from exc
        size = tok.get_vocab_size(with_added_tokens=True)
        if expected_vocab_size is not None and size != expected_vocab_size:
            raise CheckpointError(
                f"tokenizer {p} has {size} entries but the model config says text_vocab_size "
                f"{expected_vocab_size}",
                hint="use the tokenizer the checkpoint was trained with",
            )
        return cls(tok, add_bos=add_bos, bos_id=bos_id, pad_id=pad_id, source=str(p))

    # -- encoding -------------------------------------------------------------------------

    def _cut_points(self, s: str) -> list[int]:
        """Positions inside every occurrence of a reserved spelling (just after its first char)."""
        cuts = []
        by_first = self._reserved_by_first
        for i, ch in enumerate(s):
            group = by_first.get(ch)
            if group and any(s.startswith(sp, i) for sp in group):
                cuts.append(i + 1)
        return cuts

    def _pieces(self, text: str) -> list[int]:
        tok = self._tok
        normalized = tok.normalizer.normalize_str(text) if tok.normalizer is not None else text
        if tok.pre_tokenizer is not None:
            words = [w for w, _ in tok.pre_tokenizer.pre_tokenize_str(normalized)]
        else:
            words = [normalized]
        model = tok.model
        ids: list[int] = []
        for word in words:
            start = 0
            for cut in [*self._cut_points(word), len(word)]:
                if cut > start:
                    ids.extend(t.id for t in model.tokenize(word[start:cut]))
                    start = cut
        return ids

    def encode(self, text: str, *, max_len: int | None = None) -> list[int]:
        """Ids of ``text`` as plain text (BOS prepended when `add_bos`), cut to `max_len` incl. BOS."""
        if not isinstance(text, str):
            raise InputError(f"text must be a str, got {type(text).__name__}")
        text = drop_lone_surrogates(text)  # not encodable as UTF-8: the tokenizer would raise
        if not text:
            raise InputError("cannot tokenize empty text", hint="normalise with normalize_or_raise first")
        if max_len is not None and max_len < 1:
            raise InputError(f"max_len must be >= 1, got {max_len}")
        ids = self._pieces(text)
        leaked = self.special_ids.intersection(ids)
        if leaked:  # cannot happen with a byte-fallback vocab; guard the model against it anyway
            raise CheckpointError(
                f"tokenizer {self.source} produced reserved ids {sorted(leaked)} for plain text",
                hint="the tokenizer needs byte fallback so every character has ordinary pieces",
            )
        if self.add_bos:
            ids.insert(0, self.bos_id)
        if max_len is not None:
            ids = ids[:max_len]
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, skipping BOS/pad and other special ids."""
        return self._tok.decode([i for i in ids if i not in self.special_ids], skip_special_tokens=False)

    def batch(
        self,
        texts: Sequence[str],
        max_len: int | None = None,
        pad_to: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode and pad: ``(ids LongTensor (B, L), mask BoolTensor (B, L))``.

        L is the longest row unless `pad_to` is given (the reference pads to 256). With
        `pad_to` and no `max_len`, rows are cut to `pad_to`.
        """
        if isinstance(texts, str):
            raise InputError("batch() takes a sequence of texts, not one str")
        if len(texts) == 0:
            raise InputError("cannot batch an empty list of texts")
        if pad_to is not None:
            if pad_to < 1:
                raise InputError(f"pad_to must be >= 1, got {pad_to}")
            if max_len is None:
                max_len = pad_to
            elif max_len > pad_to:
                raise InputError(f"max_len {max_len} is larger than pad_to {pad_to}")
        rows = [self.encode(t, max_len=max_len) for t in texts]
        length = pad_to if pad_to is not None else max(len(r) for r in rows)
        ids = torch.full((len(rows), length), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.bool)
        for b, row in enumerate(rows):
            ids[b, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[b, : len(row)] = True
        return ids, mask


# -- tiny tokenizer for tests ----------------------------------------------------------------

# A few dozen varied Japanese lines (greetings, stream talk, news, numbers, katakana).
TINY_TOKENIZER_CORPUS: tuple[str, ...] = (
    "こんにちは、今日もよろしくお願いします。",
    "みなさん、こんばんは！配信を始めますね。",
    "今日はいい天気ですね。",
    "ありがとうございます！とても嬉しいです。",
    "次のニュースです。",
    "東京は朝から青空が広がっています。",
    "明日の天気は雨のち晴れでしょう。",
    "ゲームの続きをやっていきましょう。",
    "コメントありがとう、読みますね。",
    "えっ、本当ですか？",
    "それはすごいですね！",
    "少し休憩しましょうか。",
    "今日はここまでです、また明日。",
    "チャンネル登録お願いします。",
    "わたしはこの歌が大好きです。",
    "おはようございます、よく眠れましたか？",
    "電車が遅れているそうです。",
    "気温は二十五度まで上がる見込みです。",
    "政府は新しい対策を発表しました。",
    "台風が週末に接近する予報です。",
    "地元のチームが逆転勝ちしました。",
    "お昼ご飯は何にしようかな。",
    "うーん、ちょっと難しいですね。",
    "やったー！クリアしました！",
    "なるほど、そういうことだったんですね。",
    "そろそろ時間なので、終わりにします。",
    "質問があれば、コメントで教えてください。",
    "このお菓子、すごくおいしい。",
    "みんなで一緒に歌いましょう。",
    "新しい衣装はどうですか？",
    "ちょっと待ってくださいね。",
    "がんばります！",
    "では、また会いましょう。",
    "今日の配信は三時間の予定です。",
    "スーパーチャットありがとうございます。",
    "これは秘密の話なんですけど、",
    "ねえねえ、聞いて聞いて！",
    "そうなんだ、知らなかった。",
    "楽しい時間をありがとう。",
    "おやすみなさい。",
)

_META = "\u2581"  # the word-boundary marker of SentencePiece-style tokenizers


def _tiny_document(
    vocab: list[list[object]],
    specials: Sequence[str] = LLM_JP3_SPECIAL_TOKENS,
    post_processor: dict[str, object] | None = None,
) -> dict[str, object]:
    """A tokenizer.json document laid out like llm-jp-3's (same normaliser and decoder);
    `specials` are ids 0.. as special added tokens, `post_processor` what the file adds around
    a plain encode (our encoding never uses it)."""
    added = [
        {
            "id": i,
            "content": sp,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, sp in enumerate(specials)
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {
            "type": "Sequence",
            "normalizers": [
                {"type": "Replace", "pattern": {"Regex": "(?<!\\n)^"}, "content": _META},
                {"type": "Replace", "pattern": {"String": " "}, "content": _META},
            ],
        },
        "pre_tokenizer": None,
        "post_processor": post_processor,
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "ByteFallback"},
                {"type": "Replace", "pattern": {"String": _META}, "content": " "},
                {"type": "Fuse"},
                {"type": "Replace", "pattern": {"Regex": "(?<!\\n)^ "}, "content": ""},
            ],
        },
        "model": {"type": "Unigram", "unk_id": 0, "vocab": vocab, "byte_fallback": True},
    }


def _train_pieces(corpus: Sequence[str], count: int, max_piece_len: int = 4) -> list[tuple[str, float]]:
    """Choose `count` pieces and unigram log-probabilities for `corpus` (deterministic).

    A count-based unigram LM: candidates are all substrings of up to `max_piece_len`
    characters of the normalised lines, ranked by occurrences * length (characters
    covered), ties broken by the string itself; scores are log-probabilities of how often
    the chosen pieces are used in a greedy longest-match pass over the corpus (add-one).
    """
    lines = [_META + line.replace(" ", _META) for line in corpus]
    freq: Counter[str] = Counter()
    for line in lines:
        for i in range(len(line)):
            for n in range(1, max_piece_len + 1):
                if i + n <= len(line):
                    freq[line[i : i + n]] += 1
    ranked = sorted(freq.items(), key=lambda kv: (-kv[1] * len(kv[0]), kv[0]))
    chosen = [_META, *[p for p, _ in ranked if p != _META][: max(count - 1, 0)]]
    # Pad with kana the corpus lacks if training produced too few pieces.
    filler = 0x3041
    while len(chosen) < count:
        ch = chr(filler)
        filler += 1
        if ch not in chosen:
            chosen.append(ch)
    chosen = chosen[:count]
    pieces = set(chosen)
    use: Counter[str] = Counter()
    for line in lines:
        i = 0
        while i < len(line):
            for n in range(max_piece_len, 0, -1):
                if line[i : i + n] in pieces:
                    use[line[i : i + n]] += 1
                    i += n
                    break
            else:
                i += 1
    total = sum(use.values()) + len(chosen)
    return [(p, round(math.log((use[p] + 1) / total), 6)) for p in chosen]


def tiny_vocab(vocab_size: int, specials: Sequence[str]) -> list[list[object]]:
    """`specials`, the 256 byte pieces, then pieces learned from the corpus: `vocab_size` in all."""
    reserved = len(specials) + 256
    if vocab_size < reserved + 1:
        raise InputError(
            f"vocab_size must be >= {reserved + 1} ({len(specials)} special + 256 byte pieces + 1), "
            f"got {vocab_size}"
        )
    vocab: list[list[object]] = [[sp, 0.0] for sp in specials]
    vocab += [[_byte_piece(b), 0.0] for b in range(256)]
    vocab += [[p, s] for p, s in _train_pieces(TINY_TOKENIZER_CORPUS, vocab_size - reserved)]
    return vocab


def write_tokenizer_json(document: dict[str, object], path: str | os.PathLike[str]) -> Path:
    """Write a tokenizer.json document deterministically (sorted keys, compact)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(document, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    out.write_text(text + "\n", encoding="utf-8")
    return out


def build_tiny_tokenizer(vocab_size: int, path: str | os.PathLike[str]) -> Path:
    """Write a small byte-fallback Unigram ``tokenizer.json`` with exactly `vocab_size` entries.

    Layout as llm-jp-3: ids 0-7 the special tokens (BOS 1, pad 4), 8-263 the byte pieces,
    then pieces learned from `TINY_TOKENIZER_CORPUS`. Deterministic: the same arguments give
    a byte-identical file.
    """
    return write_tokenizer_json(_tiny_document(tiny_vocab(vocab_size, LLM_JP3_SPECIAL_TOKENS)), path)
