"""Guided decoding on the embedded engine (trtllm_model/embedded/guided.py): every guide type's output parses or
matches, through the transformers executor over the embedded SmolLM2; a guide that does not compile is refused at
enqueue with the compiler's message; compiled grammars are cached."""

from __future__ import annotations

import json
import re
import time

import jsonschema
import pytest
import torch
from engine_helpers import run_all

from trtllm_model.embedded.guided import COMPILE_THREADS, GuideBusy, GuideCompiler, GuideError, mask_guided_logits
from trtllm_model.embedded.model_loading import load_model
from trtllm_model.executor_interface import FinishReason, GenerationRequest, RequestRejected
from trtllm_model.executors.transformers_executor import TransformersExecutor

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 3},
    },
    "required": ["name", "age", "pets"],
    "additionalProperties": False,
}
EMAIL = r"[a-z]{1,10}@[a-z]{1,10}\.(com|org)"
YES_NO = 'root ::= ("yes" | "no") " because " [a-z ]{1,20} "."'
TOOL_TAG = {
    "structures": [
        {"begin": "<tool_call>", "schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                                            "required": ["city"], "additionalProperties": False},
         "end": "</tool_call>"}
    ],
    "triggers": ["<tool_call>"],
}


@pytest.fixture(scope="module")
def loaded():
    torch.set_num_threads(2)
    return load_model()


@pytest.fixture(scope="module")
def executor(loaded):
    executor = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=16, max_num_tokens=1024)
    yield executor
    executor.shutdown()


