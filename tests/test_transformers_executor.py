"""The transformers executor over the embedded SmolLM2: exact greedy tokens, in-flight batching, sampling controls,
cancellation, limits and failure handling. The model loads once per session; outputs are kept short."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from trtllm_model.embedded.model_loading import default_dtype, load_model
from trtllm_model.executor_interface import (
    ExecutorError,
    FinishReason,
    GenerationRequest,
    RequestRejected,
)
from trtllm_model.executors.transformers_executor import PARAMETERS, TransformersExecutor, create
from trtllm_model.params import Params

QUESTIONS = [
    "What is the capital of France?",
    "hi",
    "Write a haiku about the sea and the wind over the old harbour at night.",
    "List three colors.",
    "Who wrote Hamlet? Answer in one short sentence, please.",
    "Explain gravity to a child.",
    "Translate 'good morning' to French.",
    "What is 2+2?",
]
MAX_TOKENS = 12


@pytest.fixture(scope="session")
def loaded():
    torch.set_num_threads(2)
    return load_model()


@pytest.fixture(scope="session")
def prompts(loaded):
    tokenizer = loaded.tokenizer
    return [
        tokenizer.encode(
            tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        )
        for q in QUESTIONS
    ]


@pytest.fixture(scope="session")
def greedy_reference(loaded, prompts):
    """`model.generate(do_sample=False)` for each prompt alone; the end token is not part of the output."""
    eos = loaded.tokenizer.eos_token_id
    outputs = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            generated = loaded.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=MAX_TOKENS,
                do_sample=False,
                pad_token_id=eos,
            )[0, len(prompt) :].tolist()
            outputs.append(generated[: generated.index(eos)] if eos in generated else generated)
    return outputs


def new_executor(loaded, **limits) -> TransformersExecutor:
    return TransformersExecutor(loaded.model, loaded.tokenizer, **limits)


@pytest.fixture(scope="session")
def executor(loaded):
    executor = new_executor(loaded, max_batch_size=16, max_num_tokens=1024)
    yield executor
    executor.shutdown()


@dataclass
class Result:
    tokens: list[int] = field(default_factory=list)
    finish: FinishReason = FinishReason.NOT_FINISHED
    log_probs: list[float] = field(default_factory=list)
    cum_log_prob: float | None = None
    steps: int = 0


def run(executor, requests, joins=(), timeout_s=120.0) -> list[Result]:
    """Run `requests` to completion. `joins`: (k, request): enqueue `request` once the first request has k tokens.
    Returns the results in request order (joins after)."""
    ids = [executor.enqueue(request) for request in requests]
    results = {request_id: Result() for request_id in ids}
    pending = sorted(joins, key=lambda join: join[0])
    deadline = time.monotonic() + timeout_s
    while not all(result.finish is not FinishReason.NOT_FINISHED for result in results.values()) or pending:
        assert time.monotonic() < deadline, "requests did not finish in time"
        lead = results[ids[0]]
        while pending and (len(lead.tokens) >= pending[0][0] or lead.finish is not FinishReason.NOT_FINISHED):
            ids.append(executor.enqueue(pending.pop(0)[1]))
            results[ids[-1]] = Result()
        for step in executor.await_steps(1.0):
            result = results[step.request_id]
            assert result.finish is FinishReason.NOT_FINISHED, "a step after the final one"
            result.tokens += step.token_ids
            result.log_probs += step.log_probs or []
            result.cum_log_prob = step.cum_log_prob
            result.steps += 1
            if step.is_final:
                result.finish = step.finish_reason
    return [results[request_id] for request_id in ids]


def greedy(prompt, max_tokens=MAX_TOKENS, **kwargs) -> GenerationRequest:
    return GenerationRequest(input_ids=prompt, max_tokens=max_tokens, **kwargs)


def test_parameters_are_declared():
    assert {"model_dir", "device", "torch_threads", "max_num_tokens", "dtype"} <= PARAMETERS


def test_greedy_alone_matches_generate(executor, prompts, greedy_reference):
    for index in (0, 2):
        (result,) = run(executor, [greedy(prompts[index])])
        assert result.tokens == greedy_reference[index]
        expected = FinishReason.LENGTH if len(result.tokens) == MAX_TOKENS else FinishReason.END_ID
        assert result.finish is expected


def test_greedy_in_a_changing_batch_matches_generate(executor, prompts, greedy_reference):
    """8 prompts of different lengths, joining at different steps and leaving at different steps."""
    first, *others = [greedy(prompt) for prompt in prompts]
    results = run(executor, [first], joins=list(zip((1, 2, 2, 3, 5, 6, 8), others)))
    assert [result.tokens for result in results] == greedy_reference
    stats = executor.iteration_stats()
    assert max(s.active_requests for s in stats) >= 4  # they really shared the batch
    assert any(s.context_requests and s.generation_requests for s in stats)  # prefill while others decode


def test_seeded_sampling_is_the_same_whatever_shares_the_batch(executor, prompts):
    def sampled(seed):
        return greedy(prompts[3], max_tokens=10, temperature=1.0, top_k=50, top_p=0.95, seed=seed)

    (alone,) = run(executor, [sampled(1234)])
    crowd = [greedy(prompts[i], max_tokens=10) for i in (2, 5)] + [sampled(99)]
    crowded = run(executor, [*crowd[:2], sampled(1234), crowd[2]])
    assert crowded[2].tokens == alone.tokens
    assert crowded[3].tokens != alone.tokens  # another seed, another sample


def test_log_probs_and_length(executor, prompts):
    (result,) = run(executor, [greedy(prompts[2], max_tokens=5, return_log_probs=True)])
    assert result.finish is FinishReason.LENGTH and len(result.tokens) == 5
    assert len(result.log_probs) == 5 and all(lp <= 0.0 for lp in result.log_probs)
    assert result.cum_log_prob == pytest.approx(sum(result.log_probs))


def test_stop_words_end_the_output(executor, prompts, greedy_reference):
    reference = greedy_reference[2]
    word = reference[3:5]
    (result,) = run(executor, [greedy(prompts[2], stop_words=[[7, 7, 7], word])])
    assert result.finish is FinishReason.STOP_WORDS
    assert result.tokens == reference[:5]  # the stop word is included, nothing after it


def test_bad_words_are_never_produced(executor, prompts, greedy_reference):
    reference = greedy_reference[2]
    single, multi = run(
        executor,
        [
            greedy(prompts[2], max_tokens=4, bad_words=[[reference[0]]]),
            greedy(prompts[2], max_tokens=4, bad_words=[reference[1:3]]),
        ],
    )
    assert single.tokens[0] != reference[0]
    # The two-token word is blocked only after its first token: the output follows the reference up to there.
    assert multi.tokens[:2] == reference[:2] and multi.tokens[2] != reference[2]


def test_min_tokens_defers_the_end(executor, prompts, greedy_reference):
    reference = greedy_reference[0]  # "The capital of France is Paris." then the end token
    assert len(reference) < MAX_TOKENS
    (result,) = run(executor, [greedy(prompts[0], max_tokens=len(reference) + 3, min_tokens=len(reference) + 2)])
    assert result.tokens[: len(reference)] == reference
    assert len(result.tokens) >= len(reference) + 2


def test_presence_penalty_changes_the_output(executor, prompts, greedy_reference):
    (result,) = run(executor, [greedy(prompts[2], presence_penalty=50.0)])
    assert len(set(result.tokens)) == len(result.tokens)  # no token twice


def test_cancel_ends_the_request_and_frees_its_slot(loaded, prompts):
    executor = new_executor(loaded, max_batch_size=1)
    try:
        long_id = executor.enqueue(greedy(prompts[2], max_tokens=500, min_tokens=500))
        waiting_id = executor.enqueue(greedy(prompts[1], max_tokens=3))
        queued_id = executor.enqueue(greedy(prompts[3], max_tokens=3))
        executor.cancel(queued_id)  # never ran
        finals, tokens = {}, {long_id: 0, waiting_id: 0, queued_id: 0}
        deadline = time.monotonic() + 60
        while len(finals) < 3 and time.monotonic() < deadline:
            for step in executor.await_steps(1.0):
                tokens[step.request_id] += len(step.token_ids)
                if step.is_final:
                    finals[step.request_id] = step.finish_reason
            if tokens[long_id] >= 2 and long_id not in finals:
                executor.cancel(long_id)
        assert finals == {
            queued_id: FinishReason.CANCELLED,
            long_id: FinishReason.CANCELLED,
            waiting_id: FinishReason.LENGTH,
        }
        assert tokens[queued_id] == 0 and tokens[waiting_id] == 3 and tokens[long_id] < 20
        stats = executor.iteration_stats()
        assert max(s.active_requests for s in stats) == 1 and stats[-1].active_requests == 0
    finally:
        executor.shutdown()


def test_time_limit_ends_with_timed_out(executor, prompts):
    (result,) = run(executor, [greedy(prompts[2], max_tokens=400, min_tokens=400, allotted_time_ms=300)])
    assert result.finish is FinishReason.TIMED_OUT
    assert len(result.tokens) < 400


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"input_ids": list(range(40))}, "max_input_len"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 33}, "max_output_len"),
        ({"input_ids": []}, "input_ids"),
        ({"input_ids": [10**6]}, "input_ids"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"stop_words": [[-3]]}, "stop_words"),
        ({"embedding_bias": [0.0, 1.0]}, "embedding_bias"),
        # Ids the engine would index a logits row with: refused before they reach it (issue 21).
        ({"end_id": 100000, "min_tokens": 2}, r"end_id=100000: must be within \[0, 49152\)"),
        ({"end_id": -2}, "end_id"),
        ({"pad_id": 49152}, "pad_id"),
        ({"bad_words": [[5, 49152]]}, "bad_words: token id 49152"),
        ({"stop_words": [[2**40]]}, "stop_words"),
        ({"max_tokens": 2**31}, r"request_output_len \(max_tokens\): 2147483648 is outside \[1, 2147483647\]"),
        ({"min_tokens": 2**32}, "min_tokens"),
        ({"top_k": 2**31}, "top_k"),
        ({"embedding_bias": [0.0] * 49151 + [float("nan")]}, "embedding_bias: value nan at index 49151"),
        ({"return_context_logits": True, "input_ids": [1] * 30, "max_tokens": 2}, None),
        ({"return_generation_logits": True, "max_tokens": 32}, "return_generation_logits: 6291456 bytes"),
    ],
)
def test_requests_over_the_limits_are_rejected(limited_executor, change, field):
    request = GenerationRequest(input_ids=[1, 2, 3], max_tokens=4)
    for key, value in change.items():
        setattr(request, key, value)
    if field is None:  # within the limits: served
        (result,) = run(limited_executor, [request])
        assert result.finish is not FinishReason.ERROR
        return
    with pytest.raises(RequestRejected, match=field) as error:
        limited_executor.enqueue(request)
    assert not error.value.unsupported


def test_an_end_id_outside_the_vocabulary_fails_only_its_request(limited_executor, prompts):
    """Issue 21: end_id 100000 with min_tokens (the end id is banned by index) killed the engine for everyone."""
    with pytest.raises(RequestRejected, match="end_id=100000"):
        limited_executor.enqueue(GenerationRequest(input_ids=[1, 2], max_tokens=4, end_id=100000, min_tokens=2))
    (result,) = run(limited_executor, [greedy(prompts[1], 4, min_tokens=2)])
    assert len(result.tokens) == 4 and limited_executor.health_error() is None


def test_prompt_over_max_num_tokens_is_rejected(loaded):
    executor = new_executor(loaded, max_num_tokens=16)
    try:
        with pytest.raises(RequestRejected, match="max_num_tokens"):
            executor.enqueue(GenerationRequest(input_ids=list(range(17)), max_tokens=4))
    finally:
        executor.shutdown()


def test_beam_search_is_unsupported(limited_executor):
    with pytest.raises(RequestRejected, match="beam_width") as error:
        limited_executor.enqueue(GenerationRequest(input_ids=[1, 2], max_tokens=2, beam_width=2))
    assert error.value.unsupported


@pytest.fixture(scope="module")
def limited_executor(loaded):
    executor = new_executor(loaded, max_input_len=32, max_output_len=32)
    executor.max_logits_bytes = 6_000_000  # 30 tokens of SmolLM2 logits (49152 x 4 bytes each), not 32
    yield executor
    executor.shutdown()


def test_await_steps_blocks_without_spinning(limited_executor):
    time.sleep(0.3)  # torch's OpenMP workers may still spin briefly after an earlier test's forward
    started_cpu, started = time.process_time(), time.monotonic()
    assert limited_executor.await_steps(0.5) == []
    assert time.monotonic() - started >= 0.45
    assert time.process_time() - started_cpu < 0.1


def test_engine_failure_is_reported(loaded, prompts):
    executor = new_executor(loaded)

    def broken(*args, **kwargs):
        raise RuntimeError("simulated device failure")

    executor.runner.decode = broken
    try:
        executor.enqueue(greedy(prompts[0]))
        with pytest.raises(ExecutorError, match="simulated device failure"):
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                executor.await_steps(1.0)
        assert "simulated device failure" in executor.health_error()
        with pytest.raises(ExecutorError):
            executor.enqueue(greedy(prompts[0]))
    finally:
        executor.shutdown()


def test_await_steps_wakes_on_new_tokens_from_another_thread(executor, prompts):
    got: list = []
    waiter = threading.Thread(target=lambda: got.extend(executor.await_steps(30.0)))
    waiter.start()
    time.sleep(0.1)
    started = time.monotonic()
    request_id = executor.enqueue(greedy(prompts[1], max_tokens=2))
    waiter.join(30)
    assert got and got[0].request_id == request_id and time.monotonic() - started < 10
    while not any(step.is_final for step in got):
        got.extend(executor.await_steps(1.0))


def test_create_reads_config_parameters():
    executor = create(Params({"torch_threads": "2", "max_batch_size": "4", "max_num_tokens": "256"}, PARAMETERS))
    try:
        assert executor.max_batch_size == 4 and executor.max_input_len == 256
        assert executor.tokenizer().eos_token_id == 2
        # No dtype parameter: bfloat16 where this CPU has bfloat16 dot products, else float32 (default_dtype)
        assert executor.runner.dtype == getattr(torch, default_dtype("cpu"))
    finally:
        executor.shutdown()


def test_after_shutdown_await_is_quiet_and_enqueue_fails(loaded, prompts):
    executor = new_executor(loaded)
    executor.shutdown()
    executor.shutdown()  # idempotent
    assert executor.await_steps(0.01) == [] and executor.health_error() is None
    with pytest.raises(ExecutorError, match="shut down"):
        executor.enqueue(greedy(prompts[0]))


def test_logits_are_the_models_own(executor, loaded, prompts):
    """NVIDIA's return_context_logits / return_generation_logits: the model's raw logits, greedy picks their argmax."""
    prompt = prompts[0]
    request_id = executor.enqueue(greedy(prompt, 3, return_context_logits=True, return_generation_logits=True,
                                         return_perf_metrics=True))
    steps, deadline = [], time.monotonic() + 120
    while not (steps and steps[-1].is_final):
        assert time.monotonic() < deadline
        steps += [step for step in executor.await_steps(1.0) if step.request_id == request_id]
    context = [s.context_logits for s in steps if s.context_logits is not None]
    generation = [s.generation_logits for s in steps if s.generation_logits is not None]
    tokens = [t for s in steps for t in s.token_ids]
    with torch.inference_mode():
        reference = loaded.model(input_ids=torch.tensor([prompt])).logits[0].float().numpy()
    assert len(context) == 1 and context[0].shape == reference.shape
    assert np.allclose(context[0], reference, atol=1e-3)
    assert [g.shape for g in generation] == [(1, 1, reference.shape[1])] * len(tokens)
    assert [int(g[0, 0].argmax()) for g in generation] == tokens
    assert np.allclose(generation[0][0, 0], reference[-1], atol=1e-2)  # the first token's logits: the prompt's last
    # return_perf_metrics: KV blocks of 16 tokens for every position written (all but the last token), some of them
    # reused from the earlier requests with this prompt.
    final = steps[-1]
    assert final.kv_cache_reused_blocks + final.kv_cache_alloc_new_blocks == -(-(len(prompt) + len(tokens) - 1) // 16)
    assert final.kv_cache_alloc_total_blocks == final.kv_cache_alloc_new_blocks  # as NVIDIA's CI checks
