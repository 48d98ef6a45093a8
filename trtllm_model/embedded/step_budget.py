"""How many prompt tokens a step may prefill beside the decoding batch, learned from the engine's own steps.

A prefill chunk lengthens the step every decoding stream waits for. On a CPU a prompt token costs about as much as
a decode row (compute-bound), so the default budget (max_num_tokens, 2,048) put a whole long prompt into one step and
stalled every stream 30-100x its usual gap (docs/performance.md). Here the chunk is sized so that a step with it takes
at most `stall_factor` times a decode-only step: the engine reports each step's seconds and prompt tokens, a
decode-only step's time is followed as a moving average, and a prefill's extra time as a line `a + b * tokens` (a
decayed least-squares fit, so it follows the machine's load). Where even the smallest chunk would pass the factor (a
fixed cost `a` that large: eager prefills on a GPU, launch-bound) chunking cannot keep the bound, and the full budget
is used, for throughput.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Weight of the newest observation in the moving averages and the fit.
DECAY = 0.8
# The smallest chunk handed out while streams decode: below it a step's fixed costs dominate.
MIN_CHUNK = 16


@dataclass(slots=True)
class StepBudget:
    max_num_tokens: int
    stall_factor: float  # <= 1: off (the whole max_num_tokens budget every step)
    decode_s: float | None = None  # moving average of a decode-only step's seconds
    # Decayed sums over (prompt tokens, extra seconds) of steps that prefilled: weight, n, t, n*n, n*t.
    _fit: list[float] = field(default_factory=lambda: [0.0] * 5)

    def prefill_tokens(self, decoding: int) -> int:
        """The prompt tokens the next step may compute beside `decoding` decoding sequences."""
        full = self.max_num_tokens - decoding
        if self.stall_factor <= 1 or not decoding or self.decode_s is None:
            return full
        fixed, per_token = self._line()
        if per_token is None:  # no prefill seen beside decoding yet: start small, learn from it
            return min(full, MIN_CHUNK * 4)
        room = (self.stall_factor - 1.0) * self.decode_s - fixed
        if room <= 0:  # the fixed cost alone passes the bound: small chunks would only cost throughput
            return full
        return max(MIN_CHUNK, min(full, int(room / per_token)))

    def observe(self, decoding: int, prompt_tokens: int, seconds: float) -> None:
        """One engine step's wall time, with how many sequences it decoded and how many prompt tokens it computed."""
        if not decoding:
            return
        if not prompt_tokens:
            self.decode_s = seconds if self.decode_s is None else DECAY * self.decode_s + (1 - DECAY) * seconds
            return
        if self.decode_s is None:
            return
        extra = max(0.0, seconds - self.decode_s)
        w, n, t, nn, nt = (DECAY * value for value in self._fit)
        self._fit = [w + 1, n + prompt_tokens, t + extra, nn + prompt_tokens * prompt_tokens, nt + prompt_tokens * extra]

    def _line(self) -> tuple[float, float | None]:
        """(fixed seconds, seconds per prompt token) of a prefill beside decoding; (0, None) before any."""
        w, n, t, nn, nt = self._fit
        if w <= 0 or n <= 0:
            return 0.0, None
        mean_n, mean_t = n / w, t / w
        var_n = nn / w - mean_n * mean_n
        if var_n <= 1e-9 * mean_n * mean_n:  # every chunk the same size: all of its time per token (an upper bound)
            return 0.0, max(mean_t / mean_n, 1e-9)
        per_token = (nt / w - mean_n * mean_t) / var_n
        if per_token <= 0:
            return 0.0, max(mean_t / mean_n, 1e-9)
        return max(0.0, mean_t - per_token * mean_n), per_token
