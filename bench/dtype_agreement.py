"""How far bfloat16 answers are from float32 ones (SmolLM2, CPU, transformers' own forward and `generate`).

    .venv/bin/python bench/dtype_agreement.py            # ~2 min on 2 cores

For each of bench/engine.py's 16 chat questions: float32's greedy answer (--max-tokens, default 48) and bfloat16's,
whether they are identical and where they first part; then, teacher-forced over float32's answer, how often
bfloat16's top token is float32's and the mean KL divergence KL(float32 || bfloat16) of the next-token distributions.
The executor's CPU default dtype comes from `model_loading.default_dtype` (bfloat16 where the CPU has bfloat16 dot
products); this is what that default costs in agreement, and `bench/engine.py --dtype` what it buys in speed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.engine import QUESTIONS  # noqa: E402
from trtllm_model.embedded.model_loading import load_model  # noqa: E402
from trtllm_model.pipeline.detokenizer import chat_prompt_ids  # noqa: E402


def greedy(model: torch.nn.Module, prompt: list[int], max_tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                         min_new_tokens=max_tokens, do_sample=False)
    return out[0, len(prompt):].tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    full, half = load_model(dtype="float32"), load_model(dtype="bfloat16")
    identical, partings, agree, positions, divergences = 0, [], 0, 0, []
    with torch.inference_mode():
        for question in QUESTIONS:
            prompt = chat_prompt_ids(full.tokenizer, [{"role": "user", "content": question}])
            expected, got = greedy(full.model, prompt, args.max_tokens), greedy(half.model, prompt, args.max_tokens)
            if got == expected:
                identical += 1
            else:
                partings.append(next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b))
            ids = torch.tensor([prompt + expected[:-1]])
            reference = full.model(ids).logits[0, len(prompt) - 1:].float().log_softmax(-1)
            rounded = half.model(ids).logits[0, len(prompt) - 1:].float().log_softmax(-1)
            agree += int((reference.argmax(-1) == rounded.argmax(-1)).sum())
            positions += reference.shape[0]
            divergences.append(float((reference.exp() * (reference - rounded)).sum(-1).mean()))
            print(f"{question[:48]!r:52} {'identical' if got == expected else f'parts at token {partings[-1]}'}",
                  flush=True)
    print(f"greedy answers of {args.max_tokens} tokens identical: {identical} of {len(QUESTIONS)}; where they part: "
          f"tokens {sorted(partings)}")
    print(f"teacher-forced over float32's answers: bfloat16's top token is float32's at {agree} of {positions} "
          f"positions ({agree / positions:.1%}); mean KL(float32 || bfloat16) "
          f"{sum(divergences) / len(divergences):.4f} nats")


if __name__ == "__main__":
    main()
