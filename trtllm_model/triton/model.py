"""TritonPythonModel for the decoupled `tensorrt_llm` model: a thin lifecycle over the poller.

initialize: read config.pbtxt parameters (or NVIDIA's model.yaml), build the executor, start the poller.
execute:    validate and convert each request by the model's tensor convention (NVIDIA's inflight-batcher names,
            or NVIDIA's LLM API names when the model directory has a model.yaml), hand it to the poller, return
            None (responses are streamed).
finalize:   end every open stream with a final response, stop the poller and the executor.
"""

from __future__ import annotations

import atexit
import gc
import json
import logging
import os
import sys
import threading
from pathlib import Path

import triton_python_backend_utils as pb_utils

from ..conventions import llmapi
from ..conventions.common import InvalidInput, Limits, ParsedRequest, check_request_prompts_size
from ..conventions.inflight_batcher import parameters_dict, request_parser, split_batch
from ..conventions.parsing import RequestParser, parse_together
from ..executors import DEFAULT_EXECUTOR, create_executor
from ..executors.synthetic import SyntheticExecutor
from ..model_yaml import LlmApiConfig, embedded_parameters, model_yaml_path, read_model_yaml
from ..params import Params, parameters_from_model_config
from ..pipeline.build_limits import request_limits
from ..process_watch import exit_when_ended
from ..server import EXECUTOR_OVERRIDE_ENV, mark_instance
from ..serving.metrics import MetricsReporter
from ..serving.poller import Poller
from ..serving.request_context import BatchStream, ErrorCode, RequestContext
from ..serving.row_admission import default_limit as default_batched_rows_limit
from .instances import instance_of, pinned_parameters
from .triton_io import TritonMetricBackend, TritonStream, request_parameters_json, request_tensors, unload_check

log = logging.getLogger("trtllm_model")

SYNTHETIC_FAULT_PARAMETERS = frozenset(f"synthetic_fault_{name}" for name in ("reject", "error_at", "crash_at", "stall_ms"))


