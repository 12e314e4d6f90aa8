"""The library's shape: subpackages in rings that import one way, no import circles, an exact core that needs no
torch, and no function too long to read in one sitting.

These read the source (``ast``); apart from the torch-free import, they import nothing. A circle counts imports
made inside functions too, since a lazy import is still a dependency that a reader must follow both ways.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import speculative

PACKAGE = Path(speculative.__file__).parent
MODULES = {".".join(path.relative_to(PACKAGE).with_suffix("").parts): path for path in PACKAGE.rglob("*.py")
           if "__pycache__" not in path.parts}
#: the subpackages, lowest ring first: each imports only from rings below it
RINGS = ["exact", "sampling", "engine", "training", "measure", "audit", "book"]
#: the measuring, analysis and report modules, and the CLI with its options, are held to shorter functions
OUTER_RING = ("measure.", "cli", "options")
#: the most lines a module may have (the CLI: fewer, since it only parses and dispatches)
MODULE_LINES, CLI_LINES = 600, 400


def _imports(path: Path) -> set[str]:
    """The package's modules (dotted, below ``speculative``) that ``path`` imports, at module level or inside
    functions; ``from speculative.x import y`` counts y when it is a module, else x."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("speculative"):
            base = node.module.split(".", 1)[1] if "." in node.module else ""
            for alias in node.names:
                child = f"{base}.{alias.name}" if base else alias.name
                found.add(child if child in MODULES else base)
    return found & set(MODULES)


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Return one cycle per strongly connected group of more than one node (or a node importing itself)."""
    cycles, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for other in sorted(graph.get(node, ())):
            if state.get(other) == "open":
                cycles.append(path[path.index(other):] + [other])
            elif other not in state:
                visit(other, path + [other])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def test_the_cycle_finder_finds_a_cycle():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_the_library_is_in_subpackages():
    packages = {name.split(".")[0] for name in MODULES if "." in name}
    assert set(RINGS) <= packages and len(packages) >= 5
    flat = {name for name in MODULES if "." not in name} - {"__init__", "__main__", "cli", "options", "defaults"}
    assert not flat, f"modules outside every subpackage: {flat}"


def test_no_module_of_the_library_imports_itself_back():
    graph = {name: _imports(path) - {name} for name, path in MODULES.items() if not name.endswith("__init__")}
    assert import_cycles(graph) == []


def test_the_rings_import_one_way():
    for name, path in MODULES.items():
        ring = name.split(".")[0]
        if ring not in RINGS:
            continue
        for other in _imports(path):
            other_ring = other.split(".")[0]
            if other_ring in RINGS:
                assert RINGS.index(other_ring) <= RINGS.index(ring), f"{name} (ring {ring}) imports {other}"
            else:
                assert other in ("defaults", "__init__"), f"{name} imports {other}, outside the rings"


def test_nothing_in_the_library_imports_the_books_glue():
    for name, path in MODULES.items():
        if name.split(".")[0] in ("book", "cli", "options", "__main__"):
            continue
        assert not {m for m in _imports(path) if m.startswith("book")}, f"{name} imports the book's glue"


def test_the_exact_core_imports_without_torch():
    exact = sorted(f"speculative.{name}" for name in MODULES if name.startswith("exact."))
    assert len(exact) >= 3
    code = ("import sys; sys.modules['torch'] = None\n"
            f"import {', '.join(exact)}\n"
            "assert 'torch' not in {m.split('.')[0] for m in sys.modules if sys.modules[m] is not None}")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-500:]
    blocked = subprocess.run([sys.executable, "-c", code.replace(exact[-1], "speculative.sampling.transforms")],
                             capture_output=True, text=True)
    assert blocked.returncode != 0  # the same check fails on a module that needs torch


def _body_lines(function: ast.FunctionDef) -> int:
    """Lines of a function's body, its docstring left out."""
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return body[-1].end_lineno - body[0].lineno + 1 if body else 0


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_function_is_too_long_to_read(name):
    limit = 80 if name.startswith(OUTER_RING) else 100
    tree = ast.parse(MODULES[name].read_text())
    long = {node.name: _body_lines(node) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _body_lines(node) > limit}
    assert not long, f"{name}: functions over {limit} lines of body: {long}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_is_too_long_to_find_ones_way_in(name):
    limit = CLI_LINES if name == "cli" else MODULE_LINES
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= limit, f"{name}: {lines} lines, over {limit}"


def test_every_name_the_package_exports_resolves():
    missing = [name for name in speculative.__all__ if name != "__version__"
               and not callable(getattr(speculative, name, None))]
    assert not missing, f"speculative.__all__ names what cannot be imported: {missing}"