def chat(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer.encode(text)


def run(executor, requests: list[GenerationRequest], timeout_s: float = 120.0) -> list[tuple[list[int], FinishReason]]:
    """Enqueue all at once (they share batches), collect each one's tokens and finish reason."""
    results = []
    for steps in run_all(executor, requests, timeout_s):
        assert all(step.error is None for step in steps), [step.error for step in steps]
        results.append(([token for step in steps for token in step.token_ids], steps[-1].finish_reason))
    return results


def guided(prompt: list[int], guide_type: str, guide: str | None, max_tokens: int = 96, **sampling) -> GenerationRequest:
    return GenerationRequest(prompt, max_tokens, guided_decoding_type=guide_type, guided_decoding_guide=guide,
                             **sampling)


def test_every_guide_type_output_parses_or_matches_in_one_batch(executor, loaded):
    """Guided rows share batches with each other and with a free one; each ends by its grammar (END_ID)."""
    tokenizer = loaded.tokenizer
    prompt = chat(tokenizer, "Tell me about a person called Ann, her age and pets.")
    requests = [
        guided(prompt, "json", None),
        guided(prompt, "json_schema", json.dumps(PERSON)),
        guided(prompt, "json_schema", json.dumps(PERSON), temperature=1.0, top_p=0.9, seed=3),
        guided(prompt, "regex", EMAIL),
        guided(prompt, "ebnf_grammar", YES_NO),
        guided(chat(tokenizer, "What is the weather in Paris? Call the tool."), "structural_tag",
               json.dumps(TOOL_TAG)),
        GenerationRequest(prompt, 8),  # unguided, same batches
    ]
    results = run(executor, requests)
    texts = [tokenizer.decode(tokens) for tokens, _ in results]
    for (_, reason), request in zip(results[:5], requests):
        assert reason is FinishReason.END_ID, (request.guided_decoding_type, texts)
    assert isinstance(json.loads(texts[0]), (dict, list))
    for text in texts[1:3]:
        jsonschema.validate(json.loads(text), PERSON)
    assert re.fullmatch(EMAIL, texts[3]), texts[3]
    assert re.fullmatch(r"(yes|no) because [a-z ]{1,20}\.", texts[4]), texts[4]
    # A structural tag leaves the text free until a trigger; whatever follows a trigger is a valid call.
    for call in re.findall(r"<tool_call>(.*?)</tool_call>", texts[5], re.S):
        jsonschema.validate(json.loads(call), TOOL_TAG["structures"][0]["schema"])
    assert results[6][0] and results[6][1] in (FinishReason.LENGTH, FinishReason.END_ID)


def test_the_guide_holds_where_the_model_would_write_otherwise(executor, loaded):
    """Unguided, this prompt's greedy answer is prose; guided by a regex, it is the regex's language."""
    prompt = chat(loaded.tokenizer, "Write a long poem about the sea.")
    [(free, _), (digits, reason)] = run(executor, [GenerationRequest(prompt, 12),
                                                   guided(prompt, "regex", r"[0-9]{3}-[0-9]{4}")])
    assert not re.fullmatch(r"[0-9]{3}-[0-9]{4}", loaded.tokenizer.decode(free))
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", loaded.tokenizer.decode(digits)) and reason is FinishReason.END_ID


@pytest.mark.parametrize(
    ("guide_type", "guide", "message"),
    [
        ("json_schema", '{"type": "bogus"}', 'Unsupported type "bogus"'),
        ("regex", "((", "parenthesis is not closed"),
        ("ebnf_grammar", "root ::= undefined_rule", 'Rule "undefined_rule" is not defined'),
        ("structural_tag", '{"structures": [{"begin": "<a>"}], "triggers": ["<a>"]}', "schema"),
    ],
)
def test_a_guide_that_does_not_compile_ends_its_request_with_the_compilers_message(
    executor, loaded, guide_type, guide, message
):
    [[step]] = run_all(executor, [guided([1, 2, 3], guide_type, guide)], timeout_s=60)
    assert step.is_final and step.finish_reason is FinishReason.ERROR and step.client_error  # INVALID_ARG
    assert step.error.startswith("guided_decoding_guide: ") and message in step.error and guide_type in step.error
    assert executor.health_error() is None  # the engine never saw it


def test_compiled_grammars_are_cached_by_type_and_guide(loaded):
    compiler = GuideCompiler(loaded.tokenizer, 49152, [loaded.tokenizer.eos_token_id])
    schema = json.dumps(PERSON)
    first = compiler.compile("json_schema", schema)
    assert compiler.compile("json_schema", schema) is first
    assert compiler.compile("regex", schema.replace("{", "x")) is not first
    with pytest.raises(GuideError):
        compiler.compile("regex", "((")


def test_one_bitmask_masks_only_the_guided_rows(loaded):
    compiler = GuideCompiler(loaded.tokenizer, 49152, [loaded.tokenizer.eos_token_id])
    digit = compiler.matcher(compiler.compile("regex", "[0-9]"), None)
    logits = torch.zeros(3, 49152)
    mask_guided_logits(logits, [None, digit, None])
    allowed = torch.isfinite(logits[1]).nonzero().flatten().tolist()
    assert {loaded.tokenizer.decode([token]) for token in allowed} == set("0123456789")
    assert torch.isfinite(logits[0]).all() and torch.isfinite(logits[2]).all()


# -- TensorRT-LLM executors: the guide goes to TensorRT-LLM's GuidedDecodingParams (over the strict fakes) -------

GUIDES = {"json": None, "json_schema": '{"type": "object"}', "regex": "[0-9]+", "ebnf_grammar": 'root ::= "a"',
          "structural_tag": json.dumps(TOOL_TAG)}


@pytest.fixture
def fake_trtllm(monkeypatch):
    import importlib

    from trtllm_support import forget_tensorrt_llm, use_fake_tensorrt_llm

    use_fake_tensorrt_llm(monkeypatch)
    importlib.import_module("tensorrt_llm.bindings.executor")
    importlib.import_module("tensorrt_llm.llmapi")
    yield importlib.import_module("tensorrt_llm")
    forget_tensorrt_llm()


def test_every_guide_type_reaches_the_engine_executors_guided_decoding_params(fake_trtllm):
    from trtllm_model.executors.trtllm_mapping import to_trt_request

    tle = fake_trtllm.bindings.executor
    for guide_type, guide in GUIDES.items():
        trt = to_trt_request(tle, guided([1], guide_type, guide, max_tokens=4))
        assert trt.guided_decoding_params.guide_type is tle.GuidedDecodingParams.GuideType[guide_type.upper()]
        assert trt.guided_decoding_params.guide == guide


def test_every_guide_type_reaches_the_llm_apis_guided_decoding_params(fake_trtllm, tmp_path):
    from trtllm_support import collect_until_final, make_checkpoint_dir

    from trtllm_model.executors import create_executor
    from trtllm_model.executors.trtllm_llmapi_mapping import guided_decoding_kwargs

    params_cls = fake_trtllm.llmapi.GuidedDecodingParams
    expected = {"json": params_cls(json_object=True), "json_schema": params_cls(json='{"type": "object"}'),
                "regex": params_cls(regex="[0-9]+"), "ebnf_grammar": params_cls(grammar='root ::= "a"'),
                "structural_tag": params_cls(structural_tag=GUIDES["structural_tag"])}
    for guide_type, guide in GUIDES.items():
        assert guided_decoding_kwargs(guided([1], guide_type, guide), params_cls) == {
            "guided_decoding": expected[guide_type]}
    assert guided_decoding_kwargs(GenerationRequest([1], 4), params_cls) == {}

    checkpoint = str(make_checkpoint_dir(tmp_path / "model", vocab_size=5000))
    plain, _ = create_executor({"executor": "trtllm_llmapi", "hf_model_path": checkpoint})
    try:
        assert "guided_decoding" not in plain.optional_inputs  # the edge refuses the inputs as UNSUPPORTED
        with pytest.raises(RequestRejected, match="guided_decoding_backend") as refused:
            plain.enqueue(guided([1000], "regex", "[0-9]+", max_tokens=2))
        assert refused.value.unsupported
    finally:
        plain.shutdown()
    executor, _ = create_executor({"executor": "trtllm_llmapi", "hf_model_path": checkpoint,
                                   "guided_decoding_backend": "xgrammar"})
    try:
        assert executor._llm.args.guided_decoding_backend == "xgrammar"
        assert "guided_decoding" in executor.optional_inputs
        steps = collect_until_final(executor, {executor.enqueue(guided([1000], "regex", "[0-9]+", max_tokens=2))})
        assert steps[-1].is_final and steps[-1].error is None
    finally:
        executor.shutdown()


def test_a_guided_answer_ends_with_its_grammar_even_under_min_tokens(executor, loaded):
    """ignore_eos (min_tokens = max_tokens) with a guide: the grammar's end is the answer's end, not an error."""
    prompt = chat(loaded.tokenizer, "Is the sea blue?")
    [(tokens, reason)] = run(executor, [guided(prompt, "ebnf_grammar", YES_NO, max_tokens=64, min_tokens=64)])
    assert reason is FinishReason.END_ID
    assert re.fullmatch(r"(yes|no) because [a-z ]{1,20}\.", loaded.tokenizer.decode(tokens))


# -- guides from untrusted clients: limits checked before compiling, compilation bounded in time ------------------

@pytest.mark.parametrize(
    ("guide_type", "guide", "message"),
    [
        ("regex", "a" * (64 * 1024 + 1), "65537 bytes is over max_guide_bytes=65536"),
        ("regex", "[a-z]{1,20000}", "the count {1,20000} is over the 10000"),
        ("json_schema", json.dumps({"type": "string", "pattern": "^([a-z]{1,30}){1,30}$"}),
         "pattern: nested counts multiply to 900, over the 256"),
        ("json_schema", json.dumps({"type": "array", "items": {"type": "integer"}, "maxItems": 50000}),
         "maxItems 50000 is over the 10000"),
        ("ebnf_grammar", 'root ::= ("ab" [a-z]{1,40}){1,40}', "the grammar: nested counts multiply to 1600"),
        ("structural_tag", json.dumps({**TOOL_TAG, "structures": [{**TOOL_TAG["structures"][0], "schema": {
            "type": "string", "maxLength": 99999}}]}), "maxLength 99999 is over the 10000"),
    ],
)
def test_a_guide_over_the_limits_is_refused_before_it_compiles(executor, guide_type, guide, message):
    """The ([a-z]{1,30}){1,30} pattern took 102 s to compile here: refused in well under a second instead."""
    start = time.monotonic()
    with pytest.raises(RequestRejected) as refused:
        executor.enqueue(guided([1, 2, 3], guide_type, guide))
    assert time.monotonic() - start < 1.0
    assert not refused.value.unsupported
    assert str(refused.value).startswith(f"guided_decoding_guide: the {guide_type} guide: ") and message in str(
        refused.value), str(refused.value)


def test_counts_within_the_limits_pass_the_check():
    from trtllm_model.embedded.guided import check_guide

    for guide_type, guide in [("regex", r"(\d{1,3}\.){3}\d{1,3}"), ("regex", "[{]{1,5}([a-z]{1,16}){1,16}"),
                              ("ebnf_grammar", 'root ::= "{1,99999}" [a-z]{1,10000}'),
                              ("json_schema", json.dumps(PERSON)),
                              ("json_schema", json.dumps({"properties": {"maxLength": {"type": "string"}}}))]:
        check_guide(guide_type, guide, 64 * 1024)


SLOW_SCHEMA = json.dumps({"type": "object", "properties": {"note": {"type": "string", "maxLength": 300}},
                          "required": ["note"]})  # passes the checks; compiles in 2 to 15 s on 2 shared cores


def test_a_guide_that_compiles_too_slowly_is_refused_after_the_timeout_and_again_when_sent_again(loaded):
    """With a 0.1 s limit enqueue gives up on the slow schema after 0.1 s; sent again while it compiles, and after
    its compilation ended, it is refused again within the bound: the guide is kept as refused, never served."""
    executor = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=4, max_num_tokens=256)
    executor.guide_compile_timeout_s = 0.1

    def refusal_seconds() -> float:
        start = time.monotonic()
        [[step]] = run_all(executor, [guided([1, 2, 3], "json_schema", SLOW_SCHEMA, max_tokens=4)], timeout_s=60)
        assert step.client_error and "guide_compile_timeout_s=0.1 s" in step.error, step.error
        return time.monotonic() - start

    try:
        run(executor, [guided([1, 2, 3], "regex", "[0-9]", max_tokens=2)])  # the compiler is set up (once)
        assert refusal_seconds() < 1.0
        assert refusal_seconds() < 1.0  # joins the compilation under way
        deadline = time.monotonic() + 120
        while executor._guides._compiling:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert refusal_seconds() < 1.0  # compiled by now, and still refused
        [(tokens, reason)] = run(executor, [guided([1, 2, 3], "regex", "[0-9]", max_tokens=2)])
        assert tokens and reason is not None  # a guide within the bound is served as before
    finally:
        executor.shutdown()


