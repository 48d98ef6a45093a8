"""The helpers of tests/conftest.py that a failing run depends on to say why it failed."""

from __future__ import annotations

from conftest import log_excerpt


def test_a_server_logs_traceback_survives_however_much_log_follows_it():
    """On a fresh GPU host the engine worker's traceback was followed by more than 6000 characters of log, and the
    start_server error (the log's last 6000 characters) showed no cause."""
    log = "\n".join([
        "I1203 loading tensorrt_llm",
        "Traceback (most recent call last):",
        '  File "/src/trtllm_model/embedded/model_loading.py", line 80, in dequantise',
        "    raise ValueError(msg)",
        "ValueError: numpy.dtype size changed, may indicate binary incompatibility",
        *[f"I1203 waiting for the engine worker ({i})" for i in range(500)],
    ])
    excerpt = log_excerpt(log)
    assert "ValueError: numpy.dtype size changed" in excerpt
    assert '  File "/src/trtllm_model/embedded/model_loading.py", line 80, in dequantise' in excerpt
    assert excerpt.endswith("I1203 waiting for the engine worker (499)")
    assert "waiting for the engine worker (3)" not in excerpt  # the tail only, not the whole log
