"""`trtllm-triton`: serve the model repository on a real tritonserver, or write a repository from flags."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from .. import package_version
from ..process_watch import LostStubWatch, end_process_group
from ..server import (
    ADMIN_HEADER,
    ADMIN_KEY_ENV,
    CPU_HOST_NOISE,
    DEFAULT_REPOSITORY,
    EXECUTOR_OVERRIDE_ENV,
    EXIT_TIMEOUT_S,
    INSTANCE_STATE_ENV,
    READY_URL_ENV,
    ServerOptions,
    admin_headers,
    admin_key,
    cuda_driver_present,
    free_ports,
    is_ready,
    ports_in_use,
    released_models,
    server_command,
    server_environment,
    set_thread_stack_limit,
    wait_until_ready,
)
from .http_guard import HttpGuard, Route

LLMAPI_REPOSITORY = DEFAULT_REPOSITORY.parent / "model_repository_llmapi"
# Time for a signal sent to the whole process group to reach tritonserver as well (see stop_gracefully).
SIGNAL_SETTLE_S = 0.2
# tritonserver 2.51 does not exit while a client keeps a gRPC stream open that carried a request (the model stays
# live until the stream closes, even past "Exit timeout expired"): `serve` kills it this long after its exit timeout.
EXIT_KILL_MARGIN_S = 5.0
# Time the processes tritonserver started get to end on their own after it exited (an engine worker leaves once its
# last stub has: 0.3 s on the 2-core machine), before they are killed.
GROUP_EXIT_GRACE_S = 3.0
# How long a stop waits for the models to unload before it signals tritonserver (a client holding its stream open
# keeps a model from ever unloading).
UNLOAD_SETTLE_S = 5.0
# A stop ends tritonserver itself once the models still loaded have stayed so this long with every instance released
# (see held_by_triton_only).
HELD_SETTLE_S = 1.0
# After a stub was lost, the time the other models get to unload (the lost one's model never does) before the server
# is killed.
LOST_STUB_SETTLE_S = 2.0


def serve(options: ServerOptions, ready_timeout_s: float, openai_port: int | None = None,
          openai_access_log: bool = True, verbose: bool = False, served_model_name: str | None = None) -> int:
    """Run tritonserver until it exits; with `openai_port`, the OpenAI frontend next to it (stopped with it).
    Unless `verbose`, its start-up tables, the weights' progress bars and the CPU host's harmless complaints are not
    shown."""
    connect_host = "127.0.0.1" if options.host == "0.0.0.0" else options.host
    busy = ports_in_use(options.host, [options.http_port, options.grpc_port, options.metrics_port])
    if busy:
        print(f"trtllm-triton: port(s) {', '.join(map(str, busy))} already in use on {options.host}; "
              "stop the other server or pick other --http-port/--grpc-port/--metrics-port", file=sys.stderr)
        return 2
    if openai_port is not None and ports_in_use(options.host, [openai_port]):
        print(f"trtllm-triton: port {openai_port} already in use on {options.host}; pick another --openai-port "
              "or pass --no-openai", file=sys.stderr)
        return 2
    # Triton's HTTP and metrics listeners move to loopback ports behind the guard, which bounds every request on the
    # public ones before Triton reads it (http_guard says why); its threads' stacks are what those bounds assume.
    set_thread_stack_limit()
    triton_http_port, triton_metrics_port = free_ports(2)
    options = dataclasses.replace(options, triton_http_port=triton_http_port, triton_metrics_port=triton_metrics_port)
    guard = HttpGuard([Route(options.host, options.http_port, triton_http_port),
                       Route(options.host, options.metrics_port, triton_metrics_port)])
    # Where the instances mark that they loaded and released (server.mark_instance), and the prefix of the Python
    # backend's shared-memory regions, which a tritonserver that was killed leaves in /dev/shm: both go when it does.
    state_dir = Path(tempfile.mkdtemp(prefix="trtllm-triton-instances-"))
    options = dataclasses.replace(options, shm_region_prefix=f"trtllm_triton_{os.getpid()}_")
    extra_env = {READY_URL_ENV: f"http://{connect_host}:{options.http_port}", INSTANCE_STATE_ENV: str(state_dir)}
    if not verbose:
        extra_env["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # transformers' "Loading weights" bars too
    if options.executor:
        extra_env[EXECUTOR_OVERRIDE_ENV] = options.executor
    # tritonserver gets a process group of its own, so that a signal to this one (Ctrl-C in a terminal, `kill
    # -TERM -<pgid>`) reaches it only through stop_gracefully below: its Python backend stubs, in its group, never see
    # it (one hit mid-stop ended a BLS model's stub, which then never answered its streams). It goes with us.
    environment = server_environment(extra_env)
    environment.pop(ADMIN_KEY_ENV, None)  # the models never need it
    cpu_host = not cuda_driver_present()
    if cpu_host:
        print("trtllm-triton: no CUDA driver on this host: CPU start (no pinned memory, no GPU metrics); "
              "tritonserver's CUDA start-up errors (driver check, ensemble copy stream) are harmless here and not "
              "shown", flush=True)
    pipe = None if verbose else subprocess.PIPE
    process = subprocess.Popen(server_command(options), env=environment, process_group=0,
                               preexec_fn=_stop_with_parent, stdout=pipe, stderr=pipe)
    if not verbose:
        noise = CPU_HOST_NOISE if cpu_host else ()
        for source, target in ((process.stdout, sys.stdout), (process.stderr, sys.stderr)):
            threading.Thread(target=forward_output, args=(source, target, noise), daemon=True).start()

    stopping = threading.Event()
    killed = threading.Event()
    ended_early = threading.Event()  # every request answered, the models held by tritonserver alone: exit 0

    def forward(signum, _frame):
        if process.poll() is not None:
            return
        if stopping.is_set():  # a second Ctrl-C: stop now
            process.send_signal(signum)
            return
        stopping.set()
        threading.Thread(target=stop_gracefully, args=(signum,), daemon=True).start()

    def stop_gracefully(signum):
        # Unload the models first, while the server is whole: each ends its open streams with a final response.
        # Stopped with streams still sending, tritonserver 2.51 sometimes aborts (boost lock_exception).
        # But a signal to the whole process group (Ctrl-C, systemd) reached tritonserver too, and it is already
        # stopping: unload requests racing its own stop can leave both waiting until the exit timeout. So look
        # first (it answers not ready at once when it stops) and only unload a server that is still ready.
        time.sleep(SIGNAL_SETTLE_S)
        if is_ready(connect_host, options.http_port):
            unload_models(connect_host, options.http_port, options.admin_key)
        held = held_by_triton_only(connect_host, options.http_port, options.admin_key, state_dir)
        if held and process.poll() is None:
            print(f"trtllm-triton: every request is answered and every instance of {', '.join(held)} has let go, but "
                  "tritonserver 2.51 keeps it loaded (a client's gRPC stream is still open, or was cancelled as its "
                  "last response left; fixed in Triton 25.04): ending tritonserver now rather than after its "
                  f"{EXIT_TIMEOUT_S} s exit timeout", file=sys.stderr, flush=True)
            ended_early.set()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # its own process group: the released stubs go with it
            return
        if process.poll() is None:
            process.send_signal(signum)
        try:
            process.wait(EXIT_TIMEOUT_S + EXIT_KILL_MARGIN_S)
        except subprocess.TimeoutExpired:
            print(f"trtllm-triton: tritonserver still running {EXIT_TIMEOUT_S + EXIT_KILL_MARGIN_S:.0f} s after the "
                  "stop (a client holds a gRPC stream open); killing it and its models", file=sys.stderr, flush=True)
            killed.set()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # its own process group: the stubs go with it

    def stop_on_lost_stub():
        # A stub that died while the server runs (killed, crashed): Triton 2.51 neither restarts it nor answers the
        # requests it held, and its model can never unload. Only the server's end ends those streams: the other
        # models unload first (their streams get their final responses), then the process group goes.
        lost = LostStubWatch(process.pid).wait_lost(stopping)
        if not lost or stopping.is_set():
            return
        stopping.set()
        names = ", ".join(f"{stub.instance or '(not known)'} (pid {stub.pid})" for stub in lost)
        print(f"trtllm-triton: the Python backend stub of model instance {names} ended while serving (killed or "
              "crashed); Triton cannot answer its open requests nor restart it, so tritonserver is stopped (exit 1): "
              "start it again, or let your supervisor do it", file=sys.stderr, flush=True)
        killed.set()
        unload_models(connect_host, options.http_port, options.admin_key, settle_s=LOST_STUB_SETTLE_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    if wait_until_ready(process, connect_host, options.http_port, ready_timeout_s):
        print(ready_banner(connect_host, options, openai_port), flush=True)
        threading.Thread(target=stop_on_lost_stub, name="lost-stub-watch", daemon=True).start()
    elif process.poll() is None:
        print(f"trtllm-triton: server not ready after {ready_timeout_s:.0f} s; stopping it", file=sys.stderr)
        process.terminate()
    else:
        print("trtllm-triton: tritonserver exited before it was ready (see its log above)", file=sys.stderr)
    frontend = None
    if openai_port is not None and process.poll() is None and not stopping.is_set():
        frontend = start_openai_frontend(options, connect_host, openai_port, openai_access_log, served_model_name)
    try:
        code = process.wait()
        return 1 if killed.is_set() else 0 if ended_early.is_set() else code
    finally:
        stopping.set()
        if process.poll() is None:  # serve itself failed: its server goes with it
            process.kill()
            process.wait()
        # However tritonserver ended, nothing it started outlives it: a stub it did not finalize (an exit timeout
        # that ran out, a crash) ignores SIGTERM, and would keep its shared engine worker decoding.
        left = end_process_group(process.pid, GROUP_EXIT_GRACE_S)
        if left:
            print(f"trtllm-triton: killed what tritonserver left running (pids {', '.join(map(str, left))})",
                  file=sys.stderr, flush=True)
        if frontend is not None:
            stop_process(frontend)
        guard.close()
        shutil.rmtree(state_dir, ignore_errors=True)
        for region in Path("/dev/shm").glob(f"{options.shm_region_prefix}*"):
            with contextlib.suppress(OSError):
                region.unlink()


def forward_output(source, target, noise: tuple[str, ...] = ()) -> None:
    """Copy tritonserver's output (and its models') line by line, less the lines holding one of `noise` and
    tritonserver's start-up tables (repository agents, backends, models, options: `--verbose` shows them)."""
    in_table = False
    for line in iter(source.readline, b""):
        text = line.decode("utf-8", "replace")
        if text.startswith(("+-", "| ")) or (in_table and text.startswith(("+", "|"))):
            in_table = True
            continue
        if in_table and not text.strip():  # the blank line after a table
            continue
        in_table = False
        if any(piece in text for piece in noise):
            continue
        target.write(text)
        target.flush()


