"""The engine knows no int4: no engine module outside quant/ and hardware/ imports engine.quant.

Two checks: every import statement of every engine module, function-local ones included, resolved
to its absolute name (ast); and importing every engine module in a fresh interpreter leaves quant
unloaded. irodori_speaker.engine.kernels (shared by both) imports neither of them.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import irodori_speaker

PACKAGE = Path(irodori_speaker.__file__).parent


def _modules(sub: str) -> dict[str, Path]:
    """Dotted name -> file of every module under irodori_speaker.<sub>."""
    out = {}
    for path in sorted((PACKAGE / sub).rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(name: str, path: Path) -> set[str]:
    """Absolute names of everything the module imports (at any depth of its code)."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)  # `from . import quant`
    return found


def _offenders(sub: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{name} imports {imp}"
        for name, path in _modules(sub).items()
        if not any(name == f or name.startswith(f + ".") for f in forbidden)
        for imp in _imports(name, path)
        if any(imp == f or imp.startswith(f + ".") for f in forbidden)
    )


def test_no_engine_module_imports_quant():
    modules = _modules("engine")
    assert "irodori_speaker.engine.fast" in modules and "irodori_speaker.engine.codec.model" in modules
    quant_side = ("irodori_speaker.engine.quant", "irodori_speaker.engine.hardware")
    assert _offenders("engine", quant_side) == []


def test_the_kernel_helpers_import_neither_engine_nor_quant():
    kernels = "irodori_speaker.engine.kernels"
    bad = sorted(
        f"{name} imports {imp}"
        for name, path in _modules("engine/kernels").items()
        for imp in _imports(name, path)
        if imp.startswith("irodori_speaker.") and not imp.startswith(kernels)
    )
    assert bad == []


def test_the_import_walk_sees_relative_and_local_imports(tmp_path):
    """The checker itself: a function-local `from ..quant import x` one package down is caught."""
    mod = tmp_path / "m.py"
    mod.write_text(
        "def f():\n    from ..quant.layers import Int4Linear\n    import irodori_speaker.engine.quant\n"
    )
    found = _imports("irodori_speaker.engine.codec.m", mod)
    assert "irodori_speaker.engine.quant.layers" in found and "irodori_speaker.engine.quant" in found


def test_importing_every_engine_module_loads_no_quant():
    quant_side = ("irodori_speaker.engine.quant", "irodori_speaker.engine.hardware")
    names = sorted(n for n in _modules("engine") if not n.startswith(quant_side))
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.startswith('irodori_speaker.engine.quant')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout
