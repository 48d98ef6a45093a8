"""A strict fake of `tensorrt_llm.bindings.executor` (the 1.2 nanobind signatures), on a CPU thread.

Strict where the real binding is: keyword-only arguments passed positionally and unknown keywords raise
TypeError; `Response.has_error()` is a method and `error_msg`/`result` raise in the other case; in
`await_responses` an `int` selects the request-id overload and a timeout must be a timedelta or float.
An engine directory needs `config.json` and its engine file (r from OMPI_COMM_WORLD_RANK, default 0): with a
"version", `build_config` holds the limits and `rank<r>.engine` the engine; without, the older `builder_config`
and `<name>_<precision>_tp<n>_rank<r>.engine`. As the real executor, a prompt over max_input_len fails, and
max_tokens is cut to what max_seq_len leaves.
FAKE_TRTLLM_WORLD_SIZE > 1 makes ranks other than 0 workers: `can_enqueue_requests()` is False there.
"""

from __future__ import annotations

import enum
import itertools
import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Self

from .._engine import FakeEngine, Job, Update, fake_log_prob


class ModelType(enum.Enum):
    DECODER_ONLY = 0
    ENCODER_ONLY = 1
    ENCODER_DECODER = 2


class BatchingType(enum.Enum):
    STATIC = 0
    INFLIGHT = 1


class CapacitySchedulerPolicy(enum.Enum):
    MAX_UTILIZATION = 0
    GUARANTEED_NO_EVICT = 1
    STATIC_BATCH = 2


class CommunicationType(enum.Enum):
    MPI = 0


class CommunicationMode(enum.Enum):
    LEADER = 0
    ORCHESTRATOR = 1


class FinishReason(enum.Enum):
    NOT_FINISHED = 0
    END_ID = 1
    STOP_WORDS = 2
    LENGTH = 3
    TIMED_OUT = 4
    CANCELLED = 5


def _check_type(name: str, value: object, *types: type) -> None:
    if value is not None and not isinstance(value, types):
        raise TypeError(f"incompatible function arguments: {name} got {type(value).__name__}")


def _check_int_lists(name: str, value: object) -> None:
    """nanobind converts only a sequence of sequences of ints to list[list[int]]."""
    if value is None:
        return
    if not isinstance(value, list) or not all(
        isinstance(word, list) and all(isinstance(t, int) for t in word) for word in value
    ):
        raise TypeError(f"incompatible function arguments: {name} must be list[list[int]], got {value!r}")


class SchedulerConfig:
    def __init__(
        self,
        capacity_scheduler_policy: CapacitySchedulerPolicy = CapacitySchedulerPolicy.GUARANTEED_NO_EVICT,
        context_chunking_policy=None,
        dynamic_batch_config=None,
    ) -> None:
        _check_type("capacity_scheduler_policy", capacity_scheduler_policy, CapacitySchedulerPolicy)
        self.capacity_scheduler_policy = capacity_scheduler_policy
        self.context_chunking_policy = context_chunking_policy
        self.dynamic_batch_config = dynamic_batch_config


class KvCacheConfig:
    def __init__(
        self,
        enable_block_reuse: bool = True,
        max_tokens: int | None = None,
        max_attention_window: list[int] | None = None,
        sink_token_length: int | None = None,
        free_gpu_memory_fraction: float | None = None,
        host_cache_size: int | None = None,
        onboard_blocks: bool = True,
        cross_kv_cache_fraction: float | None = None,
    ) -> None:
        _check_type("enable_block_reuse", enable_block_reuse, bool)
        _check_type("max_tokens", max_tokens, int)
        _check_type("max_attention_window", max_attention_window, list)
        _check_type("free_gpu_memory_fraction", free_gpu_memory_fraction, float, int)
        _check_type("host_cache_size", host_cache_size, int)
        self.enable_block_reuse = enable_block_reuse
        self.max_tokens = max_tokens
        self.max_attention_window = max_attention_window
        self.sink_token_length = sink_token_length
        self.free_gpu_memory_fraction = free_gpu_memory_fraction
        self.host_cache_size = host_cache_size
        self.onboard_blocks = onboard_blocks
        self.cross_kv_cache_fraction = cross_kv_cache_fraction


