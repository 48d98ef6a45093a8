"""One set of request limits from config.pbtxt and the executor's build limits.

A config.pbtxt limit may narrow what the engine was built for, never widen it: a larger value fails the load,
naming both values. A limit config.pbtxt leaves unset is the engine's own.
"""

from __future__ import annotations

from ..executor_interface import BuildLimits
from ..params import ConfigError, Params

# config.pbtxt parameter -> the build limit it may not exceed.
BOUNDED_PARAMETERS = {
    "max_input_len": "max_input_len",
    "max_output_len": "max_seq_len",
    "max_beam_width": "max_beam_width",
    "max_batch_size": "max_batch_size",
}


def check_within_build(params: Params, build: BuildLimits) -> None:
    """ConfigError for the first config.pbtxt limit larger than the build limit it is bounded by."""
    for key, field in BOUNDED_PARAMETERS.items():
        value, built = params.int(key, minimum=1), getattr(build, field)
        if value is not None and built is not None and value > built:
            raise ConfigError(
                f"parameter {key}={value} is larger than {field}={built}, what {build.source} was built for; "
                f"set {key} to at most {built}, or rebuild the engine for {value}"
            )


def request_limits(params: Params, build: BuildLimits) -> dict[str, int | None]:
    """Keyword arguments for conventions.common.Limits: config.pbtxt's limits where set (checked), else the build's."""
    check_within_build(params, build)
    return {
        "max_input_len": params.int("max_input_len", minimum=1) or build.max_input_len,
        "max_output_len": params.int("max_output_len", minimum=1),
        "max_seq_len": build.max_seq_len,
        "max_beam_width": params.int("max_beam_width", minimum=1) or build.max_beam_width,
    }
