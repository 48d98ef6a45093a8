"""docs/nvidia_compatibility.md stays true: its shape table against real responses, its input table against our
config.pbtxt files, the non-decoupled mode, and final responses every tritonclient callback sees.

Servers: the shared synthetic one (beam width 1), one non-decoupled synthetic one, and the fake TensorRT-LLM
engine (beam width 2, num_return_sequences, per-beam log probs) with SmolLM2's tokenizer for text.
"""

from __future__ import annotations

import json
import queue
import re
import time
import urllib.error
import urllib.request
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import start_server
from prometheus_text import scrape
from test_e2e_trtllm_fakes import FAKE_ENVIRONMENT, UNSET_LIMITS, repository_with_fake
from triton_client import StreamClient, model_error, stream_once, tensor, text_inputs, token_inputs
from trtllm_support import make_engine_dir

from trtllm_model.server import DEFAULT_REPOSITORY

pytestmark = pytest.mark.e2e

DOC = Path(__file__).resolve().parent.parent / "docs" / "nvidia_compatibility.md"
BEAMS = 2
PROMPT_TEXT = "The capital of France is"
PROMPT_IDS = [5, 6, 7]
NUMPY = {"INT32": np.int32, "INT64": np.int64, "UINT64": np.uint64, "FP32": np.float32, "FP16": np.float16,
         "BOOL": np.bool_, "STRING": np.object_, "UINT8": np.uint8}


def doc_table(marker: str) -> list[dict[str, str]]:
    """The markdown table right after the HTML comment containing `marker`, as one dict per row."""
    lines = DOC.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("<!--") and marker in line) + 1
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    header, body = rows[0], rows[2:]
    return [dict(zip(header, row, strict=True)) for row in body]


SHAPES = doc_table("shape table")
INPUTS = doc_table("input table")


def config_io(model: str, section: str) -> dict[str, tuple[str, list[int]]]:
    """name -> (data type without TYPE_, dims) of a section of our model's config.pbtxt."""
    text = (DEFAULT_REPOSITORY / model / "config.pbtxt").read_text()
    block = re.search(r"\n" + section + r" \[\n(.*?)\n\]", "\n" + text, re.S).group(1)
    found = {}
    for entry in re.findall(r"\{(.*?)\n  \}", block, re.S):
        name = re.search(r'name: "(\w+)"', entry).group(1)
        dtype = re.search(r"data_type: TYPE_(\w+)", entry).group(1)
        dims = [int(d) for d in re.search(r"dims: \[([^\]]*)\]", entry).group(1).split(",")]
        found[name] = (dtype, dims)
    return found


# -- the input table ---------------------------------------------------------------------------------------------
def test_input_table_lists_exactly_the_inputs_of_our_models_with_their_types():
    token, text = config_io("tensorrt_llm", "input"), config_io("ensemble", "input")
    assert set(text) <= set(token), "the ensemble forwards every input to tensorrt_llm"
    table = {row["Input"]: row for row in INPUTS}
    assert sorted(set(token) - set(table)) == [], "inputs missing from docs/nvidia_compatibility.md"
    assert sorted(set(table) - set(token)) == [], "inputs in docs/nvidia_compatibility.md that no model declares"
    for name, (dtype, _) in token.items():
        row = table[name]
        assert row["Data type"] == dtype, name
        assert row["Models"] == ("both" if name in text else "tensorrt_llm"), name


def test_output_table_names_only_declared_outputs():
    for row in SHAPES:
        declared = config_io(row["Model"], "output")
        assert row["Output"] in declared, f"{row['Model']} does not declare {row['Output']}"
        assert declared[row["Output"]][0] == row["Data type"], row["Output"]


def test_every_nvidia_output_is_declared():
    # The outputs of NVIDIA's early-2025 tensorrt_llm and ensemble (context_phase_params: disaggregated serving).
    nvidia = {"output_ids", "sequence_length", "cum_log_probs", "output_log_probs", "context_logits",
              "generation_logits", "batch_index", "sequence_index", "context_phase_params",
              "kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks", "arrival_time_ns",
              "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns", "acceptance_rate",
              "total_accepted_draft_tokens", "total_draft_tokens"}
    assert nvidia <= set(config_io("tensorrt_llm", "output"))
    assert (nvidia - {"output_ids", "sequence_length", "context_phase_params"}) | {"text_output"} <= set(
        config_io("ensemble", "output"))


