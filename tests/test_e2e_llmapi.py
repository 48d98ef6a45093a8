"""NVIDIA's LLM API model interface (model.yaml, `sampling_param_*`) against a real server: the requests NVIDIA's
`llmapi_client.py`, `tests/test_llmapi_cancel.py` and `end_to_end_test.py --test-llmapi` send (TensorRT-LLM
`triton_backend/tools/`, 2026), with their names, dtypes, shapes, request ids and the `Streaming` request parameter,
on the embedded SmolLM2 (model_repository_llmapi) and over the strict tensorrt_llm fake (NVIDIA's own model.yaml).

Our own code; no line of NVIDIA's scripts. What the scripts send:
- llmapi_client.py: unary `async_infer(request_id="1", parameters={"Streaming": b})` with text_input [prompt] BYTES
  and sampling_param_max_tokens [n] INT32; to stop early, a second request of the same id with text_input
  np.empty([1], bytes_) and stop [True] BOOL (answered CANCELLED), or a client cancel.
- test_llmapi_cancel.py: a stop for an id not in flight (CANCELLED), a request (id "1"), a stop after it ended
  (CANCELLED), a second request (id "2") whose text equals the first's.
- end_to_end_test.py --test-llmapi: unary `infer(request_id=str(i))`, or with --streaming a gRPC stream with
  streaming [True] BOOL; sampling params as `sampling_param_<name>` [value], output config flags [True] BOOL.
"""

from __future__ import annotations

import queue
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import start_server
from triton_client import as_inputs
from tritonclient.utils import InferenceServerException
from trtllm_support import FAKES_DIR, make_checkpoint_dir

from trtllm_model.conventions.llmapi import INPUTS, OUTPUTS
from trtllm_model.server import PROJECT_ROOT

pytestmark = pytest.mark.e2e

PROMPT = "Born in north-east France, Soyer trained as a"
LLMAPI_REPOSITORY = PROJECT_ROOT / "model_repository_llmapi"
NP_TYPES = {"TYPE_STRING": np.object_, "TYPE_BOOL": np.bool_, "TYPE_INT32": np.int32, "TYPE_UINT64": np.uint64,
            "TYPE_FP32": np.float32, "TYPE_INT64": np.int64}


def client_inputs(prompt: str = PROMPT, max_tokens: int = 16, **extra: np.ndarray) -> list[grpcclient.InferInput]:
    """llmapi_client.py's _prepare_inputs, plus `extra` tensors as end_to_end_test.py adds them."""
    return as_inputs({"text_input": np.array([prompt], dtype=object),
                      "sampling_param_max_tokens": np.array([max_tokens], dtype=np.int32), **extra})


def stop_inputs() -> list[grpcclient.InferInput]:
    """llmapi_client.py's prepare_stop_signals: text_input np.empty([1], bytes_) and stop [True]."""
    return as_inputs({"text_input": np.empty([1], dtype=np.bytes_), "stop": np.array([True], dtype=bool)})


def async_call(client, inputs, request_id: str, results: queue.Queue, streaming: bool = False):
    return client.async_infer("tensorrt_llm", inputs, request_id=request_id,
                              callback=lambda result, error: results.put(error or result),
                              parameters={"Streaming": streaming})


