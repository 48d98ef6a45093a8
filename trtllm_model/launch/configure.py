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

from ..params import ConfigError, Params
from ..triton.instances import parse_gpu_device_ids

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TEMPLATES = PACKAGE_ROOT / "templates"
DEFAULT_ENSEMBLE = PACKAGE_ROOT / "model_repository" / "ensemble"
LLMAPI_REPOSITORY = PACKAGE_ROOT / "model_repository_llmapi"
PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
MODEL_NAME = "tensorrt_llm"
# NVIDIA's text-level models beside tensorrt_llm, each from templates/<name>/config.pbtxt (the ensemble is copied).
TEXT_MODELS = ("preprocessing", "postprocessing", "tensorrt_llm_bls")
# They tokenize, so they need a tokenizer: the engine executor has one only with tokenizer_dir.
TOKENIZER_MODELS = ("preprocessing", "postprocessing")
# NVIDIA's models that answer each request with one response whatever tensorrt_llm's policy.
ONE_RESPONSE_MODELS = ("preprocessing", "postprocessing")
MODEL_PY = (
    "# Thin entry point: Triton loads this file; the model lives in the trtllm_model package.\n"
    "from trtllm_model.triton.model import TritonPythonModel  # noqa: F401\n"
)

TEMPLATES = {"trtllm_engine": "tensorrt_llm_engine", "trtllm_llmapi": "tensorrt_llm_llmapi"}
REQUIRED = {"trtllm_engine": frozenset({"gpt_model_path"}), "trtllm_llmapi": frozenset({"hf_model_path"})}
# Triton fields must hold a value (an empty one is not valid config.pbtxt); parameters may stay unset.
DEFAULTS = {
    "triton_max_batch_size": "64",
    "max_queue_delay_microseconds": "0",
    "exclude_input_in_output": "true",
    "decoupled_mode": "true",
    "preprocessing_instance_count": "1",
    "postprocessing_instance_count": "1",
    "bls_instance_count": "1",
}
INT_KEYS = (
    "triton_max_batch_size", "max_queue_delay_microseconds", "max_queue_size", "max_beam_width",
    "max_tokens_in_paged_kv_cache", "sink_token_length", "kv_cache_host_memory_bytes", "iter_stats_max_iterations",
    "request_stats_max_iterations", "max_input_len", "max_output_len", "max_batch_size",
    "cancellation_check_period_ms", "stats_check_period_ms", "tensor_parallel_size", "pipeline_parallel_size",
    "preprocessing_instance_count", "postprocessing_instance_count", "bls_instance_count",
)
BOOL_KEYS = ("enable_kv_cache_reuse", "enable_chunked_context", "kv_cache_onboard_blocks", "normalize_log_probs",
             "exclude_input_in_output", "decoupled_mode", "add_special_tokens", "skip_special_tokens",
             "accumulate_tokens", "stop_by_request_id")
ENSEMBLE_PLATFORM = re.compile(r'^platform: "ensemble"', re.MULTILINE)
DECOUPLED_LINE = re.compile(r"model_transaction_policy \{ decoupled: (true|false) \}")
FRACTION_KEYS = ("kv_cache_free_gpu_mem_fraction", "gpu_weights_percent")
INT_LIST_KEYS = ("max_attention_window_size", "participant_ids")
INSTANCE_GROUP = re.compile(r"instance_group \[ \{ count: (\d+), kind: KIND_CPU \} \]")
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
    if params.is_set("gpu_device_ids"):
        parse_gpu_device_ids(params.str("gpu_device_ids"))


def render(template: str, executor: str, values: dict[str, str]) -> str:
    """Fill the template's placeholders; unknown keys and unfilled required placeholders raise ConfigError."""
    return render_models({MODEL_NAME: template}, executor, values)[MODEL_NAME]