def _stop_with_parent() -> None:
    """In the child before exec: SIGTERM once `trtllm-triton` is gone, however it went (Linux's PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def start_openai_frontend(options: ServerOptions, connect_host: str, port: int, access_log: bool = True,
                          served_model_name: str | None = None) -> subprocess.Popen:
    """`trtllm-triton openai` against this server's gRPC port, bound to the server's --host."""
    command = [sys.executable, "-m", "trtllm_model.launch.cli", "openai", f"--triton-url={connect_host}:{options.grpc_port}",
               f"--host={options.host}", f"--port={port}"]
    if options.executor:
        command.append(f"--executor={options.executor}")  # the frontend loads the tokenizer of the executor in use
    # An LLM API model's tokenizer is named in its model.yaml, which the frontend reads from the repository.
    command.append(f"--model-repository={options.model_repository}")
    if not access_log:
        command.append("--no-access-log")
    if served_model_name:
        command.append(f"--served-model-name={served_model_name}")
    # The frontend finds the models through the repository's folders and their readiness, which need no admin key:
    # its process is given none (an operator's key in serve's own environment included).
    environment = {name: value for name, value in os.environ.items() if name != ADMIN_KEY_ENV}
    return subprocess.Popen(command, env=environment)


def stop_process(process: subprocess.Popen, timeout_s: float = 15.0) -> None:
    """SIGTERM (uvicorn then lets open responses finish), SIGKILL if it is still there after `timeout_s`."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def model_states(host: str, http_port: int, key: str, timeout_s: float = 5.0) -> dict[str, str]:
    """Each model of the server's repository index and its state (READY, UNLOADING, UNAVAILABLE, ...); the index asks
    for the admin key."""
    request = urllib.request.Request(f"http://{host}:{http_port}/v2/repository/index", data=b"{}", method="POST",
                                     headers=admin_headers(key))
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return {model["name"]: model.get("state", "") for model in json.loads(response.read())}


