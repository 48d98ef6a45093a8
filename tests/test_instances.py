"""NVIDIA's `gpu_device_ids` over Triton's instance_group: which instance this is, which GPUs it gets, and how each
executor is pinned to them (trtllm_model/triton/instances.py)."""

from __future__ import annotations

import os
import re

import pytest

from trtllm_model.launch.configure import DEFAULT_TEMPLATES, render_models
from trtllm_model.launch.configure import main as configure
from trtllm_model.params import ConfigError, parameters_from_model_config
from trtllm_model.serving.metrics import MetricsReporter
from trtllm_model.triton import instances
from trtllm_model.triton.instances import Instance, instance_of, parse_gpu_device_ids, pinned_parameters


def _config(*groups: dict) -> dict:
    return {"name": "tensorrt_llm", "instance_group": list(groups)}


def _args(name: str, kind: str = "CPU", device_id: int = 0) -> dict:
    return {"model_name": "tensorrt_llm", "model_instance_name": name, "model_instance_kind": kind,
            "model_instance_device_id": str(device_id)}


CPU_2 = {"name": "tensorrt_llm_0", "kind": "KIND_CPU", "count": 2}


def test_each_instance_gets_its_group_of_gpu_device_ids():
    params = {"gpu_device_ids": "0,1;2,3"}
    first = instance_of(_args("tensorrt_llm_0_0"), _config(CPU_2), params)
    second = instance_of(_args("tensorrt_llm_0_1"), _config(CPU_2), params)
    assert (first.index, first.count, first.gpus) == (0, 2, (0, 1))
    assert (second.index, second.count, second.gpus) == (1, 2, (2, 3))


def test_instances_of_later_groups_come_after_the_earlier_groups():
    groups = (CPU_2, {"name": "tensorrt_llm_1", "kind": "KIND_CPU", "count": 1})
    third = instance_of(_args("tensorrt_llm_1_0"), _config(*groups), {"gpu_device_ids": "0;1;2"})
    assert (third.index, third.count, third.gpus) == (2, 3, (2,))


def test_one_instance_takes_the_whole_list():
    one = instance_of(_args("tensorrt_llm_0_0"), _config({"name": "tensorrt_llm_0", "kind": "KIND_CPU", "count": 1}),
                      {"gpu_device_ids": "0,1"})
    assert one.gpus == (0, 1) and one.label is None  # one instance keeps NVIDIA's metric labels


@pytest.mark.parametrize("value", ["${gpu_device_ids}", ""])
def test_unset_gpu_device_ids_pins_nothing(value):
    instance = instance_of(_args("tensorrt_llm_0_1"), _config(CPU_2), {"gpu_device_ids": value})
    assert instance.gpus is None and instance.label == "tensorrt_llm_0_1"


def test_a_kind_gpu_instance_gets_the_device_triton_gave_it():
    group = {"name": "tensorrt_llm_0", "kind": "KIND_GPU", "count": 1, "gpus": [0, 1]}
    instance = instance_of(_args("tensorrt_llm_0_0", "GPU", device_id=1), _config(group), {})
    assert instance.gpus == (1,) and instance.count == 2


@pytest.mark.parametrize(
    ("groups", "name", "kind", "device", "params", "peers"),
    [
        ((CPU_2,), "tensorrt_llm_0_1", "CPU", 0, {}, 2),  # unpinned: all on the one `device`
        ((CPU_2,), "tensorrt_llm_0_1", "CPU", 0, {"gpu_device_ids": "0;0"}, 2),
        ((CPU_2,), "tensorrt_llm_0_1", "CPU", 0, {"gpu_device_ids": "0;1"}, 1),
        ((CPU_2, {"name": "tensorrt_llm_1", "kind": "KIND_CPU", "count": 1}), "tensorrt_llm_1_0", "CPU", 0,
         {"gpu_device_ids": "0,1;1;0"}, 2),  # by the group's first GPU, the one the embedded engine runs on
        (({"name": "tensorrt_llm_0", "kind": "KIND_GPU", "count": 3, "gpus": [0, 1]},), "tensorrt_llm_0_2", "GPU",
         1, {}, 3),
        (({"name": "tensorrt_llm_0", "kind": "KIND_GPU", "count": 2, "gpus": [0]},
          {"name": "tensorrt_llm_1", "kind": "KIND_GPU", "count": 1, "gpus": [1]}), "tensorrt_llm_1_0", "GPU", 1, {}, 1),
    ],
)
def test_peers_are_the_instances_on_the_same_device(groups, name, kind, device, params, peers):
    """The instances that share one embedded engine worker (model.py): those the engine would run on one device."""
    assert instance_of(_args(name, kind, device), _config(*groups), params).peers == peers


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0;1;2", "3 GPU group(s) for 2 instance(s)"),
        ("0", "1 GPU group(s) for 2 instance(s)"),
        ("0;x", "expected GPU ids"),
        ("0;", "expected GPU ids"),
        ("0,0;1", "names a GPU twice"),
    ],
)
def test_gpu_device_ids_that_do_not_fit_are_config_errors(value, message):
    with pytest.raises(ConfigError, match="gpu_device_ids") as error:
        instance_of(_args("tensorrt_llm_0_0"), _config(CPU_2), {"gpu_device_ids": value})
    assert message in str(error.value)


