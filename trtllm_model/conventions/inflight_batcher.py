"""NVIDIA's inflight-batcher convention: request tensors -> ParsedRequest, and response content -> output tensors.
Pure numpy; no Triton here.

Names follow NVIDIA's `tensorrt_llm` (token-level) and `ensemble` (text-level) models, so their clients work
unchanged. Every error is an InvalidInput whose message names the offending field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import numpy as np

from ..executor_interface import MAX_TOP_LOG_PROBS, OPTIONAL_INPUTS, GenerationRequest, Tokenizer
from ..pipeline.request_checks import MAX_BIAS_VALUES, MAX_GUIDE_BYTES, MAX_NAME_BYTES, MAX_WORD_LIST_TOKENS
from .common import (
    PERF_OUTPUTS,
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

# Alternative spellings: NVIDIA renamed some inputs in 2025-05 and the text-level model uses other names.
_ALIASES = {
    "max_tokens": ("request_output_len", "max_tokens"),
    "streaming": ("streaming", "stream"),
    "top_k": ("runtime_top_k", "top_k"),
    "top_p": ("runtime_top_p", "top_p"),
    "seed": ("seed", "random_seed"),
    "min_tokens": ("min_tokens", "min_length"),
    "length_penalty": ("len_penalty", "length_penalty"),
}


# Every alias -> its key, for the inputs read as one value per request.
_SCALAR_KEYS = {alias: key for key, aliases in _ALIASES.items() for alias in aliases} | {
    name: name
    for name in (
        "input_lengths", "beam_width", "end_id", "pad_id", "exclude_input_in_output", "temperature",
        "repetition_penalty", "presence_penalty", "frequency_penalty", "return_log_probs", "num_return_sequences",
        "allotted_time_ms", "return_finish_reason", "return_num_input_tokens", "return_num_output_tokens",
        "apply_chat_template", "stop", "return_context_logits", "return_generation_logits", "return_perf_metrics",
        "lora_task_id", "num_top_log_probs",
    )
}

# NVIDIA inputs declared by our models (so that their clients' requests are well-formed) that no executor here
# honours: a request carrying one is refused as UNSUPPORTED, naming it. (docs/nvidia_compatibility.md)
UNSUPPORTED_INPUTS = frozenset(
    {
        "encoder_input_features", "encoder_output_lengths",
        "decoder_text_input", "draft_input_ids", "draft_logits", "draft_acceptance_threshold", "num_draft_tokens",
        "use_draft_logits", "runtime_top_p_min", "runtime_top_p_decay", "runtime_top_p_reset_ids", "early_stopping",
        "beam_search_diversity_rate", "prompt_embedding_table", "prompt_table_extra_ids", "prompt_table_extra_id",
        "prompt_vocab_size", "cross_attention_mask", "mrope_rotary_cos_sin", "mrope_position_deltas",
        "context_phase_params", "skip_cross_attn_blocks", "retention_token_range_starts",
        "retention_token_range_ends", "retention_token_range_priorities", "retention_token_range_durations_ms",
        "retention_decode_priority", "retention_decode_duration_ms", "lookahead_window_size", "lookahead_ngram_size",
        "lookahead_verification_set_size",
    }
)

# decoder_input_ids / decoder_input_lengths are not listed: NVIDIA's preprocessing sends decoder_input_ids=[[pad_id]]
# with every request and NVIDIA's backend ignores it for a decoder-only engine; every engine served here is
# decoder-only (encoder_input_features is refused), so they are read by nothing. (docs/nvidia_compatibility.md)

GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar", "structural_tag")

# Request parameters NVIDIA's clients send that mean nothing to the model (NVIDIA's model reads no parameters):
# inflight_batcher_llm_client.py sends `Streaming` with unary requests.
IGNORED_PARAMETERS = frozenset({"Streaming"})


_ONE_VALUE_KEYS = frozenset(_SCALAR_KEYS.values())


def _one_value(scalars: dict[str, tuple[str, object]], key: str) -> tuple[str, object] | None:
    if key not in _ONE_VALUE_KEYS:  # a key missing from _SCALAR_KEYS would otherwise never be read
        raise KeyError(f"{key}: add it to _SCALAR_KEYS")
    return scalars.get(key)


def _scalars(tensors: dict[str, np.ndarray]) -> dict[str, tuple[str, object]]:
    """The one-value inputs present, by key: (the name the client used, the value).

    Driven by what the request carries, not by every input the model knows: parsing sits on the time-to-first-
    token path, and a request usually carries three or four of these.
    """
    found: dict[str, tuple[str, object]] = {}
    for name, array in tensors.items():
        key = _SCALAR_KEYS.get(name)
        if key is None:
            continue
        if key in found:
            first, second = sorted((found[key][0], name), key=_ALIASES[key].index)
            raise InvalidInput(f"{first} and {second}: give only one of them")
        if array.size != 1:
            raise InvalidInput(f"{name}: expected one value per request, got shape {list(array.shape)}")
        found[key] = (name, array.reshape(-1)[0])
    return found


def _int(scalars, key, minimum: int | None = None, maximum: int | None = None) -> int | None:
    got = _one_value(scalars, key)
    if got is None:
        return None
    name, value = got
    if not np.issubdtype(np.asarray(value).dtype, np.integer):
        raise InvalidInput(f"{name}: expected an integer, got {np.asarray(value).dtype}")
    return in_range(name, int(value), minimum, maximum)


def _float(scalars, key, minimum: float | None = None, maximum: float | None = None, open_min: bool = False):
    got = _one_value(scalars, key)
    if got is None:
        return None
    name, value = got
    value = float(value)
    if not math.isfinite(value):
        raise InvalidInput(f"{name}={value}: must be a finite number")
    if minimum is not None and (value < minimum or (open_min and value == minimum)):
        bound = f"greater than {minimum}" if open_min else f"at least {minimum}"
        raise InvalidInput(f"{name}={value}: must be {bound}")
    if maximum is not None and value > maximum:
        raise InvalidInput(f"{name}={value}: must be at most {maximum}")
    return value


def _bool(scalars, key, default: bool = False) -> bool:
    got = _one_value(scalars, key)
    if got is None:
        return default
    name, value = got
    if np.asarray(value).dtype != np.bool_:
        raise InvalidInput(f"{name}: expected BOOL, got {np.asarray(value).dtype}")
    return bool(value)


def split_batch(tensors: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """A request carrying a batch (NVIDIA's clients may send several prompts in one request: input_ids or
    text_input with a first dimension over 1) -> one tensor dict per sequence. Every input must have that batch."""
    lead_name = "input_ids" if "input_ids" in tensors else "text_input"
    lead = tensors.get(lead_name)
    if lead is None or lead.ndim < 2 or lead.shape[0] <= 1:
        return [tensors]
    size = lead.shape[0]
    for name, array in tensors.items():
        if array.ndim == 0 or array.shape[0] != size:
            got = array.shape[0] if array.ndim else 0
            raise InvalidInput(f"{name}: batch size {got}, but {lead_name} has a batch of {size}")
    return [{name: array[index : index + 1] for name, array in tensors.items()} for index in range(size)]


def _check_batch_of_one(tensors: dict[str, np.ndarray]) -> None:
    for name, array in tensors.items():
        if array.ndim >= 2 and array.shape[0] != 1:
            raise InvalidInput(f"{name}: batch size {array.shape[0]}; send one sequence per request")


def _token_list(name: str, array: np.ndarray, limits: Limits, length: int | None) -> list[int]:
    """The first `length` (None: all) token ids, each within the vocabulary; no more than max_input_len is read."""
    if not np.issubdtype(array.dtype, np.integer):
        raise InvalidInput(f"{name}: expected INT32 token ids, got {array.dtype}")
    if array.ndim == 2 and array.shape[0] != 1:
        raise InvalidInput(f"{name}: batch size {array.shape[0]}; send one sequence per request")
    if array.ndim > 2:
        raise InvalidInput(f"{name}: expected shape [1, tokens], got {list(array.shape)}")
    array = array.reshape(-1)[:length]
    if limits.max_input_len is not None and array.size > limits.max_input_len:
        raise InvalidInput(f"{name}: prompt of {array.size} tokens is over max_input_len={limits.max_input_len}")
    ids = array.tolist()
    bad = [t for t in ids if t < 0 or (limits.vocab_size is not None and t >= limits.vocab_size)]
    if bad:
        raise InvalidInput(f"{name}: token id {bad[0]} is outside the vocabulary [0, {limits.vocab_size})")
    return ids


def words_from_offsets(name: str, array: np.ndarray) -> list[list[int]]:
    """NVIDIA's [1, 2, L] word list (row 0 token ids, row 1 end offsets padded with -1) -> list of words."""
    if array.ndim == 3 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 2 or array.shape[0] != 2 or not np.issubdtype(array.dtype, np.integer):
        raise InvalidInput(f"{name}: expected INT32 of shape [1, 2, L], got {array.dtype} {list(array.shape)}")
    if array.shape[1] > MAX_WORD_LIST_TOKENS:  # before reading it: the engines test every word at every step
        raise InvalidInput(f"{name}: {array.shape[1]} token ids; at most {MAX_WORD_LIST_TOKENS} per list")
    ids, offsets = array[0].tolist(), [o for o in array[1].tolist() if o != -1]
    words, start = [], 0
    for end in offsets:
        if end <= start or end > len(ids):
            raise InvalidInput(f"{name}: offsets must increase and stay within the {len(ids)} token ids")
        word = ids[start:end]
        if any(t < 0 for t in word):
            raise InvalidInput(f"{name}: negative token id in a word")
        words.append(word)
        start = end
    return words


