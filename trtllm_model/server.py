"""Run a real tritonserver from the `nvidia-pytriton` wheel: backend directory, environment, command line."""

from __future__ import annotations

import importlib.util
import os
import re
import resource
import secrets
import shutil
import socket
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_REPOSITORY = PROJECT_ROOT / "model_repository"
# `serve --executor NAME` passes the override to the model (trtllm_model.triton.model) through this variable.
EXECUTOR_OVERRIDE_ENV = "TRTLLM_TRITON_EXECUTOR"
LOOPBACK = "127.0.0.1"
# `serve` tells the models where the server's HTTP endpoint is, so that they ask it whether they are still served
# (triton_io.model_ready) instead of pb_utils.is_model_ready, which can crash the stub while the server stops.
READY_URL_ENV = "TRTLLM_TRITON_HTTP_URL"
# `serve` gives the models a directory where each `tensorrt_llm` instance marks that it loaded and, once it has
# answered every request and let go of its executor, that it released (mark_instance). A stop reads it
# (released_models): tritonserver 2.51 can keep such a model loaded for good (gRPC stream cancellation races its last
# response, fixed in Triton 25.04; a client holding its stream open does it too), and then nothing is left to wait for.
INSTANCE_STATE_ENV = "TRTLLM_TRITON_INSTANCE_STATE_DIR"
# How long tritonserver waits for its models to unload on a stop before it exits anyway. Every open stream ends
# within about a second of a stop (see docs/reliability.md); set Kubernetes' terminationGracePeriodSeconds above it.
EXIT_TIMEOUT_S = 15
# Triton's model-repository API (index, load, unload) runs whatever a load request uploads; its logging, trace and
# shared-memory APIs change what the whole server does (log verbosity, trace files and rates, memory regions it
# maps). `serve` answers them only to requests that carry this header with the admin key (docs/security.md). The
# operator's key comes from ADMIN_KEY_ENV; without one, each start generates its own, known only to `serve` and the
# OpenAI frontend it starts. Health, metadata, model-config, statistics and inference stay open.
RESTRICTED_PROTOCOLS = ("model-repository", "logging", "trace", "shared-memory")
ADMIN_KEY_ENV = "TRTLLM_TRITON_ADMIN_KEY"
ADMIN_HEADER = "trtllm-admin-key"
GRPC_ADMIN_PREFIX = "triton-grpc-protocol-"  # tritonserver 2.51 reads gRPC metadata keys with this prefix
# tritonserver splits its restriction flag at ':', ',' and '=': a key is one run of URL-safe characters.
_ADMIN_KEY_PATTERN = re.compile(r"[A-Za-z0-9._~+/-]{16,}")


def pytriton_dir() -> Path:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        raise RuntimeError("nvidia-pytriton is not installed: pip install nvidia-pytriton (it ships tritonserver)")
    return Path(spec.origin).parent / "tritonserver"


def pytriton_libs_dir() -> Path:
    return pytriton_dir().parent.parent / "nvidia_pytriton.libs"


