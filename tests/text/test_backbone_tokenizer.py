"""The v4 tokenizer folder (ModernBERT-ja): BOS / pad / special-token rules, on a folder in the
release's format (tests/data/modernbert_ja_tokenizer, built by build_tiny_backbone_tokenizer)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from irodori_speaker.engine.checkpoint import load_checkpoint
from irodori_speaker.errors import CheckpointError
from irodori_speaker.text.backbone_tokenizer import (
    MODERNBERT_JA_SPECIAL_TOKENS,
    TOKENIZER_FILES,
    build_tiny_backbone_tokenizer,
    find_tokenizer_dir,
    load_backbone_tokenizer,
)

DATA = Path(__file__).resolve().parents[1] / "data"
FOLDER = DATA / "modernbert_ja_tokenizer"
VOCAB = 320  # the fixture backbone's vocabulary (tests/data/dit_v4)
TEXTS = ["こんにちは、今日もよろしくお願いします。", "ありがとう！", "記号〜！？😊 and English"]


@pytest.fixture(scope="module")
def tok():
    return load_backbone_tokenizer(FOLDER, vocab_size=VOCAB, bos_token_id=1, pad_token_id=3)


def test_the_committed_folder_is_what_the_builder_writes(tmp_path):
    built = build_tiny_backbone_tokenizer(VOCAB, tmp_path / "tokenizer")
    for name in TOKENIZER_FILES:
        assert (built / name).read_bytes() == (FOLDER / name).read_bytes(), name
    config = json.loads((FOLDER / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["bos_token"] == "<s>" and config["pad_token"] == "<pad>"
    assert [config["added_tokens_decoder"][str(i)]["content"] for i in range(7)] == list(
        MODERNBERT_JA_SPECIAL_TOKENS
    )


def test_ids_are_bos_then_plain_pieces_with_no_eos(tok):
    raw = Tokenizer.from_file(str(FOLDER / "tokenizer.json"))
    assert tok.bos_id == 1 and tok.pad_id == 3
    for text in TEXTS:
        plain = raw.encode(text, add_special_tokens=False).ids
        with_specials = raw.encode(text).ids  # the file's post-processor adds <s> ... </s>
        assert with_specials[-1] == 2 and with_specials[1:-1] == plain
        assert tok.encode(text) == [1, *plain]  # BOS, the body, no EOS / CLS / SEP


def test_special_spellings_in_user_text_stay_text(tok):
    for spelling in MODERNBERT_JA_SPECIAL_TOKENS:
        ids = tok.encode(f"前{spelling}後")
        assert ids[0] == 1 and not set(ids[1:]) & set(range(7)), (spelling, ids)
        assert spelling in tok.decode(ids)


def test_batch_pads_with_the_pad_id_and_cuts_after_bos(tok):
    ids, mask = tok.batch(TEXTS[:2], max_len=8, pad_to=12)
    assert ids.shape == (2, 12) and bool((ids[:, 0] == 1).all())
    body = tok.encode(TEXTS[1])
    assert ids[1, : len(body)].tolist() == body and bool((ids[1, len(body) :] == 3).all())
    assert mask[1].tolist() == [True] * len(body) + [False] * (12 - len(body))
    assert ids[0, :8].tolist() == tok.encode(TEXTS[0])[:8] and mask[0].sum() == 8


def test_ids_drive_the_fixture_backbone_and_padding_changes_nothing(tok):
    model = load_checkpoint(DATA / "dit_v4" / "tiny_v4.safetensors").model
    short_ids, short_mask = tok.batch([TEXTS[1]])
    long_ids, long_mask = tok.batch([TEXTS[1]], pad_to=16)
    with torch.inference_mode():
        short = model.encode_text(short_ids, short_mask)
        padded = model.encode_text(long_ids, long_mask)
    n = short.shape[1]
    torch.testing.assert_close(padded[:, :n], short, atol=1e-5, rtol=1e-5)
    assert float(padded[:, n:].abs().max()) == 0.0


def test_the_ids_are_checked_against_the_backbone_config(tmp_path):
    with pytest.raises(CheckpointError, match="bos_token is id 1 in the tokenizer but 2"):
        load_backbone_tokenizer(FOLDER, bos_token_id=2, pad_token_id=3)
    with pytest.raises(CheckpointError, match="pad_token is id 3 in the tokenizer but 0"):
        load_backbone_tokenizer(FOLDER, bos_token_id=1, pad_token_id=0)
    with pytest.raises(CheckpointError, match="has 320 entries but the model's text backbone has 300"):
        load_backbone_tokenizer(FOLDER, vocab_size=300)
    broken = tmp_path / "tokenizer"
    shutil.copytree(FOLDER, broken)
    (broken / "tokenizer_config.json").unlink()
    with pytest.raises(CheckpointError, match=r"lacks tokenizer_config\.json"):
        load_backbone_tokenizer(broken)
    config = json.loads((FOLDER / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["pad_token"] = "<nope>"
    (broken / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"pad_token .<nope>. of tokenizer_config\.json is not in"):
        load_backbone_tokenizer(broken)


def test_the_folder_is_found_next_to_the_model_or_one_level_up(tmp_path):
    shutil.copytree(FOLDER, tmp_path / "tokenizer")
    assert find_tokenizer_dir(tmp_path / "model.safetensors") == tmp_path / "tokenizer"
    (tmp_path / "int8").mkdir()
    assert find_tokenizer_dir(tmp_path / "int8" / "model.safetensors") == tmp_path / "tokenizer"
    shutil.copytree(FOLDER, tmp_path / "int8" / "tokenizer")
    assert find_tokenizer_dir(tmp_path / "int8" / "model.safetensors") == tmp_path / "int8" / "tokenizer"
    assert find_tokenizer_dir(tmp_path / "elsewhere" / "deeper" / "model.safetensors") is None
