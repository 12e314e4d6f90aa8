"""The library's shape: no import circles, and no function too long to read in one sitting.

These read the source (``ast``); they import nothing. A circle counts imports made inside functions too,
since a lazy import is still a dependency that a reader must follow both ways.
"""

import ast
from pathlib import Path

import pytest

import speculative

PACKAGE = Path(speculative.__file__).parent
MODULES = {path.stem: path for path in PACKAGE.glob("*.py")}
#: the measuring, analysis and report modules are held to shorter functions (issue 22)
OUTER_RING = {"bench", "analysis", "report", "records", "gpu_report"}


def _imports(path: Path) -> set[str]:
    """The package's modules that ``path`` imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("speculative."):
            found.add(node.module.split(".")[1])
    return found & set(MODULES)


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Return one cycle per strongly connected group of more than one module (or a module importing itself)."""
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


def test_no_module_of_the_library_imports_itself_back():
    graph = {name: _imports(path) - {name} for name, path in MODULES.items() if name != "__init__"}
    assert import_cycles(graph) == []


def _body_lines(function: ast.FunctionDef) -> int:
    """Lines of a function's body, its docstring left out."""
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return body[-1].end_lineno - body[0].lineno + 1 if body else 0


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_function_is_too_long_to_read(name):
    limit = 80 if name in OUTER_RING or name == "__main__" else 100
    tree = ast.parse(MODULES[name].read_text())
    long = {node.name: _body_lines(node) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _body_lines(node) > limit}
    assert not long, f"{name}.py: functions over {limit} lines of body: {long}"
