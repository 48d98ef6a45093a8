"""Response assembly without threads: what a request's steps become."""

from __future__ import annotations

import numpy as np

from trtllm_model.conventions.common import ParsedRequest
from trtllm_model.executor_interface import FinishReason, GenerationRequest, Step
from trtllm_model.serving.request_context import RequestContext
from trtllm_model.serving.responses import Reply, ResponseAssembler


def streamed_context(**generation) -> RequestContext:
    request = GenerationRequest(input_ids=[1, 2, 3], max_tokens=8, streaming=True, **generation)
    return RequestContext(ParsedRequest(request, text_mode=False, prompt_ids=[1, 2, 3]), stream=None)


def test_context_logits_go_with_the_first_and_the_final_response_only():
    # [prompt, vocab] floats per response used to go out with every streamed token.
    ctx = streamed_context(return_context_logits=True)
    assembler = ResponseAssembler()
    context = np.ones((3, 5), dtype=np.float32)
    steps = [Step(1, [7], context_logits=context), Step(1, [8]), Step(1, [9]),
             Step(1, [10], is_final=True, finish_reason=FinishReason.LENGTH)]
    sent = [m for step in steps for m in assembler.messages(ctx, [step], None)]
    assert all(isinstance(m, Reply) for m in sent) and [m.final for m in sent] == [False, False, False, True]
    carried = ["context_logits" in m.outputs for m in sent]
    assert carried == [True, False, False, True]


def test_merged_steps_keep_every_generation_logits_row():
    ctx = streamed_context(return_generation_logits=True)
    rows = [np.full((1, 1, 4), i, dtype=np.float32) for i in range(3)]
    steps = [Step(1, [7 + i], generation_logits=rows[i]) for i in range(3)]
    (message,) = ResponseAssembler().messages(ctx, steps, None)
    logits = message.outputs["generation_logits"]
    assert logits.shape[-2:] == (3, 4)
    assert [float(v) for v in logits.reshape(3, 4)[:, 0]] == [0.0, 1.0, 2.0]
