"""The package's layers import only downward: command line -> Triton edge -> serving core -> executors and
conventions -> embedded engine and request pipeline -> executor interface; and no module imports itself in a circle."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "trtllm_model"


def imported_modules(path: Path) -> set[str]:
    """Absolute `trtllm_model.*` names a module imports, relative imports resolved."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module.removesuffix(".__init__")
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                names.add(".".join(base + ([node.module] if node.module else [])))
            elif node.module:
                names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name.startswith("trtllm_model")}


# The package's layers, top to bottom: a package (or a module at the package's top) imports only from layers below
# its own, never from its own layer's neighbours nor from above.
LAYERS = [
    {"launch"},  # the command line: trtllm-triton, the repository writer, the HTTP guard
    {"triton", "openai_frontend"},  # the Triton edge (the models tritonserver loads); the OpenAI frontend process
    {"serving"},  # the serving core: poller, dispatch, responses, admission, watches, metrics
    {"executors", "conventions"},  # the engines behind the executor interface; the tensor conventions
    {"embedded", "pipeline"},  # the embedded engine; request checks, build limits, text encoding, detokenizer
    {"model_yaml", "server", "process_watch"},
    {"executor_interface", "params", ""},  # "": the package's own __init__ (package_version)
]


def unit(module: str) -> str:
    """The layer unit of a package module: its subpackage, or its own name at the package's top."""
    return module.split(".")[1] if module.count(".") else ""


def test_every_module_of_the_package_has_a_layer() -> None:
    placed = set().union(*LAYERS)
    assert {unit(module) for module in import_graph()} == placed


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """The imports of `graph` that go to the importer's own layer (outside its own unit) or one above it."""
    layer_of = {name: index for index, layer in enumerate(LAYERS) for name in layer}
    return sorted(
        f"{module} imports {imported}"
        for module, imports in graph.items()
        for imported in imports
        if unit(module) != unit(imported) and layer_of[unit(imported)] <= layer_of[unit(module)]
    )


def test_packages_import_only_from_the_layers_below() -> None:
    assert upward_imports(import_graph()) == []


def test_upward_imports_are_found() -> None:
    # Guards the check above against passing vacuously: up a layer, across one, and down (allowed).
    graph = {
        "trtllm_model.serving.poller": {"trtllm_model.triton.model", "trtllm_model.executor_interface"},
        "trtllm_model.executors.synthetic": {"trtllm_model.conventions.common", "trtllm_model.executors.engine_wire"},
    }
    assert upward_imports(graph) == ["trtllm_model.executors.synthetic imports trtllm_model.conventions.common",
                                     "trtllm_model.serving.poller imports trtllm_model.triton.model"]


def test_executor_interface_depends_on_nothing_in_the_package() -> None:
    assert imported_modules(PACKAGE / "executor_interface.py") == set()


def test_import_resolution_sees_relative_imports() -> None:
    # Guards the checks above against passing vacuously.
    assert "trtllm_model.executor_interface" in imported_modules(PACKAGE / "embedded" / "engine.py")
    assert "trtllm_model.embedded.engine" in imported_modules(PACKAGE / "executors" / "transformers_executor.py")
    assert "trtllm_model.serving.poller" in imported_modules(PACKAGE / "triton" / "model.py")
    assert "trtllm_model.executor_interface" in imported_modules(PACKAGE / "serving" / "poller.py")


def module_name(path: Path) -> str:
    name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return name.removesuffix(".__init__")


def import_graph() -> dict[str, set[str]]:
    """Each module of the package -> the modules of the package it imports anywhere in it (inside functions and
    under `TYPE_CHECKING` too: a circle hidden from the interpreter is still a circle for the reader).
    `from package import name` counts as an import of the submodule `package.name` where that is a module."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                for alias in node.names:
                    edges.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
            elif isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names)
        graph[name] = {edge for edge in edges if edge in modules and edge != name}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in graph[module]:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in graph:
        if module not in index:
            visit(module)
    return circles


def test_no_import_circle_in_the_package() -> None:
    assert import_circles(import_graph()) == []


def test_import_circles_are_found() -> None:
    # Guards the check above against passing vacuously: a circle through a submodule imported by name, one through
    # a function-level import, and the graph sees the package's real edges.
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = import_graph()
    assert "trtllm_model.embedded.fused_forward" in graph["trtllm_model.embedded.runner"]  # `from . import x`
    assert "trtllm_model.embedded.runner" in graph["trtllm_model.embedded.engine"]
