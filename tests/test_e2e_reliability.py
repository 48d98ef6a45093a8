"""Never hang, never lose a request: cancellation, bad input, overload, executor failure, shutdown, deadlines.

Every test runs against a real tritonserver with the synthetic executor (fault injection through the request
parameters `synthetic_fault_*`). Error responses reach clients as messages that start with the Triton error code
(Triton 2.51 passes only the message through gRPC streams and HTTP generate).
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import yaml
from conftest import start_server
from prometheus_text import scrape
from test_shared_engine import exited
from triton_client import StreamClient, stream_once, tensor, text_inputs, token_inputs, wait_until_streaming

from trtllm_model.executors.synthetic import synthetic_token

pytestmark = pytest.mark.e2e

STEP_MS = 10
SLOTS = 4


def expected(ids, count):
    return [synthetic_token(ids, i, 32000) for i in range(count)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Synthetic executor with only SLOTS batch slots: a request that is not cancelled keeps its slot busy."""
    server = start_server(
        tmp_path_factory.mktemp("reliability"),
        parameters={"max_batch_size": str(SLOTS), "synthetic_step_ms": str(STEP_MS)},
        models=("tensorrt_llm", "ensemble", "tensorrt_llm_bls"),
    )
    yield server
    server.stop()


def first_token_delay(server, ids=(5,)) -> float:
    """Seconds until a new request's first token: long only if every batch slot is still held."""
    client = StreamClient(server.grpc_url)
    try:
        started = time.monotonic()
        result = client.send("tensorrt_llm", token_inputs(list(ids), 1), "probe")
        result.wait(30)
        assert result.errors == [] and result.tokens() == expected(list(ids), 1)
        return time.monotonic() - started
    finally:
        client.close()


def fill_slots(server, count=SLOTS, model="tensorrt_llm"):
    """Start `count` endless requests, each on its own gRPC stream, and wait for their first tokens."""
    clients, results = [], []
    for i in range(count):
        client = StreamClient(server.grpc_url)
        clients.append(client)
        inputs = token_inputs([i], 4000) if model == "tensorrt_llm" else text_inputs(f"story {i}", 4000)
        results.append(client.send(model, inputs, f"long{i}"))
    deadline = time.monotonic() + 10
    while not all(r.responses for r in results):
        assert time.monotonic() < deadline, "long requests never started"
        time.sleep(0.01)
    return clients, results


def assert_slots_free(server, within_s=0.2):
    delay = first_token_delay(server)
    assert delay < within_s + 3 * STEP_MS / 1000, f"first token after {delay:.3f} s: a batch slot leaked"


def assert_nothing_held(server, timeout_s=2.0):
    """The model's own count of requests it holds (its internal maps) returns to 0."""
    deadline = time.monotonic() + timeout_s
    while (held := scrape(server.metrics_url).value("nv_llm_open_requests", model="tensorrt_llm")) != 0:
        assert time.monotonic() < deadline, f"{held} requests still held by the model"
        time.sleep(0.1)


# -- 1. cancellation ---------------------------------------------------------------------------------------------


def test_cancelling_grpc_streams_frees_the_executor_within_200_ms(server):
    clients, _ = fill_slots(server)
    for client in clients:
        client.cancel()  # stop_stream(cancel_requests=True) does exactly this
    # Every slot is busy until the executor is told: the probe's first token shows when that happened.
    assert_slots_free(server, within_s=0.2)
    assert_nothing_held(server)


def test_cancelling_bls_streams_frees_the_executor(server):
    # The BLS relay's watch (every 0.1 s) sends tensorrt_llm a `stop` for each forwarded request it sees cancelled.
    clients, _ = fill_slots(server, model="tensorrt_llm_bls")
    for client in clients:
        client.cancel()
    assert_slots_free(server, within_s=0.5)
    assert_nothing_held(server)


def test_an_ensemble_stream_is_stopped_by_its_own_request_id(server):
    # Triton's ensemble passes a cancellation only to steps it starts later, so a client's cancellation never reaches
    # the running tensorrt_llm request (as with NVIDIA's ensemble). It passes the client's request id on, so a `stop`
    # with that id (NVIDIA's way) ends the generation.
    clients, results = fill_slots(server, model="ensemble")
    stopper = StreamClient(server.grpc_url)
    try:
        stops = [stopper.send("tensorrt_llm", [tensor("stop", True, np.bool_)], f"long{i}") for i in range(SLOTS)]
        for stop in stops:
            assert stop.wait(5).errors == []
        for result in results:
            assert result.wait(2).finals == 1 and result.errors == []
        assert_slots_free(server, within_s=0.2)
        assert_nothing_held(server)
    finally:
        stopper.close()
        for client in clients:
            client.close()


