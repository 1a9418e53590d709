"""Where model files come from: a local path, `hf://org/repo/file`, or a Hugging Face repo id.

Repo ids resolve through huggingface_hub into its cache. The cache is tried first
(no network); a download is tried only when the file is not there and offline mode
is off. With no network, the error says exactly what is missing and how to supply it.
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelSourceError

# Released files on the Hugging Face hub.
MODELS = {
    "v2": "Aratako/Irodori-TTS-500M-v2",
    "v2-voicedesign": "Aratako/Irodori-TTS-500M-v2-VoiceDesign",
    "v3": "Aratako/Irodori-TTS-500M-v3",
    "v3-voicedesign": "Aratako/Irodori-TTS-600M-v3-VoiceDesign",
    "v4": "Aratako/Irodori-TTS-v4-Small",
    "v4.1": "Aratako/Irodori-TTS-v4.1-Small",
    "v4.1-mf": "Aratako/Irodori-TTS-v4.1-Small-MF",
    "v4-large": "Aratako/Irodori-TTS-v4-Large",
    "lite-int4": "hf://kizuna-intelligence/Irodori-TTS-Lite-int4/dit_int4.safetensors",
}
#: The torchao copies (`<repo>-Quantized/<kind>/model.safetensors`, `tokenizer/` at repo level):
#: only their int8 weight-only folder is read (engine/torchao.py).
QUANTIZED_SUFFIX = "-Quantized"
INT8_FOLDER = "int8-weight-only"
QUANTIZED_REPOS = frozenset(MODELS[k] + QUANTIZED_SUFFIX for k in ("v4", "v4.1", "v4-large"))
#: Repos whose model ships its tokenizer in a `tokenizer/` folder beside it (v4 and later).
TOKENIZER_FOLDER_REPOS = frozenset(MODELS[k] for k in ("v4", "v4.1", "v4.1-mf", "v4-large")) | QUANTIZED_REPOS
#: The releases under the Gemma Terms of Use (their text encoder derives from T5Gemma 2).
GEMMA_REPOS = frozenset((MODELS["v4-large"], MODELS["v4-large"] + QUANTIZED_SUFFIX))
GEMMA_TERMS = (
    "Irodori-TTS v4-Large is licensed under the Gemma Terms of Use "
    "(https://ai.google.dev/gemma/terms) and the Gemma Prohibited Use Policy "
    "(https://ai.google.dev/gemma/prohibited_use_policy): its text encoder derives from "
    "T5Gemma 2; by using it you agree to them (every other Irodori-TTS release is MIT)"
)
#: An ungated copy of the Gemma 3 tokenizer folder, tried before google/t5gemma-2-* (gated on the Hub).
GEMMA_TOKENIZER_REPO = MODELS["v4-large"]
#: The files of such a folder a model needs (special_tokens_map.json is read when present).
FOLDER_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
#: What `say` / `Speaker()` / `load_synthesizer()` load with no model named: the 4-step MeanFlow
#: release (one forward per step, no CFG: the fastest family on every backend; docs/models.md).
DEFAULT_MODEL = "v4.1-mf"
CODEC_REPO = "Aratako/Semantic-DACVAE-Japanese-32dim"
TOKENIZER_REPO = "llm-jp/llm-jp-3-150m"
LITE_INT4_CODEC = "hf://kizuna-intelligence/Irodori-TTS-Lite-int4/dacvae_int4.safetensors"
#: Codec aliases: `--codec lite-int4` is the seed's int4 codec (read packed: quant/codec.py).
CODECS = {"lite-int4": LITE_INT4_CODEC}

# Suffixes that make `org/name.ext` a (missing) file rather than a repo id.
FILE_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".json", ".ckpt", ".gguf", ".onnx")

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
    if kind == "codec" and text in CODECS:
        text = CODECS[text]
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
        return SourceSpec(path=_model_file(path) if kind == "model" else path)
    if kind == "model" and _looks_like_alias(text):
        close = difflib.get_close_matches(text.lower(), list(MODELS), n=1, cutoff=0.6)
        raise ModelSourceError(
            f"unknown model alias {text!r}" + (f" (did you mean {close[0]}?)" if close else ""),
            hint=f"an alias is one of {', '.join(MODELS)}; or give a path, hf://org/repo/file or a repo id",
        )
    looks_like_repo = text.count("/") == 1 and not text.startswith((".", "/", "~")) and " " not in text
    # a dot in a repo name is fine (Irodori-TTS-v4.1-Small-MF); a file name ends in a known suffix
    if looks_like_repo and path.suffix.lower() not in FILE_SUFFIXES:
        repo, _, rev = text.partition("@")
        name = DEFAULT_FILES[kind]
        if kind == "model" and repo.endswith(QUANTIZED_SUFFIX):  # the one folder we read
            name = f"{INT8_FOLDER}/{name}"
        return SourceSpec(repo_id=repo, filename=name, revision=rev or None)
    raise ModelSourceError(
        f"{kind} file {text!r} does not exist",
        hint="give a local path, hf://org/repo/file, or a Hugging Face repo id such as "
        + MODELS[DEFAULT_MODEL],
    )


def _looks_like_alias(text: str) -> bool:
    """`v5`, `v4.1mf`, `V2`: a short word with no path in it, where a path or repo id has a slash."""
    return "/" not in text and os.sep not in text and Path(text).suffix.lower() not in FILE_SUFFIXES


def _model_file(path: Path) -> Path:
    """A local model source: a DiT .safetensors file, or a release folder holding model.safetensors;
    anything else (a WAV, a codec .pth, another folder) is "not a model checkpoint", before any
    other file is looked for. A damaged .safetensors file is the strict loader's to describe."""
    if path.is_dir():
        inside = path / DEFAULT_FILES["model"]
        if inside.is_file():
            return inside
        raise ModelSourceError(
            f"{path} is a folder, not a model checkpoint (no {DEFAULT_FILES['model']} in it)",
            hint="give the DiT's .safetensors file, or the release folder that holds model.safetensors",
        )
    if path.suffix.lower() == ".safetensors":  # the strict loader says what is wrong with one
        return path
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError as e:
        raise ModelSourceError(f"cannot read model file {path}: {e.strerror or e}") from e
    size = int.from_bytes(head[:8], "little") if len(head) == 9 else 0
    if not (head[8:9] == b"{" and 0 < size < 2**30):  # a safetensors file opens with its JSON header
        raise ModelSourceError(
            f"{path} is not a model checkpoint (not a .safetensors file)",
            hint="give the DiT's .safetensors file (docs/models.md), or an alias such as " + DEFAULT_MODEL,
        )
    return path


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
    if kind == "model":
        check_quantized_source(spec)
        if spec.repo_id in GEMMA_REPOS:
            note_gemma_terms()
    from huggingface_hub import hf_hub_download, try_to_load_from_cache
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo_id, filename = str(spec.repo_id), str(spec.filename)  # a spec without a path has both
    cache = None if cache_dir is None else str(cache_dir)
    # The cache first, read without any request (hf_hub_download(local_files_only=True) may still
    # fetch a registry from the Hub to build its user agent: a 3 s stall when offline).
    try:
        cached = try_to_load_from_cache(repo_id, filename, cache_dir=cache, revision=spec.revision)
    except HFValidationError as e:
        raise ModelSourceError(f"bad repo id in {spec.describe()}: {e}") from e
    if isinstance(cached, str):
        return Path(cached)
    if local_only or (local_only is None and _offline()):
        raise _not_available(spec, kind, cache_dir, reason="offline mode is on (HF_HUB_OFFLINE)")
    unreachable = hub_unreachable()
    if unreachable:
        raise _not_available(spec, kind, cache_dir, reason=unreachable)
    retries: list[str] = []
    try:
        with _retries_kept_quiet(retries):
            return Path(hf_hub_download(repo_id, filename, revision=spec.revision, cache_dir=cache))
    except LocalEntryNotFoundError as e:  # the Hub cannot be reached (a subclass of EntryNotFoundError)
        reason = "the Hugging Face Hub cannot be reached" + (f" ({len(retries)} retries)" if retries else "")
        raise _not_available(spec, kind, cache_dir, reason=reason) from e
    except (RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError) as e:
        raise ModelSourceError(f"{spec.describe()} does not exist on the Hub ({type(e).__name__})") from e
    except OSError as e:  # network errors from the HTTP stack are OSError subclasses
        raise _not_available(spec, kind, cache_dir, reason=f"download failed: {e}") from e


