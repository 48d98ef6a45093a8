"""deploy/kubernetes/: every manifest validates against a pinned Kubernetes schema, and the pieces refer to each other.

kubernetes-validate (pinned in pyproject.toml) carries the OpenAPI schemas of Kubernetes' own kinds; strict mode also
rejects unknown fields. Custom resources have no schema there:
  - LeaderWorkerSet (leaderworkerset.x-k8s.io/v1): its leader and worker pod templates are validated as core
    PodTemplates; the LWS fields around them (size, restartPolicy, startupPolicy) are checked here by name only;
  - PodMonitor and PrometheusRule (monitoring.coreos.com/v1): validated against the operator's CRD schemas as
    @kubernetes-models/prometheus-operator packages them (Node; the Makefile installs it into .venv/node; these
    schemas check types, patterns and required fields, not unknown ones), and checked here for what they point at
    (port names, labels, metric names: tests/test_kubernetes_e2e.py scrapes a real server);
  - kustomization.yaml and the prometheus-adapter Helm values are not Kubernetes objects: checked here.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from test_launch_trtllm import SCRIPT as LAUNCH_SCRIPT
from test_launch_trtllm import launch, make_stand_ins

from trtllm_model.launch import cli
from trtllm_model.server import (
    ADMIN_HEADER,
    ADMIN_KEY_ENV,
    EXIT_TIMEOUT_S,
    RESTRICTED_PROTOCOLS,
    ServerOptions,
    server_command,
)

ROOT = Path(__file__).resolve().parent.parent
KUBERNETES_DIR = ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.34.0"  # the schema the manifests must satisfy (kubernetes-validate ships 1.25 to 1.37)
NOT_OBJECTS = {"kustomization.yaml", "prometheus-adapter-values.yaml"}
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"),
}
VARIANTS = ("cpu", "gpu")
# What each variant's HPA scales on (docs/kubernetes.md, "The scaling signal").
HPA_METRICS = {"cpu": "trtllm_batch_demand", "gpu": "trtllm_kv_cache_demand"}


def manifest_files() -> list[Path]:
    return sorted(p for p in KUBERNETES_DIR.rglob("*.yaml") if p.name not in NOT_OBJECTS)


def objects(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def all_objects() -> list[tuple[Path, dict]]:
    return [(path, obj) for path in manifest_files() for obj in objects(path)]


def of_kind(kind: str, directory: str | None = None) -> list[dict]:
    return [obj for path, obj in all_objects() if obj["kind"] == kind and (directory is None or path.parent.name == directory)]


def the(kind: str, directory: str) -> dict:
    found = of_kind(kind, directory)
    assert len(found) == 1, f"{directory}: {len(found)} {kind}"
    return found[0]


def validate(obj: dict) -> None:
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def pod_templates(obj: dict) -> list[dict]:
    """The pod templates inside a workload (Deployment; LeaderWorkerSet's leader and worker)."""
    if obj["kind"] == "Deployment":
        return [obj["spec"]["template"]]
    if obj["kind"] == "LeaderWorkerSet":
        lws = obj["spec"]["leaderWorkerTemplate"]
        return [lws["leaderTemplate"], lws["workerTemplate"]]
    return []


# -- schemas ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(KUBERNETES_DIR)))
def test_every_manifest_validates_or_is_a_known_custom_resource(path):
    for obj in objects(path):
        if (obj["apiVersion"], obj["kind"]) in CUSTOM_KINDS:
            with pytest.raises(kubernetes_validate.SchemaNotFoundError):  # no schema: checked below instead
                validate(obj)
        else:
            validate(obj)
        for template in pod_templates(obj):  # a LeaderWorkerSet's pod templates too
            validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template})


