"""The v4 tokenizers: the `tokenizer/` folder shipped next to `model.safetensors` (ModernBERT-ja's
for v4-Small / v4.1, Gemma 3's for v4-Large).

A v4 release holds `tokenizer/tokenizer.json` (a `tokenizers` file) with
`tokenizer_config.json` and `special_tokens_map.json` beside it, as Hugging Face saves them.
Text and caption both use it (docs/models.md, "Tokens"): encoded without special tokens (the
file's post-processor, which adds BOS (and EOS), is not used), BOS first when `add_bos`, padded
with the pad token; no EOS, CLS or SEP. The BOS and pad ids (ModernBERT-ja: 1 and 3; Gemma 3:
2 and 0) are read from the folder's config files and checked against the backbone's config
(`bos_token_id`, `pad_token_id`). Encoding itself is `TextTokenizer`'s: literal special-token
spellings in user text never become special ids (so a typed `<end_of_image>` stays text on
v4-Large, where the reference would turn it into the EOI token).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from ..errors import CheckpointError, InputError
from .tokenizer import (
    TINY_TOKENIZER_CORPUS,
    TextTokenizer,
    _byte_piece,
    _tiny_document,
    _train_pieces,
    tiny_vocab,
    write_tokenizer_json,
)

__all__ = [
    "GEMMA3_SPECIAL_TOKENS",
    "MODERNBERT_JA_SPECIAL_TOKENS",
    "TOKENIZER_DIR",
    "TOKENIZER_FILES",
    "build_tiny_backbone_tokenizer",
    "build_tiny_gemma_tokenizer",
    "find_tokenizer_dir",
    "load_backbone_tokenizer",
    "special_token_ids",
    "tokenizer_for_model",
]

TOKENIZER_DIR = "tokenizer"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
REQUIRED_FILES = TOKENIZER_FILES[:2]

# ModernBERT-ja's special tokens by id (its config: pad 3, bos 1, eos 2, cls 6, sep 4).
MODERNBERT_JA_SPECIAL_TOKENS: tuple[str, ...] = ("<unk>", "<s>", "</s>", "<pad>", "<sep>", "<mask>", "<cls>")
_ROLES = {
    "unk_token": "<unk>",
    "bos_token": "<s>",
    "eos_token": "</s>",
    "pad_token": "<pad>",
    "sep_token": "<sep>",
    "mask_token": "<mask>",
    "cls_token": "<cls>",
}


def find_tokenizer_dir(model_file: str | os.PathLike[str]) -> Path | None:
    """`<dir of model>/tokenizer/`, else its parent's `tokenizer/`, when it holds
    `tokenizer.json` and `tokenizer_config.json` (a release's `sub/model.safetensors` may use
    the repo's tokenizer); None when neither does."""
    here = Path(model_file).parent
    for base in (here, here.parent):
        folder = base / TOKENIZER_DIR
        if all((folder / name).is_file() for name in REQUIRED_FILES):
            return folder
    return None


def _token_content(value: Any) -> str | None:
    """A special token as tokenizer_config writes it: a string or {"content": ...}."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"cannot read {path}: {e}") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return data


def special_token_ids(folder: str | os.PathLike[str], tok: Tokenizer) -> dict[str, int]:
    """Role ("bos_token", "pad_token", ...) -> id, from tokenizer_config.json (and
    special_tokens_map.json for roles it leaves out), looked up in the tokenizer's vocabulary."""
    folder = Path(folder)
    config = _read_json(folder / "tokenizer_config.json")
    extra = folder / "special_tokens_map.json"
    fallback = _read_json(extra) if extra.is_file() else {}
    ids: dict[str, int] = {}
    for role in _ROLES:
        content = _token_content(config.get(role)) or _token_content(fallback.get(role))
        if content is None:
            continue
        token_id = tok.token_to_id(content)
        if token_id is None:
            raise CheckpointError(
                f"{folder}: {role} {content!r} of tokenizer_config.json is not in tokenizer.json",
                hint="the tokenizer folder is inconsistent: use the one shipped with the model",
            )
        ids[role] = int(token_id)
    return ids


def load_backbone_tokenizer(
    folder: str | os.PathLike[str],
    *,
    add_bos: bool = True,
    vocab_size: int | None = None,
    bos_token_id: int | None = None,
    pad_token_id: int | None = None,
) -> TextTokenizer:
    """The tokenizer of a v4 `tokenizer/` folder, its BOS and pad ids checked against the
    backbone's config (`bos_token_id` / `pad_token_id`, when it states them) and every id
    inside the backbone's `vocab_size`."""
    folder = Path(folder)
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    if missing:
        raise CheckpointError(
            f"tokenizer folder {folder} lacks {', '.join(missing)}",
            hint="a v4 model needs the tokenizer/ folder of its release next to model.safetensors",
        )
    path = folder / "tokenizer.json"
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # the library raises bare Exception subclasses
        raise CheckpointError(f"cannot read tokenizer file {path}: {exc}") from exc
    ids = special_token_ids(folder, tok)
    for role, expected in (("bos_token", bos_token_id), ("pad_token", pad_token_id)):
        if role not in ids and expected is None:
            raise CheckpointError(f"{folder}: tokenizer_config.json names no {role}")
        if role in ids and expected is not None and ids[role] != expected:
            raise CheckpointError(
                f"{folder}: {role} is id {ids[role]} in the tokenizer but {expected} in the model's "
                "text backbone config",
                hint="this tokenizer folder belongs to another model",
            )
    size = tok.get_vocab_size(with_added_tokens=True)
    if vocab_size is not None and size > vocab_size:
        raise CheckpointError(
            f"tokenizer {path} has {size} entries but the model's text backbone has {vocab_size}",
            hint="use the tokenizer/ folder shipped with the model",
        )
    bos = ids.get("bos_token", bos_token_id)
    pad = ids.get("pad_token", pad_token_id)
    assert bos is not None and pad is not None  # checked above
    return TextTokenizer(tok, add_bos=add_bos, bos_id=bos, pad_id=pad, source=str(path))


def tokenizer_for_model(
    given: str | os.PathLike[str] | None,
    model_file: str | os.PathLike[str],
    backbone: Any,
    *,
    add_bos: bool = True,
) -> TextTokenizer:
    """The tokenizer of a v4 model: `given` (its folder, or the folder's tokenizer.json), else
    the `tokenizer/` folder beside `model_file` (`find_tokenizer_dir`); its ids checked against
    `backbone` (the model's backbone config: ModernBERT's or T5Gemma 2's)."""
    folder = None if given is None else Path(given)
    if folder is not None and folder.is_file():
        folder = folder.parent
    folder = folder or find_tokenizer_dir(model_file)
    if folder is None:
        raise CheckpointError(
            f"{model_file} is a v4 model but no tokenizer/ folder was found beside it",
            hint="put the release's tokenizer/ folder next to model.safetensors, or pass --tokenizer FOLDER",
        )
    return load_backbone_tokenizer(
        folder,
        add_bos=add_bos,
        vocab_size=backbone.vocab_size,
        bos_token_id=backbone.bos_token_id,
        pad_token_id=backbone.pad_token_id,
    )


# -- a tiny folder in the release's format, for tests and the tiny-random v4 models ------------


def build_tiny_backbone_tokenizer(vocab_size: int, folder: str | os.PathLike[str]) -> Path:
    """Write `folder/{tokenizer.json, tokenizer_config.json, special_tokens_map.json}` laid out
    as the ModernBERT-ja folder of a v4 release: ids 0-6 the special tokens (unk, BOS 1, EOS
    2, pad 3, sep 4, mask 5, cls 6), 256 byte pieces, then learned pieces; `vocab_size`
    entries in all. The post-processor adds BOS and EOS as the release's does. Deterministic.
    """
    folder = Path(folder)
    specials = MODERNBERT_JA_SPECIAL_TOKENS
    template: dict[str, object] = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": "<s>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": "</s>", "type_id": 0}},
        ],
        "pair": [
            {"SpecialToken": {"id": "<s>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": "</s>", "type_id": 0}},
            {"Sequence": {"id": "B", "type_id": 1}},
            {"SpecialToken": {"id": "</s>", "type_id": 1}},
        ],
        "special_tokens": {
            name: {"id": name, "ids": [specials.index(name)], "tokens": [name]} for name in ("<s>", "</s>")
        },
    }
    write_tokenizer_json(
        _tiny_document(tiny_vocab(vocab_size, specials), specials, template), folder / "tokenizer.json"
    )
    config = {
        "add_bos_token": True,
        "add_eos_token": True,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 8192,
        "tokenizer_class": "LlamaTokenizer",
        **_ROLES,
    }
    _write_configs(folder, dict(enumerate(specials)), config, _ROLES)
    return folder


