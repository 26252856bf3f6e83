"""The house drawn from the import graph: the code flows strictly downward (kernels -> ops -> layers -> models
-> shared plumbing -> tasks -> command line), with no import cycle and no upward import, lazy imports
included; and the re-export lists of the package's floors agree."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The floor of every part of the package, bottom up; a module may import its own floor and those below.
FLOORS = [
    ("fastqa._version", "fastqa.errors", "fastqa._checks", "fastqa.bounds", "fastqa.reference"),
    ("fastqa._C", "fastqa.triton_kernels"),  # the kernels: the C++ extension and the Triton kernels
    ("fastqa._backend", "fastqa.ops"),
    ("fastqa.layers",),
    ("fastqa.models",),
    ("fastqa.data",),        # with the run log's format (data.metrics), which the loop writes and plots reads
    ("fastqa.plots",),       # every figure; the loop draws curve.png with it
    ("fastqa.train",),
    ("fastqa.export",),      # slim exports of any task's run (model-agnostic)
    ("fastqa.pretrained",),  # the shipped models by name, read through fastqa.export
    ("fastqa.tasks",),
    ("fastqa.serve",),  # the HTTP API over the tasks' models
    ("fastqa.cli", "fastqa.__main__"),
]
# The package's own __init__ re-exports the kernel half (ops, layers, reference) for `import fastqa` users.
PACKAGE_INIT_FLOOR = 3


def _module_name(path: Path) -> str:
    if path.is_relative_to(ROOT / "triton_kernels"):
        parts = ("fastqa", "triton_kernels", *path.relative_to(ROOT / "triton_kernels").with_suffix("").parts)
    else:
        parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, Path]:
    files = list((ROOT / "fastqa").rglob("*.py")) + list((ROOT / "triton_kernels").rglob("*.py"))
    return {_module_name(p): p for p in files}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The fastqa modules ``name`` imports anywhere in its body (lazy imports too), with the parent packages each
    import loads."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            # `from pkg import mod` imports pkg.mod; `from pkg import name` imports pkg itself.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for t in targets:
            if t in known and t != name:
                found.add(t)
            # Importing a.b.c runs a/__init__ and a/b/__init__ first: a parent package's imports are this
            # module's too (those of its own parents are loaded already, before this module runs).
            parts = t.split(".")
            for i in range(1, len(parts)):
                parent = ".".join(parts[:i])
                if parent in known and not (name + ".").startswith(parent + "."):
                    found.add(parent)
    return found


def _floor(name: str) -> int:
    if name == "fastqa":
        return PACKAGE_INIT_FLOOR
    best = None
    for i, prefixes in enumerate(FLOORS):
        for p in prefixes:
            if name == p or name.startswith(p + "."):
                if best is None or len(p) > best[1]:
                    best = (i, len(p))
    if best is None:
        raise AssertionError(f"{name}: on no floor of FLOORS (add it)")
    return best[0]


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    sources = _sources()
    known = set(sources) | {"fastqa._C"}
    return {**{name: _imports(name, path, known) for name, path in sources.items()}, "fastqa._C": set()}


def test_every_import_points_down(graph):
    upward = []
    for name, targets in graph.items():
        own = PACKAGE_INIT_FLOOR if name == "fastqa" else _floor(name)
        upward += [f"{name} -> {t}" for t in targets if _floor(t) > own]
    assert not upward, "upward imports:\n" + "\n".join(sorted(upward))


def test_no_import_cycle(graph):
    # Edges to a package's own __init__ from inside it are how Python loads packages, not a design cycle.
    def edges(name):
        return {t for t in graph[name] if not name.startswith(t + ".")}

    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for t in edges(n):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(t):] + [t]))
            if t not in state:
                visit(t)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)


def test_reexport_lists_agree():
    import fastqa.layers
    import fastqa.ops
    import fastqa.reference

    ops = set(fastqa.ops.__all__)
    top = {n for n in fastqa.__all__ if callable(getattr(fastqa, n)) and n not in ("info",)}
    assert top <= ops, f"fastqa re-exports what fastqa.ops does not: {sorted(top - ops)}"
    functional = {n for n in ops if not n[0].isupper()}
    assert functional <= set(dir(fastqa)), f"ops missing from fastqa: {sorted(functional - set(dir(fastqa)))}"
    # Every layer module has its reference twin, and every reference functional op is a fastqa op.
    layers = {n for n in fastqa.layers.__all__ if n[0].isupper()}
    ref_layers = {n for n in fastqa.reference.__all__ if n[0].isupper()}
    assert layers <= ref_layers, f"layers without a reference module: {sorted(layers - ref_layers)}"
    for module in (fastqa, fastqa.ops, fastqa.layers, fastqa.reference):
        missing = [n for n in module.__all__ if not hasattr(module, n)]
        assert not missing, f"{module.__name__}.__all__ names what it lacks: {missing}"


def test_an_import_loads_its_parent_packages(tmp_path):
    # plots importing train.curves also runs fastqa/train/__init__ (whose imports then count as the importer's);
    # the importer's own parents are loaded already and are no edge.
    source = tmp_path / "plots.py"
    source.write_text("def draw():\n    from .train.curves import read_metrics\n")
    known = {"fastqa", "fastqa.plots", "fastqa.train", "fastqa.train.curves"}
    assert _imports("fastqa.plots", source, known) == {"fastqa.train", "fastqa.train.curves"}
