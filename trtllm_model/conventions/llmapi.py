"""NVIDIA's LLM API model convention (`text_input`, `sampling_param_*`, `model.yaml`): Triton tensors -> a
ParsedRequest, and a request's response content -> its output tensors.

Names, dtypes and dims are those of NVIDIA's `triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt`;
the defaults and behaviour are those of its model.py (docs/nvidia_compatibility.md, "NVIDIA's LLM API model"):
the prompt is in `text_output` unless `sampling_param_exclude_input_from_output`; a streamed response carries the
text generated so far (the LLM API's cumulative `CompletionOutput.text`); finish reasons are the LLM API's
('stop', 'length', 'timeout', 'cancelled'); a `stop` request aborts the request with its id and is itself
answered CANCELLED. What no executor here can do is UNSUPPORTED, naming the input.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import numpy as np

from ..executor_interface import GenerationRequest, Tokenizer
from ..pipeline.request_checks import MAX_NAME_BYTES
from .common import (
    UINT64_MAX,
    InvalidInput,
    Limits,
    ParsedRequest,
    ResponseContent,
    check_prompt_size,
    check_word_texts,
    element_bytes,
    in_range,
    utf8,
)
from .parsing import Prompt, RequestParser, parse_alone

# name -> (Triton data type, dims), as NVIDIA's llmapi config.pbtxt declares them. text_input alone is required.
INPUTS = {
    "text_input": ("TYPE_STRING", [-1]),
    "image_url": ("TYPE_STRING", [-1]),
    "streaming": ("TYPE_BOOL", [1]),
    "sampling_param_best_of": ("TYPE_INT32", [1]),
    "sampling_param_temperature": ("TYPE_FP32", [1]),
    "sampling_param_top_k": ("TYPE_INT32", [1]),
    "sampling_param_top_p": ("TYPE_FP32", [1]),
    "sampling_param_frequency_penalty": ("TYPE_FP32", [1]),
    "sampling_param_presence_penalty": ("TYPE_FP32", [1]),
    "sampling_param_max_tokens": ("TYPE_INT32", [1]),
    "sampling_param_stop": ("TYPE_STRING", [-1]),
    "sampling_param_seed": ("TYPE_UINT64", [1]),
    "sampling_param_exclude_input_from_output": ("TYPE_BOOL", [1]),
    "sampling_param_return_perf_metrics": ("TYPE_BOOL", [1]),
    "sampling_param_logits_post_processor_name": ("TYPE_STRING", [1]),
    "return_finish_reason": ("TYPE_BOOL", [1]),
    "return_stop_reason": ("TYPE_BOOL", [1]),
    "return_cumulative_logprob": ("TYPE_BOOL", [1]),
    "stop": ("TYPE_BOOL", [1]),
    "lora_id": ("TYPE_UINT64", [1]),
    "lora_name": ("TYPE_STRING", [1]),
    "lora_path": ("TYPE_STRING", [1]),
    "lora_ckpt_source": ("TYPE_STRING", [1]),
}
OUTPUTS = {
    "text_output": ("TYPE_STRING", [-1]),
    "finish_reason": ("TYPE_STRING", [-1]),
    "stop_reason": ("TYPE_STRING", [-1]),
    "cumulative_logprob": ("TYPE_FP32", [-1]),
    "kv_cache_reused_block": ("TYPE_INT32", [-1]),
    "kv_cache_missed_block": ("TYPE_INT32", [-1]),
    "kv_cache_alloc_new_blocks": ("TYPE_INT32", [-1]),
    "kv_cache_alloc_total_blocks": ("TYPE_INT32", [-1]),
    "kv_cache_hit_rate": ("TYPE_FP32", [-1]),
    "arrival_time_ns": ("TYPE_INT64", [1]),
    "first_scheduled_time_ns": ("TYPE_INT64", [1]),
    "first_token_time_ns": ("TYPE_INT64", [1]),
    "last_token_time_ns": ("TYPE_INT64", [1]),
    "acceptance_rate": ("TYPE_FP32", [1]),
    "total_accepted_draft_tokens": ("TYPE_INT32", [1]),
    "total_draft_tokens": ("TYPE_INT32", [1]),
}
# The LLM API's SamplingParams.max_tokens default (NVIDIA's model passes no other when the input is absent).
DEFAULT_MAX_TOKENS = 32
LORA_CKPT_SOURCES = ("hf", "nemo")
# image_url entries in one request (a multimodal prompt's images).
MAX_IMAGES = 16
STOP_ERROR = "Request cancelled by client"  # NVIDIA's message for the answer to a `stop` request
# Our finish reasons (executor_interface.FinishReason values) -> the LLM API's.
FINISH_REASONS = {"end_id": "stop", "stop_words": "stop", "length": "length", "timeout": "timeout",
                  "cancelled": "cancelled", "error": "error"}
_DTYPES = {"TYPE_BOOL": np.bool_, "TYPE_INT32": np.int32, "TYPE_UINT64": np.uint64, "TYPE_FP32": np.float32,
           "TYPE_INT64": np.int64}


@dataclass(frozen=True, slots=True)
class LlmApiOptions:
    """What the model's configuration adds to the convention (model.yaml)."""

    multimodal: bool = False
    # triton_config.max_batch_size > 0: every tensor carries a leading batch dimension (a response answers one row).
    batched: bool = False
    logits_post_processors: frozenset[str] = frozenset()  # names declared in model.yaml
    # Inputs the executor honours beyond the common ones: "lora_request", "logits_post_processor", "image_url".
    executor_features: frozenset[str] = frozenset()


