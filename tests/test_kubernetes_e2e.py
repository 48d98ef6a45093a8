"""The manifests against real servers: every probe, port and metric name they use is one a server really has.

  cpu replica  the CPU Deployment's own command line (`trtllm-triton serve` + its args, ports moved to free ones):
               the embedded transformers engine, exactly as the pod runs it;
  gpu replica  `trtllm-triton serve` with the GPU Deployment's executor, trtllm_engine, over the fake tensorrt_llm
               (tests/fakes): the real tritonserver and model, the engine's stats shaped as TensorRT-LLM's.
Probes must answer as the kubelet expects (HTTP status 200-399); each Service port must speak its protocol; the
metric names in the recording rule (what the HPA scales on) and in docs/grafana/trtllm-triton.json must appear in
real scrapes; deploy/drain.py (the preStop hook) must wait for open streams and no longer than its timeout.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import yaml
from conftest import start_server
from prometheus_text import Scrape, scrape
from test_kubernetes_manifests import EXIT_TIMEOUT_S, ROOT, of_kind, pod_templates, recording_rules, the
from triton_client import StreamClient, token_inputs
from trtllm_support import fake_engine_repository

from trtllm_model.server import free_ports, is_ready

pytestmark = pytest.mark.e2e

DASHBOARD = ROOT / "docs" / "grafana" / "trtllm-triton.json"


@dataclass
class Replica:
    ports: dict[str, int]  # port name in the manifests (http, grpc, metrics, openai) -> port on this machine
    process: subprocess.Popen
    log_path: Path
    admin_headers: dict[str, str] | None = None  # for the model-repository API (None: the server's own key)

    def url(self, name: str, path: str = "") -> str:
        return f"http://127.0.0.1:{self.ports[name]}{path}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def serve_has(flag: str) -> bool:
    done = subprocess.run([sys.executable, "-m", "trtllm_model.launch.cli", "serve", "--help"], capture_output=True, text=True)
    return flag in done.stdout


def cpu_command_line(ports: dict[int, int]) -> tuple[list[str], dict[str, int]]:
    """The CPU Deployment's command and args with each container port moved to a free one (and the port names)."""
    container = the("Deployment", "cpu")["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["trtllm-triton", "serve"]
    names = {p["containerPort"]: p["name"] for p in container["ports"]}
    args, mapped = [], {}
    for arg in container["args"]:
        match = re.fullmatch(r"(--[a-z]+-port)=(\d+)", arg)
        if match and int(match.group(2)) in names:
            port = int(match.group(2))
            if match.group(1) == "--openai-port" and not serve_has("--openai-port"):
                continue  # the OpenAI frontend (issue 12) is not in this tree yet: its port is checked once it is
            mapped[names[port]] = ports[port]
            arg = f"{match.group(1)}={ports[port]}"
        args.append(arg)
    return [sys.executable, "-m", "trtllm_model.launch.cli", "serve", *args], mapped


@pytest.fixture(scope="module")
def cpu_replica(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("k8s-cpu")
    container_ports = [8000, 8001, 8002, 9000]
    command, mapped = cpu_command_line(dict(zip(container_ports, free_ports(len(container_ports)))))
    log_path = workdir / "server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    replica = Replica(mapped, process, log_path)
    deadline = time.monotonic() + 300
    while not is_ready("127.0.0.1", mapped["http"]):
        if process.poll() is not None or time.monotonic() > deadline:
            replica.stop()
            pytest.fail(f"the CPU Deployment's command did not become ready:\n{log_path.read_text()[-4000:]}")
        time.sleep(0.5)
    yield replica
    replica.stop()


@pytest.fixture(scope="module")
def gpu_replica(tmp_path_factory):
    """trtllm_engine (the GPU Deployment's TRTLLM_EXECUTOR) over the fake tensorrt_llm, 5 ms per step."""
    workdir = tmp_path_factory.mktemp("k8s-gpu")
    repository = fake_engine_repository(workdir)
    server = start_server(workdir, executor="trtllm_engine", env={"FAKE_TRTLLM_STEP_MS": "5"}, repository=repository)
    yield Replica({"http": server.http_port, "grpc": server.grpc_port, "metrics": server.metrics_port},
                  server.process, server.log_path, server.admin_headers)
    server.stop()


def replica_for(directory: str, request) -> Replica:
    return request.getfixturevalue("cpu_replica" if directory == "cpu" else "gpu_replica")


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def probes(directory: str) -> list[tuple[str, str, str, dict]]:
    """(container, probe kind, port name, httpGet) for every probe of the directory's workload."""
    workloads = of_kind("Deployment", directory) + of_kind("LeaderWorkerSet", directory)
    found = []
    for template in pod_templates(workloads[0]):
        for container in template["spec"]["containers"]:
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                if kind in container:
                    get = container[kind]["httpGet"]
                    found.append((container["name"], kind, get["port"], get))
    return found


@pytest.mark.parametrize("directory", ["cpu", "gpu", "gpu-multi", "multinode"])
def test_every_probe_answers_as_the_kubelet_expects(directory, request):
    replica = replica_for(directory, request)
    checked = 0
    for container, kind, port, get in probes(directory):
        if port == "openai" and port not in replica.ports:
            continue  # the OpenAI frontend: test_openai_port_answers_its_probe
        assert get.get("scheme", "HTTP") == "HTTP"
        code = status(replica.url(port, get["path"]))
        assert 200 <= code < 400, f"{directory}/{container} {kind} {get['path']} on {port}: HTTP {code}"
        checked += 1
    assert checked >= 3
    kinds = {kind: get["path"] for _, kind, port, get in probes(directory) if port == "http"}
    assert kinds["readinessProbe"] == kinds["livenessProbe"] == "/v2/models/tensorrt_llm/ready"


def test_readiness_probe_fails_once_the_model_is_unloaded(gpu_replica):
    """A probe that can fail: with the model unloaded (what a stop does first) ready answers 400, live still 200."""
    base = gpu_replica.url("http", "/v2/repository/models/tensorrt_llm")
    headers = gpu_replica.admin_headers
    urllib.request.urlopen(urllib.request.Request(f"{base}/unload", b"{}", headers, method="POST"), timeout=30).close()
    try:
        assert status(gpu_replica.url("http", "/v2/health/ready")) == 400
        assert status(gpu_replica.url("http", "/v2/health/live")) == 200
    finally:
        urllib.request.urlopen(urllib.request.Request(f"{base}/load", b"{}", headers, method="POST"), timeout=60).close()
    assert status(gpu_replica.url("http", "/v2/health/ready")) == 200


@pytest.mark.parametrize("directory", ["cpu", "gpu"])
def test_every_service_port_speaks_its_protocol(directory, request):
    replica = replica_for(directory, request)
    names = {p["name"] for s in of_kind("Service", directory) for p in s["spec"]["ports"]}
    assert status(replica.url("http", "/v2/health/ready")) == 200
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{replica.ports['grpc']}")
    try:
        assert client.is_server_ready() and client.is_model_ready("tensorrt_llm")
    finally:
        client.close()
    with urllib.request.urlopen(replica.url("metrics", "/metrics"), timeout=5) as response:
        assert b"nv_inference_request_success" in response.read()
    assert names - {"http", "grpc", "metrics"} == {"openai"}


def test_openai_port_answers_its_probe(cpu_replica):
    # The frontend starts once tritonserver is ready (it loads the tokenizer first): its probe waits as the
    # Deployment's startupProbe does.
    deadline = time.monotonic() + 120
    while True:
        try:
            code = status(cpu_replica.url("openai", "/health"))
        except urllib.error.URLError:
            code = None
        if code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert code == 200
    with urllib.request.urlopen(cpu_replica.url("openai", "/v1/models"), timeout=5) as response:
        assert json.loads(response.read())["data"]


# -- metric names: recording rule (the HPA's signal) and dashboard ---------------------------------------------------
def traffic_then_scrape(replica: Replica) -> Scrape:
    """A few requests (so every per-request and per-iteration series exists), then one scrape."""
    client = StreamClient(f"127.0.0.1:{replica.ports['grpc']}")
    try:
        results = [client.send("tensorrt_llm", token_inputs([i + 1, 2], 4), f"k8s-{i}") for i in range(3)]
        for result in results:
            assert result.wait(120).errors == []
    finally:
        client.close()
    deadline = time.monotonic() + 10
    while True:  # the metrics thread flushes every stats_check_period_ms
        current = scrape(replica.url("metrics", "/metrics"))
        if current.find("nv_llm_requests_finished_total") and sum(current.find("nv_llm_requests_finished_total").values()) >= 3:
            return current
        assert time.monotonic() < deadline, "finished requests never reached /metrics"
        time.sleep(0.1)


def metric_names(promql: str) -> set[str]:
    """Metric names a PromQL expression selects (identifiers followed by a selector, not functions or labels)."""
    return {name for name in re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{", promql)} - {"by", "without", "on", "ignoring"}


def scraped_names(s: Scrape) -> set[str]:
    return {name for name, _ in s.samples}


@pytest.fixture(scope="module")
def scrapes(cpu_replica, gpu_replica) -> dict[str, Scrape]:
    return {"cpu": traffic_then_scrape(cpu_replica), "gpu": traffic_then_scrape(gpu_replica)}


def test_recording_rule_metrics_are_in_both_variants_scrapes(scrapes):
    exprs = "\n".join(recording_rules().values())
    assert metric_names(exprs) == {"nv_trt_llm_kv_cache_block_metrics", "nv_trt_llm_request_metrics", "nv_llm_queued_requests"}
    selectors = set(re.findall(r'(nv_[a-z_]+)\{model="tensorrt_llm"(?:, ([a-z_]+)="([a-z_]+)")?\}', exprs))
    assert len(selectors) == 4
    for variant, current in scrapes.items():
        for name, label, value in selectors:  # each selector finds a series, under the model the rule names
            assert current.find(name, model="tensorrt_llm", **({label: value} if label else {})), (variant, name, value)


def test_dashboard_metrics_are_in_real_scrapes(scrapes):
    dashboard = json.loads(DASHBOARD.read_text())
    names = set().union(*(metric_names(t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])))
    assert len(names) >= 15
    assert names <= scraped_names(scrapes["gpu"]), names - scraped_names(scrapes["gpu"])
    # The embedded engine on CPU reports every family too (its memory as memory_type="cpu").
    assert names <= scraped_names(scrapes["cpu"]), names - scraped_names(scrapes["cpu"])


# -- the preStop hook ------------------------------------------------------------------------------------------------
DRAIN = ROOT / "deploy" / "drain.py"


def run_drain(replica: Replica, *args: str) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(DRAIN), f"--metrics-url={replica.url('metrics', '/metrics')}", *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return time.monotonic() - started, done.stdout


def test_drain_waits_until_open_streams_end(gpu_replica):
    client = StreamClient(f"127.0.0.1:{gpu_replica.ports['grpc']}")
    try:
        # 600 tokens at 5 ms per step: about 3 s. The drain must outlast it and return once it ended.
        result = client.send("tensorrt_llm", token_inputs([3, 4], 600), "long")
        time.sleep(0.5)
        took, output = run_drain(gpu_replica, "--min-wait=0", "--timeout=60")
        assert result.done.is_set() and result.finals == 1 and len(result.tokens()) == 600
        assert "0 open request(s) left" in output and 1.0 < took < 30, (took, output)
    finally:
        client.close()


def test_drain_gives_up_at_its_timeout(gpu_replica):
    client = StreamClient(f"127.0.0.1:{gpu_replica.ports['grpc']}")
    try:
        result = client.send("tensorrt_llm", token_inputs([5, 6], 1200), "longer")  # about 6 s
        time.sleep(0.5)
        took, output = run_drain(gpu_replica, "--min-wait=0.2", "--timeout=1.5")
        assert "1 open request(s) left" in output and 1.4 < took < 4, (took, output)
        assert not result.done.is_set()
        assert result.wait(60).finals == 1
    finally:
        client.close()


# -- the recording rule evaluated by Prometheus' own engine on a real scrape ----------------------------------------
KV_PARAMETERS = {"max_tokens_in_paged_kv_cache": "256", "synthetic_tokens_per_block": "16", "synthetic_step_ms": "20"}


def promtool() -> str:
    found = shutil.which("promtool") or shutil.which("promtool", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("promtool not installed (the Makefile takes it from Debian's prometheus package)")
    return found


def series_lines(s: Scrape, pod: str) -> list[dict]:
    """promtool input series for the rule's metric families in scrape `s`, as pod `pod` of namespace `ns`."""
    wanted = {"nv_trt_llm_kv_cache_block_metrics", "nv_trt_llm_request_metrics", "nv_llm_queued_requests"}
    lines = []
    for (name, labels), value in s.samples.items():
        if name in wanted:
            selector = ",".join(f'{k}="{v}"' for k, v in sorted({**dict(labels), "namespace": "ns", "pod": pod}.items()))
            lines.append({"series": f"{name}{{{selector}}}", "values": f"{value!r}x4"})
    return lines


def test_recording_rules_give_the_benchmarks_values_on_real_scrapes(tmp_path):
    """Prometheus' engine (promtool) evaluates the PrometheusRule on a real synthetic-KV-cache scrape with requests
    queued, and on an idle one, per pod: the numbers bench/scaling.py's kv_cache_demand and batch_demand compute."""
    tool = promtool()
    sys.path.insert(0, str(ROOT / "bench"))
    from scaling import batch_demand, kv_cache_demand

    # 16 blocks of 16 tokens; each request needs 7 blocks at full length (2 + 100 tokens): 2 run, 3 wait.
    server = start_server(tmp_path / "kv", executor="synthetic", parameters=KV_PARAMETERS, models=("tensorrt_llm",))
    client = StreamClient(server.grpc_url)
    try:
        results = [client.send("tensorrt_llm", token_inputs([i + 1, 2], 100), f"kv-{i}") for i in range(5)]
        deadline = time.monotonic() + 30
        while True:
            busy = scrape(server.metrics_url)
            if busy.find("nv_llm_queued_requests") and busy.value("nv_llm_queued_requests", model="tensorrt_llm") == 3:
                break
            assert time.monotonic() < deadline, "the queue never formed"
            time.sleep(0.05)
        for result in results:
            assert result.wait(60).errors == []
        idle = wait_for_idle(server.metrics_url)
    finally:
        client.close()
        server.stop()
    assert busy.value("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="max", model="tensorrt_llm") == 16
    computed = {"trtllm:kv_cache_demand:ratio": kv_cache_demand, "trtllm:batch_demand:ratio": batch_demand}
    assert set(computed) == set(recording_rules())
    expected = {record: {"busy": f(busy), "idle": f(idle)} for record, f in computed.items()}
    for values in expected.values():  # 2 running, 3 waiting: 3 / 2 on top of the utilisation; then nothing
        assert values["busy"] > 1.5 and values["idle"] == 0

    rule = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "autoscaling" / "prometheus-rule.yaml").read_text())
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]))
    unit_test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "5s",
        "tests": [{
            "interval": "5s",
            "input_series": series_lines(busy, "busy") + series_lines(idle, "idle"),
            "promql_expr_test": [{
                "expr": record, "eval_time": "10s",
                "exp_samples": [{"labels": f'{record}{{namespace="ns",pod="{pod}"}}', "value": value}
                                for pod, value in values.items()],
            } for record, values in expected.items()],
        }],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(unit_test))
    checked = subprocess.run([tool, "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run([tool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def wait_for_idle(metrics_url: str) -> Scrape:
    deadline = time.monotonic() + 10
    while True:
        current = scrape(metrics_url)
        # Each gauge is its own call into Triton, so a scrape may fall between two of one iteration's gauges: idle
        # is no request active and no KV block held.
        kv_used = (current.value("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="used", model="tensorrt_llm")
                   if current.find("nv_trt_llm_kv_cache_block_metrics") else 0)
        if current.value("nv_trt_llm_request_metrics", request_type="active", model="tensorrt_llm") == 0 and not kv_used:
            return current
        assert time.monotonic() < deadline, "the executor never went idle"
        time.sleep(0.05)


def here(arg: str, overrides: dict[str, str]) -> str:
    """One word of a container's command, run on this machine: this Python, this checkout, other option values."""
    option = arg.split("=", 1)[0]
    if option in overrides:
        return f"{option}={overrides[option]}"
    return sys.executable if arg == "python3" else arg.replace("/opt/trtllm_triton", str(ROOT))


def test_a_pod_stops_as_kubernetes_stops_it(tmp_path):
    """The kubelet's sequence on a server: the CPU Deployment's preStop command (its timeout shortened), then SIGTERM
    to `trtllm-triton serve`. A stream that ends during the drain is whole; one still open after it gets exactly one
    final response; the server exits well inside terminationGracePeriodSeconds."""
    container = the("Deployment", "cpu")["spec"]["template"]["spec"]["containers"][0]
    grace = the("Deployment", "cpu")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    server = start_server(tmp_path, executor="synthetic")  # 10 ms per step
    client = StreamClient(server.grpc_url)
    try:
        short = client.send("tensorrt_llm", token_inputs([7, 8], 100), "short")  # about 1 s: ends during the drain
        long = client.send("tensorrt_llm", token_inputs([9, 10], 3000), "long")  # about 30 s: still open after it
        time.sleep(0.3)
        overrides = {"--metrics-url": server.metrics_url, "--min-wait": "0.5", "--timeout": "3"}
        pre_stop = [here(arg, overrides) for arg in container["lifecycle"]["preStop"]["exec"]["command"]]
        done = subprocess.run(pre_stop, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "1 open request(s) left" in done.stdout, done.stdout + done.stderr
        assert short.done.is_set() and len(short.tokens()) == 100 and short.errors == []
        stopped = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert long.wait(EXIT_TIMEOUT_S).finals == 1 and len(long.tokens()) < 3000
        client.close()  # done with its requests (an open stream holds its model until the exit timeout: reliability.md)
        # Within tritonserver's exit timeout: far inside the grace period, which must also hold the drain.
        assert server.process.wait(EXIT_TIMEOUT_S + 30) == 0
        assert time.monotonic() - stopped < EXIT_TIMEOUT_S < grace
        assert "Exit timeout expired" not in server.log() and "Non-graceful termination" not in server.log()
    finally:
        client.close()
        server.stop()