def render_models(
    templates: dict[str, str], executor: str, values: dict[str, str], instances: int | None = None,
    gpu_device_ids: str | None = None,
) -> dict[str, str]:
    """Each model's config.pbtxt with its placeholders filled; a key fills every template that has it (NVIDIA's
    tokenizer_dir: tensorrt_llm, preprocessing and postprocessing). A key that no template has is an error."""
    placeholders = set().union(*(PLACEHOLDER.findall(text) for text in templates.values()))
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
    configs = {name: PLACEHOLDER.sub(lambda match: filled.get(match.group(1), ""), text) for name, text in templates.items()}
    if MODEL_NAME in configs:
        if gpu_device_ids and filled.get("gpu_device_ids", gpu_device_ids) != gpu_device_ids:
            raise ConfigError("--gpu-device-ids and --set gpu_device_ids disagree; give one of them")
        configs[MODEL_NAME] = with_instances(configs[MODEL_NAME], instances,
                                             gpu_device_ids or filled.get("gpu_device_ids"))
    return configs


def with_instances(config_text: str, count: int | None, gpu_device_ids: str | None) -> str:
    """tensorrt_llm's config.pbtxt with `count` instances (None: as it is) and NVIDIA's gpu_device_ids, one group of
    GPUs per instance (docs/deploy.md, "Several instances")."""
    group = INSTANCE_GROUP.search(config_text)
    if group is None:
        raise ConfigError("config.pbtxt has no `instance_group [ { count: N, kind: KIND_CPU } ]` line")
    if count is not None:
        if count < 1:
            raise ConfigError(f"--instances {count}: must be at least 1")
        config_text = INSTANCE_GROUP.sub(f"instance_group [ {{ count: {count}, kind: KIND_CPU }} ]", config_text)
    count = count if count is not None else int(group.group(1))
    if not gpu_device_ids or gpu_device_ids.startswith("${"):
        return config_text
    groups = parse_gpu_device_ids(gpu_device_ids)
    if len(groups) != count:
        raise ConfigError(f"gpu_device_ids={gpu_device_ids!r} has {len(groups)} GPU group(s) for {count} instance(s); "
                          "give one group per instance (semicolons between them) or set --instances")
    block = re.compile(r'(key: "gpu_device_ids"\s*value: \{ string_value: ")[^"]*(" \})')
    if block.search(config_text):
        return block.sub(lambda match: f"{match.group(1)}{gpu_device_ids}{match.group(2)}", config_text)
    return config_text + f'parameters: {{\n  key: "gpu_device_ids"\n  value: {{ string_value: "{gpu_device_ids}" }}\n}}\n'


def with_decoupled(config_text: str, decoupled: bool) -> str:
    """A config.pbtxt with its transaction policy set: decoupled (streaming) or one response per request."""
    if not DECOUPLED_LINE.search(config_text):
        raise ConfigError("config.pbtxt has no `model_transaction_policy { decoupled: true|false }` line")
    return DECOUPLED_LINE.sub(f"model_transaction_policy {{ decoupled: {str(decoupled).lower()} }}", config_text)


def set_decoupled(repository: Path, decoupled: bool) -> None:
    """Set every Python model of a repository to one policy; in NVIDIA's LLM API layout the policy is model.yaml's
    triton_config.decoupled. A Triton ensemble has none: it passes on what its step sends."""
    for config in sorted(repository.glob("*/config.pbtxt")):
        model_yaml = config.parent / "1" / "model.yaml"
        if ENSEMBLE_PLATFORM.search(config.read_text()):
            continue
        if not DECOUPLED_LINE.search(config.read_text()) and model_yaml.is_file():
            model_yaml.write_text(yaml_with_decoupled(model_yaml.read_text(), decoupled))
            continue
        if config.parent.name in ONE_RESPONSE_MODELS:  # NVIDIA's preprocessing/postprocessing: never decoupled
            continue
        config.write_text(with_decoupled(config.read_text(), decoupled))