class OrchestratorConfig:
    def __init__(
        self, is_orchestrator: bool = True, worker_executable_path: str = "", orch_leader_comm=None,
        spawn_processes: bool = True,
    ) -> None:
        self.is_orchestrator = is_orchestrator
        self.worker_executable_path = worker_executable_path
        self.orch_leader_comm = orch_leader_comm
        self.spawn_processes = spawn_processes


class ParallelConfig:
    def __init__(
        self,
        communication_type: CommunicationType = CommunicationType.MPI,
        communication_mode: CommunicationMode = CommunicationMode.LEADER,
        device_ids: list[int] | None = None,
        participant_ids: list[int] | None = None,
        orchestrator_config: OrchestratorConfig | None = None,
        num_nodes: int | None = None,
    ) -> None:
        _check_type("communication_mode", communication_mode, CommunicationMode)
        _check_type("device_ids", device_ids, list)
        _check_type("orchestrator_config", orchestrator_config, OrchestratorConfig)
        self.communication_type = communication_type
        self.communication_mode = communication_mode
        self.device_ids = device_ids
        self.participant_ids = participant_ids
        self.orchestrator_config = orchestrator_config
        self.num_nodes = num_nodes


class ExecutorConfig:
    def __init__(
        self,
        max_beam_width: int = 1,
        scheduler_config: SchedulerConfig | None = None,
        kv_cache_config: KvCacheConfig | None = None,
        enable_chunked_context: bool = False,
        normalize_log_probs: bool = True,
        iter_stats_max_iterations: int = 1000,
        request_stats_max_iterations: int = 0,
        batching_type: BatchingType = BatchingType.INFLIGHT,
        max_batch_size: int | None = None,
        max_num_tokens: int | None = None,
        parallel_config: ParallelConfig | None = None,
        peft_cache_config=None,
        logits_post_processor_config=None,
        decoding_config=None,
        gpu_weights_percent: float = 1.0,
        max_queue_size: int | None = None,
        extended_runtime_perf_knob_config=None,
        recv_poll_period_ms: int = 0,
        max_seq_idle_microseconds: int = 180000000,
        guided_decoding_config: GuidedDecodingConfig | None = None,
    ) -> None:
        _check_type("max_beam_width", max_beam_width, int)
        _check_type("guided_decoding_config", guided_decoding_config, GuidedDecodingConfig)
        self.guided_decoding_config = guided_decoding_config
        _check_type("scheduler_config", scheduler_config, SchedulerConfig)
        _check_type("kv_cache_config", kv_cache_config, KvCacheConfig)
        _check_type("batching_type", batching_type, BatchingType)
        _check_type("parallel_config", parallel_config, ParallelConfig)
        _check_type("iter_stats_max_iterations", iter_stats_max_iterations, int)
        self.max_beam_width = max_beam_width
        self.scheduler_config = scheduler_config or SchedulerConfig()
        self.kv_cache_config = kv_cache_config or KvCacheConfig()
        self.enable_chunked_context = enable_chunked_context
        self.normalize_log_probs = normalize_log_probs
        self.iter_stats_max_iterations = iter_stats_max_iterations
        self.request_stats_max_iterations = request_stats_max_iterations
        self.batching_type = batching_type
        self.max_batch_size = max_batch_size
        self.max_num_tokens = max_num_tokens
        self.parallel_config = parallel_config
        self.peft_cache_config = peft_cache_config
        self.logits_post_processor_config = logits_post_processor_config
        self.decoding_config = decoding_config
        self.gpu_weights_percent = gpu_weights_percent
        self.max_queue_size = max_queue_size
        self.extended_runtime_perf_knob_config = extended_runtime_perf_knob_config
        self.recv_poll_period_ms = recv_poll_period_ms
        self.max_seq_idle_microseconds = max_seq_idle_microseconds


