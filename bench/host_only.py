"""The embedded engine with a forward that computes nothing, so that what is left is its host work: the steps go as
on CUDA (static shapes, overlapped steps) and the forward returns `[rows, 64]` zero logits (argmax 0). This machine's
CPU then stands in for a GPU host's Python. Used by bench/gpu/iteration_timeline.py (`fake`) and
bench/host_layouts.py, whose engine worker process starts through `main` here (the same worker, patched first).
"""

from __future__ import annotations

import torch

from trtllm_model.embedded import runner as runner_module


def zero_logits_forward(self, *parts, ends=None):
    """A forward that computes nothing: `[rows, 64]` zeros (argmax 0), a row for each of `ends` if given."""
    rows = sum(inputs.input_ids.shape[0] for inputs in parts) if ends is None else ends.shape[0]
    zeros = getattr(self, "_zeros", None)
    if zeros is None or zeros.shape[0] < rows:
        zeros = self._zeros = torch.zeros(max(rows, 512), 64, device=self.device)
    return zeros[:rows]


def make_host_only() -> None:
    """Patch `ModelRunner` in this process: zero-logit forwards and static shapes."""
    runner_class = runner_module.ModelRunner
    if runner_class._forward is zero_logits_forward:
        return
    runner_class._forward = zero_logits_forward
    original_init = runner_class.__init__

    def init(self, model, static_shapes=None, cuda_graphs=True, fused_forwards=None):
        original_init(self, model, True, cuda_graphs, fused_forwards)

    runner_class.__init__ = init


def main(argv: list[str]) -> None:
    """The engine worker process's entry (executors/engine_worker.py), host-only."""
    from trtllm_model.executors import engine_worker

    make_host_only()
    engine_worker.main(argv)
