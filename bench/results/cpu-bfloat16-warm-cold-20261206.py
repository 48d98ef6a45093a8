"""Is a prompt served warm from the prefix cache bit-equal to its cold run in the CPU's default dtype? For each
length n: the first n tokens of "The capital of France is Paris. " * 16, three times in one executor (cold, warm,
warm), 8 greedy tokens with log probs; bit-equal compares the runs' tokens, log probs and cum log prob. Lengths of
16k + 1 leave only the last token to compute warm. From the repository root:

    .venv/bin/python bench/results/cpu-bfloat16-warm-cold-20261206.py [DTYPE]
"""

import sys

sys.path[:0] = [".", "tests"]
from test_transformers_executor import greedy, run  # noqa: E402

from trtllm_model.embedded.model_loading import default_dtype, load_model  # noqa: E402
from trtllm_model.executors.transformers_executor import TransformersExecutor  # noqa: E402

dtype = sys.argv[1] if len(sys.argv) > 1 else default_dtype("cpu")
print("dtype", dtype)
loaded = load_model(dtype=dtype)
base = loaded.tokenizer("The capital of France is Paris. " * 16)["input_ids"]
equal = []
for n in (12, 17, 20, 33, 40, 49, 64, 65, 68, 81, 97, 100, 113, 129):
    executor = TransformersExecutor(loaded.model, loaded.tokenizer, max_batch_size=4, max_num_tokens=1024)
    try:
        runs = []
        for _ in range(3):
            (result,) = run(executor, [greedy(base[:n], max_tokens=8, return_log_probs=True)])
            runs.append((result.cum_log_prob, tuple(result.log_probs), tuple(result.tokens)))
        same = all(one == runs[0] for one in runs)
        equal.append(same)
        print(n, "bit-equal:", same, "same tokens:", all(one[2] == runs[0][2] for one in runs),
              [repr(one[0]) for one in runs], flush=True)
    finally:
        executor.shutdown()
print(f"{sum(equal)} of {len(equal)} lengths bit-equal")