def test_a_compilation_over_the_bound_is_kept_as_refused_even_for_a_caller_that_waits(loaded):
    compiler = GuideCompiler(loaded.tokenizer, 49152, [loaded.tokenizer.eos_token_id], timeout_s=0.1)
    with pytest.raises(GuideError, match="guide_compile_timeout_s=0.1 s"):
        compiler.compile("json_schema", SLOW_SCHEMA)  # waits for the whole compilation
    started = time.monotonic()
    with pytest.raises(GuideError, match="guide_compile_timeout_s=0.1 s"):
        compiler.compile("json_schema", SLOW_SCHEMA)
    assert time.monotonic() - started < 0.1  # the kept verdict, not a second compilation


def test_kept_grammars_are_bounded_by_bytes_and_one_over_a_quarter_is_refused(loaded):
    """A 13-byte regex compiles to 1.6 MiB (an allowed 896-byte one to about 60 MiB): the cache counts bytes."""
    compiler = GuideCompiler(loaded.tokenizer, 49152, [loaded.tokenizer.eos_token_id], max_cache_bytes=4 << 20)
    with pytest.raises(GuideError, match=r"compiles to 1\.\d MiB, over the 1 MiB one compiled guide may take"):
        compiler.compile("regex", "[a-z ]{10000}")
    with pytest.raises(GuideError, match="over the 1 MiB"):
        compiler.compile("regex", "[a-z ]{10000}")  # kept as refused
    sizes = [compiler.compile("regex", f"[a-{letter} ]{{10}}").memory_size_bytes for letter in "pqrstuvwx"]
    assert sum(sizes) > 4 << 20 and all(size <= 1 << 20 for size in sizes)
    assert compiler.cache_bytes <= 4 << 20  # the oldest were dropped


