"""The 2026-12-06 05:04-05:08 try (not kept): is a float32 prompt served warm from the prefix cache bit-equal to its
cold run? Apply the try first (`git apply bench/results/cpu-float32-prompt-onednn-20261206-0504.diff` on 305dab7: the
measured CPU dtype, and float32 forwards with prompt tokens through oneDNN), then, from the repository root:

    .venv/bin/python bench/results/cpu-float32-prompt-onednn-20261206-0504.py

For each prompt length n: the first n tokens of "The capital of France is Paris. " * 12 three times (cold, then warm),
8 greedy tokens with log probs; bit-equal compares the three runs' cum log prob, log probs and tokens.
"""

import sys

sys.path[:0] = [".", "tests"]
from test_transformers_executor import greedy, run  # noqa: E402

from trtllm_model.embedded.model_loading import default_dtype, load_model  # noqa: E402
from trtllm_model.executors.transformers_executor import TransformersExecutor  # noqa: E402

print("default dtype", default_dtype("cpu"))
loaded = load_model(dtype=default_dtype("cpu"))
base = loaded.tokenizer("The capital of France is Paris. " * 12)["input_ids"]
for n in (12, 64, 65, 68, 81):
    executor = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=4, max_num_tokens=1024)
    try:
        runs = []
        for _ in range(3):
            (result,) = run(executor, [greedy(base[:n], max_tokens=8, return_log_probs=True)])
            runs.append((result.cum_log_prob, tuple(result.log_probs), tuple(result.tokens)))
        print(n, "bit-equal:", all(one == runs[0] for one in runs), [repr(one[0]) for one in runs], flush=True)
    finally:
        executor.shutdown()