def words_to_offsets(words: list[list[int]]) -> np.ndarray:
    """Inverse of words_from_offsets, for clients: list of words -> INT32 [1, 2, L]."""
    ids = [t for word in words for t in word]
    offsets = np.cumsum([len(w) for w in words]).tolist()
    width = max(len(ids), len(offsets), 1)
    row0 = ids + [0] * (width - len(ids))
    row1 = offsets + [-1] * (width - len(offsets))
    return np.array([[row0, row1]], dtype=np.int32)


def _text_words(name: str, array: np.ndarray, tokenizer: Tokenizer) -> list[list[int]]:
    items = array.reshape(-1).tolist()
    check_word_texts(name, items, tokenizer)
    words = []
    for item in items:
        text = utf8(name, item)
        if text:
            words.append(tokenizer.encode(text, add_special_tokens=False))
    return [w for w in words if w]


def parameters_dict(parameters_json: str | None, accepted: frozenset[str]) -> dict:
    """Request parameters; unknown keys are refused (Triton's own `triton_*` keys pass through)."""
    params = json.loads(parameters_json) if parameters_json else {}
    unknown = sorted(
        k for k in params if k not in accepted and k not in IGNORED_PARAMETERS and not k.startswith("triton_")
    )
    if unknown:
        raise InvalidInput(f"unknown request parameter(s): {', '.join(unknown)}")
    return params


