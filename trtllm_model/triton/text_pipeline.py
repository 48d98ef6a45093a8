"""Tokens in and out for NVIDIA's `preprocessing` and `postprocessing` models, without Triton objects.

Both models use the tokenizer that the repository's `tensorrt_llm` uses (its `tokenizer_dir` / `model_dir`
parameters, the embedded SmolLM2, or the synthetic byte tokenizer), unless their own `tokenizer_dir` names one:
text tokenized here and by `ensemble` then gives the same ids. Shapes and dtypes are those of NVIDIA's models
(docs/nvidia_compatibility.md, "The three-model path").
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..conventions.common import InvalidInput, Limits, check_prompt_size, check_word_texts
from ..executor_interface import Tokenizer
from ..params import ConfigError, Params
from ..server import EXECUTOR_OVERRIDE_ENV

TARGET_MODEL = "tensorrt_llm"
_PARAMETER = re.compile(r'parameters:?\s*\{\s*key:\s*"(\w+)"\s*value:\s*\{\s*string_value:\s*"([^"]*)"\s*\}\s*\}')


# A request the pipeline models refuse (INVALID_ARG, or UNSUPPORTED when `unsupported`): the conventions' own, so
# that the size checks they share refuse here too.
BadInput = InvalidInput


def config_parameters(config_pbtxt: Path) -> dict[str, str]:
    """The `parameters` of a config.pbtxt (string values), {} when the file is missing."""
    try:
        text = config_pbtxt.read_text()
    except OSError:
        return {}
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    return dict(_PARAMETER.findall(text))


def repository_tokenizer(own_parameters: Mapping[str, str], repository: Path) -> Tokenizer:
    """The model's own `tokenizer_dir`, else the tokenizer of the repository's `tensorrt_llm` executor."""
    own = Params(dict(own_parameters), accepted=own_parameters.keys()).str("tokenizer_dir")
    if own:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(own)
    llm = config_parameters(repository / TARGET_MODEL / "config.pbtxt")
    params = Params(llm, accepted=llm.keys())
    executor = os.environ.get(EXECUTOR_OVERRIDE_ENV) or params.str("executor", "transformers")
    if executor == "synthetic":
        from ..executors.synthetic import SyntheticTokenizer

        return SyntheticTokenizer()
    from ..embedded.model_loading import load_tokenizer

    source = params.str("tokenizer_dir") or params.str("model_dir") or params.str("hf_model_path")
    if not source and executor != "transformers":  # only the embedded engine has a tokenizer of its own
        raise ConfigError(f"parameter tokenizer_dir: unset here and in {TARGET_MODEL} (executor {executor}); "
                          "name the engine's Hugging Face tokenizer directory")
    return load_tokenizer(source or None, params.str("model_cache_dir") or None)


def repository_limits(repository: Path) -> Limits:
    """max_input_len and max_output_len of the repository's `tensorrt_llm`: what may be tokenized or decoded here."""
    llm = config_parameters(repository / TARGET_MODEL / "config.pbtxt")
    params = Params(llm, accepted=llm.keys())
    return Limits(max_input_len=params.int("max_input_len", minimum=1),
                  max_output_len=params.int("max_output_len", minimum=1))


def end_and_pad_ids(tokenizer: Tokenizer) -> tuple[int, int]:
    """NVIDIA's defaults: end = the tokenizer's EOS, pad = its pad token, else EOS."""
    end_id = getattr(tokenizer, "eos_token_id", None)
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if end_id is None:
        raise BadInput("END_ID: the tokenizer has no end-of-sequence token; send END_ID")
    return int(end_id), int(end_id if pad_id is None else pad_id)


def texts(name: str, array: np.ndarray) -> list[str]:
    """A [batch, 1] STRING tensor -> one str per row."""
    out = []
    for item in array.reshape(array.shape[0] if array.ndim else 1, -1)[:, 0].tolist():
        try:
            out.append(item.decode("utf-8") if isinstance(item, bytes) else str(item))
        except UnicodeDecodeError as exc:
            raise BadInput(f"{name}: not valid UTF-8 ({exc})") from None
    return out


def encode_batch(tokenizer: Tokenizer, prompts: list[str], add_special_tokens: bool, pad_id: int,
                 limits: Limits) -> tuple[np.ndarray, np.ndarray]:
    """INPUT_ID INT32 [batch, longest] (padded with `pad_id`) and REQUEST_INPUT_LEN INT32 [batch, 1]; a prompt too
    long in bytes to fit `limits` is refused before anything is tokenized."""
    for text in prompts:
        check_prompt_size("QUERY", text, limits, tokenizer)
    encoded = [tokenizer.encode(text, add_special_tokens=add_special_tokens) for text in prompts]
    longest = max(1, max(len(ids) for ids in encoded))
    ids = np.full((len(encoded), longest), pad_id, dtype=np.int32)
    for row, tokens in enumerate(encoded):
        ids[row, : len(tokens)] = tokens
    return ids, np.array([[len(tokens)] for tokens in encoded], dtype=np.int32)