def example_value(dtype: str, dims: list[int]) -> np.ndarray:
    shape = [1] + [1 if d == -1 else d for d in dims]
    if dtype == "STRING":
        return np.full(shape, b"x", dtype=np.object_)
    if dtype == "BOOL":
        return np.ones(shape, dtype=np.bool_)
    return np.ones(shape, dtype=NUMPY[dtype])


def as_input(name: str, array: np.ndarray) -> grpcclient.InferInput:
    triton_dtype = "BYTES" if array.dtype == np.object_ else grpcclient.np_to_triton_dtype(array.dtype)
    infer_input = grpcclient.InferInput(name, list(array.shape), triton_dtype)
    infer_input.set_data_from_numpy(array)
    return infer_input


UNSUPPORTED_ROWS = [row["Input"] for row in INPUTS if row["Ours"] == "UNSUPPORTED"]
# What the synthetic executor does not honour either (the table names the executors that do).
SYNTHETIC_UNSUPPORTED = ["return_context_logits", "return_generation_logits", "lora_task_id",
                         "guided_decoding_guide_type"]


def test_inputs_the_table_calls_unsupported_are_refused_naming_them(synthetic_server):
    assert len(UNSUPPORTED_ROWS) >= 25  # guards the table parsing (decoder_input_* left the list: issue 23)
    token = config_io("tensorrt_llm", "input")
    client = StreamClient(synthetic_server.grpc_url)
    try:
        results = {}
        for i, name in enumerate(UNSUPPORTED_ROWS + SYNTHETIC_UNSUPPORTED):
            extra = as_input(name, example_value(*token[name]))
            results[name] = client.send("tensorrt_llm", [*token_inputs([1, 2], 2), extra], f"unsupported-{i}")
        for name, result in results.items():
            result.wait(20)
            assert result.responses == [] and len(result.errors) == 1, name
            assert result.errors[0].startswith("UNSUPPORTED: ") and name in result.errors[0], result.errors[0]
    finally:
        client.close()


def test_nvidia_client_defaults_top_k_1_top_p_0_are_greedy_not_refused(synthetic_server):
    inputs = token_inputs(PROMPT_IDS, 4, runtime_top_k=(1, np.int32), runtime_top_p=(0.0, np.float32),
                          temperature=(1.0, np.float32))
    result = stream_once(synthetic_server.grpc_url, "tensorrt_llm", inputs)
    assert result.errors == [] and len(result.tokens()) == 4
    over = stream_once(synthetic_server.grpc_url, "tensorrt_llm", token_inputs([1], 4, runtime_top_p=(1.5, np.float32)))
    assert over.errors and over.errors[0].startswith("INVALID_ARG") and "runtime_top_p" in over.errors[0]


# -- the shape table -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def beam_server(tmp_path_factory):
    """The fake TensorRT-LLM engine (beam width up to 2) with SmolLM2's tokenizer: tokens and text."""
    from trtllm_model.embedded.model_loading import default_cache_dir, dequantised_checkpoint, embedded_gguf_path

    workdir = tmp_path_factory.mktemp("beams")
    tokenizer_dir = dequantised_checkpoint(embedded_gguf_path(), default_cache_dir())
    parameters = {"executor": "trtllm_engine", "gpt_model_path": str(make_engine_dir(workdir / "engine")),
                  "max_beam_width": str(BEAMS), "tokenizer_dir": str(tokenizer_dir),
                  "guided_decoding_backend": "xgrammar", **UNSET_LIMITS}
    repository = repository_with_fake(workdir, parameters, ("tensorrt_llm", "ensemble"))
    server = start_server(workdir, executor="trtllm_engine", env=FAKE_ENVIRONMENT, repository=repository)
    yield server
    server.stop()


def match_shape(spec: str, shape: list[int], bound: dict[str, int]) -> None:
    """`[1, B, G]` against a real shape: digits exact, B and P fixed (in `bound`), other letters consistent."""
    dims = [d.strip() for d in spec.strip("[]").split(",")]
    assert len(dims) == len(shape), f"{spec} vs {shape}"
    for symbol, size in zip(dims, shape, strict=True):
        expected = int(symbol) if symbol.isdigit() else bound.setdefault(symbol, size)
        assert size == expected, f"{spec} vs {shape}: {symbol}={size}, expected {expected}"