def validate_operator_objects(objects: list[dict]) -> subprocess.CompletedProcess:
    node, models = shutil.which("node"), ROOT / ".venv" / "node"
    if node is None or not (models / "node_modules" / "@kubernetes-models" / "prometheus-operator").is_dir():
        pytest.skip("node or @kubernetes-models/prometheus-operator missing (the Makefile installs it into .venv/node)")
    return subprocess.run([node, str(ROOT / "tests" / "kubernetes_crds.mjs"), str(models)], input=json.dumps(objects),
                          capture_output=True, text=True, timeout=120)


def test_operator_objects_validate_against_the_operators_crd_schemas():
    objects = [obj for _, obj in all_objects() if obj["apiVersion"] == "monitoring.coreos.com/v1"]
    assert {obj["kind"] for obj in objects} == {"PodMonitor", "PrometheusRule"}
    done = validate_operator_objects(objects)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("\nok ") + done.stdout.startswith("ok ") == len(objects)
    broken = copy.deepcopy(the("PodMonitor", "cpu"))
    broken["spec"]["podMetricsEndpoints"][0]["interval"] = "every 5 seconds"
    done = validate_operator_objects([broken])
    assert done.returncode == 1 and "interval must match pattern" in done.stdout, done.stdout + done.stderr


def test_strict_validation_catches_a_misspelt_field():
    deployment = copy.deepcopy(the("Deployment", "cpu"))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        validate(deployment)


def test_api_versions_are_the_current_ones():
    expected = {
        "Deployment": "apps/v1", "Service": "v1", "PersistentVolumeClaim": "v1", "PodDisruptionBudget": "policy/v1",
        "HorizontalPodAutoscaler": "autoscaling/v2", "PodMonitor": "monitoring.coreos.com/v1",
        "PrometheusRule": "monitoring.coreos.com/v1", "LeaderWorkerSet": "leaderworkerset.x-k8s.io/v1",
    }
    for path, obj in all_objects():
        assert expected[obj["kind"]] == obj["apiVersion"], path


def test_each_kustomization_lists_every_manifest_of_its_directory():
    for kustomization in KUBERNETES_DIR.rglob("kustomization.yaml"):
        listed = yaml.safe_load(kustomization.read_text())["resources"]
        present = [p.name for p in kustomization.parent.glob("*.yaml") if p.name not in NOT_OBJECTS]
        assert sorted(listed) == sorted(present), kustomization


# -- how the pieces refer to each other ------------------------------------------------------------------------------
def containers_by_port(template: dict) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", [])}


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


@pytest.mark.parametrize("variant", VARIANTS)
def test_service_pdb_monitor_and_hpa_point_at_the_deployment(variant):
    deployment = the("Deployment", variant)
    template = deployment["spec"]["template"]
    labels, ports = template["metadata"]["labels"], containers_by_port(template)
    assert selects(deployment["spec"]["selector"]["matchLabels"], labels)
    services = of_kind("Service", variant)
    assert {s["spec"].get("clusterIP") for s in services} == {None, "None"}  # one ClusterIP, one headless (gRPC)
    for service in services:
        assert selects(service["spec"]["selector"], labels)
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports and ports[port["targetPort"]] == port["port"], port
    assert {p["name"]: p["port"] for p in services[0]["spec"]["ports"]} == {
        "http": 8000, "grpc": 8001, "metrics": 8002, "openai": 9000}
    assert selects(the("PodDisruptionBudget", variant)["spec"]["selector"]["matchLabels"], labels)
    monitor = the("PodMonitor", variant)
    assert selects(monitor["spec"]["selector"]["matchLabels"], labels)
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]
    assert monitor["spec"]["podMetricsEndpoints"][0]["path"] == "/metrics"
    hpa = the("HorizontalPodAutoscaler", variant)
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment["metadata"]["name"]}
    assert [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]] == [HPA_METRICS[variant]]
    assert HPA_METRICS[variant] in adapter_metric_names().values()


