"""transformers' own greedy answer as a reference, and where a served answer parts from it: rounding (the served
batch and generate's one row add in different orders) may flip a near-tie, nothing else may."""

from __future__ import annotations

import torch


def generate_with_logits(model: torch.nn.Module, prompt: list[int], max_tokens: int) -> tuple[list[int],
                                                                                                  list[torch.Tensor]]:
    """`generate(do_sample=False)` of exactly `max_tokens` tokens for `prompt` alone, with each step's float32
    logits."""
    ids = torch.tensor([prompt], device=model.device)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                             min_new_tokens=max_tokens, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
    return out.sequences[0, len(prompt):].tolist(), [step[0].float() for step in out.logits]


def parting(served: list[int], expected: list[int], logits: list[torch.Tensor]) -> tuple[int, float] | None:
    """None when `served` is `expected`; else the first position where they differ and how far the reference's
    logit of its own token was above that of the served one there."""
    if served == expected:
        return None
    position = next(i for i, (a, b) in enumerate(zip(served, expected)) if a != b)
    row = logits[position]
    return position, float(row[expected[position]] - row[served[position]])