def test_a_small_guide_is_compiled_beside_slow_ones_and_queued_guides_nobody_waits_for_are_not(loaded):
    """Slow guides fill the general compile threads and the queue: a small guide still compiles at once (its own
    thread, cheapest first), guides past the queue are refused busy at once, and a queued guide whose request left
    is never compiled."""
    compiler = GuideCompiler(loaded.tokenizer, 49152, [loaded.tokenizer.eos_token_id], timeout_s=30)
    outcomes: dict[str, object] = {}
    slow = [json.dumps({"type": "object", "properties": {"a": {"type": "string", "maxLength": 300 + n}}})
            for n in range(12)]

    def send(n: int) -> None:
        compiler.when_compiled("json_schema", slow[n], lambda outcome: outcomes.setdefault(f"slow{n}", outcome))

    for n in range(COMPILE_THREADS):
        send(n)
    deadline = time.monotonic() + 30
    while compiler._queue:  # every thread for slow guides took one
        assert time.monotonic() < deadline
        time.sleep(0.01)
    for n in range(COMPILE_THREADS, COMPILE_THREADS + 7):
        send(n)
    left = slow[COMPILE_THREADS + 7]
    leave = compiler.when_compiled("json_schema", left, lambda outcome: outcomes.setdefault("left", outcome))
    leave()  # the 8th queued guide: its place is free again
    send(COMPILE_THREADS + 8), send(COMPILE_THREADS + 9)
    over = f"slow{COMPILE_THREADS + 9}"
    assert list(outcomes) == [over], outcomes  # the queue holds 8: the ninth is refused at once
    assert isinstance(outcomes[over], GuideBusy) and str(outcomes[over]).startswith("queue full")
    started = time.monotonic()
    assert compiler.compile_within("regex", "[0-9]+") is not None
    assert time.monotonic() - started < 5.0  # 2 ms alone; the slow ones take seconds each
    with compiler._lock:
        assert ("json_schema", left) not in compiler._compiling  # left before it started: never compiled
    assert "left" not in outcomes
