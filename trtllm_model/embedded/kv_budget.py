"""How much memory the batch KV cache may take, and what a request reserves of it.

The cache is one contiguous, left-padded buffer per layer (see `kv_cache`), so it holds rows x columns token
slots, the columns being the longest row's length. A running request can grow until prompt + max_tokens, so the
batch reserves `rows x the longest prompt + max_tokens` slots for the whole life of its requests: the scheduler
admits a request only while that reservation, with it, stays within the budget (nothing is ever evicted), and a
request that needs more than the whole budget alone is refused at enqueue.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from ..executor_interface import RequestRejected
from .sequence import Sequence

# Sized for the CPU Deployment (deploy/kubernetes/cpu/deployment.yaml, 4 GiB memory limit) serving the embedded
# SmolLM2-135M in float32: with a 1.5 GiB budget filled by 2,000-token prompts the server peaked at 3.3 GiB
# (0.5 idle, the rest prefill activations and heap); docs/performance.md, "KV-cache budget".
DEFAULT_CPU_KV_CACHE_BYTES = 1 << 30  # 1 GiB
# On CUDA, NVIDIA's kv_cache_free_gpu_mem_fraction of the memory free once the weights are loaded (its default).
DEFAULT_FREE_GPU_MEM_FRACTION = 0.9


@dataclass(frozen=True, slots=True)
class KvBudget:
    memory_bytes: int
    bytes_per_slot: int  # keys and values of one token in every layer

    @property
    def max_slots(self) -> int:
        return self.memory_bytes // self.bytes_per_slot

    def fits(self, sequences: Iterable[Sequence]) -> bool:
        return reserved_slots(sequences) <= self.max_slots

    def check_request(self, prompt_len: int, max_tokens: int) -> None:
        """Raise RequestRejected for a request that would not fit even alone in the batch."""
        needed = prompt_len + max_tokens
        if needed > self.max_slots:
            raise RequestRejected(
                f"input length {prompt_len} + max_tokens {max_tokens} needs {needed} KV-cache token slots; "
                f"kv_cache_memory_bytes={self.memory_bytes} holds {self.max_slots} "
                f"({self.bytes_per_slot} bytes per token)"
            )


def lifetime_length(sequence: Sequence) -> int:
    """The most tokens the sequence can hold in the cache before it ends."""
    return sequence.prompt_len + sequence.max_tokens


def reserved_slots(sequences: Iterable[Sequence]) -> int:
    """Slots the contiguous cache needs to carry these sequences to their ends: rows x the longest life."""
    lengths = [lifetime_length(sequence) for sequence in sequences]
    return len(lengths) * max(lengths, default=0)


def default_kv_cache_bytes(device: torch.device, fraction: float = DEFAULT_FREE_GPU_MEM_FRACTION) -> int:
    """The budget when none is configured: a fixed size on CPU, a fraction of the free memory on CUDA."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free * fraction)
    return DEFAULT_CPU_KV_CACHE_BYTES