@dataclass(slots=True)
class LlmApiResponder:
    """One request's output state: which outputs it asked for, and the text streamed so far (the LLM API's text
    is cumulative)."""

    streaming: bool
    return_finish_reason: bool = False
    return_stop_reason: bool = False
    return_cumulative_logprob: bool = False
    stop_strings: list[str] = field(default_factory=list)
    batched: bool = False
    text: str = ""

    def outputs(self, parsed: ParsedRequest, content: ResponseContent) -> dict[str, np.ndarray]:
        piece = (content.texts or [""])[0]
        self.text = self.text + piece if self.streaming else piece
        reason = FINISH_REASONS.get(content.finish_reason) if content.finish_reason else None
        stop_reason = None
        if content.finish_reason == "stop_words":
            # As the LLM API (include_stop_str_in_output=False): the stop string ends the text but is not in it.
            stop_reason = next((s for s in self.stop_strings if s and self.text.endswith(s)), None)
            if stop_reason is not None:
                self.text = self.text[: -len(stop_reason)]
        outputs = {"text_output": np.array([self.text.encode("utf-8")], dtype=np.object_)}
        # NVIDIA's model sends str() of the LLM API's value: 'None' while a sequence runs.
        if self.return_finish_reason:
            outputs["finish_reason"] = np.array([str(reason).encode()], dtype=np.object_)
        if self.return_stop_reason:
            outputs["stop_reason"] = np.array([str(stop_reason).encode()], dtype=np.object_)
        if self.return_cumulative_logprob:
            cum = (content.cum_log_probs or [0.0])[0]
            outputs["cumulative_logprob"] = np.array([cum], dtype=np.float32)
        if parsed.return_perf_metrics and content.perf is not None:
            outputs.update(perf_outputs(content.perf))
        return {name: array[None] for name, array in outputs.items()} if self.batched else outputs


def split_batch(tensors: dict[str, np.ndarray], batched: bool) -> list[dict[str, np.ndarray]]:
    """With triton_config.max_batch_size > 0 every input has a leading batch dimension: one tensor dict per row
    (each a batch of 1), so that each prompt becomes a request of its own. NVIDIA's model reads only row 0."""
    if not batched or not tensors:
        return [tensors]
    lead_name = "text_input" if "text_input" in tensors else next(iter(tensors))
    size = tensors[lead_name].shape[0] if tensors[lead_name].ndim else 0
    for name, array in tensors.items():
        got = array.shape[0] if array.ndim else 0
        if got != size:
            raise InvalidInput(f"{name}: batch size {got}, but {lead_name} has a batch of {size}")
    if size <= 1:
        return [tensors]
    return [{name: array[index : index + 1] for name, array in tensors.items()} for index in range(size)]


