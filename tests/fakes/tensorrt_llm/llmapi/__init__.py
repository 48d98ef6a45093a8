"""A strict fake of the LLM API (`tensorrt_llm.LLM`, `SamplingParams`), driven by the fake engine on a thread.

As in the real API: `SamplingParams` and `KvCacheConfig` are keyword-only and reject unknown names; unknown
`LLM(...)` keywords raise ValueError (pydantic's "extra inputs are not permitted"); `generate_async` returns a
`RequestOutput` at once, and `async for` over it works only if `generate_async` ran on that event loop;
`abort()` ends the request with a final step of zero new tokens and finish_reason 'cancelled'.
A checkpoint directory needs `config.json` (`vocab_size`, `max_position_embeddings` are read). `LLM.args` holds
the resolved arguments (TorchLlmArgs' names and defaults); a prompt over `max_num_tokens` (without chunked
prefill) or a prompt + max_tokens over the sequence length is refused at `generate_async`.
The tokenizer is byte-level: ids 0-255 are bytes, 256 is EOS, higher ids decode as " w<id>".
"""

from __future__ import annotations

import asyncio
import itertools
import json
import queue
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from typing import Self

from .._engine import FakeEngine, Job, Update, fake_log_prob


def _logprob_entry(token: int, count: int) -> dict:
    """The PyTorch backend's entry for one generated token with SamplingParams.logprobs=count: the `count` likeliest
    tokens (ranks 1..count) and the sampled one. The fake's: the sampled token is the likeliest, the ids after it
    follow, each 1 less likely."""
    entry = {token: Logprob(fake_log_prob(token), 1)}
    for rank in range(2, count + 1):
        entry.setdefault(token + rank - 1, Logprob(fake_log_prob(token) - (rank - 1), rank))
    return entry


class RequestError(RuntimeError):
    """Raised from iterating a RequestOutput whose request failed in the engine."""


class Logprob(NamedTuple):
    logprob: float
    rank: int | None = None


@dataclass(kw_only=True)
class KvCacheConfig:
    enable_block_reuse: bool = True
    max_tokens: int | None = None
    max_attention_window: list[int] | None = None
    sink_token_length: int | None = None
    free_gpu_memory_fraction: float | None = None
    host_cache_size: int | None = None
    onboard_blocks: bool = True


@dataclass(kw_only=True)
class GuidedDecodingParams:
    """As tensorrt_llm.llmapi.GuidedDecodingParams: keyword-only, one of the fields is the guide."""

    json: str | dict | None = None
    regex: str | None = None
    grammar: str | None = None
    json_object: bool = False
    structural_tag: str | None = None


@dataclass(kw_only=True)
class SamplingParams:
    max_tokens: int = 32
    end_id: int | None = None
    pad_id: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    bad: str | list[str] | None = None
    bad_token_ids: list[int] | None = None
    n: int = 1
    best_of: int | None = None
    use_beam_search: bool = False
    top_k: int | None = None
    top_p: float | None = None
    temperature: float | None = None
    seed: int | None = None
    min_tokens: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    length_penalty: float | None = None
    logprobs: int | None = None
    exclude_input_from_output: bool = True
    ignore_eos: bool = False
    detokenize: bool = True
    skip_special_tokens: bool = True
    return_context_logits: bool = False
    return_generation_logits: bool = False
    embedding_bias: object = None
    logits_processor: object = None
    guided_decoding: GuidedDecodingParams | None = None

    def __post_init__(self) -> None:
        if self.best_of is not None and self.best_of < self.n:
            raise ValueError(f"best_of ({self.best_of}) cannot be less than n ({self.n})")
        if self.stop_token_ids is not None and not all(isinstance(t, int) for t in self.stop_token_ids):
            raise TypeError("stop_token_ids must be list[int]")