def backend_directory() -> Path:
    """A backend directory with the Python backend and the stub built for the running Python (made once)."""
    target = Path(sys.prefix) / "share" / "trtllm-triton" / "backends"
    python_dir = target / "python"
    stub_name = "triton_python_backend_stub"
    if not (python_dir / stub_name).exists():
        source = pytriton_dir()
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        stub = source / "python_backend_stubs" / version / stub_name
        if not stub.exists():
            raise RuntimeError(f"nvidia-pytriton has no Python backend stub for Python {version}")
        staging = target.with_name("backends.tmp")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(source / "backends" / "python", staging / "python", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy2(stub, staging / "python" / stub_name)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    return target


def server_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for tritonserver: its bundled libraries, and this virtualenv's Python first on PATH
    (the stub embeds the first Python it finds, and the model must see this environment's packages)."""
    env = dict(os.environ)
    # The stub links libpython dynamically: it must find this interpreter's libpython (e.g. pyenv's 3.11.7), not
    # an older system copy whose missing symbols break extension modules such as _ssl.
    libs = [str(pytriton_libs_dir())]
    python_libdir = sysconfig.get_config_var("LIBDIR")
    if python_libdir and Path(python_libdir, sysconfig.get_config_var("LDLIBRARY") or "").exists():
        libs.insert(0, python_libdir)
    if env.get("LD_LIBRARY_PATH"):
        libs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(libs)
    env["PATH"] = f"{sysconfig.get_path('scripts')}:{env.get('PATH', '')}"
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env


def mark_instance(model: str, state: str) -> None:
    """Record that this process's instance of `model` reached `state` ("loaded" or "released"), where `serve` asked."""
    directory = os.environ.get(INSTANCE_STATE_ENV)
    if directory and os.path.isdir(directory):
        Path(directory, f"{model}.{os.getpid()}.{state}").touch()


def released_models(directory: Path) -> set[str]:
    """The models whose every loaded instance has released (mark_instance)."""
    marks = [path.name.rsplit(".", 1) for path in directory.iterdir()] if directory.is_dir() else []
    loaded = {instance for instance, state in marks if state == "loaded"}
    released = {instance for instance, state in marks if state == "released"}
    pending = {instance.rsplit(".", 1)[0] for instance in loaded - released}
    return {instance.rsplit(".", 1)[0] for instance in loaded} - pending


def admin_key(environ: dict[str, str] | os._Environ = os.environ) -> str:
    """The operator's admin key from ADMIN_KEY_ENV, or a new random one; raises ValueError for an unusable key."""
    key = environ.get(ADMIN_KEY_ENV)
    if not key:
        return secrets.token_urlsafe(32)
    if not _ADMIN_KEY_PATTERN.fullmatch(key):
        raise ValueError(f"{ADMIN_KEY_ENV} must be at least 16 characters of A-Z a-z 0-9 . _ ~ + / - "
                         "(tritonserver's flag syntax takes no others)")
    return key


def admin_headers(key: str) -> dict[str, str]:
    """Headers (HTTP) or metadata (gRPC) that open the model-repository API of a server started with `key`.

    Triton looks for the gRPC metadata under its own prefix; each protocol ignores the other's entry, so one dict
    serves an HTTP and a gRPC client alike."""
    return {ADMIN_HEADER: key, f"{GRPC_ADMIN_PREFIX}{ADMIN_HEADER}": key}


def restricted_api_args(key: str) -> list[str]:
    """tritonserver flags that close RESTRICTED_PROTOCOLS, over HTTP and gRPC, to requests without the key."""
    protocols = ",".join(RESTRICTED_PROTOCOLS)
    return [
        f"--http-restricted-api={protocols}:{ADMIN_HEADER}={key}",
        f"--grpc-restricted-protocol={protocols}:{ADMIN_HEADER}={key}",
    ]


# A host without a CUDA driver: no pinned-memory pool (it needs CUDA) and no GPU metrics (NVML, DCGM), instead of
# tritonserver trying them at every start and logging the failures as errors and warnings.
CPU_HOST_ARGS = ("--pinned-memory-pool-byte-size=0", "--allow-gpu-metrics=false")
# What tritonserver 2.51 (built with GPU support) still logs as errors on such a host, with no flag to turn it off:
# its CUDA driver check at start and the copy stream each ensemble asks for, and the warning on the first request that
# there is no pinned-memory pool (there is none by choice). All are harmless without a GPU; `serve` leaves those lines
# out there (cli.forward_output) and says so once.
CPU_HOST_NOISE = ('"CudaDriverHelper has not been initialized."', '"unable to create stream for ',
                  '"failed to allocate pinned system memory: no pinned memory pool')


def cuda_driver_present() -> bool:
    """Whether this host has a CUDA driver (libcuda) tritonserver could use."""
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@dataclass
class ServerOptions:
    model_repository: Path = DEFAULT_REPOSITORY
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    executor: str | None = None
    log_verbose: int = 0
    extra_args: list[str] = field(default_factory=list)
    # Loopback ports of tritonserver's own HTTP and metrics listeners when `serve`'s guard (http_guard) holds
    # http_port and metrics_port; None: tritonserver listens on those itself.
    triton_http_port: int | None = None
    triton_metrics_port: int | None = None
    admin_key: str = field(default_factory=admin_key, repr=False)
    # The Python backend's shared-memory region names start with this (None: its default).
    shm_region_prefix: str | None = None


def server_command(options: ServerOptions) -> list[str]:
    # Explicit model control with every model loaded at start: a model can then unload itself when its
    # executor dies, which is how a 2.51 server learns that the model is no longer ready. That in-process
    # unload (pb_utils.unload_model) does not go through the endpoints, so the restriction does not stop it.
    return [
        str(pytriton_dir() / "bin" / "tritonserver"),
        f"--model-repository={options.model_repository}",
        f"--backend-directory={backend_directory()}",
        "--model-control-mode=explicit",
        "--load-model=*",
        # One model at a time: with tritonserver 2.51's default of 4 load threads, loading the default repository's
        # five models hung in 2 of 7 starts on a busy 2-core host (a load thread waiting forever in pthread_once under
        # the Python backend's TRITONBACKEND_ModelInstanceInitialize, its stub idle).
        "--model-load-thread-count=1",
        f"--http-address={LOOPBACK if options.triton_http_port else options.host}",
        f"--http-port={options.triton_http_port or options.http_port}",
        f"--grpc-address={options.host}",
        f"--grpc-port={options.grpc_port}",
        f"--metrics-address={LOOPBACK if options.triton_metrics_port else options.host}",
        f"--metrics-port={options.triton_metrics_port or options.metrics_port}",
        "--allow-metrics=true",
        "--allow-cpu-metrics=true",
        f"--log-verbose={options.log_verbose}",
        f"--exit-timeout-secs={EXIT_TIMEOUT_S}",
        *restricted_api_args(options.admin_key),
        *([f"--backend-config=python,shm-region-prefix-name={options.shm_region_prefix}"]
          if options.shm_region_prefix else []),
        *(() if cuda_driver_present() else CPU_HOST_ARGS),
        *options.extra_args,
    ]


# tritonserver's threads get RLIMIT_STACK's soft limit as their stack size (glibc), and 2 MiB when it is unlimited;
# http_guard's bounds keep a request's parse within this much.
THREAD_STACK_BYTES = 8 << 20


def set_thread_stack_limit(pid: int = 0) -> None:
    """Raise the RLIMIT_STACK soft limit of process `pid` (0: this one), and so of the children it starts next, to
    THREAD_STACK_BYTES if it is lower or unlimited, as far as the hard limit lets it."""
    soft, hard = resource.prlimit(pid, resource.RLIMIT_STACK)
    if soft == resource.RLIM_INFINITY or soft < THREAD_STACK_BYTES:
        wanted = THREAD_STACK_BYTES if hard == resource.RLIM_INFINITY else min(THREAD_STACK_BYTES, hard)
        resource.prlimit(pid, resource.RLIMIT_STACK, (wanted, hard))


def ports_in_use(host: str, ports: list[int]) -> list[int]:
    busy = []
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError:
                busy.append(port)
    return busy


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def is_ready(host: str, http_port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}:{http_port}/v2/health/ready", timeout=1) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_until_ready(process, host: str, http_port: int, timeout_s: float) -> bool:
    """True once the server answers ready; False if it exited or the time ran out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        if is_ready(host, http_port):
            return True
        time.sleep(0.2)
    return False
