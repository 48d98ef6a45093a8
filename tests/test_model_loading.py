"""Loading errors name their real cause: transformers' lazy imports hide it down the exception chain."""

from __future__ import annotations

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
