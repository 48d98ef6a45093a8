"""`trtllm-triton configure`: templates -> a model repository that tritonserver loads (with the fake engine)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tritonclient.http as httpclient
from conftest import start_server
from test_e2e_nvidia_repository import PROMPT, text_request, three_models
from triton_client import stream_once, token_inputs
from trtllm_support import FAKES_DIR, fake_tokens, make_checkpoint_dir, make_engine_dir

from trtllm_model.embedded.model_loading import default_cache_dir, dequantised_checkpoint, embedded_gguf_path
from trtllm_model.launch.configure import DEFAULT_TEMPLATES, main, render
from trtllm_model.params import ConfigError, parameters_from_model_config
from trtllm_model.server import DEFAULT_REPOSITORY

ENGINE_TEMPLATE = (DEFAULT_TEMPLATES / "tensorrt_llm_engine" / "config.pbtxt").read_text()
LLMAPI_TEMPLATE = (DEFAULT_TEMPLATES / "tensorrt_llm_llmapi" / "config.pbtxt").read_text()


def io_section(config_text: str) -> str:
    return config_text[config_text.index("input ["): config_text.index("parameters: {")].strip()


def parameters_of(config_text: str) -> dict[str, str]:
    pairs = re.findall(r'key: "([^"]+)"\s*value: \{ string_value: "([^"]*)" \}', config_text)
    return parameters_from_model_config({"parameters": {k: {"string_value": v} for k, v in pairs}})


@pytest.mark.parametrize("template", [ENGINE_TEMPLATE, LLMAPI_TEMPLATE])
def test_templates_have_the_project_models_inputs_and_outputs(template):
    project = io_section((DEFAULT_REPOSITORY / "tensorrt_llm" / "config.pbtxt").read_text())
    assert io_section(template) == project, (
        "templates/*/config.pbtxt: copy the input/output list of model_repository/tensorrt_llm/config.pbtxt")
    assert "decoupled: ${decoupled_mode}" in template


def test_decoupled_flag_sets_the_python_models_policy_and_the_ensemble_has_none(tmp_path):
    engine_dir = make_engine_dir(tmp_path / "engine")
    base = ["--executor", "trtllm_engine", "--set", f"gpt_model_path={engine_dir}"]
    assert main([*base, "--output", str(tmp_path / "default")]) == 0
    assert main([*base, "--output", str(tmp_path / "unary"), "--decoupled", "false"]) == 0
    for model in ("tensorrt_llm", "tensorrt_llm_bls"):
        assert "{ decoupled: true }" in (tmp_path / "default" / model / "config.pbtxt").read_text()
        assert "{ decoupled: false }" in (tmp_path / "unary" / model / "config.pbtxt").read_text()
    for repository in ("default", "unary"):  # a Triton ensemble passes on what tensorrt_llm sends, whatever it is
        ensemble = (tmp_path / repository / "ensemble" / "config.pbtxt").read_text()
        assert 'platform: "ensemble"' in ensemble and "decoupled" not in ensemble
    assert main([*base, "--output", str(tmp_path / "x"), "--decoupled", "false", "--set", "decoupled_mode=true"]) == 2


def test_the_text_models_get_nvidias_parameters_and_tokenizer_dir_fills_all_three(tmp_path, capsys):
    engine_dir = make_engine_dir(tmp_path / "engine")
    assert main(["--executor", "trtllm_engine", "--output", str(tmp_path / "repo"), "--set", f"gpt_model_path={engine_dir}",
                 "--set", "tokenizer_dir=/hf/tok", "--set", "add_special_tokens=false", "--set", "skip_special_tokens=false",
                 "--set", "accumulate_tokens=true", "--set", "triton_max_batch_size=8",
                 "--set", "postprocessing_instance_count=2"]) == 0
    assert "models: ensemble, postprocessing, preprocessing, tensorrt_llm, tensorrt_llm_bls" in capsys.readouterr().out
    configs = {model: (tmp_path / "repo" / model / "config.pbtxt").read_text()
               for model in ("tensorrt_llm", "preprocessing", "postprocessing", "tensorrt_llm_bls")}
    for model, text in configs.items():
        assert "${" not in text.split("name:")[1] and "max_batch_size: 8\n" in text, model
        assert (tmp_path / "repo" / model / "1" / "model.py").read_text() == (
            DEFAULT_REPOSITORY / model / "1" / "model.py").read_text()
    for model in ("tensorrt_llm", "preprocessing", "postprocessing"):
        assert parameters_of(configs[model])["tokenizer_dir"] == "/hf/tok", model
    assert parameters_of(configs["preprocessing"])["add_special_tokens"] == "false"
    assert parameters_of(configs["postprocessing"])["skip_special_tokens"] == "false"
    assert "count: 2," in configs["postprocessing"] and "count: 1," in configs["preprocessing"]
    bls = parameters_of(configs["tensorrt_llm_bls"])
    assert bls["accumulate_tokens"] == "true" and bls["tensorrt_llm_model_name"] == ""  # unset: tensorrt_llm
    # A text model's key is checked like tensorrt_llm's: a typo fails here, not at load.
    assert main(["--executor", "trtllm_engine", "--output", str(tmp_path / "bad"), "--set", f"gpt_model_path={engine_dir}",
                 "--set", "accumulate_tokens=yes please"]) == 2
    assert "accumulate_tokens" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_without_a_tokenizer_the_engine_repository_leaves_out_pre_and_postprocessing(tmp_path, capsys):
    engine_dir = make_engine_dir(tmp_path / "engine")
    assert main(["--executor", "trtllm_engine", "--output", str(tmp_path / "repo"),
                 "--set", f"gpt_model_path={engine_dir}"]) == 0
    assert "left out preprocessing and postprocessing" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == ["ensemble", "tensorrt_llm", "tensorrt_llm_bls"]


def test_render_fills_given_keys_defaults_and_leaves_the_rest_unset():
    text = render(ENGINE_TEMPLATE, "trtllm_engine", {"gpt_model_path": "/engines/x", "max_beam_width": "2"})
    assert "${" not in text.split("input [")[1]
    params = parameters_of(text)
    assert params["executor"] == "trtllm_engine" and params["gpt_model_path"] == "/engines/x"
    assert params["max_beam_width"] == "2" and params["kv_cache_free_gpu_mem_fraction"] == ""
    assert "max_batch_size: 64" in text and params["max_queue_size"] == ""


def test_unknown_keys_and_missing_required_ones_are_errors():
    with pytest.raises(ConfigError, match="unknown key.*gpt_model_pth"):
        render(ENGINE_TEMPLATE, "trtllm_engine", {"gpt_model_pth": "/x"})
    with pytest.raises(ConfigError, match="unknown key.*gpt_model_path"):
        render(LLMAPI_TEMPLATE, "trtllm_llmapi", {"gpt_model_path": "/x", "hf_model_path": "/m"})
    with pytest.raises(ConfigError, match="required.*--set gpt_model_path="):
        render(ENGINE_TEMPLATE, "trtllm_engine", {})
    with pytest.raises(ConfigError, match="required.*hf_model_path"):
        render(LLMAPI_TEMPLATE, "trtllm_llmapi", {"hf_model_path": ""})


@pytest.mark.parametrize(("key", "value"), [("enable_kv_cache_reuse", "ture"), ("max_beam_width", "1.5"),
                                            ("kv_cache_free_gpu_mem_fraction", "90"), ("gpt_model_type", "dynamic"),
                                            ("gpu_device_ids", "0;1"), ("triton_max_batch_size", "many")])
def test_bad_values_fail_at_configure_time_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=key):
        render(ENGINE_TEMPLATE, "trtllm_engine", {"gpt_model_path": "/e", key: value})


def test_main_refuses_a_non_empty_output_and_reports_errors(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("x")
    assert main(["--executor", "trtllm_engine", "--output", str(tmp_path), "--set", "gpt_model_path=/e"]) == 2
    assert "not empty" in capsys.readouterr().err and (tmp_path / "keep.txt").exists()
    assert main(["--executor", "trtllm_engine", "--output", str(tmp_path / "r"), "--set", "oops"]) == 2
    assert "expected key=value" in capsys.readouterr().err


def test_module_help_and_the_cli_subcommand(tmp_path):
    helped = subprocess.run([sys.executable, "-m", "trtllm_model.launch.configure", "--help"], capture_output=True,
                            text=True, timeout=60)
    assert helped.returncode == 0 and "--executor" in helped.stdout
    written = subprocess.run(
        [sys.executable, "-m", "trtllm_model.launch.cli", "configure", "--executor", "trtllm_llmapi", "--output",
         str(tmp_path / "repo"), "--set", "hf_model_path=/models/m", "--set", "tensor_parallel_size=2"],
        capture_output=True, text=True, timeout=60,
    )
    assert written.returncode == 0, written.stderr
    params = parameters_of((tmp_path / "repo" / "tensorrt_llm" / "config.pbtxt").read_text())
    assert (params["executor"], params["hf_model_path"], params["tensor_parallel_size"]) == (
        "trtllm_llmapi", "/models/m", "2")
    assert (tmp_path / "repo" / "tensorrt_llm" / "1" / "model.py").is_file()


def install_fake(repository: Path) -> None:
    """The Python backend puts the model's version directory on sys.path: the fake goes there."""
    shutil.copytree(FAKES_DIR / "tensorrt_llm", repository / "tensorrt_llm" / "1" / "tensorrt_llm",
                    ignore=shutil.ignore_patterns("__pycache__"))