def row_request(row: dict[str, str], streaming: bool, beams: int) -> list:
    when = row["When"]
    text = row["Model"] == "ensemble" or when == "text_input"
    extra = {}
    if when.startswith("return_"):
        extra[when] = (True, np.bool_)
    if when == "num_return_sequences":
        extra[when] = (2, np.int32)
    if when == "num_top_log_probs":
        extra[when] = (3, np.int32)
    if beams > 1:
        extra["beam_width"] = (beams, np.int32)
    extra["exclude_input_in_output"] = (True, np.bool_)
    if when == "batch":  # two prompts in one request, as end_to_end_grpc_client.py --batch-inputs sends them
        rows = 2
        names = {"text_input": [[PROMPT_TEXT.encode()]] * rows, "max_tokens": [[4]] * rows} if text else {
            "input_ids": [PROMPT_IDS] * rows, "request_output_len": [[4]] * rows}
        flags = {("stream" if text else "streaming"): streaming, "exclude_input_in_output": True}
        if beams > 1:
            flags["beam_width"] = beams
        arrays = {name: np.array(value, dtype=np.object_ if name == "text_input" else np.int32)
                  for name, value in names.items()}
        arrays.update({name: np.full((rows, 1), value, dtype=np.int32 if name == "beam_width" else np.bool_)
                       for name, value in flags.items()})
        return [as_input(name, array) for name, array in arrays.items()]
    if text:
        return text_inputs(PROMPT_TEXT, 4, stream=streaming, **extra)
    return token_inputs(PROMPT_IDS, 4, streaming=streaming, **extra)


def server_for(row: dict[str, str], beams: int, synthetic_server, beam_server):
    if row["When"] in ("return_context_logits", "return_generation_logits") or row["When"] == "num_return_sequences":
        return beam_server  # the synthetic executor has no logits and one sequence
    return beam_server if beams > 1 else synthetic_server


SHAPE_CASES = [
    pytest.param(row, beams, streaming, id=f"{row['Model']}-{row['Output']}-beams{beams}-{'stream' if streaming else 'whole'}")
    for row in SHAPES
    for beams in (1, BEAMS)
    if (row["Beam width 1"] if beams == 1 else row["Beam width B"]) != "-"
    for streaming in (True, False)
]


@pytest.mark.parametrize("row, beams, streaming", SHAPE_CASES)
def test_shape_table_holds_for_real_responses(row, beams, streaming, synthetic_server, beam_server):
    server = server_for(row, beams, synthetic_server, beam_server)
    inputs = row_request(row, streaming, beams)
    result = stream_once(server.grpc_url, row["Model"], inputs, timeout_s=60)
    assert result.errors == [] and result.finals == 1, result.errors
    carrying = [r for r in result.responses if r.get_output(row["Output"]) is not None]
    assert carrying, f"no response carried {row['Output']}"
    prompt_len = len(PROMPT_IDS) if row["Model"] == "tensorrt_llm" and row["When"] != "text_input" else None
    spec = row["Beam width 1"] if beams == 1 else row["Beam width B"]
    for response in carrying:
        bound = {"B": beams, **({"P": prompt_len} if prompt_len else {})}
        output = response.get_output(row["Output"])
        assert output.datatype == ("BYTES" if row["Data type"] == "STRING" else row["Data type"])
        match_shape(spec, list(output.shape), bound)
        if row["Output"].startswith("output_top_log_prob"):
            assert bound["K"] == 3
        if row["Output"] in ("output_log_probs", "generation_logits", "output_top_log_probs") and response.get_output(
                "output_ids"):
            # L: one per generated token of this response (exclude_input_in_output is set)
            assert bound["L"] == response.as_numpy("output_ids").shape[-1]


def test_text_output_decodes_as_nvidia_clients_read_it(synthetic_server):
    """end_to_end_grpc_client.py reads `result.as_numpy('text_output')[0].decode('utf-8')`."""
    for stream in (True, False):
        result = stream_once(synthetic_server.grpc_url, "ensemble", text_inputs("abc", 4, stream=stream))
        texts = [r.as_numpy("text_output")[0].decode("utf-8") for r in result.responses]
        assert "".join(texts) == "defg"  # the repository excludes the prompt by default