def parse_request(
    tensors: dict[str, np.ndarray],
    parameters: dict,
    limits: Limits,
    tokenizer: Tokenizer | None,
    chat_template: Callable[[str], str] | None = None,
) -> ParsedRequest:
    """Validate one request's input tensors and turn them into a GenerationRequest."""
    return parse_alone(request_parser(tensors, parameters, limits, tokenizer, chat_template), tokenizer)


def request_parser(
    tensors: dict[str, np.ndarray],
    parameters: dict,
    limits: Limits,
    tokenizer: Tokenizer | None,
    chat_template: Callable[[str], str] | None = None,
) -> RequestParser:
    """parse_request, stopping at a text prompt to be sent its token ids (conventions/parsing.py). `chat_template`
    renders a user's text as the model's chat prompt."""
    _check_batch_of_one(tensors)
    scalars = _scalars(tensors)
    if _bool(scalars, "stop"):
        return ParsedRequest(GenerationRequest(input_ids=[0], max_tokens=1), text_mode=False, stop_only=True)
    _refuse_unsupported(tensors, limits)
    text_mode = "text_input" in tensors
    if text_mode and "input_ids" in tensors:
        raise InvalidInput("text_input and input_ids: give one of them, not both")
    if text_mode:
        if tokenizer is None:
            raise InvalidInput("text_input: this executor has no tokenizer; send input_ids", unsupported=True)
        array = tensors["text_input"]
        if array.size != 1:
            raise InvalidInput(f"text_input: expected one string per request, got shape {list(array.shape)}")
        check_prompt_size("text_input", array.reshape(-1)[0], limits, tokenizer)
        text = utf8("text_input", array.reshape(-1)[0])
        if not text:
            raise InvalidInput("text_input: the prompt is empty")
        if _bool(scalars, "apply_chat_template", limits.apply_chat_template) and chat_template is not None:
            input_ids = yield Prompt(chat_template(text), add_special_tokens=False)  # no second BOS
        else:
            input_ids = yield Prompt(text, add_special_tokens=True)
    elif "input_ids" in tensors:
        length = _int(scalars, "input_lengths", minimum=1)  # over the ids given: all of them, as NVIDIA's slice
        input_ids = _token_list("input_ids", tensors["input_ids"], limits, length)
    else:
        raise InvalidInput("input_ids or text_input: one of them is required")
    if not input_ids:
        raise InvalidInput("input_ids: the prompt is empty")
    if limits.max_input_len is not None and len(input_ids) > limits.max_input_len:
        raise InvalidInput(f"input_ids: prompt of {len(input_ids)} tokens is over max_input_len={limits.max_input_len}")

    max_tokens = _int(scalars, "max_tokens", minimum=1, maximum=limits.max_output_len)
    if max_tokens is None:
        raise InvalidInput("request_output_len (max_tokens): required")
    if limits.max_seq_len is not None and len(input_ids) + max_tokens > limits.max_seq_len:
        raise InvalidInput(f"{_one_value(scalars, 'max_tokens')[0]}={max_tokens}: with the prompt's {len(input_ids)} "
                           f"tokens that is {len(input_ids) + max_tokens}, over max_seq_len={limits.max_seq_len}")
    streaming = _bool(scalars, "streaming")
    if streaming and not limits.decoupled:
        name = _one_value(scalars, "streaming")[0]
        raise InvalidInput(
            f"{name}=true: this model is configured with `decoupled: false` (one response per request), so it "
            f"cannot stream; send {name}=false, or serve the decoupled model (trtllm-triton serve --decoupled true)"
        )
    beam_width = _int(scalars, "beam_width", minimum=0) or 1  # 0 means 1, as in NVIDIA's model
    if limits.max_beam_width is not None and beam_width > limits.max_beam_width:
        raise InvalidInput(f"beam_width={beam_width}: over max_beam_width={limits.max_beam_width}")
    end_id = _int(scalars, "end_id", minimum=-1)  # -1: no end token (TensorRT-LLM's ignore-EOS), as NVIDIA passes it
    pad_id = _int(scalars, "pad_id", minimum=0)
    if text_mode and end_id is None:
        end_id = tokenizer.eos_token_id  # as NVIDIA's preprocessing: text requests end at the tokenizer's EOS
    stop_words, bad_words = [], []
    if "stop_words_list" in tensors:
        stop_words = words_from_offsets("stop_words_list", tensors["stop_words_list"])
    if "bad_words_list" in tensors:
        bad_words = words_from_offsets("bad_words_list", tensors["bad_words_list"])
    for name, target in (("stop_words", stop_words), ("bad_words", bad_words)):
        if name in tensors:
            if tokenizer is None:
                raise InvalidInput(f"{name}: this executor has no tokenizer; send {name}_list", unsupported=True)
            target.extend(_text_words(name, tensors[name], tokenizer))
    embedding_bias = _embedding_bias(tensors, limits, tokenizer)
    top_k, top_p = _top_k_top_p(scalars)
    lora_task_id, lora_weights, lora_config = _lora(tensors, scalars)
    guide_type, guide = _guided_decoding(tensors)

    generation = GenerationRequest(
        input_ids=input_ids,
        max_tokens=max_tokens,
        streaming=streaming,
        end_id=end_id,
        pad_id=pad_id,
        exclude_input_in_output=_bool(scalars, "exclude_input_in_output", limits.exclude_input_in_output),
        temperature=_float(scalars, "temperature", minimum=0.0),
        top_k=top_k,
        top_p=top_p,
        seed=_int(scalars, "seed", minimum=0, maximum=UINT64_MAX),
        repetition_penalty=_float(scalars, "repetition_penalty", minimum=0.0, open_min=True),
        presence_penalty=_float(scalars, "presence_penalty"),
        frequency_penalty=_float(scalars, "frequency_penalty"),
        length_penalty=_float(scalars, "length_penalty"),
        min_tokens=_int(scalars, "min_tokens", minimum=0),
        stop_words=stop_words,
        bad_words=bad_words,
        embedding_bias=embedding_bias,
        return_log_probs=_bool(scalars, "return_log_probs"),
        num_top_log_probs=_int(scalars, "num_top_log_probs", minimum=0, maximum=MAX_TOP_LOG_PROBS) or 0,
        beam_width=beam_width,
        num_return_sequences=_int(scalars, "num_return_sequences", minimum=0) or 1,  # 0 means 1, as NVIDIA's
        allotted_time_ms=_int(scalars, "allotted_time_ms", minimum=1),
        return_context_logits=_bool(scalars, "return_context_logits"),
        return_generation_logits=_bool(scalars, "return_generation_logits"),
        return_perf_metrics=_bool(scalars, "return_perf_metrics"),
        lora_task_id=lora_task_id,
        lora_weights=lora_weights,
        lora_config=lora_config,
        guided_decoding_type=guide_type,
        guided_decoding_guide=guide,
        cache_salt=_cache_salt(tensors),
        faults={k[len("synthetic_fault_"):]: str(v) for k, v in parameters.items() if k.startswith("synthetic_fault_")},
    )
    return ParsedRequest(
        generation=generation,
        text_mode=text_mode,
        return_log_probs=generation.return_log_probs,
        return_finish_reason=_bool(scalars, "return_finish_reason"),
        return_num_input_tokens=_bool(scalars, "return_num_input_tokens"),
        return_num_output_tokens=_bool(scalars, "return_num_output_tokens"),
        return_perf_metrics=_bool(scalars, "return_perf_metrics"),
        prompt_ids=input_ids,
    )


