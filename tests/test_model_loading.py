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


def _tiny_model(architecture: str):
    """A random two-layer model of `architecture` (a 512-token vocabulary)."""
    import torch
    import transformers

    from trtllm_model.embedded.model_loading import SUPPORTED_ARCHITECTURES

    assert architecture in SUPPORTED_ARCHITECTURES
    model_class = getattr(transformers, architecture)
    ids = {"vocab_size": 512, "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 0}
    if architecture == "GPT2LMHeadModel":
        config = model_class.config_class(n_embd=64, n_layer=2, n_head=4, n_positions=512, **ids)
    else:
        config = model_class.config_class(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                          max_position_embeddings=512, **ids)
    torch.manual_seed(0)
    return model_class(config).eval()


@pytest.mark.parametrize("architecture", [
    "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Phi3ForCausalLM",
    "GemmaForCausalLM", "GraniteForCausalLM", "Olmo2ForCausalLM", "GPT2LMHeadModel"])
def test_each_supported_architecture_runs_in_the_engine_as_generate_does(architecture):
    from greedy_reference import generate_with_logits

    from trtllm_model.executor_interface import GenerationRequest
    from trtllm_model.executors.transformers_executor import TransformersExecutor

    model = _tiny_model(architecture)
    prompt = list(range(5, 45))
    expected, _ = generate_with_logits(model, prompt, 12)
    executor = TransformersExecutor(model, None, max_batch_size=4, max_num_tokens=256, kv_cache_memory_bytes=1 << 24)
    try:
        request_id = executor.enqueue(GenerationRequest(input_ids=prompt, max_tokens=12, min_tokens=12))
        steps = []
        while not any(step.is_final for step in steps):
            steps += [step for step in executor.await_steps(5.0) if step.request_id == request_id]
    finally:
        executor.shutdown()
    assert steps[-1].error is None
    assert [token for step in steps for token in step.token_ids] == expected


def test_a_checkpoint_of_another_architecture_is_refused_naming_those_that_run(tmp_path):
    import json

    from trtllm_model.embedded.model_loading import check_checkpoint, load_model

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["MixtralForCausalLM"]}))
    with pytest.raises(ValueError, match=r"architecture MixtralForCausalLM is not one the embedded engine runs "
                                         r"\(LlamaForCausalLM, .*GPT2LMHeadModel\); serve it with TensorRT-LLM"):
        load_model(str(tmp_path))
    with pytest.raises(ValueError, match="no config.json"):
        check_checkpoint(tmp_path / "missing")
