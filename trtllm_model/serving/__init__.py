"""The serving core: the poller and dispatcher that move requests between the Triton edge and an executor, with the
per-request state, response assembly, admission, watches, timing and metrics."""