def _asks(array: np.ndarray) -> bool:
    """Whether an optional input asks for anything: present, not empty, and (for BOOL flags) true."""
    if array.size == 0:
        return False
    return bool(array.any()) if array.dtype == np.bool_ else True


def _refuse_unsupported(tensors: dict[str, np.ndarray], limits: Limits) -> None:
    for name, array in tensors.items():
        if name in UNSUPPORTED_INPUTS and _asks(array):
            raise InvalidInput(f"{name}: not supported by this server (see docs/nvidia_compatibility.md)", unsupported=True)
    for feature, names in OPTIONAL_INPUTS.items():
        if feature in limits.optional_inputs:
            continue
        for name in names:
            if name in tensors and _asks(tensors[name]):
                raise InvalidInput(f"{name}: {limits.executor_label} does not support it", unsupported=True)


def _top_k_top_p(scalars) -> tuple[int | None, float | None]:
    """NVIDIA's reading: top_p <= 0 means unset, top_k 0 means no cut, and neither means greedy.

    (NVIDIA's model drops runtime_top_p <= 0; TensorRT-LLM samples greedily when top_k and top_p are both 0, its
    defaults. Their client sends runtime_top_k=1, runtime_top_p=0 unless told otherwise.)
    """
    top_k = _int(scalars, "top_k", minimum=0) or None
    top_p = _float(scalars, "top_p", maximum=1.0)
    if top_p is not None and top_p <= 0.0:
        top_p = None
    if top_k is None and top_p is None:
        top_k = 1
    return top_k, top_p


