"""`trtllm-triton configure`: write a ready model repository from a template and `--set key=value` flags.

Templates (templates/<name>/config.pbtxt) carry NVIDIA-style `${name}` placeholders. A key that is no placeholder
of the chosen template is an error, so is a required one left unfilled; an optional one left unfilled becomes ""
(unset: the executor's default). Values are checked the way the executor will read them, so a typo fails here.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

from .params import ConfigError, Params

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TEMPLATES = PACKAGE_ROOT / "templates"
DEFAULT_ENSEMBLE = PACKAGE_ROOT / "model_repository" / "ensemble"
LLMAPI_REPOSITORY = PACKAGE_ROOT / "model_repository_llmapi"
PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
MODEL_NAME = "tensorrt_llm"
# NVIDIA's models that answer each request with one response whatever tensorrt_llm's policy.
ONE_RESPONSE_MODELS = ("preprocessing", "postprocessing")
MODEL_PY = (
    "# Thin entry point: Triton loads this file; the model lives in the trtllm_model package.\n"
    "from trtllm_model.model import TritonPythonModel  # noqa: F401\n"
)

TEMPLATES = {"trtllm_engine": "tensorrt_llm_engine", "trtllm_llmapi": "tensorrt_llm_llmapi"}
REQUIRED = {"trtllm_engine": frozenset({"gpt_model_path"}), "trtllm_llmapi": frozenset({"hf_model_path"})}
# Triton fields must hold a value (an empty one is not valid config.pbtxt); parameters may stay unset.
DEFAULTS = {
    "triton_max_batch_size": "64",
    "max_queue_delay_microseconds": "0",
    "exclude_input_in_output": "true",
    "decoupled_mode": "true",
}
INT_KEYS = (
    "triton_max_batch_size", "max_queue_delay_microseconds", "max_queue_size", "max_beam_width",
    "max_tokens_in_paged_kv_cache", "sink_token_length", "kv_cache_host_memory_bytes", "iter_stats_max_iterations",
    "request_stats_max_iterations", "max_input_len", "max_output_len", "max_batch_size",
    "cancellation_check_period_ms", "stats_check_period_ms", "tensor_parallel_size", "pipeline_parallel_size",
)
BOOL_KEYS = ("enable_kv_cache_reuse", "enable_chunked_context", "kv_cache_onboard_blocks", "normalize_log_probs",
             "exclude_input_in_output", "decoupled_mode")
DECOUPLED_LINE = re.compile(r"model_transaction_policy \{ decoupled: (true|false) \}")
FRACTION_KEYS = ("kv_cache_free_gpu_mem_fraction", "gpu_weights_percent")
INT_LIST_KEYS = ("max_attention_window_size", "gpu_device_ids", "participant_ids")
CHOICES = {
    "gpt_model_type": ("inflight_fused_batching", "inflight_batching", "v1", "V1"),
    "batch_scheduler_policy": ("max_utilization", "guaranteed_no_evict", "static_batch"),
    "llm_backend": ("pytorch", "_autodeploy"),
    "guided_decoding_backend": ("xgrammar",),
}


def parse_assignments(assignments: list[str]) -> dict[str, str]:
    values: dict[str, str] = {}
    for item in assignments:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected key=value")
        values[key.strip()] = value.strip()
    return values


def check_values(values: dict[str, str]) -> None:
    """Read every value with the type the executor gives it; ConfigError names the first bad one."""
    params = Params(values, accepted=values.keys())
    for key in INT_KEYS:
        params.int(key, minimum=0)
    for key in BOOL_KEYS:
        params.bool(key)
    for key in FRACTION_KEYS:
        params.float(key, minimum=0.0, maximum=1.0)
    for key in INT_LIST_KEYS:
        params.int_list(key)
    for key, choices in CHOICES.items():
        params.str(key, choices=choices)


def render(template: str, executor: str, values: dict[str, str]) -> str:
    """Fill the template's placeholders; unknown keys and unfilled required placeholders raise ConfigError."""
    placeholders = set(PLACEHOLDER.findall(template))
    unknown = sorted(set(values) - placeholders)
    if unknown:
        raise ConfigError(f"unknown key(s) for --executor {executor}: {', '.join(unknown)} "
                          f"(this template has: {', '.join(sorted(placeholders))})")
    filled = {**{k: v for k, v in DEFAULTS.items() if k in placeholders}, **values}
    missing = sorted(key for key in REQUIRED[executor] if not filled.get(key))
    if missing:
        raise ConfigError(f"required for --executor {executor}: {', '.join(missing)}; "
                          + " ".join(f"--set {key}=..." for key in missing))
    check_values(filled)
    if "decoupled_mode" in filled:  # Triton wants exactly true or false here
        filled["decoupled_mode"] = str(Params({"d": filled["decoupled_mode"]}, accepted=["d"]).bool("d")).lower()
    for key, value in filled.items():
        if '"' in value or "\n" in value or "\\" in value:
            raise ConfigError(f"--set {key}: quotes, backslashes and newlines are not allowed in a value")
    return PLACEHOLDER.sub(lambda match: filled.get(match.group(1), ""), template)


