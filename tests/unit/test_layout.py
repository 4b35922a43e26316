"""The package's layout rules, checked on the code: the LMS planner is TensorFlow-free and
never reaches into the runtime, and no modules import each other in a circle."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "brats_seg"


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at its top or inside a function (absolute names)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _module(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def test_the_planner_imports_no_tensorflow_and_not_the_runtime():
    """Statically (any import, even inside a function) and at run time (a fresh interpreter)."""
    offenders = []
    for path in sorted((PACKAGE / "lms" / "planner").glob("*.py")):
        for name in _imports(path):
            if name.split(".")[0] in ("tensorflow", "keras") or name.startswith("brats_seg.lms.runtime"):
                offenders.append(f"{path.relative_to(REPO)} imports {name}")
    assert not offenders, "\n".join(offenders)
    code = ("import sys, brats_seg.lms.planner, brats_seg.lms.planner.preflight; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras') "
            "or m.startswith('brats_seg.lms.runtime')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_no_import_circles_between_modules():
    """Module-level and function-level imports alike: a circle hidden in a function is still one."""
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        graph[name] = {m for m in _imports(path) if m in modules and m != name
                       and not name.startswith(m + ".")}  # a module's own package face is not an arrow
    # Tarjan's strongly connected components
    index, low, stack, on, circles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
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
                circles.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    assert not circles, f"modules importing each other in a circle: {circles}"


#: Modules at the very bottom: standard library (and psutil) only, importable by anyone (config.py included).
LEAVES = ("brats_seg.choices", "brats_seg.signals", "brats_seg.memory", "brats_seg.sweeps")


def test_config_and_data_import_nothing_above_them():
    """config.py is schemas only (no brats_seg import but the leaves), and script_configs.py, which
    config_reference.py and cli.py read, only adds config.py; data/ (phantoms included) takes only
    config, files, the leaves and itself; a leaf imports nothing of the package."""
    below_data = ("brats_seg.data", "brats_seg.config", "brats_seg.files", "brats_seg.locks", *LEAVES)
    offenders = [f"brats_seg/config.py imports {n}" for n in _imports(PACKAGE / "config.py")
                 if n.startswith("brats_seg") and not n.startswith(LEAVES)]
    offenders += [f"brats_seg/script_configs.py imports {n}" for n in _imports(PACKAGE / "script_configs.py")
                  if n.startswith("brats_seg") and not n.startswith(LEAVES)
                  and n.split(".")[:2] != ["brats_seg", "config"]]
    for leaf in LEAVES:
        path = PACKAGE / f"{leaf.split('.', 1)[1]}.py"
        offenders += [f"{path.relative_to(REPO)} imports {n}" for n in _imports(path) if n.startswith("brats_seg")]
    for path in sorted((PACKAGE / "data").rglob("*.py")):
        offenders += [f"{path.relative_to(REPO)} imports {n}" for n in _imports(path)
                      if n.startswith("brats_seg") and not n.startswith(below_data)]
    assert not offenders, "\n".join(offenders)
