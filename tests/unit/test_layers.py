"""The package's import structure (docs/architecture.md): the application layer (paravt_jax/cli)
on top, never imported by the library; lower layers never import higher ones; no import cycle
between modules or between packages, imports inside functions included."""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "paravt_jax")
APP = "paravt_jax.cli"
# (importer prefix, imported prefix) pairs that must not occur: the engine below the algorithms,
# the report below the sweep, the planner reading the trainers' public sections (rl/shapes,
# rl/objective, sft/objective, sft/frames), not their training loops.
FORBIDDEN = (("paravt_jax.train", "paravt_jax.rl"), ("paravt_jax.train", "paravt_jax.sft"),
             ("paravt_jax.train", "paravt_jax.sampling"), ("paravt_jax.sft", "paravt_jax.rl"),
             ("paravt_jax.models", "paravt_jax.rl"), ("paravt_jax.models", "paravt_jax.train"),
             ("paravt_jax.experiments.report", "paravt_jax.experiments.sweep"),
             ("paravt_jax.planner", "paravt_jax.rl.trainer"), ("paravt_jax.planner", "paravt_jax.sft.trainer"))
# The layers, lowest first (docs/architecture.md): a module imports from its own layer and the
# ones below, never from above. Every package and top-level module of paravt_jax has a place.
LAYERS = (
    ("infrastructure", ("config", "configs", "infra")),
    ("model and inputs", ("models", "video", "text", "data")),
    ("engines", ("sampling", "train")),
    ("agent", ("agent",)),
    ("episodes", ("episodes",)),
    ("evaluations", ("eval",)),
    ("trainers and experiments", ("sft", "rl", "experiments")),
    ("run config and planner", ("run_config", "planner")),
    ("application", ("cli",)),
)


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


def layer_of(module: str) -> int | None:
    """The LAYERS index of a module's package (None: the root __init__, or a package without a place)."""
    package = module.split(".")[1] if module.count(".") else None
    return next((i for i, (_, members) in enumerate(LAYERS) if package in members), None)


def test_every_package_has_a_layer():
    missing = sorted({module.split(".")[1] for module in package_files() if module != "paravt_jax"
                      and layer_of(module) is None})
    assert not missing, f"place them in LAYERS (and docs/architecture.md): {missing}"


def test_no_layer_imports_a_higher_one():
    offenders = sorted(f"{module} ({LAYERS[layer_of(module)][0]}) imports {name} ({LAYERS[layer_of(name)][0]})"
                       for module, names in module_graph().items() if layer_of(module) is not None
                       for name in names if (layer_of(name) or 0) > layer_of(module))
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


def nearest_module(name: str, modules) -> str | None:
    """The module an imported name loads: itself, or the nearest enclosing module
    (`import paravt_jax.models.qwen3_vl.config` of a file, a name imported from a module)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def module_graph() -> dict[str, set[str]]:
    """module -> the paravt_jax modules it imports, in any scope (a function's imports run too)."""
    files = package_files()
    graph = {}
    for module, path in files.items():
        found = {nearest_module(name, files) for name in imports(path, False, frozenset(files))}
        graph[module] = found - {module, None}
    return graph


def package_of(module: str) -> str:
    """paravt_jax.<package> of a module in a subpackage; a top-level module is its own."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for module, names in graph.items():
        if module == "paravt_jax":  # the root __init__: every import of the package runs it first
            continue
        mine = package_of(module)
        out.setdefault(mine, set()).update(package_of(n) for n in names if package_of(n) not in (mine, "paravt_jax"))
    return out


def test_no_import_cycle_between_modules():
    cycle = find_cycle(module_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_import_cycle_between_packages():
    cycle = find_cycle(package_graph(module_graph()))
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle)


def test_the_checks_see_a_violation(tmp_path):
    """The import reader finds an application-layer import in any scope."""
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from paravt_jax.cli import jobs\n")
    assert imports(str(path), top_level_only=False) == {"paravt_jax.cli.jobs"}
    assert imports(str(path), top_level_only=True) == set()
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    # modules that import each other's packages (not each other) make a package cycle
    packages = package_graph({"paravt_jax.a.one": {"paravt_jax.b.two"}, "paravt_jax.b.three": {"paravt_jax.a.four"},
                              "paravt_jax.b.two": set(), "paravt_jax.a.four": set()})
    assert find_cycle(packages) == ["paravt_jax.a", "paravt_jax.b", "paravt_jax.a"]
    assert nearest_module("paravt_jax.rl.trainer.RLConfig", {"paravt_jax.rl.trainer"}) == "paravt_jax.rl.trainer"