def with_decoupled(config_text: str, decoupled: bool) -> str:
    """A config.pbtxt with its transaction policy set: decoupled (streaming) or one response per request."""
    if not DECOUPLED_LINE.search(config_text):
        raise ConfigError("config.pbtxt has no `model_transaction_policy { decoupled: true|false }` line")
    return DECOUPLED_LINE.sub(f"model_transaction_policy {{ decoupled: {str(decoupled).lower()} }}", config_text)


def set_decoupled(repository: Path, decoupled: bool) -> None:
    """Set every model of a repository (tensorrt_llm and the ensemble forwarding to it) to one policy; in NVIDIA's
    LLM API layout the policy is model.yaml's triton_config.decoupled."""
    for config in sorted(repository.glob("*/config.pbtxt")):
        model_yaml = config.parent / "1" / "model.yaml"
        if not DECOUPLED_LINE.search(config.read_text()) and model_yaml.is_file():
            model_yaml.write_text(yaml_with_decoupled(model_yaml.read_text(), decoupled))
            continue
        if config.parent.name in ONE_RESPONSE_MODELS:  # NVIDIA's preprocessing/postprocessing: never decoupled
            continue
        config.write_text(with_decoupled(config.read_text(), decoupled))


YAML_DECOUPLED_LINE = re.compile(r"^(\s+decoupled:[ \t]*)[A-Za-z]+", re.MULTILINE)


def yaml_with_decoupled(text: str, decoupled: bool) -> str:
    """model.yaml with triton_config.decoupled set (its comments kept)."""
    if not YAML_DECOUPLED_LINE.search(text):
        raise ConfigError("model.yaml has no `decoupled:` line under triton_config")
    return YAML_DECOUPLED_LINE.sub(lambda m: m.group(1) + ("true" if decoupled else "false"), text, count=1)


def write_repository(output: Path, config_text: str, ensemble: Path | None, force: bool) -> None:
    if output.exists() and any(output.iterdir()):
        if not force:
            raise ConfigError(f"--output {output}: not empty; choose an empty directory or pass --force")
        shutil.rmtree(output)
    model_dir = output / MODEL_NAME
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(config_text)
    (model_dir / "1" / "model.py").write_text(MODEL_PY)
    if ensemble is not None:
        shutil.copytree(ensemble, output / "ensemble", ignore=shutil.ignore_patterns("__pycache__"))
        # The ensemble follows tensorrt_llm's policy (a streaming ensemble needs a decoupled tensorrt_llm).
        decoupled = DECOUPLED_LINE.search(config_text).group(1) == "true"
        ensemble_config = output / "ensemble" / "config.pbtxt"
        ensemble_config.write_text(with_decoupled(ensemble_config.read_text(), decoupled))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trtllm-triton configure",
        description="Write a model repository for a TensorRT-LLM executor from a config.pbtxt template.",
        epilog="example: trtllm-triton configure --executor trtllm_engine --output /models "
               "--set gpt_model_path=/engines/llama --set tokenizer_dir=/hf/llama --set max_beam_width=1 "
               "(add --set decoupled_mode=false for unary clients: one response per request, no streaming)",
    )
    parser.add_argument("--layout", choices=("inflight_batcher", "llmapi"), default="inflight_batcher",
                        help="llmapi: NVIDIA's LLM API layout (model.yaml); see --layout llmapi --help")
    parser.add_argument("--executor", required=True, choices=sorted(TEMPLATES))
    parser.add_argument("--output", required=True, type=Path, help="directory for the model repository")
    parser.add_argument("--set", dest="assignments", action="append", default=[], metavar="KEY=VALUE",
                        help="fill a ${KEY} placeholder (repeatable)")
    parser.add_argument("--decoupled", choices=("true", "false"),
                        help="same as --set decoupled_mode=...: false serves unary clients (one response per "
                             "request; streaming refused); default true")
    parser.add_argument("--templates", type=Path, default=DEFAULT_TEMPLATES, help="template directory")
    parser.add_argument("--no-ensemble", action="store_true", help="leave out the text-level `ensemble` model")
    parser.add_argument("--force", action="store_true", help="replace a non-empty --output directory")
    parser.add_argument("--list-keys", action="store_true", help="print the template's keys and exit")
    return parser