@pytest.mark.e2e
def test_configured_engine_repository_loads_and_streams(tmp_path):
    engine_dir = make_engine_dir(tmp_path / "engine")
    repository = tmp_path / "repo"
    assert main(["--executor", "trtllm_engine", "--output", str(repository), "--no-ensemble",
                 "--set", f"gpt_model_path={engine_dir}", "--set", "max_beam_width=2",
                 "--set", "kv_cache_free_gpu_mem_fraction=0.85", "--set", "max_queue_size=16"]) == 0
    install_fake(repository)
    server = start_server(tmp_path / "server", executor=None, repository=repository, env={"FAKE_TRTLLM_STEP_MS": "2"})
    try:
        result = stream_once(server.grpc_url, "tensorrt_llm", token_inputs([3, 4], 6))
        assert result.errors == [] and result.tokens() == fake_tokens([4], 6) and result.finals == 1
        assert "trtllm-triton: ready. models: tensorrt_llm\n" in server.log()  # --no-ensemble: no ensemble listed
    finally:
        server.stop()


@pytest.mark.e2e
def test_configured_llmapi_repository_with_ensemble_loads_and_streams(tmp_path):
    checkpoint = make_checkpoint_dir(tmp_path / "checkpoint")
    repository = tmp_path / "repo"
    # The fake checkpoint has no tokenizer files: preprocessing and postprocessing get SmolLM2's.
    assert main(["--executor", "trtllm_llmapi", "--output", str(repository), "--set", f"tokenizer_dir={smollm2()}",
                 "--set", f"hf_model_path={checkpoint}", "--set", "enable_kv_cache_reuse=true"]) == 0
    install_fake(repository)
    server = start_server(tmp_path / "server", executor=None, repository=repository, env={"FAKE_TRTLLM_STEP_MS": "2"})
    try:
        result = stream_once(server.grpc_url, "tensorrt_llm", token_inputs([1000], 5))
        assert result.errors == [] and result.tokens() == fake_tokens([1000], 5) and result.finals == 1
        assert ("trtllm-triton: ready. models: ensemble, postprocessing, preprocessing, tensorrt_llm, "
                "tensorrt_llm_bls\n") in server.log()
        assert "POST /v2/models/ensemble/generate_stream" in server.log()
    finally:
        server.stop()