def test_gpu_device_ids_with_a_kind_gpu_group_is_a_config_error():
    group = {"name": "tensorrt_llm_0", "kind": "KIND_GPU", "count": 1, "gpus": [0]}
    with pytest.raises(ConfigError, match="KIND_GPU"):
        instance_of(_args("tensorrt_llm_0_0", "GPU"), _config(group), {"gpu_device_ids": "0"})


def test_parse_gpu_device_ids():
    assert parse_gpu_device_ids("0,1;2,3") == [(0, 1), (2, 3)]
    assert parse_gpu_device_ids(" 0 ; 0 ") == [(0,), (0,)]


# -- pinning each executor ---------------------------------------------------------------------------------------
def _gpus(monkeypatch, count: int) -> None:
    monkeypatch.setattr(instances, "_cuda_device_count", lambda: count)


SECOND = Instance("tensorrt_llm_0_1", 1, 2, (1,))


def test_the_embedded_engine_runs_on_the_first_gpu_of_its_group(monkeypatch):
    _gpus(monkeypatch, 2)
    params = pinned_parameters(SECOND, "transformers", {"gpu_device_ids": "0;1", "max_batch_size": "8"})
    assert params == {"device": "cuda:1", "max_batch_size": "8"}


def test_an_explicit_device_wins(monkeypatch):
    _gpus(monkeypatch, 2)
    assert pinned_parameters(SECOND, "transformers", {"gpu_device_ids": "0;1", "device": "cpu"})["device"] == "cpu"


def test_gpu_device_ids_without_cuda_is_a_config_error_for_the_embedded_engine(monkeypatch):
    _gpus(monkeypatch, 0)
    with pytest.raises(ConfigError, match="no CUDA device.*set device to cpu"):
        pinned_parameters(SECOND, "transformers", {"gpu_device_ids": "0;1"})


def test_an_id_beyond_the_machines_gpus_is_a_config_error(monkeypatch):
    _gpus(monkeypatch, 1)
    with pytest.raises(ConfigError, match=r"GPU 1, but this machine has 1 CUDA device\(s\)"):
        pinned_parameters(SECOND, "transformers", {"gpu_device_ids": "0;1"})
    with pytest.raises(ConfigError, match="GPU 1"):
        pinned_parameters(SECOND, "trtllm_engine", {"gpu_device_ids": "0;1"})


def test_trtllm_engine_gets_its_group_as_device_ids(monkeypatch):
    _gpus(monkeypatch, 4)
    params = pinned_parameters(Instance("t_0_1", 1, 2, (2, 3)), "trtllm_engine", {"gpu_device_ids": "0,1;2,3"})
    assert params == {"gpu_device_ids": "2,3"}