def _embedding_bias(tensors: dict[str, np.ndarray], limits: Limits, tokenizer: Tokenizer | None) -> list[float] | None:
    has_words = "embedding_bias_words" in tensors or "embedding_bias_weights" in tensors
    if "embedding_bias" in tensors and tensors["embedding_bias"].size:
        if has_words:
            raise InvalidInput("embedding_bias and embedding_bias_words: give one of them, not both")
        size, vocab = tensors["embedding_bias"].size, limits.vocab_size
        if size != (vocab or size) or size > MAX_BIAS_VALUES:  # before reading the values
            expected = f"the vocab size is {vocab}" if vocab else f"at most {MAX_BIAS_VALUES} (one per token id)"
            raise InvalidInput(f"embedding_bias: {size} values; {expected}")
        return tensors["embedding_bias"].astype(np.float32).reshape(-1).tolist()
    if not has_words:
        return None
    words = tensors.get("embedding_bias_words", np.empty(0, np.object_)).reshape(-1)
    weights = tensors.get("embedding_bias_weights", np.empty(0, np.float32)).reshape(-1)
    if words.size != weights.size:
        raise InvalidInput(
            f"embedding_bias_words and embedding_bias_weights: {words.size} words but {weights.size} weights"
        )
    if not words.size:
        return None
    if tokenizer is None:
        raise InvalidInput("embedding_bias_words: this executor has no tokenizer; send embedding_bias", unsupported=True)
    words, weights = words.tolist(), weights.tolist()
    check_word_texts("embedding_bias_words", words, tokenizer)
    vocab = limits.vocab_size or len(tokenizer)
    bias = np.zeros(vocab, np.float32)
    for word, weight in zip(words, weights, strict=True):
        if not math.isfinite(weight):
            raise InvalidInput(f"embedding_bias_weights: {weight} is not a finite number")
        # As NVIDIA's preprocessing: every token of the word gets the word's weight (added up if repeated).
        for token in tokenizer.encode(utf8("embedding_bias_words", word), add_special_tokens=False):
            if 0 <= token < vocab:
                bias[token] += weight
    return bias.tolist()


