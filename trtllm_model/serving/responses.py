"""Response assembly: a request's state plus its newly arrived steps -> the responses to send, in order.

Nothing here sends: the dispatcher sends what this returns, so a failure while building a response (a detokenizer
that raises, a bad shape) happens before anything left and the dispatcher still sends the request's final response.
The request's accumulators (tokens so far, log probs, logits kept for a non-streamed final) are updated here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..conventions.common import ResponseContent
from ..conventions.inflight_batcher import response_outputs  # the default convention's outputs
from ..executor_interface import FinishReason, Step
from .delivery_timing import PhaseTimes
from .request_context import ErrorCode, RequestContext


@dataclass(frozen=True, slots=True)
class Reply:
    outputs: dict | None
    final: bool


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """An error response; always the request's final one."""

    code: ErrorCode
    message: str
    final: bool = True


Message = Reply | ErrorReply


class ResponseAssembler:
    def __init__(self, detokenizer_factory: Callable[[], object] | None = None) -> None:
        self.detokenizer_factory = detokenizer_factory

    def messages(
        self, ctx: RequestContext, steps: list[Step], failure: ErrorReply | None, times: PhaseTimes | None = None
    ) -> list[Message]:
        """What to send for `steps` (and then `failure`, if the request is being failed); sets ctx.finish_reason
        when the request ends. `times` gets the time spent detokenizing and building tensors."""
        out: list[Message] = []
        if steps:
            out.extend(self._step_messages(ctx, steps, failure is None, times or PhaseTimes()))
        if failure is not None and not (out and out[-1].final):
            ctx.finish_reason = "error"
            out.append(failure)
        return out

    def _step_messages(self, ctx: RequestContext, steps: list[Step], final_allowed: bool, times: PhaseTimes) -> list[Message]:
        last = steps[-1]
        new_tokens = list(steps[0].token_ids) if len(steps) == 1 else [t for s in steps for t in s.token_ids]
        times.tokens += len(new_tokens)
        new_log_probs = [p for s in steps for p in (s.log_probs or [])]
        new_tops = [top for s in steps for top in (s.top_log_probs or [])] if ctx.parsed.generation.num_top_log_probs else []
        new_logits = [s.generation_logits for s in steps if s.generation_logits is not None]
        if last.beams is not None and new_logits:
            new_logits = new_logits[-1:]  # with beams each step carries every beam in full so far, logits too
        now = time.monotonic_ns()
        if new_tokens or last.beams is not None:
            ctx.first_token_ns = ctx.first_token_ns or now
            ctx.last_token_ns = now
        ctx.num_output_tokens += len(new_tokens)
        ctx.log_probs.extend(new_log_probs)
        if last.cum_log_prob is not None:
            ctx.cum_log_prob = last.cum_log_prob
        generation = ctx.parsed.generation
        if generation.return_context_logits or ctx.parsed.return_perf_metrics:  # off the common path
            for step in steps:
                if step.context_logits is not None:
                    ctx.context_logits = step.context_logits
                for name in ("kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks"):
                    if getattr(step, name) is not None:
                        ctx.kv_cache_blocks[name] = getattr(step, name)
        final = last.is_final and final_allowed
        failed = next((s for s in steps if s.error), None)
        if not generation.streaming:
            ctx.output_ids.extend(new_tokens)
            ctx.generation_logits.extend(new_logits)
            ctx.top_log_probs.extend(new_tops)

        if failed is not None:
            ctx.finish_reason = "error"
            if failed.client_error:  # a refusal the client may retry begins "queue full" (QueueFull's wording)
                code = ErrorCode.UNAVAILABLE if failed.error.startswith("queue full") else ErrorCode.INVALID_ARG
                return [ErrorReply(code, failed.error)]
            return [ErrorReply(ErrorCode.INTERNAL, f"executor error: {failed.error}")]
        if final:
            ctx.finish_reason = last.finish_reason.value
        client_cancelled = final and last.finish_reason is FinishReason.CANCELLED and not ctx.stopped
        if generation.streaming:
            started = time.perf_counter_ns()
            text = self._text_delta(ctx, new_tokens, final)
            started = times.add("detokenize", started)
            out: list[Message] = []
            # A final response always carries outputs (empty if nothing is new): tritonclient hands a flag-only
            # final to no callback, so a client would never see its request end.
            if new_tokens or last.beams is not None or text or final:
                outputs = self._outputs(ctx, new_tokens, text, new_log_probs, last, new_logits, final=final,
                                        top_log_probs=new_tops)
                times.add("tensors", started)
                if client_cancelled:
                    if new_tokens or text:
                        out.append(Reply(outputs, final=False))
                else:
                    out.append(Reply(outputs, final=final))
            if client_cancelled:
                out.append(ErrorReply(ErrorCode.CANCELLED, "request cancelled"))
            return out
        if not final:
            return []
        if client_cancelled:
            return [ErrorReply(ErrorCode.CANCELLED, "request cancelled")]
        prompt = [] if generation.exclude_input_in_output else ctx.parsed.prompt_ids
        tokens = prompt + ctx.output_ids
        text = None
        if ctx.parsed.text_mode and last.beams is None:
            text = self._text_delta(ctx, tokens, True)
        outputs = self._outputs(ctx, tokens, text, ctx.log_probs, last, ctx.generation_logits, final=True, prompt=prompt,
                                top_log_probs=ctx.top_log_probs)
        return [Reply(outputs, final=True)]

    def _outputs(
        self,
        ctx: RequestContext,
        tokens: list[int],
        text: str | None,
        log_probs: list[float],
        last: Step,
        generation_logits: list,
        final: bool,
        prompt: list[int] | None = None,
        top_log_probs: list[list[tuple[int, float]]] | None = None,
    ) -> dict:
        if last.beams is not None:  # every beam in full so far
            beams = [(prompt or []) + beam for beam in last.beams]
            texts = [self._decode(beam) for beam in beams] if ctx.parsed.text_mode else None
            beam_log_probs, cum = last.beam_log_probs, last.beam_cum_log_probs
        else:
            beams, texts = [tokens], [text or ""]
            beam_log_probs = [log_probs]
            cum = None if ctx.cum_log_prob is None else [ctx.cum_log_prob]
        # Context logits ([prompt, vocab] floats) go with the first response that has them and with the final one
        # (NVIDIA's client keeps the last it saw), not with every streamed token.
        context_logits = None
        if ctx.context_logits is not None and (final or not ctx.context_logits_sent):
            context_logits = ctx.context_logits
            ctx.context_logits_sent = True
        content = ResponseContent(
            beams=beams,
            texts=texts,
            log_probs=beam_log_probs,
            cum_log_probs=cum,
            top_log_probs=top_log_probs,
            finish_reason=ctx.finish_reason,
            num_output_tokens=ctx.num_output_tokens,
            sequence_index=last.sequence_index,
            context_logits=context_logits,
            generation_logits=_concat_logits(generation_logits) if generation_logits else None,
            perf=_perf(ctx) if ctx.parsed.return_perf_metrics else None,
        )
        return (ctx.parsed.outputs or response_outputs)(ctx.parsed, content)

    def _decode(self, tokens: list[int]) -> str:
        if self.detokenizer_factory is None:
            return ""
        detokenizer = self.detokenizer_factory()
        return detokenizer.push(tokens) + detokenizer.flush()

    @staticmethod
    def _text_delta(ctx: RequestContext, tokens: list[int], final: bool) -> str | None:
        if ctx.detokenizer is None:
            return None
        text = ctx.detokenizer.push(tokens) if tokens else ""
        return text + ctx.detokenizer.flush() if final else text


def _perf(ctx: RequestContext) -> dict[str, float]:
    # Timestamps on the steady clock, as TensorRT-LLM's (time.monotonic_ns is CLOCK_MONOTONIC, as its
    # std::chrono::steady_clock on Linux). First scheduled = handed to the executor; no speculative decoding
    # here, so the draft-token counts are truly 0.
    return {
        "arrival_time_ns": ctx.arrival_ns,
        "first_scheduled_time_ns": ctx.enqueued_ns,
        "first_token_time_ns": ctx.first_token_ns,
        "last_token_time_ns": ctx.last_token_ns,
        "acceptance_rate": 0.0,
        "total_accepted_draft_tokens": 0,
        "total_draft_tokens": 0,
        **ctx.kv_cache_blocks,
    }


def _concat_logits(parts: list):
    """Per-step [beams, tokens, vocab] logits -> one [beams, tokens, vocab] array."""
    return parts[0] if len(parts) == 1 else np.concatenate([np.asarray(part) for part in parts], axis=1)