def with_parameters(config_text: str, values: dict[str, str]) -> str:
    """A config.pbtxt with each `parameters` entry of `values` set: replaced where the key is there, else added."""
    for key, value in values.items():
        if '"' in value or "\n" in value or "\\" in value:
            raise ConfigError(f"--set {key}: quotes, backslashes and newlines are not allowed in a value")
        entry = re.compile(r'parameters: \{\s*key: "' + re.escape(key) + r'"\s*value: \{ string_value: "[^"]*" \}\s*\}\n')
        config_text = entry.sub("", config_text)
        config_text += f'parameters: {{\n  key: "{key}"\n  value: {{ string_value: "{value}" }}\n}}\n'
    return config_text


def set_model_parameters(repository: Path, values: dict[str, str]) -> None:
    """`tensorrt_llm`'s settings in a repository: its config.pbtxt parameters, or in NVIDIA's LLM API layout its
    model.yaml keys (`section.key` for a section, values read as YAML). The model checks them when it loads."""
    model_yaml = repository / MODEL_NAME / "1" / "model.yaml"
    if model_yaml.is_file():
        import yaml

        data = yaml.safe_load(model_yaml.read_text()) or {}
        for key, text in values.items():
            section, _, name = key.rpartition(".")
            (data.setdefault(section, {}) if section else data)[name] = yaml.safe_load(text)
        model_yaml.write_text(yaml.safe_dump(data, sort_keys=False))
        return
    config = repository / MODEL_NAME / "config.pbtxt"
    if not config.is_file():
        raise ConfigError(f"{repository} has no {MODEL_NAME}/config.pbtxt to set parameters in")
    config.write_text(with_parameters(config.read_text(), values))


YAML_DECOUPLED_LINE = re.compile(r"^(\s+decoupled:[ \t]*)[A-Za-z]+", re.MULTILINE)


def yaml_with_decoupled(text: str, decoupled: bool) -> str:
    """model.yaml with triton_config.decoupled set (its comments kept)."""
    if not YAML_DECOUPLED_LINE.search(text):
        raise ConfigError("model.yaml has no `decoupled:` line under triton_config")
    return YAML_DECOUPLED_LINE.sub(lambda m: m.group(1) + ("true" if decoupled else "false"), text, count=1)


def model_py(model: str) -> str:
    """The thin 1/model.py of a model: the project repository's (they all import the package), else MODEL_PY."""
    project = PACKAGE_ROOT / "model_repository" / model / "1" / "model.py"
    return project.read_text() if project.is_file() else MODEL_PY


def write_repository(output: Path, configs: dict[str, str], ensemble: Path | None, force: bool) -> None:
    """Write each model's config.pbtxt and thin model.py (and a copy of `ensemble`) under `output`."""
    if output.exists() and any(output.iterdir()):
        if not force:
            raise ConfigError(f"--output {output}: not empty; choose an empty directory or pass --force")
        shutil.rmtree(output)
    for model, text in configs.items():
        (output / model / "1").mkdir(parents=True)
        (output / model / "config.pbtxt").write_text(text)
        (output / model / "1" / "model.py").write_text(MODEL_PY if model == MODEL_NAME else model_py(model))
    if ensemble is not None:  # a Triton ensemble: it streams when tensorrt_llm does, whatever the policy
        shutil.copytree(ensemble, output / "ensemble", ignore=shutil.ignore_patterns("__pycache__"))


def tokenizerless_models(configs: dict[str, str], executor: str, values: dict[str, str]) -> tuple[str, ...]:
    """preprocessing/postprocessing when they would have no tokenizer (trtllm_engine without tokenizer_dir):
    left out rather than written to fail at load."""
    if executor != "trtllm_engine" or values.get("tokenizer_dir"):
        return ()
    return tuple(model for model in TOKENIZER_MODELS if model in configs)


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
    parser.add_argument("--no-ensemble", action="store_true",
                        help="tensorrt_llm only: leave out NVIDIA's text-level models (ensemble, preprocessing, "
                             "postprocessing, tensorrt_llm_bls)")
    parser.add_argument("--force", action="store_true", help="replace a non-empty --output directory")
    parser.add_argument("--list-keys", action="store_true", help="print the template's keys and exit")
    parser.add_argument("--instances", type=int, metavar="N",
                        help="instances of tensorrt_llm (instance_group count; Triton spreads requests over them)")
    parser.add_argument("--gpu-device-ids", metavar="IDS",
                        help='NVIDIA\'s gpu_device_ids: each instance\'s GPUs, e.g. "0;1" (one GPU each) or "0,1;2,3"')
    return parser


