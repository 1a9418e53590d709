"""The house along the data path: no import circle, no import up a floor, imports at the top.

The package's wings stand on floors, bottom up (docs/architecture.md draws them):

    errors, cancel, dirs -> audio -> options -> text -> engine -> synthesis -> cache
    -> timing, outputs -> speaker, server -> cli

A module imports its own wing or wings on lower floors, never a higher one, and no set of modules
imports each other in a loop. Every import statement counts, function-local and TYPE_CHECKING ones
included (a loop through a local import is still a loop). Function-local imports are allowed only
where `LOCAL_IMPORTS` says why: the torch-free rule (a bot imports the Speaker without torch) and
optional extras. `python tests/test_house.py` prints the figures (modules per floor, circles,
upward imports, the largest classes).
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "irodori_speaker"

#: Floors, bottom up: a module may import only its own floor or lower ones. Inside the engine, the
#: kernels are under the model code, which knows nothing of int4 (quant) or of the device presets
#: (hardware, which pick the quantised layers).
FLOORS: list[tuple[str, ...]] = [
    # "": the root, whose only import is errors (its names load lazily)
    ("errors", "cancel", "lanes", "dirs", ""),
    ("audio",),  # numpy signal helpers; the options parse control values with them
    ("options",),
    ("text",),
    ("engine.kernels",),
    ("engine",),
    ("engine.quant",),
    ("engine.hardware",),
    ("synthesis",),
    ("cache",),
    ("timing", "outputs"),
    ("speaker", "server"),
    ("cli",),
]

TORCH_FREE = (
    "torch-free rule: a bot imports this without torch (tests/test_torch_free.py); torch loads with the model"
)
OFFLINE = " (offline hints and `models` read no tensor)"
CLI = "the command line imports what a command needs when it runs: --help and argument errors stay instant"

#: Wings whose every module may import inside functions, and why.
LOCAL_WINGS = {f"{PACKAGE}.cli": CLI}

#: Function-local imports of the package's own modules: importer -> {imported module: why}. Anything
#: else is imported at the top of its module.
LOCAL_IMPORTS: dict[str, dict[str, str]] = {
    "irodori_speaker.cache.prebuild": {"irodori_speaker.synthesis.voices": TORCH_FREE},
    "irodori_speaker.engine.sources": {
        "irodori_speaker.engine.checkpoint": TORCH_FREE + OFFLINE,
        "irodori_speaker.text.backbone_tokenizer": TORCH_FREE + OFFLINE,
    },
    "irodori_speaker.engine.hardware.owner": {
        "irodori_speaker.engine.encoders": TORCH_FREE + " (the owner starts its thread with the lines)"
    },
    "irodori_speaker.server.config": {
        "irodori_speaker.synthesis.voices": TORCH_FREE + " (the Ray driver builds settings without torch)"
    },
    "irodori_speaker.speaker.facade": {"irodori_speaker.synthesis.voices": TORCH_FREE},
    "irodori_speaker.speaker.settings": {"irodori_speaker.synthesis.loading": TORCH_FREE},
    "irodori_speaker.synthesis.load_options": {"irodori_speaker.engine.hardware.presets": TORCH_FREE},
    "irodori_speaker.text": {"irodori_speaker.text.tokenizer": TORCH_FREE + " (a lazy name of the package)"},
}

#: Third-party modules a function may import where it needs them: optional extras and heavy loads.
#: The standard library and light dependencies are imported at the top.
LOCAL_THIRD_PARTY: dict[str, str] = {
    "torch": TORCH_FREE,
    "safetensors": "safetensors.torch loads torch (torch-free rule)",
    "triton": "optional extra [cuda]",
    "sounddevice": "optional extra [audio]: PortAudio may be missing",
    "pyworld": "optional extra [controls]",
    "pyopenjtalk": "optional extra [ja]",
    "e2k": "optional extra [english]",
    "yaml": "optional extra [yaml]",
    "tomli": "optional extra on Python < 3.11",
    "tomllib": "standard library from Python 3.11 only (tomli before)",
    "fastapi": "optional extra [serve]",
    "uvicorn": "optional extra [serve]",
    "av": "optional extra [serve]",
    "prometheus_client": "optional extra [serve]",
    "ray": "optional extra [ray]",
    "websockets": "optional extra [vts]",
    "huggingface_hub": "loads requests and friends (~0.3 s): only when a model is fetched",
    "pyloudnorm": "loads scipy (~0.3 s): only when a reference voice is measured",
}


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


class Import:
    def __init__(self, target: str, line: int, local: bool, type_only: bool) -> None:
        self.target, self.line, self.local, self.type_only = target, line, local, type_only


def imports_of(name: str, path: Path, known: dict[str, Path]) -> list[Import]:
    """Every import of the package's own modules that `name` makes, resolved to a module name."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, local: bool, type_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            is_def = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            is_tc = isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.split(".")[0] == PACKAGE:
                        found.append(Import(_module(alias.name, known), child.lineno, local, type_only))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                if target.split(".")[0] != PACKAGE:
                    continue
                subs = [f"{target}.{a.name}" for a in child.names if f"{target}.{a.name}" in known]
                if len(subs) < len(child.names):  # names from the module itself
                    found.append(Import(_module(target, known), child.lineno, local, type_only))
                found.extend(Import(s, child.lineno, local, type_only) for s in subs)
            visit(child, local or is_def, type_only or is_tc)

    visit(tree, False, False)
    return [i for i in found if i.target != name]


