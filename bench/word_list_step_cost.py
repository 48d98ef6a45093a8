"""Python time one stream's stop and bad words add to every step of the embedded engine: at the bounds
(request_checks.MAX_WORDS words, MAX_WORD_LIST_TOKENS tokens) and at issue 31's 3.2 MB list (800k tokens).

Times the two per-step tests the engine makes for a sequence: sampling.banned_next_tokens (bad words whose prefix
the sequence just wrote) and the stop-word suffix test of Sequence.ends_with_stop_word, with the same list as both.

    .venv/bin/python bench/word_list_step_cost.py
"""

from __future__ import annotations

import random
import timeit

from trtllm_model.embedded.sampling import SamplingParams, SamplingState, banned_next_tokens
from trtllm_model.embedded.sequence import Sequence
from trtllm_model.executor_interface import GenerationRequest
from trtllm_model.pipeline.request_checks import MAX_WORD_LIST_TOKENS, MAX_WORDS

VOCAB = 49152  # SmolLM2's
PROMPT, OUTPUT = 100, 100


def step_ms(words: list[list[int]], repeat: int = 20) -> float:
    request = GenerationRequest(input_ids=list(range(PROMPT)), max_tokens=OUTPUT, bad_words=words, stop_words=words)
    state = SamplingState(SamplingParams.from_request(request, VOCAB), None, list(range(PROMPT + OUTPUT)), {},
                          OUTPUT, 0)
    sequence = Sequence.from_request(1, request, VOCAB, 0)
    sequence.token_ids = list(range(PROMPT + OUTPUT))

    def step() -> None:
        banned_next_tokens(state)
        sequence.ends_with_stop_word()

    return timeit.timeit(step, number=repeat) / repeat * 1000


def main() -> None:
    rng = random.Random(0)
    per_word = MAX_WORD_LIST_TOKENS // MAX_WORDS
    for label, count in (("at the bounds", MAX_WORDS), ("issue 31's 3.2 MB list", 200_000)):
        words = [[rng.randrange(VOCAB) for _ in range(per_word)] for _ in range(count)]
        print(f"{label}: {count} words x {per_word} tokens, as bad and stop words: {step_ms(words):.2f} ms per step")


if __name__ == "__main__":
    main()