def write_llmapi_repository(output: Path, assignments: list[str], decoupled: str | None, force: bool) -> None:
    """NVIDIA's LLM API layout (tensorrt_llm/config.pbtxt + 1/model.yaml) from model_repository_llmapi, with
    `--set key=value` written into model.yaml (values read as YAML; `triton_config.key` for that section)."""
    import yaml

    from .model_yaml import read_model_yaml

    values = parse_assignments(assignments)
    if decoupled is not None and values.setdefault("triton_config.decoupled", decoupled) != decoupled:
        raise ConfigError("--decoupled and --set triton_config.decoupled disagree; give one of them")
    if output.exists() and any(output.iterdir()):
        if not force:
            raise ConfigError(f"--output {output}: not empty; choose an empty directory or pass --force")
        shutil.rmtree(output)
    shutil.copytree(LLMAPI_REPOSITORY, output, ignore=shutil.ignore_patterns("__pycache__"))
    model_yaml = output / MODEL_NAME / "1" / "model.yaml"
    data = yaml.safe_load(model_yaml.read_text())
    for key, text in values.items():
        section, _, name = key.rpartition(".")
        target = data.setdefault(section, {}) if section else data
        target[name] = yaml.safe_load(text)
    if values:
        model_yaml.write_text(yaml.safe_dump(data, sort_keys=False))
    try:
        read_model_yaml(model_yaml)
    except ConfigError:
        shutil.rmtree(output)
        raise


def main(argv: list[str]) -> int:
    argv = list(argv)
    if "--layout" in argv and argv[argv.index("--layout") + 1 : argv.index("--layout") + 2] == ["llmapi"]:
        return llmapi_main(argv)
    args = build_parser().parse_args(argv)
    template_path = args.templates / TEMPLATES[args.executor] / "config.pbtxt"
    try:
        template = template_path.read_text()
    except OSError as exc:
        print(f"trtllm-triton configure: cannot read template {template_path}: {exc}", file=sys.stderr)
        return 2
    if args.list_keys:
        for key in sorted(set(PLACEHOLDER.findall(template))):
            flag = "required" if key in REQUIRED[args.executor] else f"default {DEFAULTS.get(key, '(unset)')}"
            print(f"{key}\t{flag}")
        return 0
    ensemble = None if args.no_ensemble or not DEFAULT_ENSEMBLE.is_dir() else DEFAULT_ENSEMBLE
    try:
        values = parse_assignments(args.assignments)
        if args.decoupled is not None and values.setdefault("decoupled_mode", args.decoupled) != args.decoupled:
            raise ConfigError("--decoupled and --set decoupled_mode disagree; give one of them")
        config_text = render(template, args.executor, values)
        write_repository(args.output, config_text, ensemble, args.force)
    except ConfigError as exc:
        print(f"trtllm-triton configure: {exc}", file=sys.stderr)
        return 2
    print(f"trtllm-triton configure: wrote {args.output} (executor={args.executor}); "
          f"serve it with: trtllm-triton serve --model-repository {args.output}")
    return 0


def llmapi_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="trtllm-triton configure --layout llmapi",
        description="Write NVIDIA's LLM API layout (tensorrt_llm/config.pbtxt + 1/model.yaml).",
        epilog="example: trtllm-triton configure --layout llmapi --output /models --set executor=trtllm_llmapi "
               "--set model=/hf/llama --set backend=pytorch --set triton_config.decoupled=true",
    )
    parser.add_argument("--layout", choices=("llmapi",), required=True)
    parser.add_argument("--output", required=True, type=Path, help="directory for the model repository")
    parser.add_argument("--set", dest="assignments", action="append", default=[], metavar="KEY=VALUE",
                        help="a model.yaml key (an LLM argument, executor, or triton_config.KEY); repeatable")
    parser.add_argument("--decoupled", choices=("true", "false"), help="same as --set triton_config.decoupled=...")
    parser.add_argument("--force", action="store_true", help="replace a non-empty --output directory")
    args = parser.parse_args(argv)
    try:
        write_llmapi_repository(args.output, args.assignments, args.decoupled, args.force)
    except ConfigError as exc:
        print(f"trtllm-triton configure: {exc}", file=sys.stderr)
        return 2
    print(f"trtllm-triton configure: wrote {args.output} (NVIDIA's LLM API layout); serve it with: "
          f"trtllm-triton serve --model-repository {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