def loaded_models(host: str, http_port: int, key: str, timeout_s: float = 5.0) -> list[str]:
    """Names of the models the server has loaded (READY in its repository index)."""
    return [name for name, state in model_states(host, http_port, key, timeout_s).items() if state == "READY"]


def model_is_decoupled(host: str, http_port: int, model: str, timeout_s: float = 5.0) -> bool:
    """Whether the loaded `model` streams (its config's model_transaction_policy), as Triton reports it."""
    with urllib.request.urlopen(f"http://{host}:{http_port}/v2/models/{model}/config", timeout=timeout_s) as response:
        return bool(json.loads(response.read()).get("model_transaction_policy", {}).get("decoupled"))


def ready_banner(host: str, options: ServerOptions, openai_port: int | None = None) -> str:
    """What `serve` prints once ready: the models actually loaded and where to reach them; streaming endpoints only
    where the model streams."""
    try:
        models = loaded_models(host, options.http_port, options.admin_key)
        generate = next((name for name in ("ensemble", "tensorrt_llm") if name in models), None)
        streams = generate is not None and model_is_decoupled(host, options.http_port, generate)
    except (OSError, ValueError) as exc:
        return f"\ntrtllm-triton: ready (could not list the loaded models: {exc})\n"
    if generate is None:
        endpoint = ""
    elif streams:
        endpoint = f"  (POST /v2/models/{generate}/generate_stream)"
    else:
        endpoint = f"  (POST /v2/models/{generate}/generate; not decoupled: one response per request)"
    key_source = f"${ADMIN_KEY_ENV}" if os.environ.get(ADMIN_KEY_ENV) == options.admin_key else "generated, not shown"
    lines = [
        f"\ntrtllm-triton: ready. models: {', '.join(models) or '(none)'}",
        f"  HTTP     http://{host}:{options.http_port}{endpoint}",
        f"  gRPC     {host}:{options.grpc_port}",
        f"  metrics  http://{host}:{options.metrics_port}/metrics",
    ]
    if openai_port is not None:
        how = "" if streams else " (the model is not decoupled: `stream: true` answers in one chunk; --decoupled true)"
        lines.append(f"  OpenAI   http://{host}:{openai_port}/v1{how}")
    lines.append(f"  model-repository API (load, unload, index): only with header {ADMIN_HEADER} (key: {key_source})")
    return "\n".join(lines) + "\n"