# -- final responses -----------------------------------------------------------------------------------------
def collect_with_tritonclient(url: str, model: str, inputs, request_id: str = "1") -> list:
    """NVIDIA's clients' way: start_stream with a callback, no empty-final option; returns what the callback saw."""
    seen: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: seen.put(error or result))
    client.async_stream_infer(model, inputs, request_id=request_id)
    client.stop_stream()  # waits for the server to end the stream
    client.close()
    return [seen.get() for _ in range(seen.qsize())]


@pytest.mark.parametrize("model", ["tensorrt_llm", "ensemble"])
def test_request_ending_without_a_new_token_still_reaches_the_callback(synthetic_server, model):
    # allotted_time_ms ends the request between two tokens: its final step has no token.
    inputs = (token_inputs([1], 1000) if model == "tensorrt_llm" else text_inputs("a", 1000))
    inputs.append(tensor("allotted_time_ms", 60, np.int32))
    inputs.append(tensor("return_finish_reason", True, np.bool_))
    seen = collect_with_tritonclient(synthetic_server.grpc_url, model, inputs)
    assert seen and not any(isinstance(item, Exception) for item in seen), seen
    last = seen[-1]
    assert last.as_numpy("finish_reason").reshape(-1)[0] == b"timeout"
    if model == "tensorrt_llm":
        assert last.as_numpy("output_ids").shape == (1, 1, 0) and last.as_numpy("sequence_length").tolist() == [[0]]
    else:
        assert last.as_numpy("text_output").tolist() == [b""]


# -- non-decoupled mode ----------------------------------------------------------------------------------------
def test_serve_decoupled_false_makes_both_models_non_decoupled(unary_server):
    for model in ("tensorrt_llm", "ensemble"):
        with urllib.request.urlopen(f"{unary_server.http_url}/v2/models/{model}/config") as response:
            config = json.loads(response.read())
        assert config.get("model_transaction_policy", {}).get("decoupled", False) is False, model


@pytest.mark.parametrize("model", ["tensorrt_llm", "ensemble"])
def test_unary_grpc_infer_gets_one_complete_response(unary_server, model):
    client = grpcclient.InferenceServerClient(unary_server.grpc_url)
    if model == "tensorrt_llm":
        inputs = token_inputs(PROMPT_IDS, 4, streaming=False, return_log_probs=(True, np.bool_),
                              exclude_input_in_output=(False, np.bool_))
        result = client.infer(model, inputs)
        assert result.as_numpy("output_ids").tolist() == [[[5, 6, 7, 8, 9, 10, 11]]]
        assert result.as_numpy("sequence_length").tolist() == [[7]]
        assert result.as_numpy("cum_log_probs").shape == (1, 1)
    else:
        result = client.infer(model, text_inputs("abc", 4, stream=False, exclude_input_in_output=(True, np.bool_)))
        assert result.as_numpy("text_output").tolist() == [b"defg"]


@pytest.mark.parametrize("model", ["tensorrt_llm", "ensemble"])
def test_unary_http_infer_gets_one_complete_response(unary_server, model):
    body = {"inputs": [
        {"name": "text_input", "shape": [1, 1], "datatype": "BYTES", "data": ["abc"]},
        {"name": "max_tokens", "shape": [1, 1], "datatype": "INT32", "data": [3]},
        {"name": "exclude_input_in_output", "shape": [1, 1], "datatype": "BOOL", "data": [True]},
    ]}
    request = urllib.request.Request(f"{unary_server.http_url}/v2/models/{model}/infer", data=json.dumps(body).encode())
    with urllib.request.urlopen(request) as response:
        outputs = json.loads(response.read())["outputs"]
    assert outputs == [{"name": "text_output", "datatype": "BYTES", "shape": [1], "data": ["def"]}]


@pytest.mark.parametrize("model, flag", [("tensorrt_llm", "streaming"), ("ensemble", "stream")])
def test_streaming_to_the_non_decoupled_model_is_refused_clearly(unary_server, model, flag):
    client = grpcclient.InferenceServerClient(unary_server.grpc_url)
    inputs = token_inputs([1], 4, streaming=True) if model == "tensorrt_llm" else text_inputs("a", 4, stream=True)
    with pytest.raises(grpcclient.InferenceServerException) as error:
        client.infer(model, inputs)
    assert error.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert f"{flag}=true" in error.value.message() and "decoupled: false" in error.value.message()
    # The server keeps serving.
    assert client.infer("tensorrt_llm", token_inputs([1], 2, streaming=False)).as_numpy("output_ids").size == 2