def perf_outputs(perf: dict[str, float]) -> dict[str, np.ndarray]:
    """Our per-request perf values -> NVIDIA's llmapi perf outputs. As TensorRT-LLM counts them, the allocated
    blocks ("total") are the new ones, reused ones not among them: missed blocks are the new ones, and the hit rate
    is reused / (reused + missed) (0 with no blocks)."""
    reused = int(perf.get("kv_cache_reused_blocks", 0))
    new = int(perf.get("kv_cache_alloc_new_blocks", 0))
    values = {
        "kv_cache_reused_block": reused,
        "kv_cache_missed_block": new,
        "kv_cache_alloc_new_blocks": new,
        "kv_cache_alloc_total_blocks": int(perf.get("kv_cache_alloc_total_blocks", 0)),
        "kv_cache_hit_rate": reused / (reused + new) if reused + new else 0.0,
        **{name: perf.get(name, 0) for name in ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns",
                                                "last_token_time_ns", "acceptance_rate",
                                                "total_accepted_draft_tokens", "total_draft_tokens")},
    }
    return {name: np.array([value], dtype=_DTYPES[OUTPUTS[name][0]]) for name, value in values.items()}


def parse_request(
    tensors: dict[str, np.ndarray],
    limits: Limits,
    tokenizer: Tokenizer | None,
    options: LlmApiOptions,
) -> ParsedRequest:
    """Validate one request of NVIDIA's LLM API convention and turn it into a GenerationRequest."""
    return parse_alone(request_parser(tensors, limits, tokenizer, options), tokenizer)