class SamplingConfig:
    def __init__(
        self,
        beam_width: int = 1,
        *,
        top_k: int | None = None,
        top_p: float | None = None,
        top_p_min: float | None = None,
        top_p_reset_ids: int | None = None,
        top_p_decay: float | None = None,
        seed: int | None = None,
        temperature: float | None = None,
        min_tokens: int | None = None,
        beam_search_diversity_rate: float | None = None,
        repetition_penalty: float | None = None,
        presence_penalty: float | None = None,
        frequency_penalty: float | None = None,
        length_penalty: float | None = None,
        early_stopping: int | None = None,
        no_repeat_ngram_size: int | None = None,
        num_return_sequences: int | None = None,
        min_p: float | None = None,
    ) -> None:
        _check_type("beam_width", beam_width, int)
        _check_type("top_k", top_k, int)
        _check_type("seed", seed, int)
        _check_type("min_tokens", min_tokens, int)
        for name, value in (("top_p", top_p), ("temperature", temperature), ("repetition_penalty", repetition_penalty),
                            ("presence_penalty", presence_penalty), ("frequency_penalty", frequency_penalty),
                            ("length_penalty", length_penalty)):
            _check_type(name, value, float, int)
        if beam_width < 1:
            raise RuntimeError("[TensorRT-LLM][ERROR] Assertion failed: beamWidth > 0")
        self.beam_width = beam_width
        self.top_k = top_k
        self.top_p = top_p
        self.top_p_min = top_p_min
        self.top_p_reset_ids = top_p_reset_ids
        self.top_p_decay = top_p_decay
        self.seed = seed
        self.temperature = temperature
        self.min_tokens = min_tokens
        self.beam_search_diversity_rate = beam_search_diversity_rate
        self.repetition_penalty = repetition_penalty
        self.presence_penalty = presence_penalty
        self.frequency_penalty = frequency_penalty
        self.length_penalty = length_penalty
        self.early_stopping = early_stopping
        self.no_repeat_ngram_size = no_repeat_ngram_size
        self.num_return_sequences = num_return_sequences
        self.min_p = min_p


class OutputConfig:
    def __init__(
        self,
        return_log_probs: bool = False,
        return_context_logits: bool = False,
        return_generation_logits: bool = False,
        exclude_input_from_output: bool = False,
        return_encoder_output: bool = False,
        return_perf_metrics: bool = False,
    ) -> None:
        self.return_log_probs = return_log_probs
        self.return_context_logits = return_context_logits
        self.return_generation_logits = return_generation_logits
        self.exclude_input_from_output = exclude_input_from_output
        self.return_encoder_output = return_encoder_output
        self.return_perf_metrics = return_perf_metrics


class LoraConfig:
    def __init__(self, task_id: int, weights=None, config=None) -> None:
        _check_type("task_id", task_id, int)
        for name, tensor in (("weights", weights), ("config", config)):
            if tensor is not None and not hasattr(tensor, "dim"):
                raise TypeError(f"incompatible function arguments: {name} must be a torch.Tensor")
        self.task_id = task_id
        self.weights = weights
        self.config = config


class GuidedDecodingParams:
    class GuideType(enum.Enum):
        JSON = 0
        JSON_SCHEMA = 1
        REGEX = 2
        EBNF_GRAMMAR = 3
        STRUCTURAL_TAG = 4

    def __init__(self, guide_type: GuideType, guide: str | None = None) -> None:
        _check_type("guide_type", guide_type, GuidedDecodingParams.GuideType)
        self.guide_type = guide_type
        self.guide = guide


class GuidedDecodingConfig:
    class GuidedDecodingBackend(enum.Enum):
        XGRAMMAR = 0
        LLGUIDANCE = 1

    def __init__(self, backend: GuidedDecodingBackend, encoded_vocab: list[str] | None = None,
                 tokenizer_str: str | None = None, stop_token_ids: list[int] | None = None) -> None:
        _check_type("backend", backend, GuidedDecodingConfig.GuidedDecodingBackend)
        self.backend = backend
        self.encoded_vocab = encoded_vocab
        self.tokenizer_str = tokenizer_str
        self.stop_token_ids = stop_token_ids


