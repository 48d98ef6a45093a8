"""Tensor naming conventions: each module turns one convention's Triton tensors into a ParsedRequest and a request's
response content back into its output tensors. The poller and the executors never learn which one a request used.

- llmapi: NVIDIA's LLM API model (`model.yaml`, `text_input` + `sampling_param_*`).
- inflight_batcher: NVIDIA's inflight-batcher names (`tensorrt_llm` token level, `ensemble` text level).
- common: what both share (ParsedRequest, Limits, ResponseContent, InvalidInput).
"""
