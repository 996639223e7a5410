"""The package's import structure: the application layer (paravt_jax/cli) on top, never
imported by the library; lower layers never import higher ones; no import cycle at module level."""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "paravt_jax")
APP = "paravt_jax.cli"
# (importer prefix, imported prefix) pairs that must not occur: the engine below the algorithms,
# the report below the sweep.
FORBIDDEN = (("paravt_jax.train", "paravt_jax.rl"), ("paravt_jax.train", "paravt_jax.sft"),
             ("paravt_jax.train", "paravt_jax.sampling"), ("paravt_jax.sft", "paravt_jax.rl"),
             ("paravt_jax.models", "paravt_jax.rl"), ("paravt_jax.models", "paravt_jax.train"),
             ("paravt_jax.experiments.report", "paravt_jax.experiments.sweep"))


def module_name(path: str) -> str:
    relative = os.path.relpath(path, ROOT)[: -len(".py")].replace(os.sep, ".")
    return relative[: -len(".__init__")] if relative.endswith(".__init__") else relative


def imports(path: str, top_level_only: bool, modules: frozenset[str] = frozenset()) -> set[str]:
    """The paravt_jax modules a file imports (every scope, or module scope only): `from P import
    name` imports the submodule P.name when `modules` holds it, else P."""
    tree = ast.parse(open(path).read(), path)
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in modules or not modules else node.module)
    return {name for name in found if name.startswith("paravt_jax")}


def package_files() -> dict[str, str]:
    out = {}
    for directory, _, files in os.walk(PACKAGE):
        for file in files:
            if file.endswith(".py"):
                path = os.path.join(directory, file)
                out[module_name(path)] = path
    return out


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_the_library_never_imports_the_application_layer():
    offenders = sorted(f"{module} imports {name}" for module, path in package_files().items()
                       if not under(module, APP) for name in imports(path, top_level_only=False) if under(name, APP))
    assert not offenders, offenders


@pytest.mark.parametrize("importer, imported", FORBIDDEN)
def test_layers_point_one_way(importer, imported):
    offenders = sorted(f"{module} imports {name}" for module, path in package_files().items()
                       if under(module, importer) for name in imports(path, top_level_only=False)
                       if under(name, imported))
    assert not offenders, offenders


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of the graph (module -> the modules it imports), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module, path):
        state[module] = 1
        for child in sorted(graph[module]):
            if state.get(child) == 1:
                return path[path.index(child):] + [child]
            if child not in state:
                cycle = visit(child, path + [child])
                if cycle:
                    return cycle
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module, [module])
            if cycle:
                return cycle
    return None


def test_no_import_cycle_at_module_level():
    files = package_files()
    graph = {module: {name for name in imports(path, True, frozenset(files)) if name in files and name != module}
             for module, path in files.items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checks_see_a_violation(tmp_path):
    """The import reader finds an application-layer import in any scope."""
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from paravt_jax.cli import jobs\n")
    assert imports(str(path), top_level_only=False) == {"paravt_jax.cli.jobs"}
    assert imports(str(path), top_level_only=True) == set()
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