class KvCacheMetrics:
    def __init__(self, num_total_allocated_blocks: int, num_new_allocated_blocks: int, num_reused_blocks: int) -> None:
        self.num_total_allocated_blocks = num_total_allocated_blocks
        self.num_new_allocated_blocks = num_new_allocated_blocks
        self.num_reused_blocks = num_reused_blocks
        self.num_missed_blocks = num_new_allocated_blocks


class RequestPerfMetrics:
    def __init__(self, kv_cache_metrics: KvCacheMetrics) -> None:
        self.kv_cache_metrics = kv_cache_metrics


class Request:
    def __init__(
        self,
        input_token_ids: list[int],
        max_tokens: int,
        *,
        streaming: bool = False,
        sampling_config: SamplingConfig | None = None,
        output_config: OutputConfig | None = None,
        end_id: int | None = None,
        pad_id: int | None = None,
        position_ids: list[int] | None = None,
        bad_words: list[list[int]] | None = None,
        stop_words: list[list[int]] | None = None,
        embedding_bias=None,
        external_draft_tokens_config=None,
        prompt_tuning_config=None,
        lora_config=None,
        lookahead_config=None,
        kv_cache_retention_config=None,
        client_id: int | None = None,
        return_all_generated_tokens: bool = False,
        priority: float = 0.5,
        num_return_sequences: int = 1,
        guided_decoding_params=None,
        allotted_time_ms: int | None = None,
    ) -> None:
        if not isinstance(input_token_ids, list) or not all(isinstance(t, int) for t in input_token_ids):
            raise TypeError("incompatible function arguments: input_token_ids must be list[int]")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
            raise TypeError("incompatible function arguments: max_tokens must be int")
        _check_type("streaming", streaming, bool)
        _check_type("sampling_config", sampling_config, SamplingConfig)
        _check_type("output_config", output_config, OutputConfig)
        _check_type("end_id", end_id, int)
        _check_type("pad_id", pad_id, int)
        _check_int_lists("bad_words", bad_words)
        _check_int_lists("stop_words", stop_words)
        _check_type("num_return_sequences", num_return_sequences, int)
        _check_type("lora_config", lora_config, LoraConfig)
        _check_type("guided_decoding_params", guided_decoding_params, GuidedDecodingParams)
        # std::chrono::milliseconds: a timedelta (or float seconds); a bare int is rejected like the binding does
        if allotted_time_ms is not None and not isinstance(allotted_time_ms, (timedelta, float)):
            raise TypeError("incompatible function arguments: allotted_time_ms must be datetime.timedelta")
        if embedding_bias is not None and (isinstance(embedding_bias, (list, tuple)) or not hasattr(embedding_bias,
                                                                                                    "tolist")):
            raise TypeError("incompatible function arguments: embedding_bias must be a tensor (torch.Tensor)")
        self.input_token_ids = input_token_ids
        self.max_tokens = max_tokens
        self.streaming = streaming
        self.sampling_config = sampling_config or SamplingConfig()
        self.output_config = output_config or OutputConfig()
        self.end_id = end_id
        self.pad_id = pad_id
        self.position_ids = position_ids
        self.bad_words = bad_words
        self.stop_words = stop_words
        self.embedding_bias = embedding_bias
        self.client_id = client_id
        self.return_all_generated_tokens = return_all_generated_tokens
        self.priority = priority
        self.num_return_sequences = num_return_sequences
        self.allotted_time_ms = allotted_time_ms
        self.lora_config = lora_config
        self.guided_decoding_params = guided_decoding_params


class Result:
    def __init__(self) -> None:
        self.is_final = False
        self.output_token_ids: list[list[int]] = []
        self.cum_log_probs: list[float] | None = None
        self.log_probs: list[list[float]] | None = None
        self.context_logits = None
        self.generation_logits = None
        self.finish_reasons: list[FinishReason] = []
        self.sequence_index = 0
        self.is_sequence_final = False
        self.decoding_iter = 0
        self.request_perf_metrics = None