def test_unary_bad_request_gets_its_code(unary_server):
    client = grpcclient.InferenceServerClient(unary_server.grpc_url)
    for model, inputs in (("tensorrt_llm", token_inputs([1], 0, streaming=False)),
                          ("ensemble", text_inputs("a", 0, stream=False))):
        with pytest.raises(grpcclient.InferenceServerException) as error:
            client.infer(model, inputs)
        assert error.value.status() == "StatusCode.INVALID_ARGUMENT", (model, error.value)


def test_unary_stop_request_gets_one_empty_response(unary_server):
    """inflight_batcher_llm_client.py --stop-after-ms without --streaming: a unary request, then a unary `stop`."""
    client = grpcclient.InferenceServerClient(unary_server.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.async_infer("tensorrt_llm", token_inputs([1], 4000, streaming=False), partial(_put, answers),
                       request_id="long-one", parameters={"Streaming": False})
    stop = [tensor("input_ids", np.empty((1, 1), np.int32), np.int32), tensor("input_lengths", 0, np.int32),
            tensor("request_output_len", 0, np.int32), tensor("stop", True, np.bool_)]
    time.sleep(0.3)
    stopped = client.infer("tensorrt_llm", stop, request_id="long-one", parameters={"Streaming": False})
    assert stopped.get_response().outputs == []
    long = answers.get(timeout=30)
    assert not isinstance(long, Exception), long  # as NVIDIA's: the tokens so far, in a normal response
    assert 0 < long.as_numpy("output_ids").size < 4000
    # Stopping a request that already ended is no error (as NVIDIA's); stopping without an id is.
    assert client.infer("tensorrt_llm", stop, request_id="long-one").get_response().outputs == []
    with pytest.raises(grpcclient.InferenceServerException, match="request id"):
        client.infer("tensorrt_llm", stop)


def _put(answers: queue.Queue, result, error) -> None:
    answers.put(error or result)


def test_unary_http_infer_on_the_decoupled_model_is_refused_by_triton(synthetic_server):
    """Decoupled (the default): unary HTTP infer is Triton's refusal, which the docs' mode table states."""
    body = {"inputs": [{"name": "text_input", "shape": [1, 1], "datatype": "BYTES", "data": ["abc"]},
                       {"name": "max_tokens", "shape": [1, 1], "datatype": "INT32", "data": [3]}]}
    request = urllib.request.Request(f"{synthetic_server.http_url}/v2/models/ensemble/infer",
                                     data=json.dumps(body).encode())
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(request)


@pytest.mark.parametrize("streaming", [True, False])
def test_a_batch_of_prompts_in_one_request_answers_each_with_its_batch_index(synthetic_server, streaming):
    inputs = [as_input("input_ids", np.array([[5], [50]], np.int32)),
              as_input("request_output_len", np.array([[4], [2]], np.int32)),
              as_input("streaming", np.full((2, 1), streaming))]
    result = stream_once(synthetic_server.grpc_url, "tensorrt_llm", inputs)
    assert result.errors == [] and result.finals == 1
    tokens: dict[int, list[int]] = {0: [], 1: []}
    for response in result.responses:
        tokens[int(response.as_numpy("batch_index")[0][0])] += response.as_numpy("output_ids").reshape(-1).tolist()
    assert tokens == {0: [6, 7, 8, 9], 1: [51, 52]}


def test_a_batch_of_many_rows_leaves_slots_for_other_clients(synthetic_server):
    # 64 rows of 100 tokens (1 s at 10 ms steps) against the model's 32 batch slots: the rows of batched requests
    # take at most half of them (max_batched_rows_in_flight), 4 rounds of 16 rows, so a one-row request sent beside
    # them is answered at once, not after the batch (issue 31 item 5: a client opening and cancelling 64-row ensemble requests held everyone).
    rows = 64
    client = StreamClient(synthetic_server.grpc_url)
    try:
        batch = client.send("tensorrt_llm", [as_input("input_ids", np.arange(1, rows + 1, dtype=np.int32)[:, None]),
                                             as_input("request_output_len", np.full((rows, 1), 100, np.int32)),
                                             as_input("streaming", np.full((rows, 1), True))], "batch")
        deadline = time.monotonic() + 10
        while not batch.responses and time.monotonic() < deadline:
            time.sleep(0.01)
        started = time.monotonic()
        single = stream_once(synthetic_server.grpc_url, "tensorrt_llm", token_inputs([7], 4))
        took = time.monotonic() - started
        assert single.errors == [] and single.tokens() == [8, 9, 10, 11]
        assert not batch.done.is_set() and took < 1.5, took
        batch.wait(60)
        assert batch.errors == [] and batch.finals == 1
        counts: dict[int, int] = {}
        for response in batch.responses:
            index = int(response.as_numpy("batch_index")[0][0])
            counts[index] = counts.get(index, 0) + response.as_numpy("output_ids").size
        assert counts == {i: 100 for i in range(rows)}
    finally:
        client.close()


def test_a_stop_row_does_not_let_a_batch_past_the_row_gate(synthetic_server):
    # A 64-row request whose row 0 is a `stop` (for an id not in flight): its 63 other rows still go through the row
    # gate, at most 16 of the 32 slots at once; they once all went straight to the engine (32 active, 31 queued
    # before any one-row client). The engine's active-requests gauge is read while the batch runs.
    rows = 64
    client = StreamClient(synthetic_server.grpc_url)
    stop = np.zeros((rows, 1), bool)
    stop[0, 0] = True
    peak = 0.0
    try:
        batch = client.send("tensorrt_llm", [as_input("input_ids", np.arange(1, rows + 1, dtype=np.int32)[:, None]),
                                             as_input("request_output_len", np.full((rows, 1), 100, np.int32)),
                                             as_input("streaming", np.full((rows, 1), True)),
                                             as_input("stop", stop)], "gated-batch")
        deadline = time.monotonic() + 60
        while not batch.done.is_set() and time.monotonic() < deadline:
            found = scrape(synthetic_server.metrics_url).find("nv_trt_llm_request_metrics", request_type="active",
                                                             model="tensorrt_llm")
            peak = max(peak, *found.values(), 0.0)
            time.sleep(0.05)
        batch.wait(60)
    finally:
        client.close()
    assert batch.errors == [] and batch.finals == 1
    counts: dict[int, int] = {}
    for response in batch.responses:
        index, ids = int(response.as_numpy("batch_index")[0][0]), response.as_numpy("output_ids")
        counts[index] = counts.get(index, 0) + (0 if ids is None else ids.size)  # the stop row's answer has none
    assert {i: counts.get(i, 0) for i in range(1, rows)} == {i: 100 for i in range(1, rows)}
    assert 0 < peak <= 16, f"the engine ran {peak} requests at once (the gate's share is 16 of 32)"


def test_the_non_decoupled_model_refuses_a_batch_as_unsupported(unary_server):
    client = grpcclient.InferenceServerClient(unary_server.grpc_url)
    inputs = [as_input("input_ids", np.array([[5], [50]], np.int32)),
              as_input("request_output_len", np.array([[4], [2]], np.int32))]
    with pytest.raises(grpcclient.InferenceServerException) as error:
        client.infer("tensorrt_llm", inputs)
    assert error.value.status() == "StatusCode.UNIMPLEMENTED" and "batch of 2" in error.value.message()


@pytest.mark.parametrize("model", ["tensorrt_llm", "ensemble"])
def test_lora_and_guided_decoding_reach_the_engine_executor(beam_server, model):
    """The engine executor takes them (the fake engine accepts what TensorRT-LLM's API takes); the synthetic one
    refuses them as UNSUPPORTED (test_inputs_the_table_calls_unsupported_are_refused_naming_them)."""
    extra = [as_input("lora_task_id", np.array([[3]], np.uint64)),
             as_input("lora_weights", np.ones((1, 2, 8), np.float16)),
             as_input("lora_config", np.array([[[1, 0, 4], [2, 0, 4]]], np.int32)),
             as_input("guided_decoding_guide_type", np.array([[b"json_schema"]], np.object_)),
             as_input("guided_decoding_guide", np.array([[b'{"type": "object"}']], np.object_))]
    inputs = token_inputs(PROMPT_IDS, 3) if model == "tensorrt_llm" else text_inputs(PROMPT_TEXT, 3)
    result = stream_once(beam_server.grpc_url, model, inputs + extra)
    assert result.errors == [] and result.finals == 1
    bad = stream_once(beam_server.grpc_url, model, inputs + [
        as_input("guided_decoding_guide_type", np.array([[b"xml"]], np.object_))])
    assert bad.errors and model_error(bad.errors[0]).startswith("INVALID_ARG") and "guided_decoding_guide_type" in bad.errors[0]
