"""The house by job: every module of infer/ sits in one layer, imports (at any depth, lazy ones
included) only from its own layer or those below, and no modules import each other in a cycle."""
import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "infer"
# Lowest first; a module belongs to the first entry naming it or a package above it
LAYERS = [
    ("core", ["errors", "env", "network", "reference", "result", "options", "progress"]),
    ("reading data", ["data"]),
    ("backends", ["backend", "cpu", "gpu"]),
    ("the plan", ["plan"]),
    ("sessions, serving, benchmarks", ["session", "serve", "bench", "cluster", "onnx_export"]),
    ("the command line", ["cli", "__main__"]),
]


def module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def layer_of(module):
    rest = module.split(".")[1:]
    for depth, (_, names) in enumerate(LAYERS):
        if rest and rest[0] in names:
            return depth
    return None


def imports(module):
    """The infer modules `module` imports anywhere in its file (a name imported from a package
    counts as that package's module where it is one)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    # the package itself holds the version and re-exports Session lazily for `import cnninfer`
    return {m for m in found if m in MODULES and m not in (module, "infer")}


GRAPH = {m: imports(m) for m in MODULES if m != "infer"}


def test_every_module_has_a_layer():
    assert [m for m in GRAPH if layer_of(m) is None] == []


def test_the_top_of_the_package_keeps_entry_points_and_the_core():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 15, top


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_no_module_imports_one_above_it(module):
    mine = layer_of(module)
    above = {m: LAYERS[layer_of(m)][0] for m in GRAPH[module] if layer_of(m) > mine}
    assert above == {}, f"{module} ({LAYERS[mine][0]}) imports from layers above it"


def test_no_import_cycles():
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert cycles == []


def test_the_walk_sees_lazy_imports():
    """The checks above mean something only if imports inside functions are found too."""
    assert "infer.serve.server" in GRAPH["infer.cli"]  # imported inside `serve`
    assert "infer.gpu.backend" in GRAPH["infer.gpu"]  # inside create
