"""The marks each `tensorrt_llm` instance leaves for `serve`'s stop: a model counts as released once every instance
that loaded has released, never before."""

from pathlib import Path

import pytest

from trtllm_model.server import INSTANCE_STATE_ENV, mark_instance, released_models


def test_a_model_is_released_only_once_every_loaded_instance_released(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(INSTANCE_STATE_ENV, str(tmp_path))
    for name in ("tensorrt_llm.101.loaded", "tensorrt_llm.102.loaded", "tensorrt_llm_bls.7.loaded"):
        (tmp_path / name).touch()
    assert released_models(tmp_path) == set()
    (tmp_path / "tensorrt_llm.101.released").touch()
    assert released_models(tmp_path) == set()  # one of its two instances still holds its executor
    (tmp_path / "tensorrt_llm.102.released").touch()
    assert released_models(tmp_path) == {"tensorrt_llm"}
    mark_instance("tensorrt_llm_bls", "loaded")  # this process: one more instance, not released
    (tmp_path / "tensorrt_llm_bls.7.released").touch()
    assert released_models(tmp_path) == {"tensorrt_llm"}


@pytest.mark.parametrize("where", ["unset", "missing"])
def test_marks_go_nowhere_without_serve(tmp_path: Path, monkeypatch, where: str) -> None:
    if where == "unset":
        monkeypatch.delenv(INSTANCE_STATE_ENV, raising=False)
    else:
        monkeypatch.setenv(INSTANCE_STATE_ENV, str(tmp_path / "gone"))
    mark_instance("tensorrt_llm", "loaded")
    assert list(tmp_path.iterdir()) == [] and released_models(tmp_path / "gone") == set()