def held_by_triton_only(host: str, http_port: int, key: str, state_dir: Path) -> list[str]:
    """The models tritonserver still holds though nothing of theirs runs: every model still loaded or unloading is
    either one whose instances all released (server.mark_instance: each answered every request and let go of its
    executor) or one without instances of ours (the ensemble, the text models), and at least one instance released;
    twice, HELD_SETTLE_S apart. Empty when anything may still be answering or the server is gone."""
    held: list[str] = []
    for attempt in range(2):
        if attempt:
            time.sleep(HELD_SETTLE_S)
        try:
            states = model_states(host, http_port, key, timeout_s=2)
        except OSError:
            return []
        released = released_models(state_dir)
        marked = {path.name.rsplit(".", 2)[0] for path in state_dir.iterdir()} if state_dir.is_dir() else set()
        if not released or any(state == "READY" for state in states.values()):
            return []
        live = sorted(name for name, state in states.items() if state == "UNLOADING")
        if not live or any(name in marked and name not in released for name in live):
            return []
        held = live
    return held


def unload_models(host: str, http_port: int, key: str, settle_s: float = UNLOAD_SETTLE_S) -> None:
    """Ask the server to unload every ready model, and wait (bounded) until none is ready."""
    base = f"http://{host}:{http_port}/v2/repository"

    try:
        for name in loaded_models(host, http_port, key, timeout_s=2):
            request = urllib.request.Request(f"{base}/models/{name}/unload", data=b"{}", method="POST",
                                             headers=admin_headers(key))
            with contextlib.suppress(OSError):  # unload answers when done; open streams may hold it: don't wait
                urllib.request.urlopen(request, timeout=0.5).close()
        # Until every model has unloaded, not only stopped being ready: a decoupled model unloads once its streams'
        # final responses have left (and their clients let go). Signalled while a stream still waited for its final,
        # tritonserver once left it without one and the model live until its exit timeout (1 of 3 runs of
        # test_serve_instances_2_shares_one_worker_and_a_stop_with_streams_on_both_ends_cleanly with a busy core).
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline and any(
                state in ("READY", "UNLOADING") for state in model_states(host, http_port, key, timeout_s=2).values()):
            time.sleep(0.1)
        time.sleep(0.5)  # let the models' final responses leave
    except OSError:
        pass  # the server is already going away: nothing left to do gracefully