def _exit_now() -> None:
    """The stub's last atexit handler (the first to run): flush what was written, end the process."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class TritonPythonModel:
    @classmethod
    def auto_complete_config(cls, config):
        """NVIDIA's LLM API layout keeps the transaction policy and max_batch_size in model.yaml, not config.pbtxt."""
        path = model_yaml_path(_version_dir_of(cls))
        if path is not None:
            triton = read_model_yaml(path).triton
            config.set_model_transaction_policy(dict(decoupled=triton.decoupled))
            config.set_max_batch_size(triton.max_batch_size)
        return config

    def initialize(self, args: dict) -> None:
        model_config = json.loads(args["model_config"])
        self.model_name = args["model_name"]
        # Decoupled (streaming) or not (`decoupled: false`: unary gRPC ModelInfer and HTTP infer work, streaming is
        # refused). Either way responses go through the request's response sender from the poller: a non-decoupled
        # Python model may send its one response, with the FINAL flag, that way instead of returning it.
        decoupled = pb_utils.using_decoupled_model_transaction_policy(model_config)
        override = os.environ.get(EXECUTOR_OVERRIDE_ENV) or None
        yaml_path = model_yaml_path(Path(args["model_repository"]) / args["model_version"])
        self.llmapi = read_model_yaml(yaml_path) if yaml_path is not None else None
        raw_params = parameters_from_model_config(model_config)
        # Each instance of instance_group runs this in its own stub: pin it to its GPUs before its engine starts.
        self.instance = instance_of(args, model_config, raw_params)
        executor_name = override or (self.llmapi.executor if self.llmapi else
                                     Params(raw_params, accepted=raw_params.keys()).str("executor"))
        raw_params = pinned_parameters(self.instance, executor_name or DEFAULT_EXECUTOR, raw_params)
        # The instances of this model in this server (the stubs' parent) on one device share one engine worker.
        shared_as = f"{os.getppid()}:{args['model_repository']}:{args['model_version']}"
        if self.llmapi is None:
            self.executor, params = create_executor(raw_params, override, shared_as, self.instance.peers)
        else:
            self.executor, params = _llmapi_executor(self.llmapi, raw_params, override, shared_as, self.instance.peers)
        self.tokenizer = self.executor.tokenizer()
        self.chat_template = self._chat_template()
        self.limits = Limits(
            **request_limits(params, self.executor.build_limits),
            vocab_size=self.executor.vocab_size,
            exclude_input_in_output=params.bool("exclude_input_in_output", False),
            apply_chat_template=params.bool("apply_chat_template", False),
            accepted_parameters=SYNTHETIC_FAULT_PARAMETERS if isinstance(self.executor, SyntheticExecutor) else frozenset(),
            optional_inputs=self.executor.optional_inputs,
            decoupled=decoupled,
            executor_name=override or (self.llmapi.executor if self.llmapi else params.str("executor", "transformers")),
        )
        if self.llmapi is not None:
            self.llmapi_options = llmapi.LlmApiOptions(
                multimodal=self.llmapi.triton.multimodal,
                batched=self.llmapi.triton.max_batch_size > 0,
                logits_post_processors=frozenset(self.llmapi.logits_post_processors),
                executor_features=getattr(self.executor, "llmapi_features", frozenset()),
            )
        cancel_check_ms = params.int("cancellation_check_period_ms", 100, minimum=1)
        if self.llmapi is not None:
            cancel_check_ms = self.llmapi.triton.cancellation_check_period_ms
        self.metrics = MetricsReporter(
            TritonMetricBackend(),
            self.executor.iteration_stats,
            model=args["model_name"],
            version=args["model_version"],
            instance=self.instance.label,
            period_s=params.int("stats_check_period_ms", 100, minimum=1) / 1000.0,
            open_requests=lambda: self.poller.open_requests,
        )
        self.poller = Poller(
            self.executor,
            detokenizer_factory=self._detokenizer_factory(),
            sender_threads=params.int("sender_threads", 4, minimum=1),  # 4 beat 2 by ~40% responses/s (bench/serving.py)
            cancel_check_s=cancel_check_ms / 1000.0,
            max_open_requests=_max_open_requests(model_config, params),
            max_batched_rows=params.int("max_batched_rows_in_flight", minimum=1)
            or default_batched_rows_limit(self.executor.batch_slots),
            stop_by_request_id=params.bool("stop_by_request_id", True),
            on_failure=self._report_not_ready,
            on_finished=self.metrics.record_finished,
            unloading=unload_check(self.model_name),
            on_unload=self._release_soon,
        )
        self._release_lock = threading.Lock()
        self._released = False
        self.metrics.start()
        self.poller.start()
        if _in_stub():  # a stub that outlives tritonserver (a stop that ran out of time) holds its engine for nothing
            exit_when_ended(os.getppid(), "tritonserver")
        mark_instance(self.model_name, "loaded")

    def execute(self, requests: list) -> None:
        with self.poller.executing(len(requests)):
            streams = [TritonStream(request) for request in requests]
            for request, stream, parsed in zip(requests, streams, self._parse_batch(requests), strict=True):
                self._take(request, stream, parsed)
        return None

    def _take(self, request, stream: TritonStream, parsed: list[ParsedRequest] | Exception) -> None:
        """Hand one request's parsed rows to the poller; what failed is answered on its own stream."""
        if isinstance(parsed, InvalidInput):
            stream.send_error(ErrorCode.UNSUPPORTED if parsed.unsupported else ErrorCode.INVALID_ARG, str(parsed))
            return
        if isinstance(parsed, Exception):  # never let one request's surprise take the batch down
            log.error("request conversion failed", exc_info=parsed)
            stream.send_error(ErrorCode.INVALID_ARG, f"malformed request: {parsed}")
            return
        streams = [stream] if len(parsed) == 1 else BatchStream(stream, len(parsed)).members
        rows = [RequestContext(one, member, triton_request_id=request.request_id())
                for one, member in zip(parsed, streams, strict=True)]
        try:
            self.poller.submit_rows(rows)
        except Exception as exc:  # the poller answers its own refusals; this is a bug, kept to one request
            log.exception("submit failed")
            stream.send_error(ErrorCode.INTERNAL, f"submit failed: {exc}")

    def _parse_batch(self, requests: list) -> list[list[ParsedRequest] | Exception]:
        """Each request's rows, or the exception that failed it. The batch's text prompts are tokenized in one call
        (conventions/parsing.py): the tokenizer then works with the interpreter's lock let go."""
        outcomes: list[list[ParsedRequest] | Exception] = []
        parsers, owners = [], []
        for number, request in enumerate(requests):
            try:
                row_parsers = self._row_parsers(request)
            except Exception as exc:
                outcomes.append(exc)
                continue
            outcomes.append([])
            parsers.extend(row_parsers)
            owners.extend([number] * len(row_parsers))
        for number, row in zip(owners, parse_together(parsers, self.tokenizer), strict=True):
            rows = outcomes[number]
            if isinstance(rows, list):  # the request's first failed row fails it
                outcomes[number] = row if isinstance(row, Exception) else [*rows, row]
        return outcomes

    def _row_parsers(self, request) -> list[RequestParser]:
        parameters = parameters_dict(request_parameters_json(request), self.limits.accepted_parameters)
        tensors = request_tensors(request)
        if "text_input" in tensors and self.tokenizer is not None:
            check_request_prompts_size("text_input", tensors["text_input"], self.limits, self.tokenizer)
        if self.llmapi is not None:
            batch = llmapi.split_batch(tensors, self.llmapi_options.batched)
        else:
            batch = split_batch(tensors)
        if len(batch) > 1 and not self.limits.decoupled:
            raise InvalidInput(f"a batch of {len(batch)} sequences in one request needs the decoupled model "
                               "(one response per sequence); send one per request", unsupported=True)
        if self.llmapi is not None:
            return [llmapi.request_parser(tensors, self.limits, self.tokenizer, self.llmapi_options) for tensors in batch]
        return [request_parser(tensors, parameters, self.limits, self.tokenizer, self.chat_template) for tensors in batch]

    def is_ready(self) -> bool:
        """Readiness for servers that ask the model (Triton 26.03+): not ready once the model stops accepting
        (its executor failed, or it is being unloaded)."""
        return self.poller.accepting

    def _report_not_ready(self, reason: str) -> None:
        # Servers before 26.03 never call is_ready(); the one way to stop reporting READY there is to unload
        # ourselves (needs --model-control-mode=explicit, which `trtllm-triton serve` uses). Open streams have
        # already received their final error. Reload with POST /v2/repository/models/<name>/load.
        threading.Thread(target=self._unload_self, args=(reason,), name="unload-self", daemon=True).start()

    def _unload_self(self, reason: str) -> None:
        log.error("executor failed (%s): unloading model %s so that it reports not ready", reason, self.model_name)
        try:
            pb_utils.unload_model(self.model_name)
        except Exception:
            log.exception("could not unload %s; it stays loaded but refuses requests with UNAVAILABLE", self.model_name)

    def _release_soon(self) -> None:
        """The model is being unloaded (its streams are ended): release its executor now, on a thread of its own.
        Triton finalizes a model's instances one after another, each once the stub before has exited; released here,
        every instance leaves a shared engine worker (which stops their requests) at once, side by side, and
        finalize() finds nothing left to wait for."""
        threading.Thread(target=self._release, name="release-on-unload", daemon=True).start()

    def _release(self) -> None:
        """Stop the poller (and so the executor) and the metrics, and free the Triton metric objects; once, a second
        caller waits for the first."""
        with self._release_lock:
            if self._released:
                return
            self.poller.shutdown("model is shutting down")
            # After the poller: the requests it ended on the way out are counted too. Then the Triton metric objects
            # go, while the stub is whole: left to the stub's own teardown, their destructors write to shared memory
            # that is already gone (a segfault in MetricFamily::~MetricFamily, gdb, tests/test_e2e_stop.py's case of
            # a stop tritonserver starts itself).
            self.metrics.close()
            # A request's response factory is released when the stub sends its final response or when its Python
            # object goes; one held only by a reference cycle would keep the model loaded (Triton 2.51 unloads a
            # decoupled model once every factory is released), so cycles go now, not at some later allocation.
            gc.collect()
            self._released = True
            mark_instance(self.model_name, "released")

    def finalize(self) -> None:
        self._release()
        # A stub's interpreter teardown after finalize (torch, transformers, ...) took 4-6 s on the 2-core machine,
        # and Triton finalizes a model's instances one after another: stopping two instances with streams open took
        # 10.5-12 s of the server's 15 s exit timeout, 4.3-4.7 s without it. Everything is stopped and answered by
        # now, so the stub ends without that teardown (only the stub: in any other process, a test's for one,
        # exiting 0 at once would hide its own exit status).
        if _in_stub():
            atexit.register(_exit_now)

    def _detokenizer_factory(self):
        if self.tokenizer is None:
            return None
        tokenizer = self.tokenizer
        token_lengths: dict[int, int] = {}  # shared by every request's detokenizer (the same tokenizer and options)

        def new_detokenizer():
            from ..pipeline.detokenizer import IncrementalDetokenizer

            return IncrementalDetokenizer(tokenizer, token_lengths=token_lengths)

        return new_detokenizer

    def _chat_template(self):
        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
            return None
        tokenizer = self.tokenizer

        def chat_prompt_of(text: str) -> str:
            from ..pipeline.detokenizer import chat_prompt_text

            return chat_prompt_text(tokenizer, [{"role": "user", "content": text}])

        return chat_prompt_of