def word_lists(name: str, tokenizer: Tokenizer, batch: np.ndarray | None, batch_size: int) -> np.ndarray:
    """BAD_WORDS_DICT / STOP_WORDS_DICT [batch, words] -> INT32 [batch, 2, L]: row 0 the words' token ids, row 1
    their end offsets padded with -1 (an absent tensor: [batch, 2, 0])."""
    if batch is None:
        return np.empty((batch_size, 2, 0), dtype=np.int32)
    rows = []
    for words in batch.reshape(batch.shape[0], -1).tolist():
        check_word_texts(name, words, tokenizer)
        ids: list[int] = []
        offsets: list[int] = []
        for word in words:
            text = word.decode("utf-8", errors="replace") if isinstance(word, bytes) else str(word)
            tokens = tokenizer.encode(text, add_special_tokens=False) if text else []
            if tokens:
                ids += tokens
                offsets.append(len(ids))
        rows.append((ids, offsets))
    width = max(1, max(max(len(ids), len(offsets)) for ids, offsets in rows))
    out = np.zeros((len(rows), 2, width), dtype=np.int32)
    out[:, 1, :] = -1
    for row, (ids, offsets) in enumerate(rows):
        out[row, 0, : len(ids)] = ids
        out[row, 1, : len(offsets)] = offsets
    return out


def embedding_bias(tokenizer: Tokenizer, words: np.ndarray | None, weights: np.ndarray | None, batch_size: int) -> np.ndarray:
    """EMBEDDING_BIAS FP32 [batch, vocab]: each token of a word gets the word's weight (summed when repeated);
    [batch, 0] when no words are given."""
    if words is None or weights is None:
        return np.empty((batch_size, 0), dtype=np.float32)
    try:
        vocab = len(tokenizer)
    except TypeError:
        raise BadInput("EMBEDDING_BIAS_WORDS: this tokenizer has no vocabulary size; send embedding_bias to "
                       "tensorrt_llm", unsupported=True) from None
    words, weights = words.reshape(words.shape[0], -1), weights.reshape(weights.shape[0], -1)
    if words.shape != weights.shape:
        raise BadInput(f"EMBEDDING_BIAS_WORDS {list(words.shape)} and EMBEDDING_BIAS_WEIGHTS {list(weights.shape)}: "
                       "one weight per word")
    bias = np.zeros((words.shape[0], vocab), dtype=np.float32)
    for row in range(words.shape[0]):
        check_word_texts("EMBEDDING_BIAS_WORDS", words[row].tolist(), tokenizer)
        for word, weight in zip(words[row].tolist(), weights[row].tolist(), strict=True):
            if not np.isfinite(weight):
                raise BadInput(f"EMBEDDING_BIAS_WEIGHTS: {weight} is not a finite number")
            text = word.decode("utf-8", errors="replace") if isinstance(word, bytes) else str(word)
            for token in tokenizer.encode(text, add_special_tokens=False) if text else []:
                if 0 <= token < vocab:
                    bias[row, token] += weight
    return bias


def decode_batch(tokenizer: Tokenizer, tokens: np.ndarray, lengths: np.ndarray, skip_special_tokens: bool,
                 limits: Limits) -> np.ndarray:
    """TOKENS_BATCH [batch, beams, tokens] and SEQUENCE_LENGTH [batch, beams] -> OUTPUT bytes [batch, beams]: each
    sequence's first `length` tokens decoded as a whole (no clean-up of spaces, as `ensemble`'s text); a sequence
    longer than `tensorrt_llm` can write (max_input_len + max_output_len) is refused before any is decoded."""
    if tokens.ndim == 2:  # a client that left out the beam dimension
        tokens = tokens[:, None, :]
    lengths = lengths.reshape(tokens.shape[0], -1)
    if lengths.shape[1] != tokens.shape[1]:
        raise BadInput(f"SEQUENCE_LENGTH {list(lengths.shape)} does not match TOKENS_BATCH {list(tokens.shape)}")
    if limits.max_input_len and limits.max_output_len and lengths.size:
        longest, bound = int(lengths.max()), limits.max_input_len + limits.max_output_len
        if longest > bound:
            raise BadInput(f"SEQUENCE_LENGTH: {longest} tokens; at most {bound} (tensorrt_llm's max_input_len + "
                           "max_output_len)")
    out = np.empty(lengths.shape, dtype=np.object_)
    for b in range(tokens.shape[0]):
        for beam in range(tokens.shape[1]):
            length = int(lengths[b, beam])
            if not 0 <= length <= tokens.shape[2]:
                raise BadInput(f"SEQUENCE_LENGTH: {length} is outside [0, {tokens.shape[2]}]")
            ids = tokens[b, beam, :length].tolist()
            if any(t < 0 for t in ids):
                raise BadInput("TOKENS_BATCH: negative token id within SEQUENCE_LENGTH")
            text = tokenizer.decode(ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)
            out[b, beam] = text.encode("utf-8")
    return out