def _write_configs(
    folder: Path, added: dict[int, str], config: dict[str, Any], roles: dict[str, str]
) -> None:
    """tokenizer_config.json (`config` plus the added tokens by id) and special_tokens_map.json."""
    flags = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
    config = dict(config)
    config["added_tokens_decoder"] = {
        str(i): {"content": name, **flags, "special": True} for i, name in sorted(added.items())
    }
    token_map = {role: {"content": name, **flags} for role, name in roles.items()}
    for name, data in (("tokenizer_config.json", config), ("special_tokens_map.json", token_map)):
        text = json.dumps(data, ensure_ascii=False, indent=2, sort_keys=True)
        (folder / name).write_text(text + "\n", encoding="utf-8")


# Gemma 3's special tokens by id (T5Gemma 2: pad 0, eos 1, bos 2), then its turn markers; the
# image markers sit at 255999 / 256000 in the real vocabulary, `eoi_token_index` - 1 / that index
# in the tiny one.
GEMMA3_SPECIAL_TOKENS: tuple[str, ...] = (
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<mask>",
    "<start_of_turn>",
    "<end_of_turn>",
)
_GEMMA3_IMAGE_TOKENS = ("<start_of_image>", "<end_of_image>")
_GEMMA3_ROLES = {
    "pad_token": "<pad>",
    "eos_token": "<eos>",
    "bos_token": "<bos>",
    "unk_token": "<unk>",
    "mask_token": "<mask>",
    "boi_token": "<start_of_image>",
    "eoi_token": "<end_of_image>",
}