def _lora(tensors: dict[str, np.ndarray], scalars) -> tuple[int | None, np.ndarray | None, np.ndarray | None]:
    task_id = _int(scalars, "lora_task_id", minimum=0, maximum=UINT64_MAX)
    weights, config = tensors.get("lora_weights"), tensors.get("lora_config")
    if weights is not None:
        weights = weights[0] if weights.ndim == 3 else weights
        if weights.ndim != 2:
            raise InvalidInput(f"lora_weights: expected shape [1, modules, size], got {list(tensors['lora_weights'].shape)}")
    if config is not None:
        config = config[0] if config.ndim == 3 else config
        if config.ndim != 2 or config.shape[1] != 3 or not np.issubdtype(config.dtype, np.integer):
            raise InvalidInput(f"lora_config: expected INT32 of shape [1, modules, 3], got {list(tensors['lora_config'].shape)}")
    if (weights is None) != (config is None):
        raise InvalidInput("lora_weights and lora_config: give both or neither")
    if weights is not None and task_id is None:
        raise InvalidInput("lora_task_id: required with lora_weights (the adapter is cached under it)")
    return task_id, weights, config


def _one_string(tensors: dict[str, np.ndarray], name: str, max_bytes: int = MAX_NAME_BYTES) -> str | None:
    if name not in tensors:
        return None
    array = tensors[name]
    if array.size != 1:
        raise InvalidInput(f"{name}: expected one string per request, got shape {list(array.shape)}")
    size = element_bytes(array.reshape(-1)[0])
    if size > max_bytes:
        raise InvalidInput(f"{name}: {size} bytes; at most {max_bytes}")
    return utf8(name, array.reshape(-1)[0])


def _cache_salt(tensors: dict[str, np.ndarray]) -> str | None:
    """vLLM's `cache_salt`: requests share cached KV blocks only with requests of the same salt."""
    salt = _one_string(tensors, "cache_salt")
    if salt == "":
        raise InvalidInput("cache_salt: must not be empty (leave it out for no salt)")
    return salt


