"""The `ensemble` model: NVIDIA's text-level names, answered by the one `tensorrt_llm` model through BLS.

Clients written for NVIDIA's repository call `ensemble`; forwarding (instead of a second executor) keeps a single
copy of the weights in memory. Tokenization and detokenization happen inside `tensorrt_llm`, so this is one
pass-through hop per response. A client's cancellation becomes a `stop` request for the forwarded request id.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os

import numpy as np
import triton_python_backend_utils as pb_utils

log = logging.getLogger("trtllm_model.ensemble")

TARGET_MODEL = "tensorrt_llm"
TEXT_OUTPUTS = ["text_output", "output_log_probs", "cum_log_probs", "finish_reason", "num_input_tokens",
                "num_output_tokens", "sequence_index"]
_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
CANCEL_CHECK_S = 0.1


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        self._ids = itertools.count(1)
        self._prefix = f"ensemble-{os.getpid()}-"
        self._open: dict[str, object] = {}  # forwarded id -> client request, for the cancel watcher
        self._tasks: set[asyncio.Task] = set()
        self._watcher: asyncio.Task | None = None

    async def execute(self, requests: list) -> None:
        if self._watcher is None:
            self._watcher = asyncio.ensure_future(self._watch_cancellations())
        for request in requests:
            task = asyncio.ensure_future(self._forward(request))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return None

    async def _forward(self, request) -> None:
        sender = request.get_response_sender()
        forwarded_id = f"{self._prefix}{next(self._ids)}"
        final_sent = False
        try:
            parameters = {k: v for k, v in json.loads(request.parameters() or "{}").items() if not k.startswith("triton_")}
            inner = pb_utils.InferenceRequest(
                model_name=TARGET_MODEL,
                inputs=request.inputs(),
                requested_output_names=list(request.requested_output_names()) or TEXT_OUTPUTS,
                request_id=forwarded_id,
                parameters=parameters,
            )
            self._open[forwarded_id] = request
            responses = await inner.async_exec(decoupled=True)
            async for response in responses:
                final = bool(response.flags() & _FINAL) if hasattr(response, "flags") else False
                if response.has_error():
                    sender.send(pb_utils.InferenceResponse(error=response.error()), flags=_FINAL)
                    final_sent = True
                    break
                tensors = response.output_tensors()
                if tensors:
                    sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=_FINAL if final else 0)
                    final_sent = final
                elif final:
                    sender.send(flags=_FINAL)
                    final_sent = True
        except Exception as exc:
            log.exception("forwarding to %s failed", TARGET_MODEL)
            if not final_sent:
                error = pb_utils.TritonError(f"ensemble: forwarding failed: {exc}", pb_utils.TritonError.INTERNAL)
                sender.send(pb_utils.InferenceResponse(error=error), flags=_FINAL)
                final_sent = True
        finally:
            self._open.pop(forwarded_id, None)
            if not final_sent:
                sender.send(flags=_FINAL)

    async def _watch_cancellations(self) -> None:
        cancelled: set[str] = set()
        while True:
            await asyncio.sleep(CANCEL_CHECK_S)
            for forwarded_id, request in list(self._open.items()):
                if forwarded_id not in cancelled and request.is_cancelled():
                    cancelled.add(forwarded_id)
                    await self._send_stop(forwarded_id)
            cancelled &= set(self._open)

    async def _send_stop(self, forwarded_id: str) -> None:
        stop = pb_utils.InferenceRequest(
            model_name=TARGET_MODEL,
            inputs=[pb_utils.Tensor("stop", np.array([[True]]))],
            requested_output_names=[],
            request_id=forwarded_id,
        )
        try:
            async for _ in await stop.async_exec(decoupled=True):
                pass
        except Exception:
            log.warning("could not forward a cancellation", exc_info=True)

    def finalize(self) -> None:
        for task in list(self._tasks):
            task.cancel()
