"""This model instance among the model's instances, and its GPUs from NVIDIA's `gpu_device_ids`.

Triton runs one Python backend stub per instance of `instance_group`; each calls initialize() with its own
`model_instance_name` ("<model>_<group>_<i>") and builds its own executor. NVIDIA's `gpu_device_ids` gives every
instance its GPUs: "0,1;2,3" means instance 0 gets GPUs 0 and 1, instance 1 GPUs 2 and 3 (semicolons between
instances, commas within one), so it has one group per instance. A KIND_GPU group needs no parameter: Triton gives
each of its instances a device (`model_instance_device_id`), and that is the instance's GPU.

The instance is pinned before its executor is created:
  transformers   `device` becomes cuda:<first id of the group> unless `device` is set; without CUDA that is a
                 config error (an explicit `device: cpu` serves on CPU and the ids are ignored with a warning)
  trtllm_engine  `gpu_device_ids` becomes the group: ParallelConfig(device_ids=group)
  trtllm_llmapi  CUDA_VISIBLE_DEVICES (and TRTLLM_VISIBLE_DEVICES) become the group before tensorrt_llm is
                 imported, as NVIDIA's LLM API model does
  synthetic      no device: the group is only logged
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..params import ConfigError, Params

log = logging.getLogger(__name__)

PARAMETER = "gpu_device_ids"


@dataclass(frozen=True, slots=True)
class Instance:
    name: str
    index: int  # among all instances of the model, in instance_group order
    count: int  # instances of the model
    gpus: tuple[int, ...] | None  # this instance's GPUs; None: not pinned
    peers: int = 1  # instances of the model on this instance's (first) GPU, itself included; all of them unpinned

    @property
    def label(self) -> str | None:
        """The metric label value that tells this instance apart; None for a model of one instance (its series
        keep NVIDIA's label set)."""
        return self.name if self.count > 1 else None


def parse_gpu_device_ids(value: str) -> list[tuple[int, ...]]:
    """"0,1;2,3" -> [(0, 1), (2, 3)]."""
    groups = []
    for part in value.split(";"):
        ids = [token.strip() for token in part.split(",")]
        if not all(token.isdigit() for token in ids):
            raise ConfigError(f"parameter {PARAMETER}={value!r}: expected GPU ids such as \"0,1;2,3\" (commas between "
                              "the GPUs of one instance, semicolons between instances)")
        group = tuple(int(token) for token in ids)
        if len(set(group)) != len(group):
            raise ConfigError(f"parameter {PARAMETER}={value!r}: GPU {group} names a GPU twice for one instance")
        groups.append(group)
    return groups


def _instances_of(group: Mapping) -> int:
    count = int(group.get("count", 1) or 1)
    if _is_gpu_kind(group.get("kind")):
        count *= max(1, len(group.get("gpus") or []))  # Triton makes `count` instances on each listed GPU
    return count


def _instances_on(device: int, groups: list[Mapping]) -> int:
    """Instances Triton makes on GPU `device`: `count` of each KIND_GPU group that lists it (or lists none: all)."""
    return sum(int(group.get("count", 1) or 1) for group in groups if _is_gpu_kind(group.get("kind"))
               and (not group.get("gpus") or device in [int(gpu) for gpu in group["gpus"]])) or 1


def _is_gpu_kind(kind: object) -> bool:
    return str(kind) in ("KIND_GPU", "GPU")


def _index_of(name: str, groups: list[Mapping]) -> int:
    """This instance's position among all instances: its group's offset plus its number within the group."""
    offset = 0
    for group in groups:
        prefix = f"{group.get('name', '')}_"
        if group.get("name") and name.startswith(prefix):
            rest = name[len(prefix):]
            number = re.match(r"\d+", rest)
            if number:
                return offset + int(number.group())
        offset += _instances_of(group)
    match = re.search(r"_(\d+)$", name)  # NVIDIA's rule: the name's last number
    return int(match.group(1)) if match else 0


def instance_of(args: Mapping[str, str], model_config: Mapping, raw_params: Mapping[str, str]) -> Instance:
    """This instance (from initialize()'s args) and its GPUs; a gpu_device_ids that does not fit the instance
    count is a ConfigError."""
    groups = list(model_config.get("instance_group") or [{"count": 1, "kind": "KIND_CPU"}])
    count = sum(_instances_of(group) for group in groups)
    name = str(args.get("model_instance_name") or args.get("model_name") or "")
    index = _index_of(name, groups)
    value = Params(raw_params, accepted=raw_params.keys()).str(PARAMETER)
    gpu_kind = _is_gpu_kind(args.get("model_instance_kind"))
    if value is None:
        if not gpu_kind:
            return Instance(name, index, count, None, count)
        device = int(args.get("model_instance_device_id", 0))
        return Instance(name, index, count, (device,), _instances_on(device, groups))
    if gpu_kind or any(_is_gpu_kind(group.get("kind")) for group in groups):
        raise ConfigError(f"parameter {PARAMETER}={value!r} places KIND_CPU instances (NVIDIA's layout); a KIND_GPU "
                          "instance_group already gives each instance its GPU: use one or the other")
    per_instance = parse_gpu_device_ids(value)
    if len(per_instance) != count:
        raise ConfigError(f"parameter {PARAMETER}={value!r} has {len(per_instance)} GPU group(s) for {count} "
                          f"instance(s) of instance_group: give one group per instance, e.g. "
                          f"\"{';'.join(str(i) for i in range(count))}\"")
    if index >= count:
        raise ConfigError(f"instance {name!r}: cannot tell which of the {count} groups of {PARAMETER} is its own")
    mine = per_instance[index]
    return Instance(name, index, count, mine, sum(group[0] == mine[0] for group in per_instance))


def pinned_parameters(instance: Instance, executor: str, raw_params: Mapping[str, str]) -> dict[str, str]:
    """The config parameters `executor` is created with on this instance, pinning it to its GPUs (for
    trtllm_llmapi through the environment of this stub process)."""
    params = dict(raw_params)
    params.pop(PARAMETER, None)
    if instance.gpus is None:
        return dict(raw_params)
    ids = ",".join(str(i) for i in instance.gpus)
    if executor == "transformers":
        return _embedded_engine_parameters(instance, params)
    if executor == "trtllm_engine":
        _check_visible(instance, _cuda_device_count())
        return {**params, PARAMETER: ids}
    if executor == "trtllm_llmapi":
        # Before tensorrt_llm (and torch's CUDA) start in this process: CUDA reads the variable once, at init.
        os.environ["CUDA_VISIBLE_DEVICES"] = ids
        os.environ["TRTLLM_VISIBLE_DEVICES"] = ids
        if _cuda_device_count() < len(instance.gpus):
            raise ConfigError(f"parameter {PARAMETER}: instance {instance.index} ({instance.name}) is given GPUs {ids}, "
                              "but CUDA sees fewer of them: an id is beyond this machine's GPUs")
        log.info("instance %s: CUDA_VISIBLE_DEVICES=%s", instance.name, ids)
        return params
    log.info("instance %s: executor %s has no device; GPUs %s ignored", instance.name, executor, ids)
    return params


def _embedded_engine_parameters(instance: Instance, params: dict[str, str]) -> dict[str, str]:
    explicit = Params(params, accepted=params.keys()).str("device")
    if explicit is not None:
        log.warning("instance %s: parameter device=%s is set, so %s (GPUs %s) is not used for it", instance.name,
                    explicit, PARAMETER, instance.gpus)
        return params
    visible = _cuda_device_count()
    if visible == 0:
        raise ConfigError(f"parameter {PARAMETER} gives instance {instance.index} GPUs {instance.gpus}, but torch sees "
                          "no CUDA device; leave it unset (or set device to cpu) to serve on the CPU")
    _check_visible(instance, visible)
    if len(instance.gpus) > 1:
        log.warning("instance %s: the embedded engine runs on one GPU: cuda:%d (of %s)", instance.name,
                    instance.gpus[0], instance.gpus)
    log.info("instance %s (%d of %d): device cuda:%d", instance.name, instance.index + 1, instance.count,
             instance.gpus[0])
    return {**params, "device": f"cuda:{instance.gpus[0]}"}


def _check_visible(instance: Instance, visible: int) -> None:
    beyond = [i for i in instance.gpus if i >= visible]
    if beyond:
        raise ConfigError(f"parameter {PARAMETER} gives instance {instance.index} ({instance.name}) GPU "
                          f"{beyond[0]}, but this machine has {visible} CUDA device(s) (ids 0 to {visible - 1})")


def _cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count()


# One stub's interpreter lock sends a bounded number of responses a second: on an H100 at 256 streams one instance sent
# 864-925 a second and every 64-token request left in one response; four streamed (docs/performance.md). So on a GPU
# the embedded engine's instances share one engine worker, a stub for every CORES_PER_STUB cores, at most
# MAX_DEFAULT_INSTANCES (the engine worker and tritonserver's own threads need the rest).
CORES_PER_STUB = 4
MAX_DEFAULT_INSTANCES = 4


def default_instance_count(executor: str, device: str, engine_process: bool, cores: int) -> int:
    """Instances of tensorrt_llm a repository left at one instance is served with (`serve`): several stubs over one
    engine worker for the embedded engine on CUDA, one anywhere else (the CPU engine shares the host's cores with
    every stub; TensorRT-LLM executors are one per instance)."""
    if executor != "transformers" or device == "cpu" or not engine_process:
        return 1
    return max(1, min(MAX_DEFAULT_INSTANCES, cores // CORES_PER_STUB))


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity, e.g. a container's cpuset), else the host's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