def request_parser(
    tensors: dict[str, np.ndarray],
    limits: Limits,
    tokenizer: Tokenizer | None,
    options: LlmApiOptions,
) -> RequestParser:
    """parse_request, stopping at the text prompt to be sent its token ids (conventions/parsing.py)."""
    unknown = sorted(set(tensors) - set(INPUTS))
    if unknown:  # Triton refuses undeclared inputs; this guards a config.pbtxt that declares more than we read
        raise InvalidInput(f"{unknown[0]}: not an input of NVIDIA's LLM API model")
    for name, array in tensors.items():
        dtype = _DTYPES.get(INPUTS[name][0])
        if dtype is not None and array.dtype != dtype:
            raise InvalidInput(f"{name}: expected {INPUTS[name][0][5:]}, got {array.dtype}")
    if _flag(tensors, "stop"):
        return ParsedRequest(GenerationRequest(input_ids=[0], max_tokens=1), text_mode=False, stop_only=True,
                             stop_error=STOP_ERROR)
    if "text_input" not in tensors:
        raise InvalidInput("text_input: required")
    if tokenizer is None:
        raise InvalidInput(f"text_input: {limits.executor_label} has no tokenizer", unsupported=True)
    prompts = tensors["text_input"].reshape(-1)
    if prompts.size != 1:
        raise InvalidInput(f"text_input: expected one prompt per request, got {prompts.size} "
                           "(shape [1]; NVIDIA's model reads only the first)")
    check_prompt_size("text_input", prompts[0], limits, tokenizer)
    text = utf8("text_input", prompts[0])
    if not text:
        raise InvalidInput("text_input: the prompt is empty")
    _check_image_url(tensors, options)
    lora = _lora(tensors, "lora_request" in options.executor_features, limits.executor_name)
    processor = _string(tensors, "sampling_param_logits_post_processor_name")
    if processor and processor not in options.logits_post_processors:
        available = ", ".join(sorted(options.logits_post_processors)) or "none configured"
        raise InvalidInput(f"sampling_param_logits_post_processor_name={processor!r}: unknown; declare it under "
                           f"logits_post_processors in model.yaml (available: {available})")
    best_of = _int(tensors, "sampling_param_best_of", 1, minimum=1)
    if best_of != 1:
        raise InvalidInput(f"sampling_param_best_of={best_of}: {limits.executor_label} returns one "
                           "sequence per request (best_of 1)", unsupported=True)
    if processor and "logits_post_processor" not in options.executor_features:
        raise InvalidInput(f"sampling_param_logits_post_processor_name: {limits.executor_label} runs no "
                           "logits post-processors", unsupported=True)

    stop_items = tensors.get("sampling_param_stop", np.empty(0)).reshape(-1).tolist()
    check_word_texts("sampling_param_stop", stop_items, tokenizer)  # before tokenizing anything (each string twice)
    input_ids = yield Prompt(text, add_special_tokens=True)
    if limits.max_input_len is not None and len(input_ids) > limits.max_input_len:
        raise InvalidInput(f"text_input: prompt of {len(input_ids)} tokens is over max_input_len={limits.max_input_len}")
    max_tokens = _int(tensors, "sampling_param_max_tokens", DEFAULT_MAX_TOKENS, minimum=1, maximum=limits.max_output_len)
    if limits.max_seq_len is not None and len(input_ids) + max_tokens > limits.max_seq_len:
        raise InvalidInput(f"sampling_param_max_tokens={max_tokens}: with the prompt's {len(input_ids)} tokens that is "
                           f"{len(input_ids) + max_tokens}, over max_seq_len={limits.max_seq_len}")
    streaming = _flag(tensors, "streaming")
    if streaming and not limits.decoupled:
        raise InvalidInput("streaming=true: Streaming is only supported in decoupled mode (set triton_config.decoupled"
                           " in model.yaml, or serve with --decoupled true)")
    stop_strings = [utf8("sampling_param_stop", item) for item in stop_items]
    stop_strings = [s for s in stop_strings if s]
    # The engines stop on token sequences: a stop string matches as it tokenizes alone and after a space (the way a
    # word inside a text tokenizes), which is where it usually follows.
    stop_words = [ids for s in stop_strings for ids in (tokenizer.encode(s, add_special_tokens=False),
                                                        _after_space(tokenizer, s)) if ids]
    top_k = _int(tensors, "sampling_param_top_k", None, minimum=0) or None  # 0: no cut
    top_p = _float(tensors, "sampling_param_top_p", minimum=0.0, maximum=1.0)
    responder = LlmApiResponder(
        streaming=streaming,
        return_finish_reason=_flag(tensors, "return_finish_reason"),
        return_stop_reason=_flag(tensors, "return_stop_reason"),
        return_cumulative_logprob=_flag(tensors, "return_cumulative_logprob"),
        stop_strings=stop_strings,
        batched=options.batched,
    )
    perf = _flag(tensors, "sampling_param_return_perf_metrics")
    generation = GenerationRequest(
        input_ids=input_ids,
        max_tokens=max_tokens,
        streaming=streaming,
        end_id=tokenizer.eos_token_id,
        exclude_input_in_output=_flag(tensors, "sampling_param_exclude_input_from_output"),
        temperature=_float(tensors, "sampling_param_temperature", minimum=0.0),
        top_k=top_k,
        top_p=top_p if top_p else None,
        seed=_int(tensors, "sampling_param_seed", None, minimum=0, maximum=UINT64_MAX),
        presence_penalty=_float(tensors, "sampling_param_presence_penalty"),
        frequency_penalty=_float(tensors, "sampling_param_frequency_penalty"),
        stop_words=stop_words,
        return_log_probs=responder.return_cumulative_logprob,
        return_perf_metrics=perf,
        lora_adapter=lora,
        logits_post_processor=processor or None,
    )
    return ParsedRequest(
        generation=generation,
        text_mode=True,
        return_perf_metrics=perf,
        prompt_ids=input_ids,
        outputs=responder.outputs,
    )


def _after_space(tokenizer: Tokenizer, text: str) -> list[int]:
    """The tokens of `text` after a space, without the space's own tokens (when the space tokenizes apart)."""
    spaced, space = tokenizer.encode(" " + text, add_special_tokens=False), tokenizer.encode(" ", add_special_tokens=False)
    return spaced[len(space):] if space and spaced[: len(space)] == space else spaced