def copy_repository(target: Path) -> Path:
    shutil.copytree(LLMAPI_REPOSITORY, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


@pytest.fixture(scope="module")
def unary_server(llmapi_unary_server):
    """model_repository_llmapi as it is (decoupled: False, as NVIDIA's model.yaml): the embedded SmolLM2."""
    return llmapi_unary_server[0]


@pytest.fixture(scope="module")
def stream_server(llmapi_stream_server):
    """The same, decoupled (`serve --decoupled true`), for streaming clients."""
    return llmapi_stream_server[0]


def test_repository_declares_nvidias_inputs_and_outputs():
    """Our config.pbtxt carries every input and output of NVIDIA's llmapi config.pbtxt with its dtype and dims."""
    text = (LLMAPI_REPOSITORY / "tensorrt_llm" / "config.pbtxt").read_text()
    for name, (dtype, dims) in {**INPUTS, **OUTPUTS}.items():
        entry = f'name: "{name}"\n    data_type: {dtype}\n    dims: [ {", ".join(map(str, dims))} ]'
        assert entry in text, name
    assert "\nmax_batch_size" not in text and "\nmodel_transaction_policy" not in text  # model.yaml sets them


def test_docs_tables_match_the_convention():
    """docs/nvidia_compatibility.md's llmapi tables list exactly the convention's inputs and outputs, dtypes, dims."""
    text = (PROJECT_ROOT / "docs" / "nvidia_compatibility.md").read_text()
    for marker, spec in (("<!-- llmapi input table", INPUTS), ("<!-- llmapi output table", OUTPUTS)):
        lines = text[text.index(marker):].splitlines()[3:]
        rows = [line.split(" | ") for line in lines[: next(i for i, line in enumerate(lines) if not line.startswith("|"))]]
        documented = {row[0].lstrip("| "): (f"TYPE_{row[1]}", row[2]) for row in rows}
        assert documented == {name: (dtype, str(dims)) for name, (dtype, dims) in spec.items()}, marker


def test_llmapi_client_unary_includes_the_prompt(unary_server):
    results: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(unary_server.grpc_url) as client:
        async_call(client, client_inputs(return_finish_reason=np.array([True])), "1", results)
        result = results.get(timeout=120)
    assert not isinstance(result, Exception), result
    text = result.as_numpy("text_output")
    assert text.shape == (1,) and text[0].decode().startswith(PROMPT) and len(text[0].decode()) > len(PROMPT)
    assert result.as_numpy("finish_reason").tolist() == [b"length"]


def test_exclude_input_stop_strings_and_cumulative_logprob(unary_server):
    with grpcclient.InferenceServerClient(unary_server.grpc_url) as client:
        plain = client.infer("tensorrt_llm", client_inputs(
            sampling_param_exclude_input_from_output=np.array([True])), request_id="2")
        generated = plain.as_numpy("text_output")[0].decode()
        assert not generated.startswith(PROMPT) and generated
        stop_word = generated.split()[1]  # a word the greedy continuation reaches
        stopped = client.infer("tensorrt_llm", client_inputs(
            sampling_param_exclude_input_from_output=np.array([True]),
            sampling_param_stop=np.array([stop_word], dtype=object), return_finish_reason=np.array([True]),
            return_stop_reason=np.array([True]), return_cumulative_logprob=np.array([True])), request_id="3")
    assert stopped.as_numpy("finish_reason").tolist() == [b"stop"]
    assert stopped.as_numpy("stop_reason").tolist() == [stop_word.encode()]
    text = stopped.as_numpy("text_output")[0].decode()
    assert generated.startswith(text) and stop_word not in text  # the stop string ends the text, not in it
    logprob = stopped.as_numpy("cumulative_logprob")
    assert logprob.dtype == np.float32 and logprob.shape == (1,) and logprob[0] < 0


def test_perf_metrics_from_the_embedded_engine(unary_server):
    with grpcclient.InferenceServerClient(unary_server.grpc_url) as client:
        result = client.infer("tensorrt_llm", client_inputs(
            sampling_param_return_perf_metrics=np.array([True])), request_id="4")
    for name, (dtype, _) in OUTPUTS.items():
        if name.startswith(("kv_cache", "arrival", "first", "last", "acceptance", "total_")):
            array = result.as_numpy(name)
            assert array is not None and array.dtype == NP_TYPES[dtype] and array.shape == (1,), name
    times = [int(result.as_numpy(n)[0]) for n in ("arrival_time_ns", "first_scheduled_time_ns",
                                                  "first_token_time_ns", "last_token_time_ns")]
    assert 0 < times[0] <= times[1] <= times[2] <= times[3]
    assert result.as_numpy("kv_cache_alloc_total_blocks")[0] > 0


def test_stop_unknown_then_completed_id_is_cancelled_and_texts_match(unary_server):
    """test_llmapi_cancel.py's sequence."""
    results: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(unary_server.grpc_url) as client:
        async_call(client, stop_inputs(), "1", results)
        answer = results.get(timeout=60)
        assert isinstance(answer, InferenceServerException) and answer.status() == "StatusCode.CANCELLED"
        first = async_call(client, client_inputs(max_tokens=100, prompt="The current time is"), "1", results)
        result = results.get(timeout=300)
        first.cancel()
        async_call(client, stop_inputs(), "1", results)
        answer = results.get(timeout=60)
        assert isinstance(answer, InferenceServerException) and answer.status() == "StatusCode.CANCELLED"
        async_call(client, client_inputs(max_tokens=100, prompt="The current time is"), "2", results)
        second = results.get(timeout=300)
    assert np.array_equal(result.as_numpy("text_output"), second.as_numpy("text_output"))


def test_stop_aborts_the_running_request(unary_server):
    """llmapi_client.py --stop-after-ms: the stop is answered CANCELLED, the stopped request ends at once with its
    text so far and finish reason 'cancelled' (NVIDIA's model never answers it: ours ends every request)."""
    results: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(unary_server.grpc_url) as client:
        start = time.monotonic()
        async_call(client, client_inputs(max_tokens=500, return_finish_reason=np.array([True])), "9", results)
        time.sleep(1.0)
        async_call(client, stop_inputs(), "9", results)
        answers = [results.get(timeout=60), results.get(timeout=60)]
    assert time.monotonic() - start < 30
    errors = [a for a in answers if isinstance(a, InferenceServerException)]
    finals = [a for a in answers if not isinstance(a, Exception)]
    assert [e.status() for e in errors] == ["StatusCode.CANCELLED"] and "Request cancelled by client" in str(errors[0])
    assert finals[0].as_numpy("finish_reason").tolist() == [b"cancelled"]


def test_refusals_name_the_input(unary_server):
    cases = {
        "streaming": ({"streaming": np.array([True])}, "INVALID_ARG", "decoupled"),
        "image_url": ({"image_url": np.array(["file:///etc/passwd"], dtype=object)}, "INVALID_ARG", "multimodal"),
        "lora_path": ({"lora_id": np.array([1], np.uint64), "lora_name": np.array(["a"], dtype=object),
                       "lora_path": np.array(["/no/such/adapter"], dtype=object)}, "UNSUPPORTED", "lora_path"),
        "lora_id": ({"lora_name": np.array(["a"], dtype=object)}, "INVALID_ARG", "lora_id"),
        "lora": ({"lora_id": np.array([1], np.uint64), "lora_name": np.array(["a"], dtype=object),
                  "lora_path": np.array(["/tmp"], dtype=object)}, "UNSUPPORTED", "lora_path"),
        "best_of": ({"sampling_param_best_of": np.array([2], np.int32)}, "UNSUPPORTED", "sampling_param_best_of"),
        "processor": ({"sampling_param_logits_post_processor_name": np.array(["nope"], dtype=object)},
                      "INVALID_ARG", "nope"),
    }
    with grpcclient.InferenceServerClient(unary_server.grpc_url) as client:
        for case, (extra, code, named) in cases.items():
            with pytest.raises(InferenceServerException) as raised:
                client.infer("tensorrt_llm", client_inputs(**extra))
            assert str(raised.value.message()).startswith(f"{code}: ") and named in raised.value.message(), case


def test_lora_path_with_lora_off_gets_one_answer_whether_the_path_exists_or_not(unary_server):
    """Without LoRA (the embedded engine) the path is never looked at: a client learns nothing of the server's files."""
    messages = []
    with grpcclient.InferenceServerClient(unary_server.grpc_url) as client:
        for path in ("/etc/passwd", "/no/such/adapter"):
            with pytest.raises(InferenceServerException) as raised:
                client.infer("tensorrt_llm", client_inputs(lora_id=np.array([1], np.uint64),
                                                           lora_name=np.array(["a"], dtype=object),
                                                           lora_path=np.array([path], dtype=object)))
            messages.append((raised.value.status(), raised.value.message()))
    assert messages[0] == messages[1] and messages[0][1].startswith("UNSUPPORTED: lora_path: "), messages


def test_end_to_end_streaming_is_cumulative_with_one_final(stream_server):
    """end_to_end_test.py --test-llmapi --streaming: streaming [True] on a gRPC stream."""
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(stream_server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put(error or result))
    client.async_stream_infer("tensorrt_llm", client_inputs(
        streaming=np.array([True]), return_finish_reason=np.array([True]), return_stop_reason=np.array([True]),
        sampling_param_exclude_input_from_output=np.array([True])), request_id="0", enable_empty_final_response=True)
    texts, reasons = [], []
    while True:
        result = results.get(timeout=120)
        assert not isinstance(result, Exception), result
        final = result.get_response().parameters["triton_final_response"].bool_param
        texts.append(result.as_numpy("text_output")[0].decode())
        reasons.append(result.as_numpy("finish_reason")[0].decode())
        if final:
            break
    client.stop_stream()
    client.close()
    assert len(texts) > 2 and all(later.startswith(earlier) for earlier, later in zip(texts, texts[1:]))
    assert reasons[:-1] == ["None"] * (len(reasons) - 1) and reasons[-1] == "length"


def test_nvidia_model_yaml_and_config_load_over_the_fake(tmp_path):
    """NVIDIA's llmapi config.pbtxt (its documented inputs and outputs, no max_batch_size, no transaction policy)
    and model.yaml (their fields and values, the hub name as `model`) with our model.py, over the strict fake."""
    repository = tmp_path / "repository"
    version = repository / "tensorrt_llm" / "1"
    version.mkdir(parents=True)
    entries = [f'  {{ name: "{n}" data_type: {d} dims: [ {", ".join(map(str, s))} ]'
               + (" optional: true" if n != "text_input" else "") + " }" for n, (d, s) in INPUTS.items()
               if n != "sampling_param_logits_post_processor_name"]  # NVIDIA's helpers read it; its config omits it
    outputs = [f'  {{ name: "{n}" data_type: {d} dims: [ {", ".join(map(str, s))} ] }}' for n, (d, s) in OUTPUTS.items()]
    (repository / "tensorrt_llm" / "config.pbtxt").write_text(
        'name: "tensorrt_llm"\nbackend: "python"\ninstance_group [ { count: 1 kind : KIND_CPU } ]\n'
        "input [\n" + ",\n".join(entries) + "\n]\noutput [\n" + ",\n".join(outputs) + "\n]\n")
    (version / "model.yaml").write_text(
        'model: TinyLlama/TinyLlama-1.1B-Chat-v1.0\nbackend: "pytorch"\ntensor_parallel_size: 1\n'
        "pipeline_parallel_size: 1\ntriton_config:\n  max_batch_size: 0\n  decoupled: False\n")
    shutil.copy(LLMAPI_REPOSITORY / "tensorrt_llm" / "1" / "model.py", version / "model.py")
    shutil.copytree(FAKES_DIR / "tensorrt_llm", version / "tensorrt_llm", ignore=shutil.ignore_patterns("__pycache__"))
    make_checkpoint_dir(tmp_path / "TinyLlama" / "TinyLlama-1.1B-Chat-v1.0")  # the hub name, relative to the cwd
    server = start_server(tmp_path / "server", executor=None, repository=repository, cwd=tmp_path,
                          env={"FAKE_TRTLLM_STEP_MS": "2"})
    try:
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            result = client.infer("tensorrt_llm", client_inputs(prompt="hi", max_tokens=4,
                                                                return_finish_reason=np.array([True])),
                                  request_id="1")
            assert result.as_numpy("text_output")[0].decode().startswith("hi")
            assert result.as_numpy("finish_reason").tolist() in ([b"length"], [b"stop"])
            with pytest.raises(InferenceServerException) as raised:  # not decoupled, as NVIDIA's model.yaml says
                client.infer("tensorrt_llm", client_inputs(prompt="hi", streaming=np.array([True])))
            assert "decoupled" in raised.value.message()
    finally:
        server.stop()


def test_configure_layout_llmapi_writes_a_repository_that_serves(tmp_path):
    from trtllm_model.launch.configure import main

    output = tmp_path / "models"
    assert main(["--layout", "llmapi", "--output", str(output), "--decoupled", "true",
                 "--set", "max_batch_size=4"]) == 0
    text = (output / "tensorrt_llm" / "1" / "model.yaml").read_text()
    assert "decoupled: true" in text and "max_batch_size: 4" in text and "executor: transformers" in text
    assert main(["--layout", "llmapi", "--output", str(tmp_path / "bad"), "--set", "executor=nope"]) == 2
    assert not (tmp_path / "bad").exists()


def stream_responses(client, inputs, request_id: str) -> list:
    """Every response of one request on a gRPC stream, up to the one flagged final."""
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put(error or result))
    client.async_stream_infer("tensorrt_llm", inputs, request_id=request_id, enable_empty_final_response=True)
    responses = []
    while True:
        result = results.get(timeout=120)
        responses.append(result)
        if isinstance(result, Exception) or result.get_response().parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()
    return responses