class Response:
    def __init__(self, request_id: int, result: Result | None = None, error_msg: str | None = None,
                 client_id: int | None = None) -> None:
        self._request_id = request_id
        self._result = result
        self._error_msg = error_msg
        self._client_id = client_id

    @property
    def request_id(self) -> int:
        return self._request_id

    @property
    def client_id(self) -> int | None:
        return self._client_id

    def has_error(self) -> bool:
        return self._error_msg is not None

    @property
    def error_msg(self) -> str:
        if self._error_msg is None:
            raise RuntimeError("[TensorRT-LLM][ERROR] Cannot get the error message for a response without error")
        return self._error_msg

    @property
    def result(self) -> Result:
        if self._error_msg is not None:
            raise RuntimeError("[TensorRT-LLM][ERROR] Cannot get the result for a response with an error")
        return self._result


class KvCacheStats:
    def __init__(self, max_num_blocks: int, free_num_blocks: int, used_num_blocks: int, tokens_per_block: int) -> None:
        self.max_num_blocks = max_num_blocks
        self.free_num_blocks = free_num_blocks
        self.used_num_blocks = used_num_blocks
        self.tokens_per_block = tokens_per_block
        self.alloc_total_blocks = used_num_blocks
        self.alloc_new_blocks = 0
        self.reused_blocks = 0
        self.missed_blocks = 0
        self.cache_hit_rate = 0.0


class InflightBatchingStats:
    def __init__(self, num_scheduled_requests: int, num_context_requests: int, num_gen_requests: int,
                 num_ctx_tokens: int) -> None:
        self.num_scheduled_requests = num_scheduled_requests
        self.num_context_requests = num_context_requests
        self.num_gen_requests = num_gen_requests
        self.num_paused_requests = 0
        self.num_ctx_tokens = num_ctx_tokens
        self.micro_batch_id = 0
        self.avg_num_decoded_tokens_per_iter = 1.0


class IterationStats:
    def __init__(self) -> None:
        self.timestamp = ""
        self.iter = 0
        self.iter_latency_ms = 0.0
        self.num_new_active_requests = 0
        self.num_active_requests = 0
        self.num_queued_requests = 0
        self.num_completed_requests = 0
        self.max_num_active_requests = 0
        self.gpu_mem_usage = 0
        self.cpu_mem_usage = 0
        self.pinned_mem_usage = 0
        self.kv_cache_stats: KvCacheStats | None = None
        self.inflight_batching_stats: InflightBatchingStats | None = None
        self.static_batching_stats = None
        self.specdec_stats = None

    def to_json_str(self) -> str:
        return json.dumps({"iter": self.iter, "timestamp": self.timestamp})


_TOKENS_PER_BLOCK = 32
_MAX_BLOCKS = 1024


def _rank() -> int:
    return int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))