def _module(dotted: str, known: dict[str, Path]) -> str:
    while dotted not in known and "." in dotted:
        dotted = dotted.rpartition(".")[0]
    return dotted


def floor_of(name: str) -> int:
    rel = name[len(PACKAGE) + 1 :] if name != PACKAGE else ""
    best, best_len = -1, -1
    for i, wings in enumerate(FLOORS):
        for wing in wings:
            if (rel == wing or rel.startswith(wing + ".") or wing == "") and len(wing) > best_len:
                best, best_len = i, len(wing)
    return best


def graph() -> tuple[dict[str, Path], dict[str, list[Import]]]:
    known = modules()
    return known, {name: imports_of(name, path, known) for name, path in known.items()}


def circles(edges: dict[str, list[Import]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for imp in edges.get(v, []):
            w = imp.target
            if w not in edges:
                continue
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in edges:
        if v not in index:
            strong(v)
    return out


def upward(edges: dict[str, list[Import]]) -> list[str]:
    return sorted(
        f"{name}:{imp.line} imports {imp.target}"
        for name, imps in edges.items()
        for imp in imps
        if floor_of(imp.target) > floor_of(name)
    )


def local_imports(edges: dict[str, list[Import]]) -> list[str]:
    """Function-local imports of the package's own modules that no rule allows."""
    return sorted(
        f"{name}:{imp.line} imports {imp.target}"
        for name, imps in edges.items()
        if not _in_local_wing(name)
        for imp in imps
        if imp.local and imp.target not in LOCAL_IMPORTS.get(name, {})
    )


def _in_local_wing(name: str) -> bool:
    return any(name == wing or name.startswith(wing + ".") for wing in LOCAL_WINGS)


def local_third_party(known: dict[str, Path]) -> list[str]:
    """Function-local imports of other modules (standard library included) that no rule allows."""
    bad = []
    for name, path in known.items():
        if _in_local_wing(name):
            continue
        for node in _local_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level:
                continue
            top = (node.names[0].name if isinstance(node, ast.Import) else node.module or "").split(".")[0]
            if top != PACKAGE and top not in LOCAL_THIRD_PARTY:
                bad.append(f"{name}:{node.lineno} imports {top}")
    return sorted(bad)


def _local_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += [n for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return list({id(n): n for n in found}.values())


def test_every_module_stands_on_a_floor():
    known, _ = graph()
    assert [n for n in known if floor_of(n) < 0] == []


def test_no_import_circle():
    _, edges = graph()
    assert circles(edges) == []


def test_no_import_runs_up_a_floor():
    _, edges = graph()
    assert upward(edges) == []


def test_imports_are_at_the_top_unless_listed():
    known, edges = graph()
    assert local_imports(edges) == []
    assert local_third_party(known) == []


def test_every_listed_local_import_is_still_made():
    """The list shrinks with the code: an entry nothing makes any more is an error."""
    _, edges = graph()
    made = {(name, imp.target) for name, imps in edges.items() for imp in imps if imp.local}
    stale = [(m, t) for m, targets in LOCAL_IMPORTS.items() for t in targets if (m, t) not in made]
    assert stale == []


def test_the_top_level_holds_few_modules():
    top = sorted(p.name for p in (ROOT / PACKAGE).glob("*.py"))
    assert len(top) <= 6, top


def test_the_checks_can_fail(tmp_path):
    """The walk itself: a relative, a function-local and a TYPE_CHECKING import are all seen, an
    upward one is reported and a loop is a circle."""
    pkg = tmp_path / PACKAGE
    (pkg / "text").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "text" / "__init__.py").write_text("")
    (pkg / "text" / "a.py").write_text("def f():\n    from ..speaker import x\n")
    (pkg / "options.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .text import a\n"
    )
    known = {
        f"{PACKAGE}.text.a": pkg / "text" / "a.py",
        f"{PACKAGE}.options": pkg / "options.py",
        f"{PACKAGE}.speaker": pkg / "speaker.py",
    }
    a = imports_of(f"{PACKAGE}.text.a", known[f"{PACKAGE}.text.a"], known)
    assert [(i.target, i.local) for i in a] == [(f"{PACKAGE}.speaker", True)]
    o = imports_of(f"{PACKAGE}.options", known[f"{PACKAGE}.options"], known)
    assert [(i.target, i.type_only) for i in o] == [(f"{PACKAGE}.text.a", True)]
    edges = {f"{PACKAGE}.text.a": a, f"{PACKAGE}.options": o}
    assert upward(edges) == [
        f"{PACKAGE}.options:3 imports {PACKAGE}.text.a",
        f"{PACKAGE}.text.a:2 imports {PACKAGE}.speaker",
    ]
    edges[f"{PACKAGE}.speaker"] = [Import(f"{PACKAGE}.text.a", 1, False, False)]
    assert circles(edges) == [[f"{PACKAGE}.speaker", f"{PACKAGE}.text.a"]]


def _largest_classes(known: dict[str, Path], n: int = 8) -> list[tuple[int, int, str]]:
    rows = []
    for name, path in known.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                methods = sum(isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) for b in node.body)
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                rows.append((lines, methods, f"{name}.{node.name}"))
    return sorted(rows, reverse=True)[:n]


if __name__ == "__main__":
    known, edges = graph()
    per_floor: dict[int, int] = defaultdict(int)
    for name in known:
        per_floor[floor_of(name)] += 1
    top = sorted(p.name for p in (ROOT / PACKAGE).glob("*.py"))
    print(f"modules: {len(known)}; top level: {len(top)} ({', '.join(top)})")
    print(
        "modules per floor:",
        ", ".join(f"{'/'.join(FLOORS[f]) or 'root'} {c}" for f, c in sorted(per_floor.items())),
    )
    print(f"circles: {len(circles(edges))}", *circles(edges), sep="\n  ")
    print(f"upward imports: {len(upward(edges))}", *upward(edges), sep="\n  ")
    locals_ = [i for imps in edges.values() for i in imps if i.local]
    print(f"function-local imports of the package: {len(locals_)}")
    print("largest classes (lines, methods):", *_largest_classes(known), sep="\n  ")
