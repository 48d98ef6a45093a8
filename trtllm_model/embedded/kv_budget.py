"""How much memory the KV block pool may take, and the check for a request that could never fit in it.

The pool (`kv_cache.KvBlockPool`) is preallocated at load: `memory_bytes` / (bytes of one token x block size)
blocks. The scheduler admits a request when the free blocks hold its prompt and grows its blocks as it decodes,
preempting the newest request when the pool runs out (`scheduler`); a request whose prompt + max_tokens needs more
blocks than the whole pool could never finish, so it is refused at enqueue.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..executor_interface import RequestRejected

# Sized for the CPU Deployment (deploy/kubernetes/cpu/deployment.yaml, 4 GiB memory limit) serving the embedded
# SmolLM2-135M in float32: with a 1.5 GiB budget filled by 2,000-token prompts the server peaked at 3.3 GiB
# (0.5 idle, the rest prefill activations and heap); docs/performance.md, "KV-cache budget".
DEFAULT_CPU_KV_CACHE_BYTES = 1 << 30  # 1 GiB
# On CUDA, NVIDIA's kv_cache_free_gpu_mem_fraction of the memory free once the weights are loaded (its default).
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


def default_kv_cache_bytes(device: torch.device, fraction: float = DEFAULT_FREE_GPU_MEM_FRACTION) -> int:
    """The budget when none is configured: a fixed size on CPU, a fraction of the free memory on CUDA."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free * fraction)
    return DEFAULT_CPU_KV_CACHE_BYTES