def repository_copy(repository: Path, decoupled: bool | None, parameters: dict[str, str],
                    instances: int | None = None, executor: str | None = None) -> Path:
    """A copy of the repository (in a temporary directory) with every model set to the transaction policy (None: as
    they are), `tensorrt_llm`'s `parameters` set (configure.set_model_parameters) and its instance count (None: as
    it is); `parameters` are checked as the model (run by `executor`, None: the config's) will read them."""
    from ..params import ConfigError
    from .configure import MODEL_NAME, set_decoupled, set_model_parameters, with_instances

    copy = Path(tempfile.mkdtemp(prefix="trtllm-triton-repository-")) / repository.name
    shutil.copytree(repository, copy, ignore=shutil.ignore_patterns("__pycache__"))
    changes = []
    if decoupled is not None:
        set_decoupled(copy, decoupled)
        changes.append(f"decoupled: {str(decoupled).lower()}")
    if parameters:
        set_model_parameters(copy, parameters)
        changes += [f"{key}={value}" for key, value in parameters.items()]
    if instances is not None:
        config = copy / MODEL_NAME / "config.pbtxt"
        config.write_text(with_instances(config.read_text(), instances, None))
        changes.append(f"{instances} instance(s) of {MODEL_NAME}")
    if parameters:
        try:
            check_served_parameters(copy, executor)
        except ConfigError:
            shutil.rmtree(copy.parent, ignore_errors=True)
            raise
    print(f"trtllm-triton: serving {copy} (a copy of {repository} with {', '.join(changes)})")
    return copy


def check_served_parameters(repository: Path, executor: str | None) -> None:
    """The repository's `tensorrt_llm` settings read as the model will read them, before tritonserver starts
    (ConfigError names the first bad one)."""
    from ..executors import check_parameters
    from ..model_yaml import embedded_parameters, read_model_yaml
    from ..triton.text_pipeline import config_parameters
    from .configure import MODEL_NAME

    model_yaml = repository / MODEL_NAME / "1" / "model.yaml"
    if not model_yaml.is_file():
        check_parameters(config_parameters(repository / MODEL_NAME / "config.pbtxt"), executor)
        return
    config = read_model_yaml(model_yaml)
    if (executor or config.executor) == "transformers":
        check_parameters(embedded_parameters(config)[0], "transformers")


def unary_llmapi_model(repository: Path) -> bool:
    """Whether the repository's `tensorrt_llm` is an LLM API model whose model.yaml says decoupled: False."""
    from ..model_yaml import read_model_yaml
    from .configure import MODEL_NAME

    path = repository / MODEL_NAME / "1" / "model.yaml"
    return path.is_file() and not read_model_yaml(path).triton.decoupled


def checkpoint_assignment(repository: Path, executor: str | None, checkpoint: Path) -> str:
    """The `--set` that serves `checkpoint` in this repository (model.yaml's `model`; config.pbtxt's `model_dir` for
    the embedded engine, `hf_model_path` for the LLM API executor); ValueError when the executor takes none, or the
    embedded engine cannot run it."""
    from ..embedded.model_loading import check_checkpoint
    from ..model_yaml import read_model_yaml
    from ..triton.text_pipeline import config_parameters
    from .configure import MODEL_NAME

    model_yaml = repository / MODEL_NAME / "1" / "model.yaml"
    if model_yaml.is_file():
        key, name = "model", executor or read_model_yaml(model_yaml).executor
    else:
        name = executor or config_parameters(repository / MODEL_NAME / "config.pbtxt").get("executor") or "transformers"
        key = {"transformers": "model_dir", "trtllm_llmapi": "hf_model_path"}.get(name)
    if key is None:
        raise ValueError(f"--model: the {name} executor serves no Hugging Face checkpoint (transformers and "
                         "trtllm_llmapi do)")
    if name == "transformers":
        check_checkpoint(checkpoint)
    return f"{key}={checkpoint}"


