"""The v4-Large tokenizer folder (Gemma 3: pad 0, eos 1, bos 2): the v4 encoding rule with these
ids, on a folder in the release's format (tests/data/gemma3_tokenizer, built by
build_tiny_gemma_tokenizer)."""

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
    GEMMA3_SPECIAL_TOKENS,
    TOKENIZER_FILES,
    build_tiny_gemma_tokenizer,
    tokenizer_for_model,
)

DATA = Path(__file__).resolve().parents[1] / "data"
FOLDER = DATA / "gemma3_tokenizer"
MODEL = DATA / "dit_v4_large" / "tiny_v4_large.safetensors"
VOCAB, EOI = 320, 300  # the fixture backbone's vocabulary and end-of-image id (tests/data/dit_v4_large)
TEXTS = ["こんにちは、今日もよろしくお願いします。", "ありがとう！", "記号〜！？😊 and English"]


@pytest.fixture(scope="module")
def model():
    return load_checkpoint(MODEL).model


@pytest.fixture(scope="module")
def tok(model):
    return tokenizer_for_model(FOLDER, MODEL, model.cfg.text_backbone)


def test_the_committed_folder_is_what_the_builder_writes(tmp_path):
    built = build_tiny_gemma_tokenizer(VOCAB, tmp_path / "tokenizer", eoi_token_index=EOI)
    for name in TOKENIZER_FILES:
        assert (built / name).read_bytes() == (FOLDER / name).read_bytes(), name
    config = json.loads((FOLDER / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert (config["bos_token"], config["pad_token"], config["eos_token"]) == ("<bos>", "<pad>", "<eos>")
    assert config["tokenizer_class"] == "GemmaTokenizer" and config["add_eos_token"] is False
    decoder = config["added_tokens_decoder"]
    assert [decoder[str(i)]["content"] for i in range(len(GEMMA3_SPECIAL_TOKENS))] == list(
        GEMMA3_SPECIAL_TOKENS
    )
    assert decoder[str(EOI)]["content"] == "<end_of_image>"
    raw = Tokenizer.from_file(str(FOLDER / "tokenizer.json"))
    assert raw.get_vocab_size() == VOCAB and raw.token_to_id("<end_of_image>") == EOI


def test_ids_are_bos_2_then_plain_pieces_with_no_eos(tok):
    raw = Tokenizer.from_file(str(FOLDER / "tokenizer.json"))
    assert (tok.bos_id, tok.pad_id) == (2, 0)
    for text in TEXTS:
        plain = raw.encode(text, add_special_tokens=False).ids
        assert raw.encode(text).ids == [2, *plain]  # the file's post-processor: <bos> only
        assert tok.encode(text) == [2, *plain]
        assert tok.decode(tok.encode(text)) == text


def test_special_spellings_in_user_text_stay_text(tok):
    """Unlike the reference (whose tokenizer matches added tokens in the text), a typed
    `<end_of_image>` never becomes the EOI id the backbone swaps for its own vector."""
    raw = Tokenizer.from_file(str(FOLDER / "tokenizer.json"))
    assert EOI in raw.encode("前<end_of_image>後", add_special_tokens=False).ids
    for spelling in (*GEMMA3_SPECIAL_TOKENS, "<start_of_image>", "<end_of_image>"):
        ids = tok.encode(f"前{spelling}後")
        assert ids[0] == 2 and not set(ids[1:]) & tok.special_ids, (spelling, ids)
        assert spelling in tok.decode(ids)


def test_batch_pads_with_0_and_cuts_after_bos(tok):
    ids, mask = tok.batch(TEXTS[:2], max_len=8, pad_to=12)
    body = tok.encode(TEXTS[1])
    assert ids[1, : len(body)].tolist() == body and bool((ids[1, len(body) :] == 0).all())
    assert mask[1].tolist() == [True] * len(body) + [False] * (12 - len(body))
    assert ids[0, :8].tolist() == tok.encode(TEXTS[0])[:8] and mask[0].sum() == 8


def test_ids_drive_the_fixture_backbone_and_padding_changes_nothing(tok, model):
    short_ids, short_mask = tok.batch([TEXTS[1]])
    long_ids, long_mask = tok.batch([TEXTS[1]], pad_to=16)
    with torch.inference_mode():
        short = model.encode_text(short_ids, short_mask)
        padded = model.encode_text(long_ids, long_mask)
    n = short.shape[1]
    torch.testing.assert_close(padded[:, :n], short, atol=1e-5, rtol=1e-5)
    assert float(padded[:, n:].abs().max()) == 0.0


def test_the_folder_beside_the_model_is_found_and_checked(tmp_path, model):
    shutil.copytree(FOLDER, tmp_path / "tokenizer")
    shutil.copy(MODEL, tmp_path / "model.safetensors")
    found = tokenizer_for_model(None, tmp_path / "model.safetensors", model.cfg.text_backbone)
    assert (found.bos_id, found.pad_id) == (2, 0)
    modernbert = DATA / "modernbert_ja_tokenizer"  # another model's folder: its ids do not match
    with pytest.raises(CheckpointError, match="bos_token is id 1 in the tokenizer but 2"):
        tokenizer_for_model(modernbert, MODEL, model.cfg.text_backbone)