def smollm2() -> Path:
    """The embedded SmolLM2 as a Hugging Face checkpoint directory (its tokenizer files included)."""
    return dequantised_checkpoint(embedded_gguf_path(), default_cache_dir())


@pytest.mark.e2e
def test_configured_repository_serves_nvidias_five_models(tmp_path):
    # What NVIDIA's end_to_end_test.py does against a repository that `configure` wrote: the three-model chain,
    # ensemble and tensorrt_llm_bls give the same text (the fake engine is deterministic).
    engine_dir = make_engine_dir(tmp_path / "engine")
    repository = tmp_path / "repo"
    assert main(["--executor", "trtllm_engine", "--output", str(repository), "--decoupled", "false",
                 "--set", f"gpt_model_path={engine_dir}", "--set", f"tokenizer_dir={smollm2()}",
                 "--set", "skip_special_tokens=true", "--set", "accumulate_tokens=false"]) == 0
    install_fake(repository)
    server = start_server(tmp_path / "server", executor=None, repository=repository, env={"FAKE_TRTLLM_STEP_MS": "2"})
    try:
        assert ("trtllm-triton: ready. models: ensemble, postprocessing, preprocessing, tensorrt_llm, "
                "tensorrt_llm_bls\n") in server.log()
        client = httpclient.InferenceServerClient(server.http_url.removeprefix("http://"), network_timeout=120)
        manual = three_models(client, PROMPT, 8)
        wanted = [httpclient.InferRequestedOutput("text_output")]
        ensemble = client.infer("ensemble", text_request(PROMPT, 8), outputs=wanted).as_numpy("text_output")
        bls = client.infer("tensorrt_llm_bls", text_request(PROMPT, 8), outputs=wanted).as_numpy("text_output")
        assert manual.shape == (1, 1) and manual[0][0]
        assert manual.reshape(-1).tolist() == ensemble.reshape(-1).tolist() == bls.reshape(-1).tolist()
        client.close()  # a kept-alive connection would hold the server's stop for the whole exit timeout (15 s)
    finally:
        server.stop()


def test_serve_instances_writes_the_count_into_a_copy_and_refuses_less_than_one(tmp_path):
    """`trtllm-triton serve --instances N` (cli.repository_copy): the copy's tensorrt_llm has count N, the repository
    itself is untouched; 0 is a ConfigError (serve reports it as a usage error)."""
    from trtllm_model.launch.cli import repository_copy
    from trtllm_model.launch.configure import ConfigError
    from trtllm_model.server import DEFAULT_REPOSITORY

    original = (DEFAULT_REPOSITORY / "tensorrt_llm" / "config.pbtxt").read_text()
    copy = repository_copy(DEFAULT_REPOSITORY, None, {}, 3)
    try:
        assert "instance_group [ { count: 3, kind: KIND_CPU } ]" in (copy / "tensorrt_llm" / "config.pbtxt").read_text()
        assert (DEFAULT_REPOSITORY / "tensorrt_llm" / "config.pbtxt").read_text() == original
    finally:
        shutil.rmtree(copy.parent)
    with pytest.raises(ConfigError, match="--instances 0: must be at least 1"):
        repository_copy(DEFAULT_REPOSITORY, None, {}, 0)