def machine_instances(repository: Path, parameters: dict[str, str], executor: str | None) -> int | None:
    """The instance count this machine serves `repository` with when its tensorrt_llm has the one instance the
    shipped config gives (instances.default_instance_count), said on stdout with how to change it; None: as it is."""
    from ..params import Params
    from ..triton.instances import CORES_PER_STUB, MAX_DEFAULT_INSTANCES, default_instance_count, usable_cores
    from ..triton.text_pipeline import config_parameters
    from .configure import INSTANCE_GROUP, MODEL_NAME

    config = repository / MODEL_NAME / "config.pbtxt"
    group = INSTANCE_GROUP.search(config.read_text()) if config.is_file() else None
    if group is None or group.group(1) != "1":
        return None
    values = {**config_parameters(config), **parameters}
    params = Params(values, accepted=values.keys())
    device = params.str("device", "cpu") or "cpu"
    cores = usable_cores()
    count = default_instance_count(executor or params.str("executor", "transformers") or "transformers", device,
                                   params.bool("engine_process", device != "cpu"), cores)
    if count == 1:
        return None
    print(f"trtllm-triton: {count} instances of {MODEL_NAME} over one engine worker ({device}, {cores} cores: a stub "
          f"for every {CORES_PER_STUB} cores, at most {MAX_DEFAULT_INSTANCES}, so that responses keep up at 256+ "
          "streams); --instances N to change", flush=True)
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trtllm-triton")
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("serve", help="start tritonserver on a model repository and wait until it exits")
    run.add_argument("--model-repository", type=Path, help=f"default: {DEFAULT_REPOSITORY} (--layout llmapi: "
                     f"{LLMAPI_REPOSITORY})")
    run.add_argument("--layout", choices=("inflight_batcher", "llmapi"), default="inflight_batcher",
                     help="llmapi: serve NVIDIA's LLM API layout (model.yaml, sampling_param_* inputs)")
    run.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 for every interface)")
    run.add_argument("--http-port", type=int, default=8000)
    run.add_argument("--grpc-port", type=int, default=8001)
    run.add_argument("--metrics-port", type=int, default=8002)
    run.add_argument("--executor", help="override the config's `executor` parameter (e.g. synthetic, transformers)")
    run.add_argument("--model", type=Path, metavar="DIR",
                     help="serve this Hugging Face checkpoint directory instead of SmolLM2 (the embedded engine runs "
                          "the architectures named in README.md; TensorRT-LLM's LLM API executor any it runs)")
    run.add_argument("--decoupled", choices=("true", "false"),
                     help="serve the repository's models decoupled (streaming) or not (one response per request, "
                          "for unary gRPC ModelInfer and HTTP infer); default: as their config.pbtxt says")
    run.add_argument("--set", dest="assignments", action="append", default=[], metavar="KEY=VALUE",
                     help="set a parameter of tensorrt_llm in a copy of the repository (config.pbtxt; model.yaml in "
                          "the LLM API layout), e.g. --set max_batch_size=8 --set kv_cache_memory_bytes=268435456; "
                          "repeatable")
    run.add_argument("--instances", type=int, metavar="N",
                     help="instances of tensorrt_llm (instance_group count) in a copy of the repository; on a GPU the "
                          "embedded engine's instances share one engine worker, and 4 stream best (docs/deploy.md)")
    run.add_argument("--log-verbose", type=int, default=0, help="tritonserver's --log-verbose level")
    run.add_argument("--verbose", action="store_true",
                     help="tritonserver's output as it is: its start-up tables, progress bars, and on a host without a "
                          "CUDA driver its harmless CUDA complaints")
    run.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for the models to load")
    run.add_argument("--openai-port", type=int, default=9000, help="port of the OpenAI-compatible API (on --host)")
    run.add_argument("--no-openai", action="store_true", help="serve without the OpenAI-compatible API")
    run.add_argument("--served-model-name", metavar="NAME",
                     help="the name the OpenAI API serves tensorrt_llm under (default: tensorrt_llm)")
    run.add_argument("--no-openai-access-log", action="store_true",
                     help="no log line per OpenAI API request (method, path, status, tokens, seconds)")
    run.add_argument("server_args", nargs="*", help="extra tritonserver flags, after --")
    commands.add_parser("configure", help="write a model repository from flags", add_help=False)
    openai = commands.add_parser("openai", help="serve the OpenAI-compatible API in front of a running tritonserver")
    openai.add_argument("--triton-url", action="append", required=True,
                        help="Triton gRPC address host:port; repeat (or comma-separate) for replicas of one repository")
    openai.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 for every interface)")
    openai.add_argument("--port", type=int, default=9000)
    openai.add_argument("--executor", help="the executor the server runs, if `serve --executor` overrode the config's "
                        "(the frontend loads that executor's tokenizer)")
    openai.add_argument("--log-level", default="warning", help="uvicorn's log level (info logs every request)")
    openai.add_argument("--max-body-bytes", type=int, default=4 << 20,
                        help="largest request body accepted (default 4 MiB); a larger one gets 413")
    openai.add_argument("--model-repository", help="the server's model repository (an LLM API model's model.yaml "
                        "names its tokenizer)")
    openai.add_argument("--no-access-log", action="store_true", help="no log line per request (on stderr)")
    openai.add_argument("--served-model-name", metavar="NAME",
                        help="the name tensorrt_llm is served under (default: tensorrt_llm)")

    args, rest = parser.parse_known_args(argv)
    if args.command == "configure":
        from .configure import main as configure_main

        return configure_main(rest)
    if rest:
        parser.error(f"unrecognised arguments: {' '.join(rest)}")
    if args.command == "openai":
        # gRPC's older client stack, before grpc is loaded: a request reaches Triton sooner without the EventEngine
        # client's thread handoffs (0.1 ms of every first token on 2 cores, bench/openai.py).
        os.environ.setdefault("GRPC_EXPERIMENTS", "-event_engine_client")
        from ..openai_frontend.app import run as run_openai

        urls = [url for value in args.triton_url for url in value.split(",") if url]
        run_openai(urls, args.host, args.port, args.executor, args.log_level, args.max_body_bytes,
                   args.model_repository, not args.no_access_log, args.served_model_name)
        return 0
    repository = (args.model_repository or (LLMAPI_REPOSITORY if args.layout == "llmapi" else DEFAULT_REPOSITORY)).resolve()
    decoupled = None if args.decoupled is None else args.decoupled == "true"
    if decoupled is None and not args.no_openai and unary_llmapi_model(repository):
        decoupled = True
        print("trtllm-triton: serving the LLM API model decoupled, so that the OpenAI API and generate_stream stream "
              "token by token (--decoupled false keeps model.yaml's unary mode for unary clients)")
    if args.model is not None:
        try:
            args.assignments.insert(0, checkpoint_assignment(repository, args.executor, args.model.resolve()))
        except ValueError as exc:
            parser.error(str(exc))
    from ..params import ConfigError
    from .configure import parse_assignments

    try:
        parameters = parse_assignments(args.assignments)
        instances = args.instances if args.instances is not None else machine_instances(repository, parameters,
                                                                                        args.executor)
    except ConfigError as exc:
        parser.error(str(exc))
    if decoupled is not None or parameters or instances is not None:
        try:
            repository = repository_copy(repository, decoupled, parameters, instances, args.executor)
        except ConfigError as exc:
            parser.error(str(exc))
    try:
        key = admin_key()
    except ValueError as exc:
        parser.error(str(exc))
    options = ServerOptions(
        model_repository=repository,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        executor=args.executor,
        log_verbose=args.log_verbose,
        extra_args=args.server_args,
        admin_key=key,
    )
    return serve(options, args.ready_timeout, None if args.no_openai else args.openai_port,
                 not args.no_openai_access_log, args.verbose, args.served_model_name)


if __name__ == "__main__":
    sys.exit(main())
