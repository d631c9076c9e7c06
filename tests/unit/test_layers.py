"""The package layout is the architecture: each layer imports only from itself and layers below.

Read statically (ast), so a lazy import inside a function counts as much as one at the top: a
dependency is a dependency, whenever it is paid.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "zerospec"
LAYERS = ["paper", "model", "runtime", "comm", "cluster", "optim", "zero", "zero_r", "offload", "training",
          "render", "plan", "evaluation", "report", "testing", "cli"]
# bottom to top; zerospec/__init__ and __main__ (the public face) sit above


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else len(LAYERS)


@functools.cache   # three tests read every module's imports: each file is parsed once a run
def imports(path: Path) -> frozenset[str]:
    """The zerospec modules ``path`` imports, inside functions too (``from pkg import sub`` resolves
    to ``pkg.sub``)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("zerospec")}
        elif isinstance(node, ast.Call) and dynamic_import(node):   # importlib.import_module("…")
            out.add(node.args[0].value)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("zerospec"):
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.add(sub if sub in MODULES else target)
    return frozenset(out)


def dynamic_import(node: ast.Call) -> bool:
    """``importlib.import_module("zerospec…")`` or ``__import__("zerospec…")``: an import too."""
    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
    return (name in ("import_module", "__import__") and node.args
            and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith("zerospec"))


FILES = sorted(ROOT.rglob("*.py"))
MODULES = {module_name(p): p for p in FILES}


def test_every_package_is_a_named_layer():
    """A new package must be placed in LAYERS: otherwise it would silently count as the top."""
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages == set(LAYERS), f"packages not in LAYERS: {sorted(packages - set(LAYERS))}; " \
                                    f"layers with no package: {sorted(set(LAYERS) - packages)}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: module_name(p))
def test_a_module_imports_no_layer_above_its_own(path):
    """No upward import: a layer uses only itself and the layers below it (README, "Layout")."""
    me = module_name(path)
    up = sorted(m for m in imports(path) if layer(m) > layer(me))
    assert not up, f"{me} (layer {layer(me)}) imports from a higher layer: {up}; layers: {LAYERS}"


@pytest.mark.parametrize("path", [p for p in FILES if layer(module_name(p)) != LAYERS.index("testing")],
                         ids=lambda p: module_name(p))
def test_the_library_never_imports_the_testing_oracles(path):
    """zerospec.testing (oracles, fault hooks) is for tests; no library module imports it."""
    bad = sorted(m for m in imports(path) if m.startswith("zerospec.testing"))
    assert not bad, f"{module_name(path)} imports {bad}"


def test_there_is_no_import_cycle():
    """Imports form a DAG, those inside functions included: a cycle held together by an import
    placed inside a function works by the order of calls, not by design."""
    graph = {m: {t for t in imports(p) if t in MODULES and t != m} for m, p in MODULES.items()}
    state: dict[str, int] = {}   # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(t):] + [m, t]))
            if t not in state:
                visit(t, path + [m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