def _guided_decoding(tensors: dict[str, np.ndarray]) -> tuple[str | None, str | None]:
    guide_type = _one_string(tensors, "guided_decoding_guide_type")
    guide = _one_string(tensors, "guided_decoding_guide", MAX_GUIDE_BYTES)
    if guide_type is None:
        if guide is not None:
            raise InvalidInput("guided_decoding_guide: needs guided_decoding_guide_type")
        return None, None
    if guide_type not in GUIDE_TYPES:
        raise InvalidInput(f"guided_decoding_guide_type={guide_type!r}: expected one of {', '.join(GUIDE_TYPES)}")
    if guide_type != "json" and not guide:
        raise InvalidInput(f"guided_decoding_guide: required with guided_decoding_guide_type={guide_type}")
    return guide_type, guide


def _padded(rows: list[list], fill, dtype) -> np.ndarray:
    """[1, rows, longest row], shorter rows padded with `fill` (NVIDIA pads output_ids with -1)."""
    if len(rows) == 1:  # one beam: every streamed token takes this path
        return np.array(rows[0], dtype=dtype).reshape(1, 1, -1)
    width = max((len(row) for row in rows), default=0)
    array = np.full((1, len(rows), width), fill, dtype=dtype)
    for index, row in enumerate(rows):
        array[0, index, : len(row)] = row
    return array


def _top_log_probs(positions: list[list[tuple[int, float]]], k: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.full((1, 1, len(positions), k), -1, dtype=np.int32)
    values = np.full((1, 1, len(positions), k), -np.inf, dtype=np.float32)
    for index, top in enumerate(positions):
        if top:
            ids[0, 0, index, : len(top)], values[0, 0, index, : len(top)] = zip(*top)
    return ids, values


def response_outputs(parsed: ParsedRequest, content: ResponseContent) -> dict[str, np.ndarray]:
    """Output tensors of one response, shaped as NVIDIA's models return them (docs/nvidia_compatibility.md):
    the new tokens (streaming) or the whole output (final, non-streaming)."""
    outputs: dict[str, np.ndarray] = {}
    if parsed.text_mode:
        # NVIDIA's postprocessing returns one string per beam, without a batch dimension.
        outputs["text_output"] = np.array([text.encode("utf-8") for text in content.texts or [""]], dtype=np.object_)
    else:
        outputs["output_ids"] = _padded(content.beams, -1, np.int32)
        outputs["sequence_length"] = np.array([[len(beam) for beam in content.beams]], dtype=np.int32)
    if parsed.return_log_probs:
        log_probs = content.log_probs or [[] for _ in content.beams]
        outputs["output_log_probs"] = _padded(log_probs, 0.0, np.float32)
        cum = content.cum_log_probs or [0.0] * len(log_probs)
        outputs["cum_log_probs"] = np.array([cum], dtype=np.float32)
    if parsed.generation.num_top_log_probs:
        # Ours (NVIDIA's models have none): [1, beams, tokens, k] ids and log probs of the likeliest tokens at each
        # position, best first; a position with fewer than k (tokens banned) is padded with id -1, log prob -inf.
        outputs["output_top_log_prob_ids"], outputs["output_top_log_probs"] = _top_log_probs(
            content.top_log_probs or [], parsed.generation.num_top_log_probs)
    if parsed.generation.return_context_logits and content.context_logits is not None:
        outputs["context_logits"] = np.asarray(content.context_logits, np.float32)[None]
    if parsed.generation.return_generation_logits and content.generation_logits is not None:
        outputs["generation_logits"] = np.asarray(content.generation_logits, np.float32)[None]
    if parsed.return_finish_reason and content.finish_reason is not None:
        outputs["finish_reason"] = np.array([[content.finish_reason.encode()]], dtype=np.object_)
    if parsed.return_num_input_tokens:
        outputs["num_input_tokens"] = np.array([[len(parsed.prompt_ids)]], dtype=np.int32)
    if parsed.return_num_output_tokens:
        outputs["num_output_tokens"] = np.array([[content.num_output_tokens]], dtype=np.int32)
    if parsed.generation.num_return_sequences > 1:
        outputs["sequence_index"] = np.array([[content.sequence_index]], dtype=np.int32)
    if parsed.return_perf_metrics and content.perf is not None:
        for name, dtype in PERF_OUTPUTS.items():
            outputs[name] = np.array([[content.perf.get(name, 0)]], dtype=dtype)
    return outputs
