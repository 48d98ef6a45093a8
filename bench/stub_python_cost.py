"""The `tensorrt_llm` stub's own Python a request and a response, in process (no Triton): thread CPU of parsing a
64-token chat request the way `execute()` does (parameters, rows, NVIDIA's convention, chat template, one tokenizer
call for a batch of 6), and of assembling one streamed response of --tokens-per-response tokens the way a delivery
worker does (detokenizing, the response's arrays; Triton's tensor objects and the send are not in it:
bench/send_cost.py measures those). Run it in two trees one after the other, alternating, to compare them.

    .venv/bin/python bench/stub_python_cost.py --tokenizer DIR [--rounds 5]

DIR: a Hugging Face tokenizer directory (bench/tiny_checkpoint.py writes one with SmolLM2's tokenizer).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
# model.py imports the Python backend's triton_python_backend_utils (a plain module, shipped with the backend)
sys.path[:0] = [str(BENCH_DIR.parent), str(BENCH_DIR), f"{sys.prefix}/share/trtllm-triton/backends/python"]

import e2e  # noqa: E402
import numpy as np  # noqa: E402

from trtllm_model.conventions.common import Limits  # noqa: E402
from trtllm_model.conventions.inflight_batcher import parameters_dict, request_parser, split_batch  # noqa: E402
from trtllm_model.conventions.parsing import parse_together  # noqa: E402
from trtllm_model.executor_interface import FinishReason, Step  # noqa: E402
from trtllm_model.serving.delivery_timing import UntimedPhases  # noqa: E402
from trtllm_model.serving.request_context import RequestContext  # noqa: E402
from trtllm_model.serving.responses import ResponseAssembler  # noqa: E402


def request_tensors(question: str) -> dict[str, np.ndarray]:
    """What bench/e2e.py's client sends through `ensemble`."""
    return {"text_input": np.array([[question.encode()]], dtype=np.object_),
            "max_tokens": np.array([[64]], np.int32), "min_tokens": np.array([[64]], np.int32),
            "stream": np.array([[True]]), "apply_chat_template": np.array([[True]]),
            "return_num_output_tokens": np.array([[True]])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=1200)
    parser.add_argument("--tokens-per-response", type=int, default=11)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from trtllm_model.triton.model import TritonPythonModel

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    model = TritonPythonModel()  # its chat template and detokenizer factory, as the stub builds them
    model.tokenizer = tokenizer
    chat_template, new_detokenizer = model._chat_template(), model._detokenizer_factory()
    limits = Limits(max_input_len=4096, max_output_len=4096, max_seq_len=8192, vocab_size=len(tokenizer))
    requests = [request_tensors(question) for question in e2e.questions(256)]

    def parse(batch: list[dict[str, np.ndarray]]) -> list:
        parsers = []
        for tensors in batch:
            parameters = parameters_dict("{}", frozenset())
            parsers.extend(request_parser(row, parameters, limits, tokenizer, chat_template) for row in split_batch(tensors))
        return parse_together(parsers, tokenizer)

    def per_request() -> float:
        started = time.thread_time()
        for first in range(0, args.requests, 6):
            parse(requests[first % 250 : first % 250 + 6])
        return (time.thread_time() - started) / args.requests * 1e6

    parsed = parse(requests[:1])[0]
    answer = tokenizer.encode(" ".join(e2e.questions(8)), add_special_tokens=False)
    assembler, times, per = ResponseAssembler(new_detokenizer), UntimedPhases(), args.tokens_per_response

    def per_response(streams: int = 200, tokens: int = 64) -> float:
        batches = []  # the steps, made before the clock starts (the executor's side)
        for stream in range(streams):
            ids = [answer[(stream + k) % len(answer)] for k in range(tokens)]
            batches.append([[Step(1, [ids[k]], k == tokens - 1,
                                  FinishReason.LENGTH if k == tokens - 1 else FinishReason.NOT_FINISHED)
                             for k in range(start, min(start + per, tokens))] for start in range(0, tokens, per)])
        sent = 0
        started = time.thread_time()
        for steps_of_stream in batches:
            ctx = RequestContext(parsed, None)
            ctx.detokenizer = new_detokenizer()
            for steps in steps_of_stream:
                assembler.messages(ctx, steps, None, times)
                sent += 1
        return (time.thread_time() - started) / sent * 1e6

    per_request(), per_response(50)  # warm: imports, the template's compilation, the token-length table
    requests_us = [per_request() for _ in range(args.rounds)]
    responses_us = [per_response() for _ in range(args.rounds)]
    print(f"{BENCH_DIR.parent}: a request {statistics.median(requests_us):.1f} us "
          f"({min(requests_us):.1f}-{max(requests_us):.1f}), a response of {per} tokens "
          f"{statistics.median(responses_us):.2f} us ({min(responses_us):.2f}-{max(responses_us):.2f}), "
          f"median of {args.rounds} rounds, thread CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