def _check_image_url(tensors: dict[str, np.ndarray], options: LlmApiOptions) -> None:
    if "image_url" not in tensors or tensors["image_url"].size == 0:
        return
    if not options.multimodal:
        raise InvalidInput("image_url: this model is not multimodal (triton_config.multimodal in model.yaml)")
    if tensors["image_url"].size > MAX_IMAGES:
        raise InvalidInput(f"image_url: {tensors['image_url'].size} images; at most {MAX_IMAGES}")
    for item in tensors["image_url"].reshape(-1):
        url = utf8("image_url", item)
        if not url.startswith(("http://", "https://", "data:")):
            raise InvalidInput(f"image_url={url[:80]!r}: only http(s):// URLs and data: URIs; local paths and file:// "
                               "are refused (a client must not make the server read its files)")
    if "image_url" not in options.executor_features:
        raise InvalidInput("image_url: no executor here takes images", unsupported=True)


def _lora(tensors: dict[str, np.ndarray], enabled: bool, executor_name: str) -> tuple[int, str, str, str] | None:
    """The adapter asked for; with LoRA off (`enabled` False) refused before the path is looked at, so that a client
    cannot learn which server paths exist."""
    lora_id = _int(tensors, "lora_id", None, minimum=0, maximum=UINT64_MAX)
    name, path = _string(tensors, "lora_name"), _string(tensors, "lora_path")
    given = {"lora_id": lora_id, "lora_name": name, "lora_path": path}
    if all(value is None for value in given.values()):
        if "lora_ckpt_source" in tensors:
            raise InvalidInput("lora_ckpt_source: needs lora_id, lora_name and lora_path")
        return None
    missing = [key for key, value in given.items() if value is None]
    if missing:
        raise InvalidInput(f"{', '.join(missing)}: lora_id, lora_name and lora_path must all be provided together")
    if not enabled:
        if executor_name == "trtllm_llmapi":
            raise InvalidInput("lora_path: this model's LLM takes no LoRA adapters (model.yaml sets no lora_config)",
                               unsupported=True)
        raise InvalidInput(f"lora_path: LoRA adapters by path need executor trtllm_llmapi, not {executor_name or 'this one'}",
                           unsupported=True)
    source = _string(tensors, "lora_ckpt_source") or "hf"
    if source not in LORA_CKPT_SOURCES:
        raise InvalidInput(f"lora_ckpt_source={source!r}: expected one of {', '.join(LORA_CKPT_SOURCES)}")
    if not os.path.exists(path):
        raise InvalidInput(f"lora_path={path!r}: does not exist on the Triton server's filesystem")
    return lora_id, name, path, source


def _one(tensors: dict[str, np.ndarray], name: str):
    array = tensors.get(name)
    if array is None:
        return None
    if array.size != 1:
        raise InvalidInput(f"{name}: expected one value, got shape {list(array.shape)}")
    return array.reshape(-1)[0]


def _flag(tensors: dict[str, np.ndarray], name: str) -> bool:
    value = _one(tensors, name)
    return bool(value) if value is not None else False


def _int(tensors, name: str, default: int | None, minimum: int | None = None, maximum: int | None = None) -> int | None:
    value = _one(tensors, name)
    if value is None:
        return default
    return in_range(name, int(value), minimum, maximum)


def _float(tensors, name: str, minimum: float | None = None, maximum: float | None = None) -> float | None:
    value = _one(tensors, name)
    if value is None:
        return None
    value = float(value)
    if not math.isfinite(value):
        raise InvalidInput(f"{name}={value}: must be a finite number")
    if minimum is not None and value < minimum:
        raise InvalidInput(f"{name}={value}: must be at least {minimum}")
    if maximum is not None and value > maximum:
        raise InvalidInput(f"{name}={value}: must be at most {maximum}")
    return value


def _string(tensors, name: str) -> str | None:
    value = _one(tensors, name)
    if value is not None and element_bytes(value) > MAX_NAME_BYTES:
        raise InvalidInput(f"{name}: {element_bytes(value)} bytes; at most {MAX_NAME_BYTES}")
    return None if value is None else utf8(name, value)