def test_trtllm_llmapi_sees_only_its_gpus(monkeypatch):
    _gpus(monkeypatch, 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("TRTLLM_VISIBLE_DEVICES", "")
    params = pinned_parameters(Instance("t_0_1", 1, 2, (2, 3)), "trtllm_llmapi", {"gpu_device_ids": "0,1;2,3"})
    assert params == {}
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3" and os.environ["TRTLLM_VISIBLE_DEVICES"] == "2,3"


def test_the_synthetic_executor_is_not_pinned(monkeypatch):
    _gpus(monkeypatch, 0)
    assert pinned_parameters(SECOND, "synthetic", {"gpu_device_ids": "0;1", "synthetic_step_ms": "5"}) == {
        "synthetic_step_ms": "5"}


# -- the metric label ------------------------------------------------------------------------------------------------
class _Recorder:
    def __init__(self) -> None:
        self.labels: list[dict[str, str]] = []

    def _metric(self, name, description, labels, *rest):
        self.labels.append(labels)
        return self

    counter = gauge = histogram = _metric

    def increment(self, value): ...
    def set(self, value): ...
    def observe(self, value): ...


@pytest.mark.parametrize("label", ["tensorrt_llm_0_1", None])
def test_every_series_of_an_instance_carries_its_label(label):
    backend = _Recorder()
    MetricsReporter(backend, lambda: [], model="tensorrt_llm", version="1", instance=label)
    assert backend.labels
    for labels in backend.labels:
        assert labels.get("model_instance") == label


# -- trtllm-triton configure --instances N --gpu-device-ids IDS ------------------------------------------------------
ENGINE_TEMPLATE = (DEFAULT_TEMPLATES / "tensorrt_llm_engine" / "config.pbtxt").read_text()


def test_configure_writes_the_instance_count_and_one_gpu_group_each(tmp_path, capsys):
    text = render_models({"tensorrt_llm": ENGINE_TEMPLATE}, "trtllm_engine", {"gpt_model_path": "/e"}, 2, "0,1;2,3")[
        "tensorrt_llm"]
    assert "instance_group [ { count: 2, kind: KIND_CPU } ]" in text
    assert parameters_from_model_config(_pbtxt_parameters(text))["gpu_device_ids"] == "0,1;2,3"

    assert configure(["--layout", "llmapi", "--output", str(tmp_path / "llmapi"), "--instances", "2",
                      "--gpu-device-ids", "0;0"]) == 0
    text = (tmp_path / "llmapi" / "tensorrt_llm" / "config.pbtxt").read_text()
    assert "instance_group [ { count: 2, kind: KIND_CPU } ]" in text and 'string_value: "0;0"' in text


def test_configure_refuses_gpu_groups_that_do_not_match_the_instances(tmp_path, capsys):
    assert configure(["--layout", "llmapi", "--output", str(tmp_path / "bad"), "--instances", "2",
                      "--gpu-device-ids", "0;1;2"]) == 2
    assert "3 GPU group(s) for 2 instance(s)" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    with pytest.raises(ConfigError, match="gpu_device_ids"):
        render_models({"tensorrt_llm": ENGINE_TEMPLATE}, "trtllm_engine", {"gpt_model_path": "/e",
                                                                          "gpu_device_ids": "0;1"})


def _pbtxt_parameters(text: str) -> dict:
    pairs = re.findall(r'key: "([^"]+)"\s*value: \{ string_value: "([^"]*)" \}', text)
    return {"parameters": {key: {"string_value": value} for key, value in pairs}}


# -- the instance count `serve` chooses from the machine ----------------------------------------------------------
@pytest.mark.parametrize(("executor", "device", "engine_process", "cores", "count"), [
    ("transformers", "cuda", True, 16, 4),  # the GPU machine: four stubs over one engine worker
    ("transformers", "cuda:1", True, 64, 4),  # at most four
    ("transformers", "cuda", True, 8, 2),
    ("transformers", "cuda", True, 2, 1),
    ("transformers", "cuda", False, 16, 1),  # the engine on a stub's thread: instances would not share it
    ("transformers", "cpu", False, 16, 1),
    ("trtllm_engine", "cpu", False, 16, 1),  # one TensorRT-LLM executor an instance
    ("synthetic", "cpu", False, 16, 1),
])
def test_default_instance_count_follows_device_and_cores(executor, device, engine_process, cores, count):
    assert instances.default_instance_count(executor, device, engine_process, cores) == count


def test_serve_chooses_four_instances_for_the_embedded_engine_on_cuda_and_says_so(monkeypatch, capsys):
    from trtllm_model.launch import cli
    from trtllm_model.server import DEFAULT_REPOSITORY

    monkeypatch.setattr(instances, "usable_cores", lambda: 16)
    assert cli.machine_instances(DEFAULT_REPOSITORY, {"device": "cuda"}, None) == 4
    banner = capsys.readouterr().out
    assert "4 instances of tensorrt_llm over one engine worker" in banner and "--instances N" in banner
    # The shipped CPU default, another executor, or the engine on the stub's thread: as the repository says.
    assert cli.machine_instances(DEFAULT_REPOSITORY, {}, None) is None
    assert cli.machine_instances(DEFAULT_REPOSITORY, {"device": "cuda"}, "synthetic") is None
    assert cli.machine_instances(DEFAULT_REPOSITORY, {"device": "cuda", "engine_process": "false"}, None) is None
    assert capsys.readouterr().out == ""


def test_serve_keeps_an_instance_count_the_repository_sets(monkeypatch, tmp_path):
    import shutil

    from trtllm_model.launch import cli
    from trtllm_model.launch.configure import with_instances
    from trtllm_model.server import DEFAULT_REPOSITORY

    monkeypatch.setattr(instances, "usable_cores", lambda: 16)
    repository = tmp_path / "repo"
    shutil.copytree(DEFAULT_REPOSITORY, repository)
    config = repository / "tensorrt_llm" / "config.pbtxt"
    config.write_text(with_instances(config.read_text(), 2, None))
    assert cli.machine_instances(repository, {"device": "cuda"}, None) is None