@dataclass
class LoRARequest:
    """As tensorrt_llm.llmapi.LoRARequest (tensorrt_llm/executor/request.py): the path must exist."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    lora_ckpt_source: str = "hf"

    def __post_init__(self) -> None:
        if not Path(self.lora_path).exists():
            raise ValueError(f"lora_path ({self.lora_path}) does not exist.")
        if self.lora_ckpt_source not in ("hf", "nemo"):
            raise ValueError(f"lora_ckpt_source must be one of 'hf' or 'nemo', got {self.lora_ckpt_source}")


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: list = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids_diff: list[int] = field(default_factory=list)
    logprobs_diff: list = field(default_factory=list)
    text_diff: str = ""
    generation_logits: object = None  # torch [tokens so far, vocab] with return_generation_logits


_FINISH = {"END_ID": "stop", "STOP_WORDS": "stop", "LENGTH": "length", "TIMED_OUT": "timeout",
           "CANCELLED": "cancelled"}


class RequestOutput:
    def __init__(self, llm: LLM, request_id: int, prompt_token_ids: list[int], params: SamplingParams,
                 width: int, loop: asyncio.AbstractEventLoop | None) -> None:
        self.request_id = request_id
        self.prompt: str | None = None
        self.prompt_token_ids = prompt_token_ids
        self.outputs = [CompletionOutput(index=i) for i in range(width)]
        self.finished = False
        self._llm = llm
        self._params = params
        self._loop = loop
        self._aqueue: asyncio.Queue | None = asyncio.Queue() if loop is not None else None
        self._queue: queue.Queue = queue.Queue()
        self._stop_words: list[list[int]] = []
        self.context_logits = None  # torch [prompt tokens, vocab] with return_context_logits

    # engine thread
    def _push(self, item: Update) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._aqueue.put_nowait, item)
        else:
            self._queue.put(item)

    def _apply(self, update: Update) -> None:
        if update.error is not None:
            self.finished = True
            raise RequestError(update.error)
        job = update.job
        for output, new, reason in zip(self.outputs, update.new_tokens, update.finished):
            if job.beam_width > 1:
                output.token_ids_diff = new[len(output.token_ids):] if new[: len(output.token_ids)] == \
                    output.token_ids else list(new)
                output.token_ids = list(new)
            else:
                output.token_ids_diff = list(new)
                output.token_ids = output.token_ids + list(new)
            if self._params.logprobs:
                output.logprobs_diff = [_logprob_entry(t, self._params.logprobs) for t in output.token_ids_diff]
                output.logprobs = output.logprobs + output.logprobs_diff
                output.cumulative_logprob = sum(fake_log_prob(t) for t in output.token_ids)
            if self._params.return_generation_logits and output.token_ids:
                output.generation_logits = self._one_hot(output.token_ids)  # fake logits: 1.0 at each token
            if output.finish_reason is None and reason is not None:
                output.finish_reason = _FINISH[reason]
                if reason == "STOP_WORDS":
                    word = next(w for w in self._stop_words if output.token_ids[-len(w):] == w)
                    output.stop_reason = word[0] if len(word) == 1 else self._llm.tokenizer.decode(word)
        if self._params.return_context_logits and self.context_logits is None:
            self.context_logits = self._one_hot(self.prompt_token_ids[1:] + self.outputs[0].token_ids[:1])
        self.finished = update.job_done

    def _one_hot(self, tokens: list[int]):
        import torch

        return torch.nn.functional.one_hot(torch.tensor(tokens), self._llm.vocab_size).float()

    # consumer side
    def abort(self) -> None:
        self._llm._engine.cancel(self.request_id)

    def __aiter__(self) -> RequestOutput:
        if self._aqueue is None:
            raise RuntimeError("async iteration needs generate_async() to be called on a running event loop")
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        self._apply(await self._aqueue.get())
        return self

    def __iter__(self) -> RequestOutput:
        return self

    def __next__(self) -> RequestOutput:
        if self.finished:
            raise StopIteration
        self._apply(self._queue.get())
        return self

    async def aresult(self) -> RequestOutput:
        async for _ in self:
            pass
        return self


# `LLM(...)` keywords this fake knows, with TorchLlmArgs' defaults (`LLM.args` holds them, resolved).
_LLM_ARGUMENTS = {
    "backend": "pytorch", "max_batch_size": 2048, "max_num_tokens": 8192, "max_seq_len": None, "max_input_len": 1024,
    "max_beam_width": 1, "kv_cache_config": None, "enable_chunked_prefill": False, "pipeline_parallel_size": 1,
    "gpus_per_node": None, "moe_expert_parallel_size": None, "enable_attention_dp": False, "cuda_graph_config": None,
    "disable_overlap_scheduler": False, "enable_iter_perf_stats": False, "return_perf_metrics": False,
    "scheduler_config": None, "build_config": None, "guided_decoding_backend": None, "lora_config": None,
}


class FakeTokenizer:
    eos_token_id = 256
    pad_token_id = 256

    def encode(self, text: str, *args, add_special_tokens: bool = True, **kwargs) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: list[int], *args, skip_special_tokens: bool = True, **kwargs) -> str:
        out = bytearray()
        for token in token_ids:
            if token < 256:
                out.append(token)
            elif token > 256:
                out.extend(f" w{token}".encode())
            elif not skip_special_tokens:
                out.extend(b"</s>")
        return out.decode("utf-8", errors="replace")


class LLM:
    def __init__(self, model, tokenizer=None, tokenizer_mode: str = "auto", skip_tokenizer_init: bool = False,
                 trust_remote_code: bool = False, tensor_parallel_size: int = 1, dtype: str = "auto",
                 revision=None, tokenizer_revision=None, **kwargs) -> None:
        unknown = sorted(set(kwargs) - set(_LLM_ARGUMENTS))
        if unknown:
            raise ValueError(f"1 validation error for TorchLlmArgs\n{unknown[0]}\n  Extra inputs are not permitted")
        if kwargs.get("backend") not in (None, "pytorch", "_autodeploy"):
            raise ValueError(f"backend {kwargs['backend']!r}: expected 'pytorch' or '_autodeploy'")
        kv = kwargs.get("kv_cache_config")
        if kv is not None and not isinstance(kv, KvCacheConfig):
            raise ValueError("kv_cache_config: Input should be a valid KvCacheConfig")
        config_path = Path(model) / "config.json"
        if not config_path.is_file():
            raise ValueError(f"Failed to load the model from {model}: no config.json (not a Hugging Face checkpoint)")
        config = json.loads(config_path.read_text())
        self.args = SimpleNamespace(**{**_LLM_ARGUMENTS, **kwargs}, model=str(model),
                                    tensor_parallel_size=tensor_parallel_size)
        self.vocab_size = int(config.get("vocab_size", 32000))
        # As the PyTorch model engine: the checkpoint's length, or a smaller max_seq_len when given.
        supported = int(config.get("max_position_embeddings") or 2048)
        self.max_seq_len = min(self.args.max_seq_len or supported, supported)
        self.max_beam_width = int(self.args.max_beam_width or 1)
        self._tokenizer = None if skip_tokenizer_init else FakeTokenizer()
        self._ids = itertools.count(1)
        self._outputs: dict[int, RequestOutput] = {}
        keep_stats = 1000 if kwargs.get("enable_iter_perf_stats") else 0  # the PyTorch backend keeps none otherwise
        self._max_batch_size = int(self.args.max_batch_size)
        self._engine = FakeEngine(self.vocab_size, self._max_batch_size, self._on_update, keep_stats)
        self._submitted = False
        self.requests: list = []  # (SamplingParams, LoRARequest | None) of each generate_async, for tests

    @property
    def tokenizer(self) -> FakeTokenizer | None:
        return self._tokenizer

    def _on_update(self, update: Update) -> None:
        output = self._outputs[update.job.job_id]
        if update.job_done:
            del self._outputs[update.job.job_id]
        output._push(update)

    def generate_async(self, inputs, sampling_params: SamplingParams | None = None, lora_request=None,
                       prompt_adapter_request=None, streaming: bool = False, kv_cache_retention_config=None,
                       disaggregated_params=None, scheduling_params=None, cache_salt=None) -> RequestOutput:
        params = sampling_params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError("sampling_params must be a SamplingParams")
        if lora_request is not None and not isinstance(lora_request, LoRARequest):
            raise TypeError("lora_request must be a LoRARequest")
        if lora_request is not None and self.args.lora_config is None:
            raise ValueError("LoRA is not enabled: build the LLM with lora_config")
        self.requests.append((params, lora_request))
        if isinstance(inputs, dict):
            prompt = inputs.get("prompt_token_ids")
        elif isinstance(inputs, list):
            prompt = inputs
        elif isinstance(inputs, str) and self._tokenizer is not None:
            prompt = self._tokenizer.encode(inputs)
        else:
            raise TypeError(f"unsupported prompt input {type(inputs).__name__}")
        if not prompt or not all(isinstance(t, int) for t in prompt):
            raise ValueError("prompt_token_ids must be a non-empty list of ints")
        if not self.args.enable_chunked_prefill and len(prompt) > self.args.max_num_tokens:
            raise ValueError(f"The sum of prompt length ({float(len(prompt))}), query length (0) should not exceed "
                             f"max_num_tokens ({self.args.max_num_tokens})")
        if len(prompt) + params.max_tokens > self.max_seq_len:
            raise ValueError(f"The sum of prompt length ({len(prompt)}) and max_tokens ({params.max_tokens}) "
                             f"should not exceed max_seq_len ({self.max_seq_len})")
        beam_width = (params.best_of or params.n) if params.use_beam_search else 1
        if beam_width > self.max_beam_width:
            raise ValueError(f"beam width {beam_width} exceeds max_beam_width {self.max_beam_width}")
        stop_words = [[t] for t in params.stop_token_ids or []] + self._encode_words(params.stop)
        bad_words = [[t] for t in params.bad_token_ids or []] + self._encode_words(params.bad)
        end_id = params.end_id
        if end_id is None and self._tokenizer is not None and not params.ignore_eos:
            end_id = self._tokenizer.eos_token_id
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        request_id = next(self._ids)
        width = beam_width if beam_width > 1 else params.n
        output = RequestOutput(self, request_id, list(prompt), params, width, loop)
        output._stop_words = stop_words
        forced = None
        if params.embedding_bias is not None:
            bias = list(params.embedding_bias.tolist())  # a tensor; a plain list has no tolist()
            if len(bias) != self.vocab_size:
                raise ValueError(f"embedding_bias has {len(bias)} entries, vocab size is {self.vocab_size}")
            forced = bias.index(max(bias)) if max(bias) > 0 else None
        job = Job(job_id=request_id, prompt=list(prompt), max_tokens=params.max_tokens, beam_width=beam_width,
                  num_sequences=params.n if beam_width == 1 else 1, end_id=end_id, min_tokens=params.min_tokens or 0,
                  stop_words=stop_words, bad_words=bad_words, forced_token=forced)
        if not streaming:
            raise NotImplementedError("the fake LLM API serves streaming=True only")
        with self._engine.cond:
            self._outputs[request_id] = output
        self._engine.submit(job)
        self._submitted = True
        return output

    def get_stats(self, timeout: float) -> list[dict]:
        """Iteration stats since the last call, as the runtime's JSON dicts (camelCase keys)."""
        time.sleep(min(timeout, self._engine.stats_block_s))
        if not self._submitted:
            print("Iteration statistics are not available yet. Call get_stats() after prompts have been submitted.")
            return []
        with self._engine.cond:
            raw = list(self._engine.stats)
            self._engine.stats.clear()
        return [
            {
                "timestamp": stat.timestamp, "iter": stat.iteration, "numActiveRequests": stat.active,
                "numQueuedRequests": stat.queued, "maxNumActiveRequests": stat.max_active, "gpuMemUsage": 1 << 30,
                "cpuMemUsage": 1 << 20, "pinnedMemUsage": 0,
                "kvCacheStats": {"maxNumBlocks": 1024, "freeNumBlocks": 1024 - 2 * stat.active,
                                 "usedNumBlocks": 2 * stat.active, "tokensPerBlock": 32},
                "inflightBatchingStats": {"numScheduledRequests": stat.active, "numContextRequests":
                                          stat.context_requests, "numGenRequests": stat.generation_requests,
                                          "numPausedRequests": 0, "numCtxTokens": stat.context_tokens,
                                          "microBatchId": 0},
            }
            for stat in raw
        ]

    def _encode_words(self, words: str | list[str] | None) -> list[list[int]]:
        if words is None:
            return []
        if self._tokenizer is None:
            raise ValueError("stop/bad strings need a tokenizer")
        return [self._tokenizer.encode(w) for w in ([words] if isinstance(words, str) else words)]

    def shutdown(self) -> None:
        self._engine.shutdown()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


__all__ = ["LLM", "CompletionOutput", "GuidedDecodingParams", "KvCacheConfig", "Logprob", "LoRARequest", "RequestError", "RequestOutput", "SamplingParams"]