def test_gpu_variants_take_gpus_and_the_engine_from_the_volume():
    claim = the("PersistentVolumeClaim", "gpu")["metadata"]["name"]
    for directory, gpus in (("gpu", 1), ("gpu-multi", 2)):
        pod = the("Deployment", directory)["spec"]["template"]["spec"]
        triton = pod["containers"][0]
        env = {e["name"]: e.get("value") for e in triton["env"]}
        assert triton["resources"]["limits"]["nvidia.com/gpu"] == gpus == int(env["WORLD_SIZE"])
        assert triton["command"] == ["bash", "/opt/trtllm_triton/deploy/launch_trtllm.sh"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in triton["volumeMounts"]}
        assert volumes[mounts["/models"]]["persistentVolumeClaim"]["claimName"] == claim
        assert env["ENGINE_DIR"].startswith("/models/") and env["TOKENIZER_DIR"].startswith("/models/")
        # launch_trtllm.sh takes its ports from the environment: they must be the ports the probes and Service use.
        ports = containers_by_port(the("Deployment", directory)["spec"]["template"])
        assert (int(env["HTTP_PORT"]), int(env["GRPC_PORT"]), int(env["METRICS_PORT"])) == (
            ports["http"], ports["grpc"], ports["metrics"])


def test_the_leaderworkerset_runs_the_launcher_on_the_leader_and_configures_the_workers():
    (lws,) = of_kind("LeaderWorkerSet")
    spec = lws["spec"]["leaderWorkerTemplate"]
    assert spec["size"] >= 2 and spec["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader, worker = (t["spec"]["containers"][0] for t in (spec["leaderTemplate"], spec["workerTemplate"]))
    env = {e["name"]: e.get("value") for e in leader["env"]}
    assert int(env["WORLD_SIZE"]) == spec["size"] * int(env["GPUS_PER_NODE"]) == spec["size"] * leader["resources"]["limits"]["nvidia.com/gpu"]
    assert "MPI_HOSTS" in leader["args"][0] and "launch_trtllm.sh" in leader["args"][0]
    assert "CONFIGURE_ONLY=1" in worker["args"][0] and "sshd" in worker["args"][0]
    (service,) = of_kind("Service", "multinode")
    assert service["spec"]["selector"]["role"] == "leader" == spec["leaderTemplate"]["metadata"]["labels"]["role"]


# -- stopping: preStop, exit timeout and grace period fit together -----------------------------------------------------
def prestop_timeout_s(container: dict) -> float:
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["python3", "/opt/trtllm_triton/deploy/drain.py"]
    return float(next(arg.split("=", 1)[1] for arg in command if arg.startswith("--timeout=")))


# tritonserver's --exit-timeout-secs under deploy/launch_trtllm.sh: its EXIT_TIMEOUT_SECS default.
LAUNCH_EXIT_TIMEOUT_S = int(re.search(r"EXIT_TIMEOUT_SECS:-(\d+)", (ROOT / "deploy" / "launch_trtllm.sh").read_text())[1])


def exit_timeout_s(container: dict) -> int:
    """The --exit-timeout-secs the container's tritonserver runs with: `trtllm-triton serve` sets its own."""
    if container.get("command", [])[:2] == ["trtllm-triton", "serve"]:
        return EXIT_TIMEOUT_S
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    return int(env.get("EXIT_TIMEOUT_SECS", LAUNCH_EXIT_TIMEOUT_S))


@pytest.mark.parametrize("directory", ["cpu", "gpu", "gpu-multi", "multinode"])
def test_grace_period_covers_the_drain_and_the_exit_timeout(directory):
    workloads = of_kind("Deployment", directory) + of_kind("LeaderWorkerSet", directory)
    template = pod_templates(workloads[0])[0]
    container = template["spec"]["containers"][0]
    exit_timeout = exit_timeout_s(container)
    grace = template["spec"]["terminationGracePeriodSeconds"]
    assert grace >= prestop_timeout_s(container) + exit_timeout + 30, (grace, prestop_timeout_s(container), exit_timeout)


@pytest.mark.parametrize("directory", ["cpu", "gpu", "gpu-multi", "multinode"])
def test_readiness_and_liveness_fail_once_the_engine_model_stopped_on_its_fault_but_outlast_a_stop(directory):
    """A model whose engine failed unloads itself: its /v2/models/tensorrt_llm/ready answers 400 from then on, while
    /v2/health/live stays 200 and /v2/health/ready answers 200 again once no model is left loaded
    (tests/test_e2e_reliability.py), so readiness and liveness ask for the engine's model. Liveness failures must
    outlast a stop's own unload (SIGTERM, then the exit timeout); the startup probe waits for every model first."""
    for container in triton_containers(directory):
        live, ready, startup = container["livenessProbe"], container["readinessProbe"], container["startupProbe"]
        assert live["httpGet"] == {"path": "/v2/models/tensorrt_llm/ready", "port": "http"} == ready["httpGet"]
        assert live["periodSeconds"] * live["failureThreshold"] >= exit_timeout_s(container) + 30, live
        assert startup["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 300, startup


# -- the model-repository API: only with the admin key (docs/security.md) -----------------------------------------------
SECRET_KEY = "from-the-secret-0123456789"  # what the test puts where the Secret's value would be
ADMIN_SECRET = {"name": "trtllm-triton-admin", "key": "admin-key"}


def triton_containers(directory: str) -> list[dict]:
    """The containers of the directory's workloads that run tritonserver: those with an http or grpc port."""
    workloads = of_kind("Deployment", directory) + of_kind("LeaderWorkerSet", directory)
    return [container for workload in workloads for template in pod_templates(workload)
            for container in template["spec"]["containers"]
            if {p["name"] for p in container.get("ports", [])} & {"http", "grpc"}]


def admin_key_ref(container: dict) -> dict:
    (ref,) = [e["valueFrom"]["secretKeyRef"] for e in container.get("env", []) if e["name"] == ADMIN_KEY_ENV]
    return ref


def tritonserver_command_line(container: dict, tmp_path: Path, monkeypatch) -> list[str]:
    """The tritonserver command line the container would run (rank 0's under mpirun), with the Secret's key."""
    env = {e["name"]: e.get("value", SECRET_KEY) for e in container.get("env", [])}
    command = container["command"] + container.get("args", [])
    if command[:2] == ["trtllm-triton", "serve"]:
        started: list[ServerOptions] = []
        monkeypatch.setattr(cli, "serve", lambda options, *_: started.append(options) or 0)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        assert cli.main(command[1:]) == 0
        return server_command(started[0])
    # bash running deploy/launch_trtllm.sh, itself or at the end of a script (the LeaderWorkerSet's leader).
    command = [arg.replace("/opt/trtllm_triton/deploy/launch_trtllm.sh", str(LAUNCH_SCRIPT)) for arg in command]
    env.update(LWS_LEADER_ADDRESS="group-0.trtllm", LWS_GROUP_SIZE="2")  # set by the LeaderWorkerSet controller
    done = launch(tmp_path, make_stand_ins(tmp_path), command, **env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1].split(" : ")[0].split()


@pytest.mark.parametrize("directory", ["cpu", "gpu", "gpu-multi", "multinode"])
def test_tritonserver_runs_with_the_model_repository_api_restricted_to_the_secrets_key(directory, tmp_path, monkeypatch):
    """Without the restriction anyone reaching port 8000 or 8001 could upload a model (Python code) and run it."""
    (container,) = triton_containers(directory)
    assert {k: admin_key_ref(container)[k] for k in ("name", "key")} == ADMIN_SECRET
    assert "--" not in container.get("args", [])  # no tritonserver flags of its own that could undo it
    line = tritonserver_command_line(container, tmp_path, monkeypatch)
    protocols = ",".join(RESTRICTED_PROTOCOLS)
    assert f"--http-restricted-api={protocols}:{ADMIN_HEADER}={SECRET_KEY}" in line, line
    assert f"--grpc-restricted-protocol={protocols}:{ADMIN_HEADER}={SECRET_KEY}" in line, line


@pytest.mark.parametrize("directory", ["cpu", "gpu", "gpu-multi", "multinode"])
def test_tensorrt_llm_is_served_with_stop_by_request_id_off(directory, tmp_path, monkeypatch):
    """Triton tells the model nothing about who sends a `stop`: in these deployments a stop may not end another
    client's stream by its id (docs/security.md)."""
    (container,) = triton_containers(directory)
    line = tritonserver_command_line(container, tmp_path, monkeypatch)
    (repository,) = [arg.split("=", 1)[1] for arg in line if arg.startswith("--model-repository=")]
    config = (Path(repository) / "tensorrt_llm" / "config.pbtxt").read_text()
    assert re.search(r'key: "stop_by_request_id"\s*value: \{ string_value: "false" \}', config), directory


def test_an_openai_container_beside_tritonserver_reads_the_same_key_which_must_exist():
    """It lists the models through the restricted repository index: a key made by launch_trtllm.sh would lock it out."""
    checked = 0
    for directory in ("gpu", "gpu-multi"):
        template = the("Deployment", directory)["spec"]["template"]
        (openai,) = [c for c in template["spec"]["containers"] if c["command"][:2] == ["trtllm-triton", "openai"]]
        (triton,) = triton_containers(directory)
        assert admin_key_ref(openai) == admin_key_ref(triton) and not admin_key_ref(openai).get("optional", False)
        checked += 1
    assert checked == 2


def test_the_images_start_tritonserver_only_through_serve_or_the_launcher():
    stages = {}
    for stage in re.split(r"^FROM ", (ROOT / "deploy" / "Dockerfile").read_text(), flags=re.M)[1:]:
        name = re.match(r"\S+ AS (\S+)", stage).group(1)
        entrypoint = re.search(r"^ENTRYPOINT (.*)$", stage, flags=re.M)
        stages[name] = json.loads(entrypoint.group(1)) if entrypoint else None
        assert "tritonserver " not in re.sub(r"#.*", "", stage), name
    assert stages == {"gpu": ["bash", "/opt/trtllm_triton/deploy/launch_trtllm.sh"], "cpu": ["trtllm-triton", "serve"],
                      "gpu-multinode": None}  # gpu-multinode: FROM gpu, its entrypoint


# -- the autoscaling pipeline: recording rule -> adapter -> HPA -------------------------------------------------------
def recording_rules() -> dict[str, str]:
    (rule,) = of_kind("PrometheusRule")
    return {r["record"]: r["expr"] for group in rule["spec"]["groups"] for r in group["rules"]}


def adapter_rules() -> list[dict]:
    values = yaml.safe_load((KUBERNETES_DIR / "autoscaling" / "prometheus-adapter-values.yaml").read_text())
    return values["rules"]["custom"]


def adapter_metric_names() -> dict[str, str]:
    """Recorded series -> the custom metric name prometheus-adapter serves it as."""
    return {re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{", rule["seriesQuery"]).group(1): rule["name"]["as"]
            for rule in adapter_rules()}


def test_adapter_serves_every_recorded_signal_per_pod():
    assert set(adapter_metric_names()) == set(recording_rules())
    for rule in adapter_rules():
        series = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{", rule["seriesQuery"]).group(1)
        assert re.fullmatch(rule["name"]["matches"], series)
        assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
        for placeholder in ("<<.Series>>", "<<.LabelMatchers>>", "<<.GroupBy>>"):
            assert placeholder in rule["metricsQuery"]
    # The recording rule keeps the labels the adapter maps to Kubernetes objects.
    for expr in recording_rules().values():
        assert all(group == "namespace, pod" for group in re.findall(r"by \(([^)]*)\)", expr)), expr
