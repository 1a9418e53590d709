"""Where model files come from: a local path, `hf://org/repo/file`, or a Hugging Face repo id.

Repo ids resolve through huggingface_hub into its cache. The cache is tried first
(no network); a download is tried only when the file is not there and offline mode
is off. With no network, the error says exactly what is missing and how to supply it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelSourceError

# Released files on the Hugging Face hub.
MODELS = {
    "v2": "Aratako/Irodori-TTS-500M-v2",
    "v2-voicedesign": "Aratako/Irodori-TTS-500M-v2-VoiceDesign",
    "v3": "Aratako/Irodori-TTS-500M-v3",
    "v3-voicedesign": "Aratako/Irodori-TTS-600M-v3-VoiceDesign",
    "lite-int4": "hf://kizuna-intelligence/Irodori-TTS-Lite-int4/dit_int4.safetensors",
}
DEFAULT_MODEL = "v2"
CODEC_REPO = "Aratako/Semantic-DACVAE-Japanese-32dim"
TOKENIZER_REPO = "llm-jp/llm-jp-3-150m"
LITE_INT4_CODEC = "hf://kizuna-intelligence/Irodori-TTS-Lite-int4/dacvae_int4.safetensors"

# The file a bare repo id means, per kind of artefact.
DEFAULT_FILES = {"model": "model.safetensors", "codec": "weights.pth", "tokenizer": "tokenizer.json"}


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class SourceSpec:
    """A parsed source: either a local path or (repo_id, filename, revision)."""

    path: Path | None = None
    repo_id: str | None = None
    filename: str | None = None
    revision: str | None = None

    def describe(self) -> str:
        if self.path is not None:
            return str(self.path)
        rev = f"@{self.revision}" if self.revision else ""
        return f"hf://{self.repo_id}{rev}/{self.filename}"


def parse_source(source: str | os.PathLike, kind: str = "model") -> SourceSpec:
    """Interpret `source`: an existing path, `hf://org/repo[@rev]/path/in/repo`, an alias, or `org/repo`."""
    if kind not in DEFAULT_FILES:
        raise ValueError(f"unknown artefact kind {kind!r}")
    text = os.fspath(source)
    if kind == "model" and text in MODELS:
        text = MODELS[text]
    if text.startswith("hf://"):
        parts = text[len("hf://") :].split("/")
        if len(parts) < 3 or not all(parts):
            raise ModelSourceError(
                f"bad source {text!r}", hint="write hf://org/repo/file (e.g. hf://org/repo/model.safetensors)"
            )
        repo, _, rev = "/".join(parts[:2]).partition("@")
        return SourceSpec(repo_id=repo, filename="/".join(parts[2:]), revision=rev or None)
    path = Path(text).expanduser()
    if path.exists():
        return SourceSpec(path=path)
    looks_like_repo = text.count("/") == 1 and not text.startswith((".", "/", "~")) and " " not in text
    if looks_like_repo and not path.suffix:
        repo, _, rev = text.partition("@")
        return SourceSpec(repo_id=repo, filename=DEFAULT_FILES[kind], revision=rev or None)
    raise ModelSourceError(
        f"{kind} file {text!r} does not exist",
        hint="give a local path, hf://org/repo/file, or a Hugging Face repo id such as " + MODELS["v2"],
    )


def resolve(
    source: str | os.PathLike,
    kind: str = "model",
    *,
    cache_dir: str | os.PathLike | None = None,
    local_only: bool | None = None,
) -> Path:
    """A local file path for `source`, downloading into the huggingface_hub cache if needed."""
    spec = parse_source(source, kind)
    if spec.path is not None:
        if not spec.path.is_file():
            raise ModelSourceError(f"{spec.path} is not a file")
        return spec.path
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo_id, filename = str(spec.repo_id), str(spec.filename)  # a spec without a path has both
    cache = None if cache_dir is None else str(cache_dir)

    def download(local_files_only: bool = False) -> Path:
        return Path(
            hf_hub_download(
                repo_id, filename, revision=spec.revision, cache_dir=cache, local_files_only=local_files_only
            )
        )

    try:
        return download(local_files_only=True)
    except LocalEntryNotFoundError:
        pass
    except HFValidationError as e:
        raise ModelSourceError(f"bad repo id in {spec.describe()}: {e}") from e
    if local_only or (local_only is None and _offline()):
        raise _not_available(spec, cache_dir, reason="offline mode is on and it is not in the local cache")
    try:
        return download()
    except LocalEntryNotFoundError as e:  # the Hub cannot be reached (a subclass of EntryNotFoundError)
        raise _not_available(spec, cache_dir, reason="the Hugging Face Hub cannot be reached") from e
    except (RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError) as e:
        raise ModelSourceError(f"{spec.describe()} does not exist on the Hub ({type(e).__name__})") from e
    except OSError as e:  # network errors from the HTTP stack are OSError subclasses
        raise _not_available(spec, cache_dir, reason=f"download failed: {e}") from e


def _not_available(spec: SourceSpec, cache_dir, reason: str) -> ModelSourceError:
    from huggingface_hub import constants

    where = cache_dir or constants.HF_HUB_CACHE
    return ModelSourceError(
        f"{spec.describe()} is not available: {reason} (looked in the cache at {where})",
        hint=(
            "pass a local file path instead, or pre-fill the cache on a machine with network "
            f"(`hf download {spec.repo_id} {spec.filename}`) and copy it to {where} (or set HF_HOME)"
        ),
    )
