"""Serve LLMs from Triton Inference Server (see README.md)."""

import os
import sys


def _add_pythonpath() -> None:
    """tritonserver's Python backend stub starts its interpreter isolated from the environment: it inherits
    PYTHONPATH but leaves it off sys.path, so a package installed there (tensorrt_llm beside a tritonserver started
    with PYTHONPATH=...) would not be found by the model. Its entries go where Python puts them: before
    site-packages. Elsewhere (python, pytest) they are on sys.path already and nothing changes."""
    entries = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry and entry not in sys.path]
    if not entries:
        return
    site = next((i for i, path in enumerate(sys.path) if path.endswith(("site-packages", "dist-packages"))), len(sys.path))
    sys.path[site:site] = entries


_add_pythonpath()


def package_version() -> str:
    """This package's installed version (`trtllm-triton --version`, the OpenAI API's /version)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trtllm-triton")
    except PackageNotFoundError:
        return "(not installed: running from a source tree)"
