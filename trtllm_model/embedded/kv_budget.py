"""How much memory the KV block pool may take, and the check for a request that could never fit in it.

The pool (`kv_cache.KvBlockPool`) is preallocated at load: `memory_bytes` / (bytes of one token x block size)
blocks. The scheduler admits a request when the free blocks hold its prompt and grows its blocks as it decodes,
preempting the newest request when the pool runs out (`scheduler`); a request whose prompt + max_tokens needs more
blocks than the whole pool could never finish, so it is refused at enqueue.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..executor_interface import RequestRejected
from ..params import ConfigError
from .decode_graphs import graph_outputs_bytes

if TYPE_CHECKING:
    from .runner import ModelRunner

log = logging.getLogger(__name__)

# Sized for the CPU Deployment (deploy/kubernetes/cpu/deployment.yaml, 4 GiB memory limit) serving the embedded
# SmolLM2-135M in float32: with a 1.5 GiB budget filled by 2,000-token prompts the server peaked at 3.3 GiB
# (0.5 idle, the rest prefill activations and heap); docs/performance.md, "KV-cache budget".
DEFAULT_CPU_KV_CACHE_BYTES = 1 << 30  # 1 GiB
# On CUDA, NVIDIA's kv_cache_free_gpu_mem_fraction (its default) of the memory free once the weights, the largest
# step's activations and the decode graphs have theirs (`MemoryPlan`).
DEFAULT_FREE_GPU_MEM_FRACTION = 0.9
# Tokens per KV block (TensorRT-LLM's tokens_per_block default 32, vLLM's 16): small blocks share more of a prefix.
DEFAULT_BLOCK_SIZE = 16


@dataclass(frozen=True, slots=True)
class KvBudget:
    memory_bytes: int
    bytes_per_slot: int  # keys and values of one token in every layer
    block_size: int = DEFAULT_BLOCK_SIZE

    @property
    def num_blocks(self) -> int:
        return self.memory_bytes // (self.bytes_per_slot * self.block_size)

    @property
    def max_slots(self) -> int:
        return self.num_blocks * self.block_size

    def check_request(self, prompt_len: int, max_tokens: int) -> None:
        """Raise RequestRejected for a request that would not fit even alone in the pool."""
        needed = -(-(prompt_len + max_tokens) // self.block_size)
        if needed > self.num_blocks:
            raise RequestRejected(
                f"input length {prompt_len} + max_tokens {max_tokens} needs {needed} KV-cache blocks of "
                f"{self.block_size} tokens; kv_cache_memory_bytes={self.memory_bytes} holds {self.num_blocks} "
                f"({self.bytes_per_slot * self.block_size} bytes per block)"
            )


# GPU memory left out of every plan: the CUDA context's later needs, cuBLAS workspaces, allocator fragmentation.
PLAN_MARGIN_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Where a CUDA device's memory goes, measured at load before the KV pool exists (`plan_cuda_kv_cache`): the
    pool gets `fraction` (NVIDIA's kv_cache_free_gpu_mem_fraction) of what the weights, the largest prompt forward's
    activations and the decode graphs leave free, as TensorRT-LLM sizes its pool after the engine's own buffers."""

    total_bytes: int
    free_bytes: int  # free with the weights loaded (torch's unused cache counted free)
    weights_bytes: int  # what torch had allocated when the plan was made: the weights, mostly
    prefill_bytes: int  # peak of the largest prompt forward, beyond that
    decode_bytes: int  # peak of the largest eager decode step, beyond that
    graph_bytes: int  # the decode graphs' memory pool: their outputs plus one decode step's intermediates
    fraction: float

    @property
    def pool_bytes(self) -> int:
        left = self.free_bytes - max(self.prefill_bytes, self.decode_bytes) - self.graph_bytes - PLAN_MARGIN_BYTES
        return max(0, int(left * self.fraction))

    def describe(self) -> str:
        gib = 1 << 30
        return (f"{self.total_bytes / gib:.1f} GiB device: weights {self.weights_bytes / gib:.2f} GiB, free "
                f"{self.free_bytes / gib:.2f} GiB; largest prompt forward {self.prefill_bytes / gib:.2f} GiB, largest "
                f"decode step {self.decode_bytes / gib:.2f} GiB, decode graphs about {self.graph_bytes / gib:.2f} GiB, "
                f"margin {PLAN_MARGIN_BYTES / gib:.2f} GiB; KV pool {self.pool_bytes / gib:.2f} GiB "
                f"(kv_cache_free_gpu_mem_fraction={self.fraction:g} of the rest)")

    def check(self, bytes_per_block: int, max_batch_size: int) -> None:
        """Raise ConfigError when the pool could not give each of `max_batch_size` sequences one block."""
        blocks = self.pool_bytes // bytes_per_block
        if blocks < max_batch_size:
            raise ConfigError(
                f"max_batch_size={max_batch_size} does not fit this device: {self.describe()} holds {blocks} KV blocks, "
                f"fewer than one a sequence; lower max_batch_size or max_num_tokens, or give the engine a device of "
                f"its own")


def default_kv_cache_bytes(runner: ModelRunner, max_batch_size: int, max_num_tokens: int, graph_rows: int,
                           greedy_steps: int, fraction: float = DEFAULT_FREE_GPU_MEM_FRACTION,
                           block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """The budget when none is configured: a fixed size on CPU; on CUDA, what `plan_cuda_kv_cache` gives the pool,
    refused (ConfigError, with the plan's numbers) when it could not hold a block for each of `max_batch_size`."""
    if runner.device.type != "cuda":
        return DEFAULT_CPU_KV_CACHE_BYTES
    plan = plan_cuda_kv_cache(runner, fraction, max_batch_size, max_num_tokens, graph_rows, greedy_steps, block_size)
    plan.check(runner.kv_bytes_per_token * block_size, max_batch_size)
    log.info("memory plan: %s", plan.describe())
    return plan.pool_bytes


def plan_cuda_kv_cache(runner: ModelRunner, fraction: float, max_batch_size: int, max_num_tokens: int,
                       graph_rows: int, greedy_steps: int, block_size: int = DEFAULT_BLOCK_SIZE) -> MemoryPlan:
    """Measure, with the weights loaded and before the pool exists, the peaks of the largest prompt forward (an
    iteration's `max_num_tokens` and the padding a forward is worth, as the warm-up runs it) and of the largest
    decode step (`graph_rows` rows), and estimate the decode graphs' pool (`graph_outputs_bytes` plus one decode
    step's intermediates): the plan the pool is sized from."""
    device = runner.device
    torch.cuda.synchronize(device)
    weights = torch.cuda.memory_allocated(device)
    max_tokens = max_num_tokens + int(runner.prefill_forward_cost_tokens)
    with torch.inference_mode(), runner.attention_backends():
        prefill, decode = runner.profile_step_peaks(max_tokens, max_batch_size, graph_rows, block_size)
    free, total = torch.cuda.mem_get_info(device)
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    graphs = 0
    if runner.cuda_graphs:
        most = -(-runner.max_positions // block_size)
        graphs = decode + graph_outputs_bytes(graph_rows, most, runner.vocab_size, greedy_steps, max_batch_size,
                                              max_num_tokens, joined=runner.fused_forward is not None)
    return MemoryPlan(total, free, weights, prefill, decode, graphs, fraction)