class Executor:
    def __init__(self, model_path, model_type: ModelType, executor_config: ExecutorConfig) -> None:
        if not isinstance(model_path, (str, os.PathLike)):
            raise TypeError("incompatible function arguments: model_path must be a path")
        _check_type("model_type", model_type, ModelType)
        _check_type("executor_config", executor_config, ExecutorConfig)
        engine_dir = Path(model_path)
        config_path = engine_dir / "config.json"
        if not config_path.is_file():
            raise RuntimeError(f"[TensorRT-LLM][ERROR] Assertion failed: Failed to open {config_path}")
        config = json.loads(config_path.read_text())
        # As TensorRT-LLM's GptJsonConfig: a "version" means trtllm-build's layout (build_config, pretrained_config,
        # rank<r>.engine); none means the older builder's (builder_config, <name>_<precision>_tp<n>_rank<r>.engine).
        if "version" in config:
            build, model = config["build_config"], config["pretrained_config"]
            engine_name = f"rank{_rank()}.engine"
        else:
            build = model = config["builder_config"]
            pp = int(build.get("pipeline_parallel", 1))
            engine_name = (f"{build['name']}_{build['precision']}_tp{build['tensor_parallel']}"
                           f"{f'_pp{pp}' if pp > 1 else ''}_rank{_rank()}.engine")
        if not (engine_dir / engine_name).is_file():
            raise RuntimeError(f"[TensorRT-LLM][ERROR] Failed to open engine file {engine_dir}/{engine_name}")
        parallel = executor_config.parallel_config
        if parallel is not None and parallel.communication_mode == CommunicationMode.ORCHESTRATOR:
            orchestrator = parallel.orchestrator_config
            if orchestrator is None or not Path(orchestrator.worker_executable_path).is_file():
                raise RuntimeError("[TensorRT-LLM][ERROR] orchestrator mode needs an existing worker executable")
        self.vocab_size = int(model["vocab_size"])
        self.max_input_len = int(build.get("max_input_len", 0))
        # Builders before max_seq_len wrote max_output_len; the sequence is then input + output (as GptJsonConfig did).
        self.max_seq_len = int(build.get("max_seq_len") or self.max_input_len + int(build.get("max_output_len", 0)))
        self.max_beam_width = min(int(build.get("max_beam_width", 1)), executor_config.max_beam_width)
        self.config = executor_config
        self.model_path = engine_dir
        world_size = int(os.environ.get("FAKE_TRTLLM_WORLD_SIZE", "1"))
        self._is_leader = world_size == 1 or _rank() == 0 or (
            parallel is not None and parallel.communication_mode == CommunicationMode.ORCHESTRATOR
        )
        self._ids = itertools.count(1)
        self._responses: list[Response] = []
        self._shut_down = False
        max_batch = executor_config.max_batch_size or int(build.get("max_batch_size", 8))
        self._engine = FakeEngine(self.vocab_size, max_batch, self._on_update, executor_config.iter_stats_max_iterations)
        self._requests: dict[int, Request] = {}
        self._sent: dict[int, int] = {}  # request id -> tokens already sent (per sequence, for streaming deltas)

    # -- context manager -------------------------------------------------------------------------------------
    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # -- requests --------------------------------------------------------------------------------------------
    def can_enqueue_requests(self) -> bool:
        return self._is_leader and not self._shut_down and self._engine.dead is None

    def enqueue_request(self, request: Request) -> int:
        _check_type("request", request, Request)
        if request is None:
            raise TypeError("incompatible function arguments: request is None")
        if not self._is_leader:
            raise RuntimeError("[TensorRT-LLM][ERROR] Assertion failed: Can only enqueue requests on the leader rank")
        if self._shut_down:
            raise RuntimeError("[TensorRT-LLM][ERROR] Assertion failed: Shutdown called, cannot enqueue requests")
        request_id = next(self._ids)
        self._requests[request_id] = request
        self._engine.submit(self._job(request_id, request))
        return request_id

    def enqueue_requests(self, requests: list[Request]) -> list[int]:
        return [self.enqueue_request(request) for request in requests]

    def _job(self, request_id: int, request: Request) -> Job:
        sampling = request.sampling_config
        error = None
        if not request.input_token_ids:
            error = "[TensorRT-LLM][ERROR] Assertion failed: input token ids must not be empty"
        elif len(request.input_token_ids) > self.max_input_len:
            error = (f"[TensorRT-LLM][ERROR] Assertion failed: Prompt length ({len(request.input_token_ids)}) "
                     f"exceeds maximum input length ({self.max_input_len}).")
        elif sampling.beam_width > self.max_beam_width:
            error = (f"[TensorRT-LLM][ERROR] Assertion failed: Request beam width {sampling.beam_width} exceeds "
                     f"max_beam_width {self.max_beam_width}")
        forced = None
        if request.embedding_bias is not None:
            bias = list(request.embedding_bias.tolist())
            if len(bias) != self.vocab_size:
                error = f"[TensorRT-LLM][ERROR] embedding_bias has {len(bias)} entries, vocab size is {self.vocab_size}"
            elif max(bias) > 0:
                forced = bias.index(max(bias))
        max_tokens = request.max_tokens
        if len(request.input_token_ids) + max_tokens > self.max_seq_len:
            max_tokens = self.max_seq_len - len(request.input_token_ids)  # the engine cuts it, with a warning
        allotted = request.allotted_time_ms
        if allotted is not None:
            allotted = allotted.total_seconds() * 1000 if isinstance(allotted, timedelta) else allotted * 1000
        return Job(
            job_id=request_id,
            prompt=list(request.input_token_ids),
            max_tokens=max_tokens,
            beam_width=sampling.beam_width,
            num_sequences=request.num_return_sequences if sampling.beam_width == 1 else 1,
            end_id=request.end_id,
            min_tokens=sampling.min_tokens or 0,
            stop_words=request.stop_words or [],
            bad_words=request.bad_words or [],
            forced_token=forced,
            deadline=time.monotonic() + allotted / 1000 if allotted else None,
            error=error,
        )

    def cancel_request(self, id: int) -> None:
        if not isinstance(id, int):
            raise TypeError("incompatible function arguments: cancel_request(id: int)")
        self._engine.cancel(id)

    # -- responses -------------------------------------------------------------------------------------------
    def _on_update(self, update: Update) -> None:
        """Engine thread, under the engine lock: turn one iteration of a job into Responses."""
        job = update.job
        request = self._requests[job.job_id]
        if update.error is not None:
            self._responses.append(Response(job.job_id, error_msg=update.error, client_id=request.client_id))
            return
        want_logs = request.output_config.return_log_probs
        if job.beam_width > 1:
            if not (request.streaming or update.job_done):
                return
            result = self._result(job, update.new_tokens, list(range(job.beam_width)), update.new_tokens, want_logs)
            result.is_final = result.is_sequence_final = update.job_done
            self._add_outputs(result, job, request, update.new_tokens)
            self._responses.append(Response(job.job_id, result, client_id=request.client_id))
            return
        for index, new in enumerate(update.new_tokens):
            finished = index in update.finished_now
            if not new and not finished:
                continue
            if request.streaming:
                tokens = generated = list(new)
            elif finished:
                tokens = generated = list(job.sequences[index])
                if not request.output_config.exclude_input_from_output:
                    tokens = list(job.prompt) + tokens
            else:
                continue
            result = self._result(job, [tokens], [index], [generated], want_logs)
            result.sequence_index = index
            result.is_sequence_final = finished
            result.is_final = finished and update.job_done and index == max(update.finished_now)
            self._add_outputs(result, job, request, [generated])
            self._responses.append(Response(job.job_id, result, client_id=request.client_id))

    def _result(self, job: Job, token_lists: list[list[int]], indices: list[int], generated: list[list[int]],
                want_logs: bool) -> Result:
        result = Result()
        result.output_token_ids = token_lists
        result.finish_reasons = [FinishReason[job.finished[i]] if job.finished[i] else FinishReason.NOT_FINISHED
                                 for i in indices]
        result.decoding_iter = len(job.sequences[indices[0]])
        if want_logs:
            result.log_probs = [[fake_log_prob(t) for t in tokens] for tokens in generated]
            result.cum_log_probs = [sum(fake_log_prob(t) for t in job.sequences[i]) for i in indices]
        else:
            result.log_probs = []
            result.cum_log_probs = []
        return result

    def _add_outputs(self, result: Result, job: Job, request: Request, generated: list[list[int]]) -> None:
        """Logits and perf metrics a request asked for. Fake logits: 1.0 at the token that follows, 0 elsewhere.
        Context logits come with every response; generation logits are [beams, tokens, vocab], or
        [tokens, beams, vocab] when streaming (as TensorRT-LLM lays them out)."""
        import torch

        config = request.output_config
        if config.return_context_logits:
            following = job.prompt[1:] + [job.sequences[0][0] if job.sequences[0] else 0]
            result.context_logits = torch.nn.functional.one_hot(torch.tensor(following), self.vocab_size).float()
        if config.return_generation_logits:
            width = max(len(tokens) for tokens in generated)
            logits = torch.zeros(len(generated), width, self.vocab_size)
            for beam, tokens in enumerate(generated):
                logits[beam, torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.long)] = 1.0
            result.generation_logits = logits.transpose(0, 1).contiguous() if request.streaming else logits
        if config.return_perf_metrics:
            total = -(-(len(job.prompt) + len(job.sequences[0])) // 32)  # 32 tokens per fake block
            result.request_perf_metrics = RequestPerfMetrics(KvCacheMetrics(total, total, 0))

    def get_num_responses_ready(self, id: int | None = None) -> int:
        with self._engine.cond:
            return sum(1 for r in self._responses if id is None or r.request_id == id)

    def await_responses(self, *args, **kwargs):
        """Overloads: `(timeout=None)`, `(id: int, timeout=None)`, `(ids: list[int], timeout=None)`."""
        unknown = set(kwargs) - {"id", "ids", "timeout"}
        if unknown:
            raise TypeError(f"incompatible function arguments: unexpected keyword(s) {sorted(unknown)}")
        selector = None
        if args and isinstance(args[0], (int, list)) and not isinstance(args[0], bool):
            selector, args = args[0], args[1:]
        elif "id" in kwargs or "ids" in kwargs:
            selector = kwargs.pop("id", kwargs.pop("ids", None))
        if len(args) > 1:
            raise TypeError("incompatible function arguments: too many positional arguments")
        timeout = args[0] if args else kwargs.get("timeout")
        if timeout is not None and (isinstance(timeout, (int, bool)) or not isinstance(timeout, (timedelta, float))):
            raise TypeError(f"incompatible function arguments: timeout must be datetime.timedelta, got {timeout!r}")
        seconds = None if timeout is None else (timeout.total_seconds() if isinstance(timeout, timedelta) else timeout)
        if isinstance(selector, list):
            return [self._take(lambda r, i=i: r.request_id == i, seconds) for i in selector]
        if isinstance(selector, int):
            return self._take(lambda r: r.request_id == selector, seconds)
        return self._take(lambda r: True, seconds)

    def _take(self, wanted, seconds: float | None) -> list[Response]:
        if self._shut_down:
            raise RuntimeError("[TensorRT-LLM][ERROR] Assertion failed: Shutdown called")
        deadline = None if seconds is None else time.monotonic() + seconds
        with self._engine.cond:
            while not any(wanted(r) for r in self._responses):
                remaining = None if deadline is None else deadline - time.monotonic()
                if (remaining is not None and remaining <= 0) or self._shut_down:
                    return []
                self._engine.cond.wait(remaining)
            taken = [r for r in self._responses if wanted(r)]
            self._responses = [r for r in self._responses if not wanted(r)]
            return taken

    # -- stats and lifetime ----------------------------------------------------------------------------------
    def get_latest_iteration_stats(self) -> list[IterationStats]:
        time.sleep(self._engine.stats_block_s)
        with self._engine.cond:
            raw, stats = list(self._engine.stats), []
            self._engine.stats.clear()
        for stat in raw:
            item = IterationStats()
            item.timestamp = stat.timestamp
            item.iter = stat.iteration
            item.num_active_requests = stat.active
            item.num_queued_requests = stat.queued
            item.max_num_active_requests = stat.max_active
            item.gpu_mem_usage = 1 << 30
            item.cpu_mem_usage = 1 << 20
            item.pinned_mem_usage = 1 << 10
            used = stat.active * 2
            item.kv_cache_stats = KvCacheStats(_MAX_BLOCKS, _MAX_BLOCKS - used, used, _TOKENS_PER_BLOCK)
            if self.config.batching_type == BatchingType.INFLIGHT:
                item.inflight_batching_stats = InflightBatchingStats(
                    stat.active, stat.context_requests, stat.generation_requests, stat.context_tokens
                )
            stats.append(item)
        return stats

    def get_latest_request_stats(self) -> list:
        return []

    def shutdown(self) -> None:
        if self._shut_down:
            return
        self._shut_down = True
        self._engine.shutdown()
        with self._engine.cond:
            self._engine.cond.notify_all()


__all__ = [
    "BatchingType", "CapacitySchedulerPolicy", "CommunicationMode", "CommunicationType", "Executor",
    "ExecutorConfig", "FinishReason", "IterationStats", "KvCacheConfig", "ModelType", "OrchestratorConfig",
    "OutputConfig", "ParallelConfig", "Request", "Response", "Result", "SamplingConfig", "SchedulerConfig",
]