def finished_by_reason(server) -> dict[str, float]:
    found = scrape(server.metrics_url).find("nv_llm_requests_finished_total", model="tensorrt_llm")
    return {dict(key)["finish_reason"]: value for key, value in found.items()}


def test_a_cancelled_ensemble_batch_runs_on_within_the_row_gate_and_a_one_row_client_is_served_as_alone(server):
    # Triton 2.51 passes an ensemble's cancellation only to a step it starts after it (ScheduleSteps in
    # ensemble_scheduler.cc); `ensemble` has one step, started before, so tensorrt_llm never hears it: the rows run
    # to their max_tokens. What they still cost is bounded by the row gate: at most max_batched_rows_in_flight (2 of
    # the 4 slots) at once, so they end within ceil(rows / 2) x max_tokens steps, and a one-row client keeps the
    # other slots (its first token as fast as alone, within 2x).
    rows, max_tokens, share = 8, 100, SLOTS // 2
    alone = sorted(first_token_delay(server) for _ in range(5))[2]
    before = finished_by_reason(server)
    tokens_before = scrape(server.metrics_url).value("nv_llm_generation_tokens_total", model="tensorrt_llm")
    client = StreamClient(server.grpc_url)
    result = client.send("ensemble", [tensor("text_input", [[f"row {i}".encode()] for i in range(rows)], np.object_),
                                      tensor("max_tokens", [[max_tokens]] * rows, np.int32),
                                      tensor("stream", [[True]] * rows, np.bool_)], "abandoned")
    wait_until_streaming([result], 10)
    client.cancel()
    cancelled = time.monotonic()
    client.close()
    beside = sorted(first_token_delay(server) for _ in range(5))[2]
    finals = rows + 5  # the rows and the five one-token probes beside them
    bound_s = -(-rows // share) * max_tokens * STEP_MS / 1000
    peak, ended = 0.0, {}
    while sum(ended.values()) < finals:
        assert time.monotonic() - cancelled < 2 * bound_s + 3, f"rows still running past the bound: {ended}"
        found = scrape(server.metrics_url).find("nv_trt_llm_request_metrics", request_type="active", model="tensorrt_llm")
        peak = max(peak, *found.values(), 0.0)
        ended = {reason: n - before.get(reason, 0) for reason, n in finished_by_reason(server).items()}
        time.sleep(0.05)
    tokens = scrape(server.metrics_url).value("nv_llm_generation_tokens_total", model="tensorrt_llm") - tokens_before - 5
    assert beside <= 2 * alone + 0.02, f"a one-row client's first token in {beside:.3f} s beside, {alone:.3f} s alone"
    assert 0 < peak <= share, f"the engine ran {peak} rows of the cancelled batch at once (the gate's share: {share})"
    assert tokens <= rows * max_tokens
    # The documented limit (docs/reliability.md): if Triton ever passes the cancellation on, this fails; say so there.
    assert ended.get("cancelled", 0) == 0 and ended.get("length") == finals, ended
    assert_nothing_held(server)


def test_cancelling_one_stream_leaves_the_others_running(server):
    clients, results = fill_slots(server, 2)
    clients[0].cancel()
    time.sleep(0.3)
    before = len(results[1].tokens())
    time.sleep(0.2)
    assert len(results[1].tokens()) > before, "the other stream stopped receiving tokens"
    clients[1].cancel()
    assert_slots_free(server)


def test_stop_input_cancels_the_request_with_that_id_which_ends_normally_with_reason_cancelled(server):
    # As NVIDIA's model: the stopped request's last response is a normal final one (TensorRT-LLM's final response
    # after cancel_request), so NVIDIA's clients, which raise on any stream error, see it end cleanly.
    victim_client, stopper = StreamClient(server.grpc_url), StreamClient(server.grpc_url)
    try:
        victim = victim_client.send("tensorrt_llm", token_inputs([1], 4000, return_finish_reason=(True, np.bool_)),
                                    "victim-1")
        time.sleep(0.1)
        stop = stopper.send("tensorrt_llm", [tensor("stop", True, np.bool_)], "victim-1").wait(5)
        assert stop.errors == [] and stop.finals == 1
        victim.wait(1)
        assert victim.finals == 1 and victim.errors == []
        assert victim.responses[-1].as_numpy("finish_reason").reshape(-1)[0] == b"cancelled"
        assert 0 < len(victim.tokens()) < 4000
        assert victim.tokens() == expected([1], len(victim.tokens()))  # what arrived before is intact
    finally:
        victim_client.close()
        stopper.close()
    assert_slots_free(server)
    assert_nothing_held(server)


def test_with_stop_by_request_id_off_another_clients_stop_is_refused_and_the_stream_goes_on(tmp_path):
    # Triton tells the model nothing about who sends a `stop` (no connection, peer or stream): with the Kubernetes
    # deployments' stop_by_request_id=false, a stop for id "1" from another connection ends nothing (it ended the
    # stream before); the owner still ends its request by cancelling it.
    server = start_server(tmp_path, parameters={"synthetic_step_ms": str(STEP_MS), "stop_by_request_id": "false"})
    victim_client, stopper = StreamClient(server.grpc_url), StreamClient(server.grpc_url)
    try:
        victim = victim_client.send("tensorrt_llm", token_inputs([1], 4000), "1")
        wait_until_streaming([victim], 30)
        stop = stopper.send("tensorrt_llm", [tensor("stop", True, np.bool_)], "1").wait(30)
        assert stop.finals == 1 and len(stop.errors) == 1
        assert "UNSUPPORTED" in stop.errors[0] and "stop_by_request_id=false" in stop.errors[0], stop.errors
        before = len(victim.responses)
        time.sleep(0.5)
        assert not victim.done.is_set(), f"another client's stop ended the stream: {victim.errors}"
        assert len(victim.responses) > before, "the stream stopped receiving tokens"
        assert victim.tokens() == expected([1], len(victim.tokens()))
        victim_client.cancel()
        assert_nothing_held(server, timeout_s=30)  # the owner's cancel ends it
    finally:
        victim_client.close()
        stopper.close()
        server.stop()


def test_a_stop_cannot_reach_a_stream_forwarded_by_the_bls_model(server):
    # `stop` cancels by request id, and the BLS relay's forwarded ids were once `ensemble-<stub pid>-<n>`: any client
    # could stop another's stream. Try every id of that shape (the pids of the server's stubs, the first counts).
    import psutil

    pids = [p.pid for p in psutil.Process(server.process.pid).children(recursive=True)] + [server.process.pid]
    victim_client, stopper = StreamClient(server.grpc_url), StreamClient(server.grpc_url)
    try:
        victim = victim_client.send("tensorrt_llm_bls", text_inputs("mine", 4000), "victim-text")
        deadline = time.monotonic() + 10
        while not victim.responses:
            assert time.monotonic() < deadline, "the forwarded stream never started"
            time.sleep(0.01)
        guesses = [stopper.send("tensorrt_llm", [tensor("stop", True, np.bool_)], f"{prefix}{pid}-{n}")
                   for prefix in ("ensemble-", "bls-forwarded-") for pid in pids for n in range(1, 8)]
        for guess in guesses:
            guess.wait(5)
        time.sleep(0.3)
        assert not victim.done.is_set(), f"a guessed forwarded id stopped another client's stream: {victim.errors}"
        before = len(victim.responses)
        time.sleep(0.2)
        assert len(victim.responses) > before, "the forwarded stream stopped receiving tokens"
    finally:
        victim_client.cancel()
        victim_client.close()
        stopper.close()
    assert_slots_free(server)


def test_stop_for_an_id_not_in_flight_is_answered_with_one_empty_response(server):
    # As NVIDIA's model: a client stopping after a delay must not fail because its request already ended.
    # (A stop without any request id is INVALID_ARG: tests/test_nvidia_compat.py.)
    result = stream_once(server.grpc_url, "tensorrt_llm", [tensor("stop", True, np.bool_)])
    assert result.errors == [] and result.finals == 1


def test_http_client_disconnecting_from_generate_stream_frees_its_slot(server):
    connections = []
    for i in range(SLOTS):
        connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
        body = json.dumps({"input_ids": [i], "request_output_len": 4000, "streaming": True})
        connection.request("POST", "/v2/models/tensorrt_llm/generate_stream", body)
        response = connection.getresponse()
        assert response.status == 200
        assert response.readline().startswith(b"data:")
        connections.append(connection)
    for connection in connections:
        connection.sock.close()
        connection.close()
    assert_slots_free(server, within_s=0.3)
    assert_nothing_held(server)


def test_200_streams_cancelled_at_random_points_leak_nothing(server):
    rng = random.Random(7)
    clients = []
    for i in range(200):
        client = StreamClient(server.grpc_url)
        client.send("tensorrt_llm", token_inputs([i], rng.randint(1, 400)), f"c{i}")
        clients.append(client)
        if rng.random() < 0.5:
            time.sleep(rng.random() * 0.01)
        victim = clients.pop(rng.randrange(len(clients)))
        (victim.cancel if rng.random() < 0.8 else victim.close)()
    for client in clients:
        client.cancel()
    time.sleep(0.5)
    assert_slots_free(server)
    assert_nothing_held(server)
    # ...and the server still serves full requests.
    assert stream_once(server.grpc_url, "tensorrt_llm", token_inputs([3], 30)).tokens() == expected([3], 30)


# -- 2. bad input ------------------------------------------------------------------------------------------------

I32, F32, B, U64, S = np.int32, np.float32, np.bool_, np.uint64, np.object_


def ids_and_len(ids=(1, 2), length=4):
    return [tensor("input_ids", [list(ids)], I32), tensor("request_output_len", length, I32)]


BAD_REQUESTS = [
    # (name, model, inputs, parameters, words the message must contain)
    ("no prompt", "tensorrt_llm", [tensor("request_output_len", 4, I32)], None, ["input_ids or text_input"]),
    ("no length", "tensorrt_llm", [tensor("input_ids", [[1]], I32)], None, ["request_output_len"]),
    ("empty prompt", "tensorrt_llm", [tensor("input_ids", np.zeros((1, 0), I32), I32), tensor("request_output_len", 4, I32)], None, ["input_ids"]),
    ("prompt over limit", "tensorrt_llm", ids_and_len(range(1, 5000)), None, ["max_input_len"]),
    ("zero tokens", "tensorrt_llm", ids_and_len(length=0), None, ["request_output_len"]),
    ("negative tokens", "tensorrt_llm", ids_and_len(length=-3), None, ["request_output_len"]),
    ("tokens over cap", "tensorrt_llm", ids_and_len(length=5000), None, ["request_output_len", "4096"]),
    ("token id over vocab", "tensorrt_llm", ids_and_len([1, 40000]), None, ["input_ids", "40000"]),
    ("negative token id", "tensorrt_llm", ids_and_len([-1]), None, ["input_ids", "-1"]),
    ("negative temperature", "tensorrt_llm", ids_and_len() + [tensor("temperature", -1.0, F32)], None, ["temperature"]),
    ("NaN temperature", "tensorrt_llm", ids_and_len() + [tensor("temperature", np.nan, F32)], None, ["temperature"]),
    ("draft tokens", "tensorrt_llm", ids_and_len() + [tensor("draft_input_ids", [[1, 2]], I32)], None, ["draft_input_ids"]),
    ("top_p over one", "tensorrt_llm", ids_and_len() + [tensor("runtime_top_p", 1.5, F32)], None, ["runtime_top_p"]),
    ("negative top_k", "tensorrt_llm", ids_and_len() + [tensor("runtime_top_k", -2, I32)], None, ["runtime_top_k"]),
    ("infinite penalty", "tensorrt_llm", ids_and_len() + [tensor("presence_penalty", np.inf, F32)], None, ["presence_penalty"]),
    ("zero repetition penalty", "tensorrt_llm", ids_and_len() + [tensor("repetition_penalty", 0.0, F32)], None, ["repetition_penalty"]),
    ("negative min_tokens", "tensorrt_llm", ids_and_len() + [tensor("min_tokens", -1, I32)], None, ["min_tokens"]),
    ("negative end_id", "tensorrt_llm", ids_and_len() + [tensor("end_id", -5, I32)], None, ["end_id"]),
    ("negative beam width", "tensorrt_llm", ids_and_len() + [tensor("beam_width", -1, I32)], None, ["beam_width"]),
    ("negative sequences", "tensorrt_llm", ids_and_len() + [tensor("num_return_sequences", -2, I32)], None, ["num_return_sequences"]),
    ("input_lengths zero", "tensorrt_llm", ids_and_len() + [tensor("input_lengths", 0, I32)], None, ["input_lengths"]),
    ("bias words without weights", "ensemble", text_inputs("hi", 4) + [tensor("embedding_bias_words", [[b"a"]], S)], None, ["embedding_bias_words", "weights"]),
    ("stop words offsets", "tensorrt_llm", ids_and_len() + [tensor("stop_words_list", [[[1, 2], [5, -1]]], I32)], None, ["stop_words_list"]),
    ("bad words shape", "tensorrt_llm", ids_and_len() + [tensor("bad_words_list", [[[1, 2, 3]]], I32)], None, ["bad_words_list"]),
    ("text and tokens", "tensorrt_llm", ids_and_len() + [tensor("text_input", [[b"hi"]], S)], None, ["text_input", "input_ids"]),
    ("unknown parameter", "tensorrt_llm", ids_and_len(), {"tempreture": 0.5}, ["tempreture"]),
    ("batch sizes differ", "tensorrt_llm", [tensor("input_ids", [[1, 2], [3, 4]], I32), tensor("request_output_len", [[4]], I32)], None, ["input_ids", "batch size"]),  # Triton refuses it itself
    ("two lengths", "tensorrt_llm", [tensor("input_ids", [[1]], I32), tensor("request_output_len", [[4, 5]], I32)], None, ["request_output_len"]),
    ("wrong dtype", "tensorrt_llm", [tensor("input_ids", [[1.0]], F32), tensor("request_output_len", 4, I32)], None, ["input_ids"]),
    ("bool as int", "tensorrt_llm", ids_and_len() + [tensor("streaming", 1, I32)], None, ["streaming"]),
    ("invalid UTF-8", "ensemble", [tensor("text_input", [[b"\xff\xfe"]], S), tensor("max_tokens", 4, I32)], None, ["text_input", "UTF-8"]),
    ("empty text", "ensemble", [tensor("text_input", [[b""]], S), tensor("max_tokens", 4, I32)], None, ["text_input", "empty"]),
    ("text zero tokens", "ensemble", text_inputs("hi", 0), None, ["max_tokens"]),
    ("unknown input", "tensorrt_llm", ids_and_len() + [tensor("temprature", 1.0, F32)], None, ["temprature"]),
]


def test_at_least_30_bad_requests_are_refused_naming_the_field_and_the_server_keeps_serving(server):
    assert len(BAD_REQUESTS) >= 30
    client = StreamClient(server.grpc_url)
    try:
        results = {
            name: client.send(model, inputs, f"bad-{i}", parameters)
            for i, (name, model, inputs, parameters, _) in enumerate(BAD_REQUESTS)
        }
        for name, _, _, _, words in BAD_REQUESTS:
            result = results[name].wait(10)
            assert result.errors and result.responses == [], f"{name}: not refused"
            message = result.errors[0]
            for word in words:
                assert word in message, f"{name}: {message!r} does not name {word!r}"
            if message.split(":")[0].isupper():  # ours; the rest are Triton's own (INVALID_ARG) refusals
                assert message.split(":")[0] in ("INVALID_ARG", "UNSUPPORTED"), f"{name}: {message}"
    finally:
        client.close()
    assert urllib.request.urlopen(f"{server.http_url}/v2/models/tensorrt_llm/ready").status == 200
    assert stream_once(server.grpc_url, "tensorrt_llm", token_inputs([9], 5)).tokens() == expected([9], 5)


def test_unsupported_beam_width_is_unsupported(server):
    result = stream_once(server.grpc_url, "tensorrt_llm", token_inputs([1], 4, beam_width=(4, I32)))
    assert result.errors[0].startswith("UNSUPPORTED") and "beam_width" in result.errors[0]


# -- 7. deadline -------------------------------------------------------------------------------------------------


def test_allotted_time_ends_the_request_with_its_tokens_and_reason_timeout(server):
    inputs = token_inputs([2], 4000, allotted_time_ms=(200, I32), return_finish_reason=(True, B))
    started = time.monotonic()
    result = stream_once(server.grpc_url, "tensorrt_llm", inputs)
    assert time.monotonic() - started < 1.0
    assert result.errors == [] and result.finals == 1
    assert 5 <= len(result.tokens()) <= 40 and result.tokens() == expected([2], len(result.tokens()))
    reasons = [r.as_numpy("finish_reason") for r in result.responses if r.as_numpy("finish_reason") is not None]
    assert reasons and reasons[-1].reshape(-1)[0] == b"timeout"


# -- 3. overload -------------------------------------------------------------------------------------------------


def test_past_the_queue_bound_requests_get_unavailable_at_once_and_accepted_ones_complete(tmp_path):
    server = start_server(
        tmp_path,
        parameters={"max_batch_size": "2", "synthetic_step_ms": "20", "max_queue_size": "4"},
    )
    try:
        client = StreamClient(server.grpc_url)
        started = time.monotonic()
        results = [client.send("tensorrt_llm", token_inputs([i], 20), f"o{i}") for i in range(12)]
        refused, accepted = [], []
        for i, result in enumerate(results):
            result.wait(30)
            (refused if result.errors else accepted).append((i, result))
        assert len(accepted) == 6 and len(refused) == 6
        for _, result in refused:
            assert result.errors[0].startswith("UNAVAILABLE") and "Exceeds maximum queue size" in result.errors[0]
        for i, result in accepted:
            assert result.tokens() == expected([i], 20) and result.finals == 1
        assert time.monotonic() - started < 5
        client.close()
    finally:
        server.stop()


# -- 4. executor failure -----------------------------------------------------------------------------------------


def test_executor_crash_ends_every_stream_within_1_s_and_the_model_reports_not_ready(tmp_path):
    server = start_server(tmp_path)
    try:
        client = StreamClient(server.grpc_url)
        victims = [client.send("tensorrt_llm", token_inputs([i], 4000), f"v{i}") for i in range(10)]
        time.sleep(0.2)
        crash = client.send("tensorrt_llm", token_inputs([1], 4000), "crash", {"synthetic_fault_crash_at": 3})
        crash.wait(2)
        crashed_at = time.monotonic()
        for result in victims + [crash]:
            assert result.done.wait(max(0.0, crashed_at + 1.0 - time.monotonic())), "a stream was left hanging"
            assert result.finals == 1 and result.errors[0].startswith("UNAVAILABLE: executor failed")
        # New work is refused while Triton unloads the model, then Triton itself refuses the unknown model.
        late = stream_once(server.grpc_url, "tensorrt_llm", token_inputs([1], 3))
        assert late.errors and ("UNAVAILABLE" in late.errors[0] or "no available versions" in late.errors[0])
        grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
        deadline = time.monotonic() + 10
        while grpc_client.is_model_ready("tensorrt_llm"):
            assert time.monotonic() < deadline, "model still reports ready with a dead executor"
            time.sleep(0.1)
        # The operator's way back: load it again.
        grpc_client.load_model("tensorrt_llm", headers=server.admin_headers)
        assert stream_once(server.grpc_url, "tensorrt_llm", token_inputs([4], 3)).tokens() == expected([4], 3)
        client.close()
    finally:
        server.stop()


def test_a_killed_stub_ends_its_streams_and_the_model_reports_not_ready(tmp_path):
    """Triton 2.51 neither restarts a decoupled model's stub nor answers the requests the stub held, and such a model
    never unloads: `serve` sees the stub die, unloads what can unload, and ends the server (exit 1, naming the
    instance). The held streams end, their gRPC call with UNAVAILABLE, instead of hanging; nothing is left running."""
    server = start_server(tmp_path, new_session=True)
    try:
        (tritonserver,) = psutil.Process(server.process.pid).children()
        processes = [tritonserver, *tritonserver.children(recursive=True)]
        (stub,) = [p for p in processes if "tensorrt_llm_0_0" in p.cmdline()]
        client = StreamClient(server.grpc_url)
        streams = [client.send("tensorrt_llm", token_inputs([i], 4000), f"s{i}") for i in range(3)]
        wait_until_streaming(streams, 30)
        stub.kill()
        assert client.call_ended.wait(30), "the killed stub's streams never ended"
        assert client.call_code == grpc.StatusCode.UNAVAILABLE, client.call_code
        assert not kubelet_http_probe(server, {"httpGet": {"path": "/v2/models/tensorrt_llm/ready"}})
        assert server.process.wait(30) == 1
        assert f"(pid {stub.pid}) ended while serving" in server.log(), server.log()[-3000:]
        assert [p.pid for p in processes if not exited(p.pid, 10)] == [], "a process outlived the server"
    finally:
        server.stop()


CPU_DEPLOYMENT = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes" / "cpu" / "deployment.yaml"


def kubelet_http_probe(server, probe: dict) -> bool:
    """What the kubelet makes of an httpGet probe on the server's http port: success is a status from 200 to 399."""
    try:
        url = f"{server.http_url}{probe['httpGet']['path']}"
        with urllib.request.urlopen(url, timeout=probe.get("timeoutSeconds", 1)) as response:
            return 200 <= response.status < 400
    except urllib.error.HTTPError as error:
        return 200 <= error.code < 400
    except OSError:
        return False


def test_an_engine_fault_fails_the_manifests_liveness_probe_until_a_restart(tmp_path):
    """The engine stops on its own fault: the model unloads itself, and the readiness and liveness probes of the
    Kubernetes manifests fail from then on, so the kubelet takes the pod out of the Service and restarts the
    container. Before, liveness probed /v2/health/live, which stays 200 (and readiness /v2/health/ready, which is 200
    again once no model is left loaded): the pod lived on without its model."""
    (container,) = yaml.safe_load(CPU_DEPLOYMENT.read_text())["spec"]["template"]["spec"]["containers"][:1]
    liveness, readiness = container["livenessProbe"], container["readinessProbe"]
    server = start_server(tmp_path)
    try:
        assert kubelet_http_probe(server, liveness) and kubelet_http_probe(server, readiness)
        crash = stream_once(server.grpc_url, "tensorrt_llm", token_inputs([1], 4000),
                            parameters={"synthetic_fault_crash_at": 3})
        assert crash.errors and crash.errors[0].startswith("UNAVAILABLE: executor failed")
        deadline = time.monotonic() + 10
        while kubelet_http_probe(server, liveness):
            assert time.monotonic() < deadline, f"{liveness['httpGet']['path']} still passes with a dead executor"
            time.sleep(0.1)
        # It keeps failing for as long as the kubelet counts (shortened here: 3 checks, a second apart).
        for _ in range(3):
            time.sleep(1.0)
            assert not kubelet_http_probe(server, liveness) and not kubelet_http_probe(server, readiness)
    finally:
        server.stop()
    restarted = start_server(tmp_path / "restarted")
    try:
        assert kubelet_http_probe(restarted, liveness)
        assert stream_once(restarted.grpc_url, "tensorrt_llm", token_inputs([4], 3)).tokens() == expected([4], 3)
    finally:
        restarted.stop()


def test_an_error_step_ends_only_its_own_request(server):
    client = StreamClient(server.grpc_url)
    try:
        ok = client.send("tensorrt_llm", token_inputs([6], 40), "fine")
        bad = client.send("tensorrt_llm", token_inputs([7], 40), "broken", {"synthetic_fault_error_at": 5})
        assert bad.wait(5).errors[0].startswith("INTERNAL") and bad.tokens() == expected([7], 5)
        assert ok.wait(5).tokens() == expected([6], 40)
    finally:
        client.close()


# -- 6. shutdown -------------------------------------------------------------------------------------------------


def _open_streams(server, count):
    client = StreamClient(server.grpc_url)
    results = [client.send("tensorrt_llm", token_inputs([i], 4000), f"s{i}") for i in range(count)]
    deadline = time.monotonic() + 10
    while not all(r.responses for r in results):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return client, results


def test_unloading_the_model_ends_50_streams_with_unavailable(tmp_path):
    server = start_server(tmp_path, parameters={"max_batch_size": "64"})
    try:
        client, results = _open_streams(server, 50)
        grpcclient.InferenceServerClient(server.grpc_url).unload_model("tensorrt_llm", headers=server.admin_headers)
        for result in results:
            assert result.done.wait(10)
            assert result.finals == 1 and result.errors == ["UNAVAILABLE: model is shutting down"]
        client.close()
    finally:
        server.stop()


def test_stopping_the_server_ends_50_streams_before_it_exits(tmp_path):
    server = start_server(tmp_path, parameters={"max_batch_size": "64"})
    client, results = _open_streams(server, 50)
    stopped = threading.Event()
    threading.Thread(target=lambda: (server.stop(), stopped.set()), daemon=True).start()
    for result in results:
        assert result.done.wait(20)
        assert result.finals == 1 and result.errors == ["UNAVAILABLE: model is shutting down"]
    assert not stopped.is_set()
    # A client holding its gRPC stream open keeps Triton from unloading; done with its requests, it closes it.
    client.close()
    assert stopped.wait(30) and server.process.returncode == 0