def _bpe_pieces(count: int) -> tuple[list[str], list[list[str]]]:
    """`count` pieces learned from the tiny corpus, closed under BPE merges: every piece of two or
    more characters is (its prefix, its last character), both pieces before it; with the merges."""
    ranked = [p for p, _ in _train_pieces(TINY_TOKENIZER_CORPUS, 4 * count + 64)]
    chars = sorted({p for p in ranked if len(p) == 1})
    kept, seen = list(chars[:count]), set(chars[:count])
    merges = []
    for piece in ranked:
        if len(kept) >= count:
            break
        if len(piece) > 1 and piece not in seen and piece[:-1] in seen and piece[-1] in seen:
            kept.append(piece)
            seen.add(piece)
            merges.append([piece[:-1], piece[-1]])
    return kept, merges


def build_tiny_gemma_tokenizer(
    vocab_size: int, folder: str | os.PathLike[str], *, eoi_token_index: int = 300
) -> Path:
    """Write `folder/{tokenizer.json, tokenizer_config.json, special_tokens_map.json}` laid out as
    the Gemma 3 folder of v4-Large (a byte-fallback BPE, `tokenizer_class` GemmaTokenizer): ids
    0-6 the special tokens (pad 0, EOS 1, BOS 2, unk 3, mask 4, the turn markers), 256 byte
    pieces, learned pieces, and `<start_of_image>` / `<end_of_image>` at `eoi_token_index` - 1 /
    `eoi_token_index`; `vocab_size` entries in all. The post-processor adds BOS, as the
    release's does. Deterministic. (The released files were not seen: the layout follows
    Gemma 3's published tokenizer files.)"""
    folder = Path(folder)
    specials = GEMMA3_SPECIAL_TOKENS
    reserved = len(specials) + 256
    if not reserved + 1 <= eoi_token_index < vocab_size or vocab_size < reserved + 3:
        raise InputError(
            f"vocab_size {vocab_size} and eoi_token_index {eoi_token_index} leave no room for the "
            f"{reserved} reserved ids, the learned pieces and the image markers"
        )
    pieces, merges = _bpe_pieces(vocab_size - reserved - 2)
    ordered = [*specials, *(_byte_piece(b) for b in range(256)), *pieces]
    start = eoi_token_index - 1
    ordered[start:start] = list(_GEMMA3_IMAGE_TOKENS)
    vocab = {piece: i for i, piece in enumerate(ordered)}
    added = {vocab[name]: name for name in (*specials, *_GEMMA3_IMAGE_TOKENS)}
    meta = "\u2581"
    document: dict[str, object] = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": name, "single_word": False, "lstrip": False, "rstrip": False}
            | {"normalized": False, "special": True}
            for i, name in sorted(added.items())
        ],
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": meta},
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": "<bos>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [
                {"SpecialToken": {"id": "<bos>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": "<bos>", "type_id": 1}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {"<bos>": {"id": "<bos>", "ids": [vocab["<bos>"]], "tokens": ["<bos>"]}},
        },
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": meta}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
            ],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": "<unk>",
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }
    write_tokenizer_json(document, folder / "tokenizer.json")
    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1_000_000_000_000_000_019_884_624_838_656,
        "padding_side": "right",
        "spaces_between_special_tokens": False,
        "tokenizer_class": "GemmaTokenizer",
        **_GEMMA3_ROLES,
    }
    _write_configs(folder, added, config, _GEMMA3_ROLES)
    return folder
