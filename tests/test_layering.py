"""The package's layers import only downward: Triton edge -> poller -> executor interface -> engines."""

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


def test_embedded_engine_imports_nothing_from_executors_or_above() -> None:
    above = ("trtllm_model.executors", "trtllm_model.poller", "trtllm_model.model", "trtllm_model.triton_io")
    for path in (PACKAGE / "embedded").glob("*.py"):
        offending = {name for name in imported_modules(path) if name.startswith(above)}
        assert not offending, f"{path.name} imports {offending}"


def test_executor_interface_depends_on_nothing_in_the_package() -> None:
    assert imported_modules(PACKAGE / "executor_interface.py") == set()


def test_executors_never_import_the_triton_edge_or_the_poller() -> None:
    above = ("trtllm_model.poller", "trtllm_model.model", "trtllm_model.triton_io", "trtllm_model.bls_forwarding")
    for path in (PACKAGE / "executors").glob("*.py"):
        offending = {name for name in imported_modules(path) if name.startswith(above)}
        assert not offending, f"{path.name} imports {offending}"


def test_import_resolution_sees_relative_imports() -> None:
    # Guards the checks above against passing vacuously.
    assert "trtllm_model.executor_interface" in imported_modules(PACKAGE / "embedded" / "engine.py")
    assert "trtllm_model.embedded.engine" in imported_modules(PACKAGE / "executors" / "transformers_executor.py")
