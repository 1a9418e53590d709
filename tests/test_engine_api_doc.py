"""docs/engine-api.md stays true: its runnable example runs, and the names it shows exist.

tests/test_docs_commands.py runs the docs' shell commands; the python blocks of this doc are
checked here: the block under "A whole line on the tiny models" runs as written (offline, the
tiny-random files built into a fresh IRODORI_CACHE), every `irodori_speaker...` path and
import it names resolves, the methods it calls on the model, codec and conditions exist, and
every sampler option and family is named.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path

import pytest

from irodori_speaker.engine.checkpoint import LoadedModel
from irodori_speaker.engine.codec import DACVAE
from irodori_speaker.engine.config import InferenceConfig, ModelConfig
from irodori_speaker.engine.model import Conditions, TextToLatentRFDiT
from irodori_speaker.options import SamplerConfig

DOC = Path(__file__).resolve().parents[1] / "docs" / "engine-api.md"
TEXT = DOC.read_text(encoding="utf-8")
PYTHON = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
EXAMPLE_HEADING = "## A whole line on the tiny models (runnable)"


def python_blocks() -> list[tuple[int, str]]:
    """(first line, code) of each python block of the doc."""
    return [(TEXT.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in PYTHON.finditer(TEXT)]


def example_block() -> tuple[int, str]:
    start = TEXT.index(EXAMPLE_HEADING)
    end = TEXT.find("\n## ", start + len(EXAMPLE_HEADING))
    blocks = [(line, code) for line, code in python_blocks() if start < TEXT.index(code) < end]
    assert len(blocks) == 1, "the example section must hold exactly one python block"
    return blocks[0]


def test_the_example_runs_for_rf_and_meanflow_families(irodori_home, capsys):
    line, code = example_block()
    # compiled with blank lines before it, so a traceback names the doc's own line numbers
    exec(compile("\n" * (line - 1) + code, str(DOC), "exec"), {"__name__": "engine_api_doc"})
    families = [row.split()[0] for row in capsys.readouterr().out.splitlines()]
    assert {"v2", "v4.1-mf"} <= set(families), families


def resolve_dotted(path: str) -> object:
    """`a.b.c.name` -> the object: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(path)


def test_every_import_and_dotted_path_resolves():
    names = set()
    for _, code in python_blocks():
        for module, imported in re.findall(r"^from (irodori_speaker[\w.]*) import ([\w, ]+)$", code, re.M):
            names |= {f"{module}.{n.strip()}" for n in imported.split(",")}
    # dotted paths in the prose: `irodori_speaker.x.y` and the short `engine.x.y` / `audio.x.y`
    for path in re.findall(r"`((?:irodori_speaker|engine|audio|text)\.[\w.]*\w)", TEXT):
        names.add(path if path.startswith("irodori_speaker") else f"irodori_speaker.{path}")
    assert len(names) > 20
    missing = []
    for name in sorted(names):
        try:
            resolve_dotted(name)
        except (ImportError, AttributeError) as e:
            missing.append(f"{name} ({e})")
    assert not missing, missing


@pytest.mark.parametrize(
    ("prefix", "cls"),
    [
        ("model", TextToLatentRFDiT),
        ("codec", DACVAE),
        ("conds", Conditions),
        ("Conditions", Conditions),
        ("loaded", LoadedModel),
    ],
)
def test_the_methods_and_attributes_shown_exist(prefix, cls):
    used = attributes_of(prefix)
    assert used, prefix
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    assert not {n for n in used if not hasattr(cls, n) and n not in fields}


def test_config_attributes_shown_exist():
    for prefix, cls in (("cfg", ModelConfig), ("inference", InferenceConfig)):
        used = attributes_of(prefix)
        fields = {f.name for f in dataclasses.fields(cls)}
        assert used and not {n for n in used if not hasattr(cls, n) and n not in fields}, (prefix, used)


def attributes_of(name: str) -> set[str]:
    """What the doc reads off a variable `name` (`model.velocity`, not `model.safetensors`)."""
    return set(re.findall(rf"(?<![\w./]){name}\.(\w+)", TEXT)) - {"safetensors"}


def test_every_sampler_option_and_family_is_named():
    options = [f.name for f in dataclasses.fields(SamplerConfig)]
    assert not [o for o in options if f"`{o}`" not in TEXT and f"`{o} / " not in TEXT]
    # every value of ModelConfig.family
    families = {"v2", "v2-voicedesign", "v3", "v3-voicedesign", "v4", "v4.1-mf", "v4-large"}
    assert not [f for f in families if f"`{f}`" not in TEXT]