def write_llmapi_repository(
    output: Path, assignments: list[str], decoupled: str | None, force: bool, instances: int | None = None,
    gpu_device_ids: str | None = None,
) -> None:
    """NVIDIA's LLM API layout (tensorrt_llm/config.pbtxt + 1/model.yaml) from model_repository_llmapi, with
    `--set key=value` written into model.yaml (values read as YAML; `triton_config.key` for that section)."""
    import yaml

    from ..model_yaml import read_model_yaml

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
        config = output / MODEL_NAME / "config.pbtxt"
        config.write_text(with_instances(config.read_text(), instances, gpu_device_ids))
    except ConfigError:
        shutil.rmtree(output)
        raise


def main(argv: list[str]) -> int:
    argv = list(argv)
    if "--layout" in argv and argv[argv.index("--layout") + 1 : argv.index("--layout") + 2] == ["llmapi"]:
        return llmapi_main(argv)
    args = build_parser().parse_args(argv)
    paths = {MODEL_NAME: args.templates / TEMPLATES[args.executor] / "config.pbtxt"}
    if not args.no_ensemble:
        paths.update((model, args.templates / model / "config.pbtxt") for model in TEXT_MODELS)
    templates = {}
    for model, template_path in paths.items():
        try:
            templates[model] = template_path.read_text()
        except OSError as exc:
            print(f"trtllm-triton configure: cannot read template {template_path}: {exc}", file=sys.stderr)
            return 2
    if args.list_keys:
        for key in sorted(set().union(*(PLACEHOLDER.findall(text) for text in templates.values()))):
            flag = "required" if key in REQUIRED[args.executor] else f"default {DEFAULTS.get(key, '(unset)')}"
            print(f"{key}\t{flag}")
        return 0
    ensemble = None if args.no_ensemble or not DEFAULT_ENSEMBLE.is_dir() else DEFAULT_ENSEMBLE
    try:
        values = parse_assignments(args.assignments)
        if args.decoupled is not None and values.setdefault("decoupled_mode", args.decoupled) != args.decoupled:
            raise ConfigError("--decoupled and --set decoupled_mode disagree; give one of them")
        configs = render_models(templates, args.executor, values, args.instances, args.gpu_device_ids)
        skipped = tokenizerless_models(configs, args.executor, values)
        write_repository(args.output, {m: t for m, t in configs.items() if m not in skipped}, ensemble, args.force)
    except ConfigError as exc:
        print(f"trtllm-triton configure: {exc}", file=sys.stderr)
        return 2
    if skipped:
        print(f"trtllm-triton configure: left out {' and '.join(skipped)}: they tokenize, and --executor "
              f"{args.executor} has no tokenizer without --set tokenizer_dir=...")
    print(f"trtllm-triton configure: wrote {args.output} (executor={args.executor}; models: "
          f"{', '.join(sorted(set(configs) - set(skipped) | ({'ensemble'} if ensemble else set())))}); "
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
    parser.add_argument("--instances", type=int, metavar="N",
                        help="instances of tensorrt_llm (instance_group count; Triton spreads requests over them)")
    parser.add_argument("--gpu-device-ids", metavar="IDS",
                        help='NVIDIA\'s gpu_device_ids: each instance\'s GPUs, e.g. "0;1" (one GPU each) or "0,1;2,3"')
    args = parser.parse_args(argv)
    try:
        write_llmapi_repository(args.output, args.assignments, args.decoupled, args.force, args.instances,
                                args.gpu_device_ids)
    except ConfigError as exc:
        print(f"trtllm-triton configure: {exc}", file=sys.stderr)
        return 2
    print(f"trtllm-triton configure: wrote {args.output} (NVIDIA's LLM API layout); serve it with: "
          f"trtllm-triton serve --model-repository {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