def _in_stub() -> bool:
    """Whether this process is tritonserver's Python backend stub (not a test's process, nor a tool's)."""
    return os.path.basename(os.readlink("/proc/self/exe")) == "triton_python_backend_stub"


def _version_dir_of(cls: type) -> Path | None:
    """The model's version directory, seen from auto_complete_config (the stub passes no arguments there): the
    directory of the thin model.py that imported `cls`."""
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and module.__name__ != __name__ and getattr(module, "TritonPythonModel", None) is cls:
            return Path(path).parent
    return None


def _llmapi_executor(config: LlmApiConfig, raw_params: dict[str, str], override: str | None, shared_as: str,
                     peers: int):
    """The executor model.yaml asks for: every LLM argument to tensorrt_llm.LLM (trtllm_llmapi), or the embedded
    engine (`executor: transformers`); `serve --executor` overrides it."""
    name = override or config.executor
    if name == "trtllm_llmapi":
        from ..executors.trtllm_llmapi import create_from_model_yaml

        return create_from_model_yaml(config, raw_params)
    embedded, ignored = embedded_parameters(config)
    if ignored and name == "transformers":
        log.warning("%s: executor %s does not use these LLM arguments: %s", config.path, name, ", ".join(ignored))
    if name != "transformers":
        embedded = {}
    return create_executor({**raw_params, **embedded}, name, shared_as, peers)


def _max_open_requests(model_config: dict, params: Params) -> int | None:
    """Requests the model holds at once: the executor's batch plus NVIDIA's `max_queue_size` (0 = unbounded)."""
    policy = model_config.get("dynamic_batching", {}).get("default_queue_policy", {})
    queue_size = params.int("max_queue_size", 0, minimum=0) or int(policy.get("max_queue_size", 0) or 0)
    if not queue_size:
        return None
    return params.int("max_batch_size", 64, minimum=1) + queue_size