@pytest.fixture(scope="module")
def batched_server(tmp_path_factory):
    """triton_config.max_batch_size 2, decoupled: inputs carry a batch dimension (NVIDIA's model reads row 0)."""
    workdir = tmp_path_factory.mktemp("llmapi_batched")
    repository = copy_repository(workdir / "repository")
    (repository / "tensorrt_llm" / "1" / "model.yaml").write_text(
        "executor: transformers\nmodel: smollm2\ntriton_config:\n  max_batch_size: 2\n  decoupled: true\n")
    server = start_server(workdir, executor=None, repository=repository)
    yield server
    server.stop()


def test_batched_text_input_answers_each_row_on_one_stream(batched_server):
    """Ours goes beyond NVIDIA's: a batch of 2 prompts in one request is 2 requests, each answered with its own
    text ([1, 1], one row) and finish reason, on the request's stream; the last one alone is flagged final."""
    prompts = [PROMPT, "The capital of France is"]
    inputs = as_inputs({"text_input": np.array([[p] for p in prompts], dtype=object),
                        "sampling_param_max_tokens": np.array([[6], [6]], dtype=np.int32),
                        "return_finish_reason": np.array([[True], [True]])})
    with grpcclient.InferenceServerClient(batched_server.grpc_url) as client:
        responses = stream_responses(client, inputs, "b1")
        single = stream_responses(client, as_inputs({"text_input": np.array([[prompts[1]]], dtype=object),
                                                     "sampling_param_max_tokens": np.array([[6]], dtype=np.int32)}),
                                  "b2")
        mismatched = stream_responses(client, as_inputs({
            "text_input": np.array([[p] for p in prompts], dtype=object),
            "sampling_param_max_tokens": np.array([[6]], dtype=np.int32)}), "b3")
    assert not any(isinstance(r, Exception) for r in responses + single), responses + single
    with_text = [r for r in responses if r.as_numpy("text_output") is not None]
    assert len(with_text) == 2 and all(r.as_numpy("text_output").shape == (1, 1) for r in with_text)
    texts = {p: [t for r in with_text if (t := r.as_numpy("text_output")[0, 0].decode()).startswith(p)]
             for p in prompts}
    assert all(len(texts[p]) == 1 and len(texts[p][0]) > len(p) for p in prompts), texts  # each row, once
    assert all(r.as_numpy("finish_reason").tolist() == [[b"length"]] for r in with_text)
    assert [r.get_response().parameters["triton_final_response"].bool_param for r in responses][-1] is True
    assert sum(r.get_response().parameters["triton_final_response"].bool_param for r in responses) == 1
    assert single[-1].as_numpy("text_output")[0, 0].decode() == texts[prompts[1]][0]  # as when sent alone
    [error] = mismatched
    assert isinstance(error, InferenceServerException)
    assert "batch size does not match" in error.message()  # Triton refuses it before the model sees it


