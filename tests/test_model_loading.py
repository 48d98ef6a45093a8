"""Loading errors name their real cause: transformers' lazy imports hide it down the exception chain."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trtllm_model.embedded.model_loading import exception_chain


def _chained() -> ImportError:
    try:
        try:
            raise AttributeError("module 'numpy' has no attribute 'long'")
        except AttributeError as inner:
            raise ModuleNotFoundError("Could not import module 'GenerationMixin'") from inner
    except ModuleNotFoundError as middle:
        try:
            raise ModuleNotFoundError("Could not import module 'LlamaForCausalLM'") from middle
        except ModuleNotFoundError as outer:
            return outer


def test_chain_lists_every_cause_outermost_first():
    assert exception_chain(_chained()) == (
        "ModuleNotFoundError: Could not import module 'GenerationMixin' <- "
        "AttributeError: module 'numpy' has no attribute 'long'"
    )


def test_chain_of_a_lone_exception_says_so():
    with pytest.raises(ValueError) as info:
        raise ValueError("alone")
    assert exception_chain(info.value) == "none recorded"


CONVERT_AND_LOAD = """
import logging, sys
from pathlib import Path
logging.basicConfig(level=logging.INFO, format="%(message)s")
from trtllm_model.embedded.model_loading import load_tokenizer
tokenizer = load_tokenizer(cache_dir=sys.argv[1])
print("loaded", len(tokenizer("Hello there")["input_ids"]), flush=True)
"""


def test_three_first_starts_convert_the_embedded_model_once_and_all_load(tmp_path):
    # A server's first start: tensorrt_llm, preprocessing and postprocessing load at the same time with an empty
    # cache; one converts the GGUF, the others wait for its copy.
    cache = tmp_path / "cache"
    processes = [subprocess.Popen([sys.executable, "-c", CONVERT_AND_LOAD, str(cache)], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for _ in range(3)]
    outputs = [process.communicate(timeout=600)[0] for process in processes]
    assert [process.returncode for process in processes] == [0, 0, 0], outputs
    assert sum(output.count("dequantising") for output in outputs) == 1, outputs
    assert all("loaded" in output for output in outputs), outputs
    assert [path.name for path in cache.iterdir() if not path.name.endswith(".lock")] == [
        path.name for path in cache.glob("*-float32")]  # no staging directory left behind
