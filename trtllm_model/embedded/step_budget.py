"""How many prompt tokens a step may prefill beside the decoding batch, learned from the engine's own steps.

A prefill chunk lengthens the step every decoding stream waits for. On a CPU a prompt token costs about as much as
a decode row (compute-bound), so the default budget (max_num_tokens, 2,048) put a whole long prompt into one step and
stalled every stream 30-50x its usual gap (docs/performance.md). Here the chunk is steered so that a step with it takes
about `stall_factor` times a decode-only step (beside decoding streams or not: a request arriving meanwhile waits for
one such step at most): a decode-only step's time is followed as a moving average, and after
each step that prefilled, the chunk becomes the one that step's cost per prompt token says would have hit the target
(at most halved or doubled a step, so one noisy step cannot swing it). A controller, not a cost model: it follows
prompts whose chunks grow dearer as their prefix grows, and a machine whose load changes.

It assumes a chunk's cost grows with its tokens. Where a prefill has a large fixed cost (eager forwards on a GPU,
launch-bound) it would shrink chunks for nothing, so the engine leaves it off on CUDA (`prefill_stall_factor` 0).
"""

from __future__ import annotations

from dataclasses import dataclass

# Weight of the newest decode-only step in the moving average.
DECAY = 0.8
# The chunk before anything is learned, and the smallest one handed out while streams decode. On a 2-core CPU a chunk of
# 32 tokens beside 16 streams already cost about 3x a decode-only step deep into a long prompt, so a floor of 32 left
# factors below about 2.5 no effect; with 8 the steps follow the factor (docs/performance.md).
FIRST_CHUNK = 64
MIN_CHUNK = 8


@dataclass(slots=True)
class StepBudget:
    max_num_tokens: int
    stall_factor: float  # <= 1: off (the whole max_num_tokens budget every step)
    decode_s: float | None = None  # moving average of a decode-only step's seconds
    chunk: int = FIRST_CHUNK

    def prefill_tokens(self, decoding: int) -> int:
        """The prompt tokens the next step may compute beside `decoding` decoding sequences (none decoding too: a
        request that arrives while a long prompt prefills alone waits for one bounded step, not a 2,048-token one)."""
        full = self.max_num_tokens - decoding
        if self.stall_factor <= 1 or self.decode_s is None:
            return full
        return max(1, min(full, self.chunk))

    def observe(self, decoding: int, prompt_tokens: int, seconds: float) -> None:
        """One engine step's wall time, with how many sequences it decoded and how many prompt tokens it computed."""
        if self.stall_factor <= 1:
            return
        if not prompt_tokens:
            if decoding:
                self.decode_s = seconds if self.decode_s is None else DECAY * self.decode_s + (1 - DECAY) * seconds
            return
        if self.decode_s is None:
            return
        # What a chunk may add to a decode-only step, and what this step's prompt tokens added (a step of prompts
        # alone reads the weights as a decode step does: it is counted the same).
        room = (self.stall_factor - 1.0) * self.decode_s
        extra = max(seconds - self.decode_s, 1e-6)
        wanted = prompt_tokens * room / extra
        self.chunk = int(max(MIN_CHUNK, self.chunk / 2, min(wanted, self.chunk * 2, self.max_num_tokens)))