def test_a_tensorrt_llm_without_llmapi_on_pythonpath_is_named_with_this_layouts_fix(tmp_path):
    # A stand-in `tensorrt_llm` that imports but has no `tensorrt_llm.llmapi`, on the PYTHONPATH tritonserver gets:
    # the model must see it (the stub leaves PYTHONPATH off sys.path) and say what is missing, and where the
    # executor is chosen in this layout (model.yaml's `executor:`; config.pbtxt parameters do nothing here).
    stand_in = tmp_path / "pythonpath" / "tensorrt_llm"
    stand_in.mkdir(parents=True)
    (stand_in / "__init__.py").write_text("# imports; no llmapi\n")
    repository = copy_repository(tmp_path / "repository")
    server = start_server(tmp_path, executor=None, repository=repository, expect_ready=False,
                          serve_args=["--set", "executor=trtllm_llmapi", "--set", f"model={tmp_path}"],
                          env={"PYTHONPATH": str(stand_in.parent)})
    deadline = time.monotonic() + 120
    while server.process.poll() is None and "failed to load" not in server.log() and time.monotonic() < deadline:
        time.sleep(0.5)
    server.stop()
    log = server.log()
    assert f"needs tensorrt_llm.llmapi, which the tensorrt_llm package found at {stand_in}" in log, log[-3000:]
    assert "`executor: transformers` in model.yaml" in log
    assert "is not installed" not in log and "parameter executor=transformers" not in log