# ---- offline detection ------------------------------------------------------------------------

#: How long the one probe of the Hub may take before we call it unreachable.
PROBE_TIMEOUT_S = 3.0
_PROBE_TTL_S = 60.0
_probes: dict[str, tuple[float, str | None]] = {}


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def hub_unreachable() -> str | None:
    """None when the Hub answers one short request; else why not (cached for a minute).

    One HEAD request, at most PROBE_TIMEOUT_S: without it huggingface_hub retries each file
    for ~25 s and prints every retry. Any HTTP answer (even an error status) counts as reachable.
    """

    endpoint = hub_endpoint()
    now = time.monotonic()
    cached = _probes.get(endpoint)
    if cached is not None and now - cached[0] < _PROBE_TTL_S:
        return cached[1]
    reason: str | None = None
    try:
        urllib.request.urlopen(
            urllib.request.Request(endpoint, method="HEAD"), timeout=PROBE_TIMEOUT_S
        ).close()
    except urllib.error.HTTPError:
        pass  # it answered
    except (urllib.error.URLError, OSError, ValueError) as e:
        why = getattr(e, "reason", e)
        reason = f"the Hugging Face Hub at {endpoint} cannot be reached ({why})"
    _probes[endpoint] = (now, reason)
    return reason


@contextlib.contextmanager
def _retries_kept_quiet(retries: list[str]) -> Iterator[None]:
    """Keeps huggingface_hub's "Retrying in 1s [Retry 1/5]" lines (and the errors between them)
    off the user's terminal while a download runs; collects them in `retries`."""

    def keep(record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if "Retrying in" in msg or "thrown while requesting" in msg:
            retries.append(msg)
            return False
        return True

    names = [n for n in logging.root.manager.loggerDict if n.startswith("huggingface_hub")]
    loggers = [logging.getLogger(n) for n in {"huggingface_hub", *names}]
    for lg in loggers:
        lg.addFilter(keep)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(keep)


# ---- the error that names every missing file ----------------------------------------------------


class FilesNotAvailable(ModelSourceError):
    """One or more files are neither on disk nor in the hub cache, and cannot be downloaded now."""

    def __init__(self, missing: list[tuple[str, SourceSpec]], reason: str, cache: str) -> None:
        self.missing, self.reason, self.cache = missing, reason, cache
        names = ", ".join(f"{kind} {spec.describe()}" for kind, spec in missing)
        what = "is missing" if len(missing) == 1 else f"are missing ({len(missing)} files)"
        fetch = "; ".join(f"hf download {spec.repo_id} {spec.filename}" for _, spec in missing)
        folder = {
            kind: "FOLDER" if "tokenizer/" in (spec.filename or "") else "FILE" for kind, spec in missing
        }
        flags = " ".join(f"--{kind} {what}" for kind, what in folder.items())  # each flag once
        super().__init__(
            f"{names} {what}: {reason}; not in the Hugging Face cache at {cache}",
            hint=(
                f"on a machine with network run `{fetch}` and copy its ~/.cache/huggingface/hub to {cache} "
                f"(or set HF_HOME); or give local files ({flags}; in Python model=, codec=, tokenizer=)"
            ),
        )


def _not_available(spec: SourceSpec, kind: str, cache_dir, reason: str) -> FilesNotAvailable:
    from huggingface_hub import constants

    return FilesNotAvailable([(kind, spec)], reason, str(cache_dir or constants.HF_HUB_CACHE))


def resolve_files(
    model: str | os.PathLike,
    codec: str | os.PathLike,
    tokenizer: str | os.PathLike | None,
    *,
    cache_dir: str | os.PathLike | None = None,
    want_tokenizer: bool = True,
) -> tuple[Path, Path, Path | None]:
    """Model, codec and tokenizer files at once: when some are missing, ONE error names them all.

    The tokenizer defaults to the one the model's file names (its header is read, not the
    weights), else the released one. `want_tokenizer=False` (a tokenizer object was given)
    leaves it out. A `-Quantized` repo's int4 / fp8 folder is refused first, before any download.
    """
    try:
        model_spec: SourceSpec | None = parse_source(model, "model")
    except ModelSourceError:
        model_spec = None  # resolving it names the problem, beside any other missing file
    if model_spec is not None:
        check_quantized_source(model_spec)
    found: dict[str, Path] = {}
    errors: list[ModelSourceError] = []

    def attempt(source: str | os.PathLike, kind: str) -> None:
        try:
            found[kind] = resolve(source, kind, cache_dir=cache_dir)
        except ModelSourceError as e:
            errors.append(e)

    attempt(model, "model")
    if errors and not isinstance(errors[0], FilesNotAvailable):  # a bad model: no other file matters
        raise errors[0]
    attempt(codec, "codec")
    if want_tokenizer and tokenizer is not None and Path(tokenizer).expanduser().is_dir():
        found["tokenizer"] = Path(tokenizer).expanduser()  # a v4 tokenizer folder
    elif want_tokenizer and tokenizer is not None:
        attempt(tokenizer, "tokenizer")
    elif want_tokenizer:
        choices = _tokenizer_folder_sources(model, found.get("model"))
        if choices is None:
            attempt(_tokenizer_named_by(found.get("model")) or TOKENIZER_REPO, "tokenizer")
        else:  # the first folder whose files all resolve; else the first one's errors
            first_errors: list[ModelSourceError] | None = None
            for sources in choices:
                paths, failed = [], []
                for source in sources:
                    try:
                        paths.append(resolve(source, "tokenizer", cache_dir=cache_dir))
                    except ModelSourceError as e:
                        failed.append(e)
                if not failed:
                    found["tokenizer"] = paths[0]  # tokenizer.json: it stands for the folder
                    break
                first_errors = failed if first_errors is None else first_errors
            else:
                errors.extend(first_errors or [])
    if len(errors) == 1:
        raise errors[0]
    if errors and all(isinstance(e, FilesNotAvailable) for e in errors):
        first = errors[0]
        assert isinstance(first, FilesNotAvailable)
        missing = [m for e in errors if isinstance(e, FilesNotAvailable) for m in e.missing]
        raise FilesNotAvailable(missing, first.reason, first.cache)
    if errors:  # several problems of different kinds (a mistyped path, a file not in the cache)
        raise ModelSourceError("; ".join(str(e.args[0]) for e in errors), hint=errors[0].hint)
    return found["model"], found["codec"], found.get("tokenizer")


def check_quantized_source(spec: SourceSpec) -> None:
    """A `-Quantized` repo's file must be its int8 weight-only copy: its int4 (tile-packed) and
    fp8 folders are refused here, before any download, in one line."""
    repo, filename = spec.repo_id or "", spec.filename or ""
    if not repo.endswith(QUANTIZED_SUFFIX) or filename.startswith(f"{INT8_FOLDER}/"):
        return
    folder = filename.partition("/")[0] if "/" in filename else "its top level"
    raise ModelSourceError(
        f"{spec.describe()}: {folder} of a torchao -Quantized repo is not read; "
        f"supported: its {INT8_FOLDER}/model.safetensors (--model {repo})",
        hint="for 4-bit weights make our int4 with `irodori-speaker quantize` (from the float "
        "release or the int8 copy), or pass --int4 to quantise at load",
    )


_gemma_noted = False


def note_gemma_terms() -> None:
    """Name the Gemma Terms of Use once per process (a warning log line: never silently)."""
    global _gemma_noted
    if not _gemma_noted:
        _gemma_noted = True
        logging.getLogger("irodori_speaker.models").warning(GEMMA_TERMS)


def _pretrained_text(model_file: Path) -> tuple[str | None, str | None] | None:
    """(text_tokenizer_repo, text_encoder_revision) of a v4 model file; None for older files."""
    from .checkpoint import config_from_metadata, read_header

    try:
        cfg, _ = config_from_metadata(read_header(model_file)[0], str(model_file))
    except Exception:  # a bad file: loading it reports that, with the file's name
        return None
    return (cfg.text_tokenizer_repo, cfg.text_encoder_revision) if cfg.pretrained_text else None


def _tokenizer_folder_sources(
    model: str | os.PathLike, model_file: Path | None
) -> list[list[str | Path]] | None:
    """Where a v4 model's tokenizer folder may be, in order, each as its files (tokenizer.json
    first; docs/models.md): the `tokenizer/` beside the model file (or one level up), else the
    same places in the model's repo, else `text_tokenizer_repo` at `text_encoder_revision`.
    None for a model that does not use a tokenizer folder (v2, v3)."""
    from ..text.backbone_tokenizer import find_tokenizer_dir

    try:
        spec = parse_source(model, "model")
    except ModelSourceError:
        return None
    in_folder_repo = spec.repo_id in TOKENIZER_FOLDER_REPOS
    if model_file is None:  # not resolvable now: a known v4 repo still names its folder
        return _repo_folder(spec) if in_folder_repo else None
    text = _pretrained_text(model_file)
    if text is None and not in_folder_repo:
        return None
    folder = find_tokenizer_dir(model_file)
    if folder is not None:
        return [[folder / name for name in FOLDER_TOKENIZER_FILES]]
    if spec.repo_id is not None:
        return _repo_folder(spec)
    repo, revision = text or (None, None)
    if not repo:
        return None
    at = f"@{revision}" if revision else ""
    named: list[list[str | Path]] = [[f"hf://{repo}{at}/{name}" for name in FOLDER_TOKENIZER_FILES]]
    if repo.startswith("google/t5gemma-2"):  # gated on the Hub: the release's copy first
        release = SourceSpec(repo_id=GEMMA_TOKENIZER_REPO, filename=DEFAULT_FILES["model"])
        return _repo_folder(release) + named
    return named


def _repo_folder(spec: SourceSpec) -> list[list[str | Path]]:
    """`<dir of the model in its repo>/tokenizer/*`, then (for `sub/model.safetensors`) the
    repo's `tokenizer/*` (the other way round in a `-Quantized` repo), as hf:// sources."""
    sub = str(Path(spec.filename or "").parent)
    bases = [""] if sub in ("", ".") else [f"{sub}/", ""]
    if spec.repo_id in QUANTIZED_REPOS:  # their tokenizer/ sits at the repo's top level
        bases.reverse()
    at = f"@{spec.revision}" if spec.revision else ""
    return [
        [f"hf://{spec.repo_id}{at}/{base}tokenizer/{name}" for name in FOLDER_TOKENIZER_FILES]
        for base in bases
    ]


def _tokenizer_named_by(model_file: Path | None) -> str | None:
    if model_file is None:
        return None
    from .checkpoint import config_from_metadata, read_header

    try:
        cfg, _ = config_from_metadata(read_header(model_file)[0], str(model_file))
    except Exception:  # a bad file: loading it reports that, with the file's name
        return None
    return cfg.text_tokenizer_repo or None
